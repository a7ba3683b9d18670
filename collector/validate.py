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
* ``X-Fleetscope-Host`` fills empty ``host`` values;
* no time column (after the offset) later than ``now + max_future_s``, and one request's
  partition times within ``max_batch_span_days`` (ClickHouse refuses an insert touching
  more than 1000 day partitions: such a batch would fail every insert it joins);
* ``rank < max_world_size``; ``jobs`` topology ``dp, tp, pp, num_microbatches >= 1``,
  ``dp * tp * pp <= max_world_size``, a valid axis order, and the SQL column widths
  (name 400, status 20).

Every limit is a server setting (:class:`IngestLimits` carries them) and every error
names the limit and its value.

Cost: a request's fixed cost is what limits ingest at fleet scale (1,536 agents), so
the checks first run on each column's (min, max), one compute call per column, and
only a batch that may fail runs the exact, row-naming checks.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from fleetscope.codec import BatchError, Limits
from fleetscope.schema import RECORD_TYPES, RecordType

MIN_TIME_NS: Final = 946_684_800 * 10**9
"""2000-01-01T00:00:00Z in ns since the epoch."""
DAY_NS: Final = 86_400 * 10**9
ORDERS: Final = frozenset("-".join(p) for p in itertools.permutations(("dp", "tp", "pp")))
JOB_TEXT_CHARS: Final = {"name": 400, "status": 20}
"""Widths of SQL ``jobs`` columns filled from ``jobs`` records (PostgreSQL enforces them)."""


@dataclass(frozen=True)
class IngestLimits:
    """The ingest limits of :class:`fleetscope.server.settings.Settings`."""

    codec: Limits = field(default_factory=Limits)
    max_world_size: int = 2**20
    max_future_s: float = 3600.0
    max_batch_span_days: int = 900

    @classmethod
    def from_settings(cls, s: Any) -> IngestLimits:
        return cls(
            codec=Limits(
                max_decoded_bytes=s.max_decoded_bytes, max_rows=s.max_request_rows,
                max_string_bytes=s.max_string_bytes, max_symbol_bytes=s.max_symbol_bytes,
            ),
            max_world_size=s.max_world_size, max_future_s=s.max_future_s,
            max_batch_span_days=s.max_batch_span_days,
        )  # fmt: skip


DEFAULT_INGEST_LIMITS = IngestLimits()


def prepare(
    tables: dict[str, pa.Table], host: str = "", clock_offset_ns: int = 0,
    limits: IngestLimits | None = None, now_ns: int | None = None,
) -> dict[str, pa.Table]:
    """Validate value ranges and apply the clock offset and host header.

    Args:
        tables: decoded batch, record type -> canonical table.
        host: value of ``X-Fleetscope-Host`` ("" if absent).
        clock_offset_ns: value of ``X-Fleetscope-Clock-Offset-Ns``.
        limits: bounds (default :data:`DEFAULT_INGEST_LIMITS`).
        now_ns: the server's time (default: now), for the future bound.

    Returns:
        The transformed tables (new objects; inputs are not modified).

    Raises:
        BatchError: a value is out of range; the message names table, column and row.
    """
    lim = limits or DEFAULT_INGEST_LIMITS
    now = time.time_ns() if now_ns is None else now_ns
    out = {}
    for name, table in tables.items():
        rt = RECORD_TYPES[name]
        if not table.num_rows:
            out[name] = table
            continue
        spans = {c: _min_max(table[c]) for c in rt.time_columns}
        if clock_offset_ns:
            table, spans = _shift_times(rt, table, clock_offset_ns, spans)
        if host and "host" in table.column_names:
            table = _fill_host(table, host)
        if rt.name == "jobs" or not _surely_valid(rt, table, lim, now, spans):
            # the exact checks, which name the first offending row (and may find nothing)
            _check(rt, table)
            _check_limits(rt, table, lim, now)
        out[name] = table
    return out


def _min_max(col: pa.ChunkedArray | pa.Array) -> tuple[int, int]:
    mm = pc.min_max(col)
    return mm["min"].as_py(), mm["max"].as_py()


def _surely_valid(rt: RecordType, table: pa.Table, lim: IngestLimits, now_ns: int,
                  spans: dict[str, tuple[int, int]]) -> bool:
    """True when every check of :func:`_check` and :func:`_check_limits` passes, decided
    from each column's (min, max) with one compute call per column: a request costs the
    server a handful of calls per record type instead of several per check. False means
    "run the exact checks" (they find the row to name, or nothing)."""
    if "job" in table.column_names and rt.column("job").required and pc.index(table["job"], "").as_py() >= 0:
        return False
    if "rank" in table.column_names:
        lo, hi = _min_max(table["rank"])
        if lo < -1 or hi >= lim.max_world_size:
            return False
    latest = now_ns + int(lim.max_future_s * 1e9)
    if any(hi > latest for _, hi in spans.values()):
        return False
    lo, hi = spans[rt.time_column]
    return lo >= MIN_TIME_NS and hi - lo <= lim.max_batch_span_days * DAY_NS


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


