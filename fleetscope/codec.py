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
import reprlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from fleetscope.schema import RECORD_TYPES, SCHEMA_VERSION, ColType, RecordType, arrow_type

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSON_CONTENT_TYPE = "application/json"
FRAME_MAGIC = b"FSB1"
_LEN = struct.Struct("<I")


class BatchError(ValueError):
    """A batch that cannot be accepted; the message says exactly why."""


class LimitError(BatchError):
    """A batch larger than a configured limit (HTTP 413); the message names the limit."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what one decoded batch may cost (the server passes its settings).

    ``max_decoded_bytes`` counts Arrow buffers after decompression, read from the IPC
    metadata *before* anything is decompressed, plus the bytes a dictionary-to-string
    cast would produce; a JSON body counts its own length.
    """

    max_decoded_bytes: int = 256 << 20
    max_rows: int = 2_000_000
    max_string_bytes: int = 1 << 20
    max_symbol_bytes: int = 200


DEFAULT_LIMITS = Limits()


class _Budget:
    """Decoded bytes and rows spent so far by one batch."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.bytes = 0
        self.rows = 0

    def spend(self, nbytes: int, rows: int, where: str) -> None:
        self.bytes += nbytes
        self.rows += rows
        lim = self.limits
        if self.bytes > lim.max_decoded_bytes:
            raise LimitError(
                f"{where}: batch decodes to more than max_decoded_bytes={lim.max_decoded_bytes} "
                f"bytes ({self.bytes} so far)"
            )
        if self.rows > lim.max_rows:
            raise LimitError(f"{where}: batch has more than max_request_rows={lim.max_rows} rows ({self.rows} so far)")


_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlevel = 2


def _names(names: Iterable[Any]) -> str:
    """``['a', 'b']`` with each name shortened by :func:`_show`."""
    return "[" + ", ".join(_show(n) for n in sorted(names, key=str)[:20]) + "]"


def _show(v: Any) -> str:
    """A bounded repr of a bad value for error messages (huge or deep values stay short)."""
    try:
        return _short.repr(v)
    except Exception:  # pragma: no cover - exotic values
        return f"<{type(v).__name__}>"


# ---------------------------------------------------------------------------------------
# building tables
# ---------------------------------------------------------------------------------------
def rows_to_table(
    rt: RecordType, rows: Iterable[Mapping[str, Any]], limits: Limits | None = None
) -> pa.Table:
    """Build a canonical table from row dicts, filling defaults; errors name the row."""
    rows = list(rows)
    lim = limits or DEFAULT_LIMITS
    cols: dict[str, list[Any]] = {c.name: [] for c in rt.columns}
    known = set(cols)
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise BatchError(f"{rt.name}[{i}]: expected an object, got {type(row).__name__}")
        extra = set(row) - known
        if extra:
            raise BatchError(f"{rt.name}[{i}]: unknown field(s) {_names(extra)}")
        for c in rt.columns:
            v = row.get(c.name, c.default)
            if v is None:
                raise BatchError(f"{rt.name}[{i}]: missing required field {c.name!r}")
            cols[c.name].append(_check_value(rt, i, c.name, c.type, v, lim))
    try:
        arrays = [pa.array(cols[c.name], type=arrow_type(c.type)) for c in rt.columns]
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:  # pragma: no cover
        raise BatchError(f"{rt.name}: {e}") from None
    return pa.Table.from_arrays(arrays, schema=rt.arrow_schema())


def _check_value(rt: RecordType, i: int, name: str, t: ColType, v: Any, limits: Limits = DEFAULT_LIMITS) -> Any:
    where = f"{rt.name}[{i}].{name}"
    if t in (ColType.STRING, ColType.SYMBOL):
        if not isinstance(v, str):
            raise BatchError(f"{where}: expected a string, got {_show(v)}")
        cap, what = (
            (limits.max_symbol_bytes, "max_symbol_bytes") if t == ColType.SYMBOL
            else (limits.max_string_bytes, "max_string_bytes")
        )  # fmt: skip
        if len(v) > cap // 4 or not v.isascii():
            try:
                n = len(v.encode("utf-8"))
            except UnicodeEncodeError:
                raise BatchError(f"{where}: not valid UTF-8 (lone surrogate)") from None
            if n > cap:
                raise BatchError(f"{where}: {n} bytes, more than {what}={cap}")
        return v
    if t == ColType.BOOL:
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return int(v)
        raise BatchError(f"{where}: expected a boolean, got {_show(v)}")
    if t in (ColType.INT64, ColType.INT32):
        if isinstance(v, bool) or not isinstance(v, int):
            raise BatchError(f"{where}: expected an integer, got {_show(v)}")
        lim = 2**63 if t == ColType.INT64 else 2**31
        if not -lim <= v < lim:
            raise BatchError(f"{where}: integer {_show(v)} out of range for {t.value}")
        return v
    if t == ColType.FLOAT64:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BatchError(f"{where}: expected a number, got {_show(v)}")
        try:
            f = float(v)
        except OverflowError:
            raise BatchError(f"{where}: number {_show(v)} out of range for float64") from None
        return math.nan if math.isinf(f) else f  # see _finite_or_nan
    raise AssertionError(t)  # pragma: no cover


def conform(
    rt: RecordType, table: pa.Table, limits: Limits | None = None, budget: _Budget | None = None
) -> pa.Table:
    """Check a table against the record type and cast it to the canonical schema.

    Missing columns with defaults are filled; missing required columns, unknown or
    duplicate columns, nulls, uncastable types, invalid UTF-8, values longer than
    ``limits`` raise (±inf floats are stored as NaN) :class:`BatchError` (:class:`LimitError`
    when a dictionary column would expand past the decoded-bytes budget).
    """
    lim = limits or DEFAULT_LIMITS
    if len(set(table.column_names)) != len(table.column_names):
        dups = sorted({n for n in table.column_names if table.column_names.count(n) > 1})
        raise BatchError(f"{rt.name}: duplicate column name(s) {_names(dups)}")
    names = set(table.column_names)
    extra = names - set(rt.column_names)
    if extra:
        raise BatchError(f"{rt.name}: unknown column(s) {_names(extra)}")
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
                col = _expand_dictionary(rt, c.name, col, budget)
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
        if c.type in (ColType.STRING, ColType.SYMBOL):
            _check_strings(rt, c, col, lim)
        elif c.type == ColType.FLOAT64 and n:
            col = _finite_or_nan(col)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=rt.arrow_schema())


def _expand_dictionary(rt: RecordType, name: str, col: pa.ChunkedArray, budget: _Budget | None) -> pa.ChunkedArray:
    """Cast a dictionary column to plain strings, charging its expanded size first."""
    if not (pa.types.is_string(col.type.value_type) or pa.types.is_large_string(col.type.value_type)):
        raise BatchError(f"{rt.name}.{name}: type {col.type} cannot be used as a string")
    if budget is not None:
        total = 0
        for chunk in col.chunks:
            if len(chunk) == 0:
                continue
            sizes = pc.binary_length(chunk.dictionary)
            total += int(pc.sum(pc.take(sizes, chunk.indices)).as_py() or 0)
        budget.spend(total, 0, f"{rt.name}.{name} (dictionary expanded to strings)")
    try:
        return col.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowIndexError) as e:
        raise BatchError(f"{rt.name}.{name}: {e}") from None


def _check_strings(rt: RecordType, c: Any, col: pa.ChunkedArray, lim: Limits) -> None:
    if c.type == ColType.SYMBOL:
        cap, what = lim.max_symbol_bytes, "max_symbol_bytes"
    else:
        cap, what = lim.max_string_bytes, "max_string_bytes"
    if len(col) == 0:
        return
    longest = _longest_value(col)
    if longest > cap:
        lengths = pc.binary_length(col)
        i = int(pc.index(pc.greater(lengths, cap), True).as_py())
        raise BatchError(f"{rt.name}[{i}].{c.name}: {longest} bytes, more than {what}={cap}")


def _longest_value(col: pa.ChunkedArray) -> int:
    """Bytes of the longest value of a (null-free) string column, read from the chunks'
    offsets with numpy: one call per chunk instead of two Arrow compute calls (their
    per-call overhead dominates at a request's few thousand rows)."""
    longest = 0
    for chunk in col.chunks:
        n = len(chunk)
        if n == 0:
            continue
        if pa.types.is_large_string(chunk.type) or pa.types.is_large_binary(chunk.type):
            dtype: type = np.int64
        elif pa.types.is_string(chunk.type) or pa.types.is_binary(chunk.type):
            dtype = np.int32
        else:  # pragma: no cover - conform casts strings to a string type first
            longest = max(longest, int(pc.max(pc.binary_length(chunk)).as_py() or 0))
            continue
        size = np.dtype(dtype).itemsize
        offsets: np.ndarray = np.frombuffer(chunk.buffers()[1], dtype=dtype, count=n + 1, offset=chunk.offset * size)
        longest = max(longest, int(np.diff(offsets).max()))
    return longest


def _finite_or_nan(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """±inf is stored as NaN ("no finite value"), never rejected: a diverged run's inf loss
    is exactly the telemetry an operator needs, and rejecting it would drop the batch's
    other rows with it. NaN is what every view already treats as missing, and JSON
    answers (which cannot carry inf) stay valid."""
    # null-free float64 chunks: zero-copy numpy views, one call each
    if not any(np.isinf(c.to_numpy(zero_copy_only=False)).any() for c in col.chunks if len(c)):
        return col
    bad = pc.is_inf(col)
    return pc.if_else(bad, pa.scalar(math.nan, pa.float64()), col)


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


# Arrow IPC message metadata (flatbuffers, format/Message.fbs), read just far enough to
# learn what a stream decodes to before anything is decompressed.
_MSG_HEADER, _MSG_BODY_LENGTH = 2, 3
_RB_LENGTH, _RB_BUFFERS, _RB_COMPRESSION = 0, 2, 3
_DICT_DATA = 1


def _fb_field(buf: memoryview, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the flatbuffer table at ``table``."""
    (soff,) = struct.unpack_from("<i", buf, table)
    vtable = table - soff
    (vlen,) = struct.unpack_from("<H", buf, vtable)
    slot = 4 + 2 * index
    if slot + 2 > vlen:
        return None
    (off,) = struct.unpack_from("<H", buf, vtable + slot)
    return table + off if off else None


def _fb_deref(buf: memoryview, pos: int) -> int:
    (off,) = struct.unpack_from("<I", buf, pos)
    return pos + off


def _record_batch_cost(meta: memoryview, rb: int, body: memoryview) -> tuple[int, int]:
    """(decoded bytes, rows) of the RecordBatch table at ``rb`` with message ``body``."""
    pos = _fb_field(meta, rb, _RB_LENGTH)
    rows = struct.unpack_from("<q", meta, pos)[0] if pos is not None else 0
    if rows < 0:
        raise ValueError("negative row count")
    compressed = _fb_field(meta, rb, _RB_COMPRESSION) is not None
    pos = _fb_field(meta, rb, _RB_BUFFERS)
    if pos is None:
        return 0, rows
    vec = _fb_deref(meta, pos)
    (count,) = struct.unpack_from("<I", meta, vec)
    if count > 1_000_000:
        raise ValueError(f"{count} buffers")
    total = 0
    for k in range(count):
        offset, length = struct.unpack_from("<qq", meta, vec + 4 + 16 * k)
        if offset < 0 or length < 0 or offset + length > len(body):
            raise ValueError(f"buffer {k} outside the message body")
        if not compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise ValueError(f"compressed buffer {k} shorter than its length prefix")
        (raw,) = struct.unpack_from("<q", body, offset)
        total += length - 8 if raw == -1 else raw
        if raw < -1:
            raise ValueError(f"buffer {k}: negative decompressed length")
    return total, rows


def _prescan(data: memoryview, frame: int, budget: _Budget, record: str = "") -> None:
    """Charge ``budget`` with what the IPC stream ``data`` decodes to, reading only the
    message metadata and the length prefixes of compressed buffers."""
    where = f"frame {frame}"
    try:
        reader = ipc.MessageReader.open_stream(pa.py_buffer(data))
        while True:
            try:
                msg = reader.read_next_message()
            except StopIteration:
                break
            if msg.type not in ("record batch", "dictionary"):
                continue
            meta = memoryview(msg.metadata)
            body = memoryview(msg.body) if msg.body is not None else memoryview(b"")
            header = _fb_field(meta, _fb_deref(meta, 0), _MSG_HEADER)
            if header is None:
                raise ValueError("message without a header")
            table = _fb_deref(meta, header)
            if msg.type == "dictionary":
                data_pos = _fb_field(meta, table, _DICT_DATA)
                if data_pos is None:
                    raise ValueError("dictionary batch without data")
                nbytes, _ = _record_batch_cost(meta, _fb_deref(meta, data_pos), body)
                budget.spend(nbytes, 0, where)
            else:
                nbytes, rows = _record_batch_cost(meta, table, body)
                budget.spend(nbytes, rows, where)
    except BatchError:
        raise
    except (pa.ArrowException, OSError, ValueError, struct.error, IndexError, OverflowError) as e:
        raise BatchError(f"{where}: not an Arrow IPC stream: {e}") from None


def decode_batch(data: bytes, limits: Limits | None = None) -> dict[str, pa.Table]:
    """Decode and validate the Arrow wire format; raises :class:`BatchError`.

    Every frame's decoded size and row count are checked against ``limits`` from the
    IPC metadata before the frame is decompressed (:class:`LimitError`).
    """
    lim = limits or DEFAULT_LIMITS
    budget = _Budget(lim)
    view = memoryview(data)
    pos = 0
    out: dict[str, pa.Table] = {}
    frame = 0
    while pos < len(view):
        if len(view) - pos < 8 or bytes(view[pos : pos + 4]) != FRAME_MAGIC:
            raise BatchError(f"frame {frame} at byte {pos}: bad frame header (expected FSB1)")
        (n,) = _LEN.unpack_from(view, pos + 4)
        start, end = pos + 8, pos + 8 + n
        if end > len(view):
            raise BatchError(f"frame {frame} at byte {pos}: truncated ({len(view) - start} of {n} bytes)")
        _prescan(view[start:end], frame, budget)
        try:
            table = ipc_to_table(view[start:end])
        except (pa.ArrowException, OSError, ValueError, IndexError, OverflowError) as e:
            raise BatchError(f"frame {frame}: not an Arrow IPC stream: {e}") from None
        try:
            table.validate(full=True)  # offsets in range, strings valid UTF-8
        except (pa.ArrowException, ValueError) as e:
            raise BatchError(f"frame {frame}: invalid Arrow data: {e}") from None
        meta = table.schema.metadata or {}
        try:
            name = meta.get(b"fleetscope.record", b"").decode("utf-8")
            version = meta.get(b"fleetscope.schema_version", str(SCHEMA_VERSION).encode()).decode("utf-8")
        except UnicodeDecodeError:
            raise BatchError(f"frame {frame}: schema metadata is not valid UTF-8") from None
        if not name:
            raise BatchError(f"frame {frame}: schema metadata lacks fleetscope.record")
        if version != str(SCHEMA_VERSION):
            raise BatchError(
                f"frame {frame} ({_show(name)}): schema version {_show(version)} not supported "
                f"(server speaks {SCHEMA_VERSION})"
            )
        rt = _rt(name)
        table = conform(rt, table, lim, budget)
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


def decode_json(data: bytes | str | Mapping[str, Any], limits: Limits | None = None) -> dict[str, pa.Table]:
    """Decode and validate the JSON wire format; raises :class:`BatchError`."""
    lim = limits or DEFAULT_LIMITS
    if isinstance(data, (bytes, str)):
        if len(data) > lim.max_decoded_bytes:
            raise LimitError(f"JSON body of {len(data)} bytes is more than max_decoded_bytes={lim.max_decoded_bytes}")
        try:
            doc = json.loads(data)
        except RecursionError:
            raise BatchError("invalid JSON: nested too deeply") from None
        except ValueError as e:  # includes UnicodeDecodeError and over-long integers
            raise BatchError(f"invalid JSON: {_show(str(e))}") from None
    else:
        doc = data
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), dict):
        raise BatchError('expected an object {"schema_version": 1, "records": {type: [rows]}}')
    version = doc.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise BatchError(f"schema_version {_show(version)} not supported (server speaks {SCHEMA_VERSION})")
    out = {}
    rows_total = 0
    for name, rows in doc["records"].items():
        rt = _rt(name)
        if not isinstance(rows, list):
            raise BatchError(f"records.{name}: expected a list of objects")
        rows_total += len(rows)
        if rows_total > lim.max_rows:
            raise LimitError(f"records.{name}: batch has more than max_request_rows={lim.max_rows} rows")
        fixed = []
        for row in rows:
            if isinstance(row, dict):  # JSON has no NaN: null float -> default NaN
                row = {
                    k: (rt.column(k).default if v is None and k in rt.column_names else v)
                    for k, v in row.items()
                }
            fixed.append(row)
        table = rows_to_table(rt, fixed, lim)
        if table.num_rows:
            out[name] = table
    return out


def decode(data: bytes, content_type: str, limits: Limits | None = None) -> dict[str, pa.Table]:
    """Decode either wire format by content type (which must be given)."""
    ct = (content_type or "").split(";")[0].strip().lower()
    if ct == ARROW_CONTENT_TYPE:
        return decode_batch(data, limits)
    if ct == JSON_CONTENT_TYPE:
        return decode_json(data, limits)
    raise BatchError(
        f"unsupported content type {content_type!r}; use {ARROW_CONTENT_TYPE} or {JSON_CONTENT_TYPE}"
    )


def _rt(name: str) -> RecordType:
    try:
        return RECORD_TYPES[name]
    except (KeyError, TypeError):
        raise BatchError(
            f"unknown record type {_show(name)}; expected one of {sorted(RECORD_TYPES)}"
        ) from None
