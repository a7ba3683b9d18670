"""Checks and transforms applied to a decoded batch before it is queued for writing.

:mod:`fleetscope.codec` already checks column names, types and nulls. This module adds
the value checks the store relies on and applies the per-request headers, all with
vectorised Arrow compute (no per-row Python):

* ``job`` must be non-empty where the record type requires it;
* ``rank`` must be ``>= -1``;
* the partitioning time column must be after 2000-01-01 (times are ns since the Unix
  epoch; earlier values are almost always a unit mistake and would land in a long
  expired TTL partition);
* ``X-Fleetscope-Clock-Offset-Ns`` is added to every time column of the record type
  (``-1`` sentinels stay ``-1``);
* ``X-Fleetscope-Host`` fills empty ``host`` values.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from fleetscope.codec import BatchError
from fleetscope.schema import RECORD_TYPES, RecordType

MIN_TIME_NS: Final = 946_684_800 * 10**9
"""2000-01-01T00:00:00Z in ns since the epoch."""


def prepare(
    tables: dict[str, pa.Table], host: str = "", clock_offset_ns: int = 0
) -> dict[str, pa.Table]:
    """Validate value ranges and apply the clock offset and host header.

    Args:
        tables: decoded batch, record type -> canonical table.
        host: value of ``X-Fleetscope-Host`` ("" if absent).
        clock_offset_ns: value of ``X-Fleetscope-Clock-Offset-Ns``.

    Returns:
        The transformed tables (new objects; inputs are not modified).

    Raises:
        BatchError: a value is out of range; the message names table, column and row.
    """
    out = {}
    for name, table in tables.items():
        rt = RECORD_TYPES[name]
        if clock_offset_ns:
            table = _shift_times(rt, table, clock_offset_ns)
        if host and "host" in table.column_names:
            table = _fill_host(table, host)
        _check(rt, table)
        out[name] = table
    return out


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    if not pc.any(mask).as_py():
        return None
    return int(pc.index(mask, True).as_py())


def _check(rt: RecordType, table: pa.Table) -> None:
    if "job" in table.column_names and rt.column("job").required:
        i = _first(pc.equal(table["job"], ""))
        if i is not None:
            raise BatchError(f"{rt.name}[{i}].job: must not be empty")
    if "rank" in table.column_names:
        i = _first(pc.less(table["rank"], -1))
        if i is not None:
            raise BatchError(f"{rt.name}[{i}].rank: {table['rank'][i].as_py()} is below -1")
    col = table[rt.time_column]
    i = _first(pc.less(col, MIN_TIME_NS))
    if i is not None:
        raise BatchError(
            f"{rt.name}[{i}].{rt.time_column}: {col[i].as_py()} is before 2000-01-01; "
            "times are integer nanoseconds since the Unix epoch"
        )


def _shift_times(rt: RecordType, table: pa.Table, offset_ns: int) -> pa.Table:
    offset = pa.scalar(offset_ns, pa.int64())
    for c in rt.time_columns:
        idx = table.schema.get_field_index(c)
        col = table.column(idx)
        shifted = pc.if_else(pc.equal(col, -1), col, pc.add(col, offset))
        table = table.set_column(idx, table.schema.field(idx), shifted)
    return table


def _fill_host(table: pa.Table, host: str) -> pa.Table:
    idx = table.schema.get_field_index("host")
    col = table.column(idx)
    empty = pc.equal(col, "")
    if not pc.any(empty).as_py():
        return table
    filled = pc.if_else(empty, pa.scalar(host), col)
    return table.set_column(idx, table.schema.field(idx), filled)


class UnsupportedContentType(BatchError):
    """The request's content type is neither Arrow nor JSON (HTTP 415)."""


_MALFORMED = ("invalid JSON", "expected an object {", "bad frame header", "truncated", "not an Arrow IPC")


def is_malformed(err: BatchError) -> bool:
    """True when the body could not be parsed at all (HTTP 400) rather than failing
    schema validation (HTTP 422)."""
    msg = str(err)
    return any(m in msg for m in _MALFORMED)


def decode_request(
    body: bytes, content_type: str, host: str = "", clock_offset_ns: int = 0
) -> dict[str, pa.Table]:
    """Decode a request body (Arrow or JSON wire format) and :func:`prepare` it.

    Raises:
        UnsupportedContentType: neither wire format.
        BatchError: malformed or invalid; the message names the bad field or row.
    """
    from fleetscope.codec import ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE, decode

    ct = (content_type or "").split(";")[0].strip().lower()
    if ct not in (ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE, ""):
        raise UnsupportedContentType(
            f"unsupported content type {content_type!r}; use {ARROW_CONTENT_TYPE} or {JSON_CONTENT_TYPE}"
        )
    return prepare(decode(body, ct), host=host, clock_offset_ns=clock_offset_ns)