def _check_limits(rt: RecordType, table: pa.Table, lim: IngestLimits, now_ns: int) -> None:
    latest = now_ns + int(lim.max_future_s * 1e9)
    for c in rt.time_columns:
        col = table[c]
        i = _first(pc.greater(col, latest))
        if i is not None:
            raise BatchError(
                f"{rt.name}[{i}].{c}: {col[i].as_py()} is more than max_future_s={lim.max_future_s:g} "
                "seconds after the server's time"
            )
    col = table[rt.time_column]
    lo, hi = pc.min(col).as_py(), pc.max(col).as_py()
    if hi - lo > lim.max_batch_span_days * DAY_NS:
        raise BatchError(
            f"{rt.name}.{rt.time_column}: times span {(hi - lo) / DAY_NS:.0f} days, more than "
            f"max_batch_span_days={lim.max_batch_span_days}"
        )
    world = lim.max_world_size
    if "rank" in table.column_names:
        i = _first(pc.greater_equal(table["rank"], world))
        if i is not None:
            raise BatchError(f"{rt.name}[{i}].rank: {table['rank'][i].as_py()} is not below max_world_size={world}")
    if rt.name == "jobs":
        _check_job_rows(table, world)


def _check_job_rows(table: pa.Table, world: int) -> None:
    for c in ("dp", "tp", "pp", "num_microbatches"):
        i = _first(pc.less(table[c], 1))
        if i is not None:
            raise BatchError(f"jobs[{i}].{c}: {table[c][i].as_py()} must be at least 1")
    for c in ("dp", "tp", "pp"):
        i = _first(pc.greater(table[c], world))
        if i is not None:
            raise BatchError(f"jobs[{i}].{c}: {table[c][i].as_py()} is more than max_world_size={world}")
    dp, tp, pp = (pc.cast(table[c], pa.int64()) for c in ("dp", "tp", "pp"))
    size = pc.multiply(dp, tp)  # each factor <= world <= 2**24: no overflow
    i = _first(pc.greater(size, world))
    if i is None:
        size = pc.multiply(size, pp)
        i = _first(pc.greater(size, world))
    if i is not None:
        r = {c: table[c][i].as_py() for c in ("dp", "tp", "pp")}
        raise BatchError(
            f"jobs[{i}]: world size dp*tp*pp = {r['dp']}*{r['tp']}*{r['pp']} is more than max_world_size={world}"
        )
    i = _first(pc.invert(pc.is_in(table["order"], pa.array(sorted(ORDERS)))))
    if i is not None:
        raise BatchError(f"jobs[{i}].order: {table['order'][i].as_py()[:40]!r} is not one of {sorted(ORDERS)}")
    for c, width in JOB_TEXT_CHARS.items():
        i = _first(pc.greater(pc.utf8_length(table[c]), width))
        if i is not None:
            raise BatchError(f"jobs[{i}].{c}: longer than {width} characters (the jobs table column)")
    for c in ("model_flops_per_step", "device_peak_flops"):
        i = _first(pc.invert(pc.is_finite(table[c])))
        if i is not None:
            raise BatchError(f"jobs[{i}].{c}: must be a finite number")


INT64_MAX: Final = 2**63 - 1


def _shift_times(
    rt: RecordType, table: pa.Table, offset_ns: int, spans: dict[str, tuple[int, int]]
) -> tuple[pa.Table, dict[str, tuple[int, int]]]:
    """Add the clock offset to every time column (``-1`` sentinels stay ``-1``); returns
    the table and each time column's new (min, max)."""
    offset = pa.scalar(offset_ns, pa.int64())
    out = dict(spans)
    for c in rt.time_columns:
        idx = table.schema.get_field_index(c)
        col = table.column(idx)
        lo, hi = spans[c]
        if not (-INT64_MAX - 1 <= lo + offset_ns and hi + offset_ns <= INT64_MAX):
            raise BatchError(f"{rt.name}.{c}: adding X-Fleetscope-Clock-Offset-Ns={offset_ns} overflows int64")
        shifted = pc.add(col, offset)  # cannot overflow: checked on (min, max) above
        if lo <= -1 <= hi and pc.index(col, -1).as_py() >= 0:
            shifted = pc.if_else(pc.equal(col, -1), col, shifted)
            out[c] = _min_max(shifted)
        else:
            out[c] = (lo + offset_ns, hi + offset_ns)
        table = table.set_column(idx, table.schema.field(idx), shifted)
    return table, out


def _fill_host(table: pa.Table, host: str) -> pa.Table:
    idx = table.schema.get_field_index("host")
    col = table.column(idx)
    if pc.index(col, "").as_py() < 0:
        return table
    filled = pc.if_else(pc.equal(col, ""), pa.scalar(host), col)
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
    body: bytes, content_type: str, host: str = "", clock_offset_ns: int = 0,
    limits: IngestLimits | None = None,
) -> dict[str, pa.Table]:
    """Decode a request body (Arrow or JSON wire format) and :func:`prepare` it.

    Raises:
        UnsupportedContentType: neither wire format.
        BatchError: malformed or invalid; the message names the bad field or row.
    """
    from fleetscope.codec import ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE, decode

    ct = (content_type or "").split(";")[0].strip().lower()
    if ct not in (ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE):
        raise UnsupportedContentType(
            f"unsupported content type {content_type[:100]!r}; use {ARROW_CONTENT_TYPE} or {JSON_CONTENT_TYPE}"
        )
    lim = limits or DEFAULT_INGEST_LIMITS
    return prepare(decode(body, ct, lim.codec), host=host, clock_offset_ns=clock_offset_ns, limits=lim)
