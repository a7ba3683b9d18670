"""Wire codec: telemetry batches as Arrow IPC streams (zstd) or JSON.

A *batch* maps record-type names to Arrow tables. On the wire (``POST /api/v1/ingest``
with ``Content-Type: application/vnd.apache.arrow.stream``) a batch is a sequence of
frames, one per record type::

    b"FSB1" | uint32 little-endian length | Arrow IPC stream bytes

Each IPC stream carries the schema metadata ``fleetscope.record`` (the record type) and
``fleetscope.schema_version``. Small clients may send JSON instead
(``application/json``)::

    {"schema_version": 1, "records": {"sections": [{"job": "j", ...}, ...], ...}}

Decoding validates every table against :mod:`fleetscope.schema` and raises
:class:`BatchError` whose message names the bad record type, column or row.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from fleetscope.schema import RECORD_TYPES, SCHEMA_VERSION, ColType, RecordType, arrow_type

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSON_CONTENT_TYPE = "application/json"
FRAME_MAGIC = b"FSB1"
_LEN = struct.Struct("<I")


class BatchError(ValueError):
    """A batch that cannot be accepted; the message says exactly why."""


# ---------------------------------------------------------------------------------------
# building tables
# ---------------------------------------------------------------------------------------
def rows_to_table(rt: RecordType, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Build a canonical table from row dicts, filling defaults; errors name the row."""
    rows = list(rows)
    cols: dict[str, list[Any]] = {c.name: [] for c in rt.columns}
    known = set(cols)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise BatchError(f"{rt.name}[{i}]: expected an object, got {type(row).__name__}")
        extra = set(row) - known
        if extra:
            raise BatchError(f"{rt.name}[{i}]: unknown field(s) {sorted(extra)}")
        for c in rt.columns:
            v = row.get(c.name, c.default)
            if v is None:
                raise BatchError(f"{rt.name}[{i}]: missing required field {c.name!r}")
            cols[c.name].append(_check_value(rt, i, c.name, c.type, v))
    arrays = [pa.array(cols[c.name], type=arrow_type(c.type)) for c in rt.columns]
    return pa.Table.from_arrays(arrays, schema=rt.arrow_schema())


def _check_value(rt: RecordType, i: int, name: str, t: ColType, v: Any) -> Any:
    where = f"{rt.name}[{i}].{name}"
    if t in (ColType.STRING, ColType.SYMBOL):
        if not isinstance(v, str):
            raise BatchError(f"{where}: expected a string, got {v!r}")
        return v
    if t == ColType.BOOL:
        if isinstance(v, bool) or v in (0, 1):
            return int(v)
        raise BatchError(f"{where}: expected a boolean, got {v!r}")
    if t in (ColType.INT64, ColType.INT32):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BatchError(f"{where}: expected an integer, got {v!r}")
        lim = 2**63 if t == ColType.INT64 else 2**31
        if not -lim <= v < lim:
            raise BatchError(f"{where}: integer {v} out of range for {t.value}")
        return v
    if t == ColType.FLOAT64:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BatchError(f"{where}: expected a number, got {v!r}")
        return float(v)
    raise AssertionError(t)  # pragma: no cover


def conform(rt: RecordType, table: pa.Table) -> pa.Table:
    """Check a table against the record type and cast it to the canonical schema.

    Missing columns with defaults are filled; missing required columns, unknown
    columns, nulls and uncastable types raise :class:`BatchError`.
    """
    names = set(table.column_names)
    extra = names - set(rt.column_names)
    if extra:
        raise BatchError(f"{rt.name}: unknown column(s) {sorted(extra)}")
    n = table.num_rows
    arrays = []
    for c in rt.columns:
        target = arrow_type(c.type)
        if c.name not in names:
            if c.required:
                raise BatchError(f"{rt.name}: missing required column {c.name!r}")
            default = int(c.default) if c.type == ColType.BOOL else c.default
            arrays.append(pa.array([default] * n, type=target))
            continue
        col = table.column(c.name)
        if col.null_count:
            raise BatchError(f"{rt.name}.{c.name}: {col.null_count} null value(s)")
        if not col.type.equals(target):
            if c.type in (ColType.STRING, ColType.SYMBOL) and pa.types.is_dictionary(col.type):
                col = col.cast(pa.string())
            if not col.type.equals(target):
                ok = _castable(col.type, c.type)
                if not ok:
                    raise BatchError(
                        f"{rt.name}.{c.name}: type {col.type} cannot be used as {c.type.value}"
                    )
                try:
                    col = col.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise BatchError(f"{rt.name}.{c.name}: {e}") from None
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=rt.arrow_schema())


def _castable(src: pa.DataType, t: ColType) -> bool:
    if t in (ColType.STRING, ColType.SYMBOL):
        return pa.types.is_string(src) or pa.types.is_large_string(src)
    if t in (ColType.INT64, ColType.INT32, ColType.BOOL):
        return pa.types.is_integer(src) or pa.types.is_boolean(src)
    if t == ColType.FLOAT64:
        return pa.types.is_integer(src) or pa.types.is_floating(src)
    return False


