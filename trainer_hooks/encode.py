"""Rows -> one Arrow IPC stream, cheaply, on the hooks' background thread.

The generic path (``pa.array`` over Python lists, ``RecordBatch``, ``ipc.new_stream``)
costs a few hundred microseconds per frame and, on its first call, makes pyarrow import
pandas (about half a second of CPU holding the GIL, in every rank, mid-training). The
hooks write a few small frames per flush from every rank, so here the stream is put
together directly in the Arrow IPC streaming format:

* the record type's schema message, serialised by pyarrow once and cached;
* one record-batch message: its flatbuffer metadata (a fixed layout: ``Message`` ->
  ``RecordBatch`` with one ``FieldNode`` per column and the ``Buffer`` list) packed with
  ``struct``, then the body: the columns' buffers, 8-byte aligned, packed with one
  ``array`` per numeric type and one ``encode`` pass over the strings (no validity
  bitmaps: the schema's columns are non-nullable);
* the end-of-stream marker.

Readers (pyarrow, the agent, ``codec.ipc_to_table``) get the same schema and values as
from ``codec.table_to_ipc`` for these rows. Values the fast path cannot pack (wrong
types, out of range, a missing required field) go through :func:`codec.rows_to_table`
(pyarrow's generic path), which raises naming the bad row. Fields that are not columns
of the record type are ignored.
"""

from __future__ import annotations

import struct
from array import array
from itertools import accumulate, chain
from operator import itemgetter
from typing import Any

from fleetscope.schema import ColType, RecordType

CONTINUATION = b"\xff\xff\xff\xff"
EOS = CONTINUATION + b"\x00\x00\x00\x00"
"""Arrow IPC end-of-stream marker (continuation token, zero-length metadata)."""

_V5, _RECORD_BATCH = 4, 3  # MetadataVersion.V5, MessageHeader.RecordBatch
# Flatbuffer of the record-batch message; offsets are from the start of the metadata.
#   0  uoffset -> Message table (16)
#   4  Message vtable: 4 fields (version, header_type, header, bodyLength)
#  16  Message table: soffset, header uoffset, bodyLength i64, version i16, header_type u8
#  40  RecordBatch vtable: 3 fields (length, nodes, buffers)
#  56  RecordBatch table: soffset, nodes uoffset, length i64, buffers uoffset
#  84  nodes vector: u32 count, FieldNode{length i64, null_count i64}*   (items 8-aligned)
#   .. buffers vector: u32 count, Buffer{offset i64, length i64}*
_HEAD = struct.Struct("<I HHHHHH i I q h B x 4x HHHHH 6x i I q I 4x 4x I")
_PAIR = struct.Struct("<qq")
_PAD = bytes(8)
_CODES = {ColType.INT64: "q", ColType.INT32: "i", ColType.BOOL: "B", ColType.FLOAT64: "d"}
_STRINGS = (ColType.STRING, ColType.SYMBOL)
_layouts: dict[str, tuple] = {}


class _Slow(Exception):
    """The fast path cannot pack a column; use the checking path."""


def _layout(rt: RecordType) -> tuple:
    """Cached per record type: (schema message, number of columns, row -> values getter,
    defaults, [(numeric type, its column indices)], string column indices)."""
    lay = _layouts.get(rt.name)
    if lay is None:
        names = rt.column_names
        getter = itemgetter(*names) if len(names) > 1 else (lambda r: (r[names[0]],))
        defaults = {c.name: c.default for c in rt.columns if c.default is not None}
        numeric: dict[ColType, list[int]] = {}
        for i, c in enumerate(rt.columns):
            if c.type not in _STRINGS:
                numeric.setdefault(c.type, []).append(i)
        strings = [i for i, c in enumerate(rt.columns) if c.type in _STRINGS]
        lay = _layouts[rt.name] = (rt.arrow_schema().serialize().to_pybytes(), len(names),
                                   getter, defaults, list(numeric.items()), strings)
    return lay


