"""Rows -> one Arrow IPC stream, cheaply, on the hooks' background thread.

The generic path (``pa.array`` over Python lists, ``RecordBatch``, ``ipc.new_stream``)
costs a few hundred microseconds per frame and, on its first call, makes pyarrow import
pandas (about half a second of CPU holding the GIL, in every rank, mid-training). The
hooks write a few small frames per flush from every rank, so here the stream is put
together directly in the Arrow IPC streaming format:

* the record type's schema message, serialised by pyarrow once and cached;
* one record-batch message: its flatbuffer metadata (a fixed layout: ``Message`` ->
  ``RecordBatch`` with one ``FieldNode`` per column and the ``Buffer`` list) packed with
  ``struct``, then the body: all fixed-size buffers (numeric columns, then the string
  columns' int32 offsets) packed by one ``Struct`` per row count, then the strings' UTF-8
  data, every buffer 8-byte aligned; the ``Buffer`` list (in schema order, as readers
  expect) says where each one is (no validity bitmaps: the columns are non-nullable);
* the end-of-stream marker.

The packing code is generated per record type and batch shape (:func:`_compile`):
straight-line Python with no per-column loop at run time. :class:`ColumnEncoder` packs
the background thread's column batches (constant columns such as job and rank packed
once per frame, the columns the recorder computes itself not type-checked);
:func:`ipc_stream` packs row dicts, checking every value.

Readers (pyarrow, the agent, ``codec.ipc_to_table``) get the same schema and values as
from ``codec.table_to_ipc`` for these rows. Values the fast path cannot pack (wrong
types, out of range, a missing required field) go through :func:`codec.rows_to_table`
(pyarrow's generic path), which raises naming the bad row. Fields that are not columns
of the record type are ignored.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
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
_I32 = struct.Struct("<i")
_PAD = bytes(8)
_CODES = {ColType.INT64: "q", ColType.INT32: "i", ColType.BOOL: "B", ColType.FLOAT64: "d"}
_WIDTH = {"q": 8, "i": 4, "B": 1, "d": 8}
_STRINGS = (ColType.STRING, ColType.SYMBOL)
_ALLOWED = {"q": frozenset({int}), "i": frozenset({int}), "d": frozenset({int, float}),
            "B": frozenset({int, bool})}
"""Python types each numeric column may hold (bools only in BOOL, floats only in FLOAT64)."""
_BOOLS = frozenset({0, 1})
_MAX_SHAPES = 256
_layouts: dict[str, tuple] = {}
_compiled: dict[tuple, Callable] = {}


class _Slow(Exception):
    """The fast path cannot pack a column; use the checking path."""


def _layout(rt: RecordType) -> tuple:
    """Cached per record type: (schema message, number of columns, row -> values getter,
    defaults, per column its struct code (None: a string column), column names,
    per-row-count shapes, the encoder of all columns, every value checked)."""
    lay = _layouts.get(rt.name)
    if lay is None:
        names = rt.column_names
        getter = itemgetter(*names) if len(names) > 1 else (lambda r: (r[names[0]],))
        defaults = {c.name: c.default for c in rt.columns if c.default is not None}
        codes = tuple(None if c.type in _STRINGS else _CODES[c.type] for c in rt.columns)
        lay = (rt.arrow_schema().serialize().to_pybytes(), len(names), getter, defaults,
               codes, names, {})
        lay = _layouts[rt.name] = (*lay, _compile(lay, names, {}, frozenset()))
    return lay


def _shape(lay: tuple, n: int) -> tuple:
    """What every batch of ``n`` rows of a record type shares (cached): a ``Struct`` that
    packs all fixed-size buffers (the numeric columns, then the string columns' int32
    offsets, each padded to 8 bytes) as the start of the body, and that part's size; the
    field nodes; the buffer count; the buffer table (schema order: validity, offsets,
    data per column) cut where the string data buffers' places go, which follow the
    fixed part and are filled in per batch."""
    shapes = lay[6]
    shape = shapes.get(n)
    if shape is not None:
        return shape
    codes = lay[4]
    fmt = ["<"]
    place: dict[int, tuple[int, int]] = {}  # column -> (offset, length) of its fixed buffer
    pos = 0
    for numeric in (True, False):
        for i, code in enumerate(codes):
            if (code is not None) == numeric:
                size = _WIDTH[code] * n if numeric else 4 * (n + 1)
                fmt.append(f"{n}{code}{-size & 7}x" if numeric else f"{n + 1}i{-size & 7}x")
                place[i] = (pos, size)
                pos += size + (-size & 7)
    pieces: list[bytes] = []
    table: list[int] = []
    n_bufs = 0
    for i, code in enumerate(codes):
        table += (0, 0, *place[i])  # validity (none), then data or offsets
        n_bufs += 2
        if code is None:  # the data buffer: its place depends on the batch
            pieces.append(struct.pack(f"<{len(table)}q", *table))
            table = []
            n_bufs += 1
    pieces.append(struct.pack(f"<{len(table)}q", *table))
    if len(shapes) >= _MAX_SHAPES:
        shapes.clear()
    shape = shapes[n] = (struct.Struct("".join(fmt)), pos, _PAIR.pack(n, 0) * lay[1],
                         struct.pack("<4xI", n_bufs), tuple(pieces))
    return shape


def _compile(lay: tuple, names: Sequence[str], consts: dict[str, Any],
             trusted: frozenset[str]) -> Callable[[Sequence[Sequence[Any]], int], bytes]:
    """A function ``(cols, n) -> record-batch message`` for batches whose columns come as
    ``cols`` (one sequence of ``n`` values per name in ``names``, in that order) plus
    ``consts`` (one value for all rows); columns in neither hold their default. It is
    straight-line code generated for this layout (no per-column loop or branch at run
    time), and raises :class:`_Slow` when a value needs the checking path: the value
    types of every string column and of the numeric columns not in ``trusted`` are
    checked; ``struct`` refuses out-of-range integers."""
    index = {name: j for j, name in enumerate(names)}
    env: dict[str, Any] = {
        "_Slow": _Slow, "_shape": _shape, "_lay": lay, "_set": set, "_map": map, "_type": type,
        "_list": list, "_encode": str.encode, "_len": len, "_acc": accumulate, "_repeat": repeat,
        "_range": range, "_join": b"".join, "_sjoin": "".join, "_pair": _PAIR.pack, "_head": _HEAD.pack,
        "_i32": _I32.pack, "_PAD": _PAD, "_CONT": CONTINUATION, "_BOOLS": _BOOLS,
        "_StructError": struct.error, "_TypeError": TypeError,
        **{f"_A{code}": allowed for code, allowed in _ALLOWED.items()},
    }
    body = ["def enc(cols, n):"]
    numeric: list[str] = []
    offsets: list[str] = []
    datas: list[str] = []
    for i, (name, code) in enumerate(zip(lay[5], lay[4])):
        if name in index:
            src = f"cols[{index[name]}]"
            if code is not None:
                if name not in trusted:
                    body.append(f"    if not _set(_map(_type, {src})) <= _A{code}: raise _Slow")
                    if code == "B":
                        body.append(f"    if not _set({src}) <= _BOOLS: raise _Slow")
                numeric.append(f"*{src}")
            else:
                body += [  # ASCII (the usual case): byte lengths are string lengths
                    f"    try: t{i} = _sjoin({src})",
                    "    except _TypeError: raise _Slow from None",
                    f"    if t{i}.isascii(): o{i} = {src}; d{i} = t{i}.encode()",
                    f"    else: o{i} = _list(_map(_encode, {src})); d{i} = _join(o{i})"]
                offsets.append(f"*_acc(_map(_len, o{i}), initial=0)")
                datas.append(f"d{i}")
            continue
        value = consts[name] if name in consts else lay[3].get(name)
        ok = value is not None and (
            isinstance(value, str) if code is None else
            type(value) in _ALLOWED[code] and (code != "B" or value in _BOOLS))
        if not ok:  # a required column is missing, or a constant of the wrong type
            body.append("    raise _Slow")
            continue
        if code is not None:
            env[f"K{i}"] = value
            numeric.append(f"*_repeat(K{i}, n)")
        else:
            env[f"K{i}"] = data = value.encode()
            offsets.append(f"*_range(0, {len(data)} * n + 1, {len(data)})" if data
                           else "*_repeat(0, n + 1)")
            body.append(f"    d{i} = K{i} * n")
            datas.append(f"d{i}")
    body.append("    fixed, p, nodes, n_bufs, P = _shape(_lay, n)")
    body.append(f"    try: head = fixed.pack({', '.join(numeric + offsets)})")
    body.append("    except _StructError: raise _Slow from None")
    spans, tail = [], []
    for k, d in enumerate(datas):
        body.append(f"    l{k} = len({d}); p{k} = p; p += l{k} + (-l{k} & 7)")
        spans += [f"P[{k}]", f"_pair(p{k}, l{k})"]
        tail += [d, f"_PAD[:-l{k} & 7]"]
    spans.append(f"P[{len(datas)}]")
    n_cols = lay[1]
    body.append(f"    meta = _join((_head(16, 12, 24, 16, 18, 4, 8, 12, 36, p, {_V5}, {_RECORD_BATCH}, "
                f"10, 24, 8, 4, 16, 16, 24, n, {88 + 16 * n_cols + 4 - 72}, {n_cols}), "
                f"nodes, n_bufs, {', '.join(spans)}))")
    body.append(f"    return _join((_CONT, _i32(len(meta)), meta, head, {', '.join(tail)}))")
    exec("\n".join(body), env)  # noqa: S102 - our own code, from the schema's column list
    return env["enc"]


def _record_batch(lay: tuple, columns: Sequence[Sequence[Any]], n: int) -> bytes:
    """The record-batch message of ``n`` rows given as one sequence per column of the
    record type (schema order); every value is checked."""
    if n <= 0:
        raise _Slow
    return lay[7](columns, n)


def ipc_stream(rt: RecordType, rows: list[dict[str, Any]]) -> bytes:
    """One uncompressed Arrow IPC stream holding ``rows`` of record type ``rt``."""
    lay = _layout(rt)
    try:
        if not rows:
            raise _Slow
        columns = _columns(lay[2], lay[3], rows)
        return b"".join((lay[0], _record_batch(lay, columns, len(rows)), EOS))
    except _Slow:
        from fleetscope import codec

        # raises BatchError naming the bad row, or encodes what the fast path could not
        return codec.table_to_ipc(codec.rows_to_table(rt, rows), compression=None)


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


class ColumnEncoder:
    """Encodes batches of one record type held column by column (see :mod:`.batch`)."""

    __slots__ = ("rt", "lay", "fn")

    def __init__(self, rt: RecordType, names: Sequence[str], consts: dict[str, Any],
                 trusted: frozenset[str] = frozenset()) -> None:
        """
        Args:
            rt: The record type.
            names: The columns given per batch, in the order they are given.
            consts: Columns with one value in every row.
            trusted: Numeric columns whose values the caller computes itself (ints), so
                their types need no check.
        """
        unknown = (set(names) | set(consts)) - set(rt.column_names)
        if unknown:
            raise ValueError(f"record type {rt.name!r} has no column(s) {sorted(unknown)}")
        self.rt = rt
        self.lay = _layout(rt)
        key = (rt.name, tuple(names), tuple((k, type(v), v) for k, v in consts.items()),
               frozenset(trusted))
        fn = _compiled.get(key)
        if fn is None:  # ~1 ms of exec per record type: once per process and shape
            if len(_compiled) >= _MAX_SHAPES:
                _compiled.clear()
            fn = _compiled[key] = _compile(self.lay, key[1], dict(consts), key[3])
        self.fn = fn

    def stream(self, cols: Sequence[Sequence[Any]], n: int,
               rows: Callable[[], list[dict[str, Any]]]) -> bytes:
        """The same stream as :func:`ipc_stream` of these rows.

        Args:
            cols: One sequence of ``n`` values per name, in ``names`` order.
            n: Number of rows.
            rows: Builds the rows as dicts; called only when a value needs the checking
                path (which raises ``codec.BatchError`` naming the bad row).
        """
        try:
            if n <= 0:
                raise _Slow
            return b"".join((self.lay[0], self.fn(cols, n), EOS))
        except _Slow:
            from fleetscope import codec

            return codec.table_to_ipc(codec.rows_to_table(self.rt, rows()), compression=None)