# ---------------------------------------------------------------------------------------
# Arrow frames
# ---------------------------------------------------------------------------------------
def table_to_ipc(table: pa.Table, compression: str | None = "zstd") -> bytes:
    """One Arrow IPC stream for one table (compression: 'zstd', 'lz4' or None)."""
    sink = pa.BufferOutputStream()
    opts = ipc.IpcWriteOptions(compression=compression)
    with ipc.new_stream(sink, table.schema, options=opts) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_to_table(data: bytes | memoryview | pa.Buffer) -> pa.Table:
    with ipc.open_stream(pa.py_buffer(data) if not isinstance(data, pa.Buffer) else data) as r:
        return r.read_all()


def encode_batch(
    tables: Mapping[str, pa.Table | list[dict[str, Any]]], compression: str | None = "zstd"
) -> bytes:
    """Encode ``{record type: table or rows}`` as the Arrow wire format."""
    out = bytearray()
    for name, data in tables.items():
        rt = _rt(name)
        table = rows_to_table(rt, data) if isinstance(data, list) else conform(rt, data)
        if table.num_rows == 0:
            continue
        payload = table_to_ipc(table, compression)
        out += FRAME_MAGIC + _LEN.pack(len(payload)) + payload
    return bytes(out)


def decode_batch(data: bytes) -> dict[str, pa.Table]:
    """Decode and validate the Arrow wire format; raises :class:`BatchError`."""
    view = memoryview(data)
    pos, out = 0, {}
    frame = 0
    while pos < len(view):
        if len(view) - pos < 8 or bytes(view[pos : pos + 4]) != FRAME_MAGIC:
            raise BatchError(f"frame {frame} at byte {pos}: bad frame header (expected FSB1)")
        (n,) = _LEN.unpack_from(view, pos + 4)
        start, end = pos + 8, pos + 8 + n
        if end > len(view):
            raise BatchError(f"frame {frame} at byte {pos}: truncated ({len(view) - start} of {n} bytes)")
        try:
            table = ipc_to_table(view[start:end])
        except (pa.ArrowInvalid, OSError) as e:
            raise BatchError(f"frame {frame}: not an Arrow IPC stream: {e}") from None
        meta = table.schema.metadata or {}
        name = meta.get(b"fleetscope.record", b"").decode()
        version = meta.get(b"fleetscope.schema_version", str(SCHEMA_VERSION).encode()).decode()
        if not name:
            raise BatchError(f"frame {frame}: schema metadata lacks fleetscope.record")
        if version != str(SCHEMA_VERSION):
            raise BatchError(
                f"frame {frame} ({name}): schema version {version} not supported "
                f"(server speaks {SCHEMA_VERSION})"
            )
        rt = _rt(name)
        table = conform(rt, table)
        out[name] = pa.concat_tables([out[name], table]) if name in out else table
        pos, frame = end, frame + 1
    return out


# ---------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------
def encode_json(tables: Mapping[str, pa.Table | list[dict[str, Any]]]) -> bytes:
    records: dict[str, list[dict[str, Any]]] = {}
    for name, data in tables.items():
        rows = data if isinstance(data, list) else data.to_pylist()
        records[name] = [{k: _json_safe(v) for k, v in r.items()} for r in rows]
    return json.dumps({"schema_version": SCHEMA_VERSION, "records": records}).encode()


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def decode_json(data: bytes | str | Mapping[str, Any]) -> dict[str, pa.Table]:
    """Decode and validate the JSON wire format; raises :class:`BatchError`."""
    if isinstance(data, (bytes, str)):
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise BatchError(f"invalid JSON: {e}") from None
    else:
        doc = data
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), dict):
        raise BatchError('expected an object {"schema_version": 1, "records": {type: [rows]}}')
    version = doc.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise BatchError(f"schema_version {version!r} not supported (server speaks {SCHEMA_VERSION})")
    out = {}
    for name, rows in doc["records"].items():
        rt = _rt(name)
        if not isinstance(rows, list):
            raise BatchError(f"records.{name}: expected a list of objects")
        fixed = []
        for row in rows:
            if isinstance(row, dict):  # JSON has no NaN: null float -> default NaN
                row = {
                    k: (rt.column(k).default if v is None and k in rt.column_names else v)
                    for k, v in row.items()
                }
            fixed.append(row)
        table = rows_to_table(rt, fixed)
        if table.num_rows:
            out[name] = table
    return out


def decode(data: bytes, content_type: str) -> dict[str, pa.Table]:
    """Decode either wire format by content type."""
    ct = (content_type or "").split(";")[0].strip().lower()
    if ct == ARROW_CONTENT_TYPE:
        return decode_batch(data)
    if ct in (JSON_CONTENT_TYPE, ""):
        return decode_json(data)
    raise BatchError(
        f"unsupported content type {content_type!r}; use {ARROW_CONTENT_TYPE} or {JSON_CONTENT_TYPE}"
    )


def _rt(name: str) -> RecordType:
    try:
        return RECORD_TYPES[name]
    except KeyError:
        raise BatchError(
            f"unknown record type {name!r}; expected one of {sorted(RECORD_TYPES)}"
        ) from None