def _numeric(t: ColType, values: list[Any]) -> bytes:
    """The values of all columns of type ``t``, column after column, packed."""
    kinds = set(map(type, values))
    if t == ColType.FLOAT64:
        ok = kinds <= {float, int}
    elif t == ColType.BOOL:
        ok = kinds <= {bool, int} and set(values) <= {0, 1}
    else:  # no bools, floats, None, numpy scalars here: those are checked slowly
        ok = kinds == {int}
    if not ok:
        raise _Slow
    try:
        return array(_CODES[t], values).tobytes()
    except OverflowError:
        raise _Slow from None


def _columns(getter: Any, defaults: dict[str, Any], rows: list[dict[str, Any]]) -> list:
    """Column-major values of ``rows`` (defaults filled in)."""
    try:
        return list(zip(*map(getter, rows)))
    except KeyError:  # some rows leave optional columns out
        try:
            return list(zip(*(getter(r if defaults.keys() <= r.keys() else {**defaults, **r})
                              for r in rows)))
        except KeyError:  # a required column is missing
            raise _Slow from None


def _record_batch(lay: tuple, columns: list, n: int) -> bytes:
    _, n_cols, _, _, numeric, strings = lay
    col_bufs: list[tuple] = [()] * n_cols
    for t, idx in numeric:  # one array() per type; each column is a slice of it
        data = _numeric(t, list(chain.from_iterable(columns[i] for i in idx)))
        w = len(data) // len(idx)
        for k, i in enumerate(idx):
            col_bufs[i] = (data[k * w:(k + 1) * w],)
    if strings:  # offsets (int32, n + 1) and UTF-8 data per column
        try:
            enc = [v.encode() for v in chain.from_iterable(columns[i] for i in strings)]
        except AttributeError:
            raise _Slow from None
        for k, i in enumerate(strings):
            part = enc[k * n:(k + 1) * n]
            offsets = array("i", [0])
            offsets.extend(accumulate(map(len, part)))
            col_bufs[i] = (offsets.tobytes(), b"".join(part))
    spans: list[int] = []  # Buffer{offset, length} pairs, flattened
    body: list[bytes] = []
    pos = 0
    for bufs in col_bufs:
        spans += (pos, 0)  # validity: none (no nulls)
        for buf in bufs:
            size = len(buf)
            spans += (pos, size)
            body.append(buf)
            pad = -size % 8
            if pad:
                body.append(_PAD[:pad])
            pos += size + pad
    n_bufs = len(spans) // 2
    buffers_at = 88 + 16 * n_cols + 4
    meta = _HEAD.pack(
        16,                                   # root: Message table
        12, 24, 16, 18, 4, 8,                 # Message vtable
        12, 56 - 20, pos, _V5, _RECORD_BATCH,  # Message table (header -> RecordBatch at 56)
        10, 24, 8, 4, 16,                     # RecordBatch vtable
        16, 84 - 60, n, buffers_at - 72,      # RecordBatch table
        n_cols,                               # nodes vector (count at 84)
    )
    meta += (_PAIR.pack(n, 0) * n_cols + struct.pack("<4xI", n_bufs)
             + struct.pack(f"<{len(spans)}q", *spans))
    return CONTINUATION + struct.pack("<i", len(meta)) + meta + b"".join(body)


def ipc_stream(rt: RecordType, rows: list[dict[str, Any]]) -> bytes:
    """One uncompressed Arrow IPC stream holding ``rows`` of record type ``rt``."""
    lay = _layout(rt)
    try:
        if not rows:
            raise _Slow
        columns = _columns(lay[2], lay[3], rows)
        return lay[0] + _record_batch(lay, columns, len(rows)) + EOS
    except _Slow:
        from fleetscope import codec

        # raises BatchError naming the bad row, or encodes what the fast path could not
        return codec.table_to_ipc(codec.rows_to_table(rt, rows), compression=None)
