"""Batches: spool frames decoded, validated, merged per record type, re-encoded.

A batch covers contiguous byte ranges of one or more files. Its idempotency key is a
hash of (host, file, inode, offset range) of every range, so the same bytes always
travel under the same key, whichever agent process sends them.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from fleetscope.agent.offsets import Pending, Range
from fleetscope.agent.ranks import RankRegistry, describe_inflight
from fleetscope.agent.tailer import ReadFrame, Segment, scan_frames

from fleetscope import codec, spool
from fleetscope.schema import RECORD_TYPES

log = logging.getLogger("fleetscope.agent")


@dataclass
class Decoded:
    """One valid frame: its place in the file and its conformed table."""

    frame: ReadFrame
    record: str
    table: pa.Table


@dataclass
class Batch:
    host: str
    ranges: tuple[Range, ...]
    frames: list[Decoded]
    bad: list[tuple[ReadFrame, str]] = field(default_factory=list)
    """Frames skipped while building: (frame, reason) for corrupt or invalid ones."""
    body: bytes | None = None
    """The encoded request body, once :meth:`encode` ran."""
    pending: Pending | None = None
    """Its durable in-flight record, once the sender began it."""
    inflight_ns: dict[tuple[str, int], int] = field(default_factory=dict)
    """(job, rank) -> the newest ``inflight`` time among the batch's records of the rank."""

    @property
    def key(self) -> str:
        return batch_key(self.host, self.ranges)

    @property
    def num_rows(self) -> int:
        return sum(d.table.num_rows for d in self.frames)

    @property
    def num_bytes(self) -> int:
        return sum(r.end - r.start for r in self.ranges)

    @property
    def files(self) -> set[str]:
        return {r.file for r in self.ranges}

    def rows_by_record(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.frames:
            out[d.record] = out.get(d.record, 0) + d.table.num_rows
        return out

    def encode(self, compression: str | None) -> bytes:
        """The request body: one Arrow frame per record type (codec wire format); cached."""
        if self.body is None:
            self.body = self._encode(compression)
        return self.body

    def _encode(self, compression: str | None) -> bytes:
        groups: dict[str, list[pa.Table]] = {}
        for d in self.frames:
            groups.setdefault(d.record, []).append(d.table)
        tables = {}
        for name, ts in groups.items():
            # one contiguous record batch per type, not one per spool frame: compressing
            # and decoding a few large buffers costs the agent and the server several
            # times less than hundreds of small ones
            t = (ts[0] if len(ts) == 1 else pa.concat_tables(ts)).combine_chunks()
            tables[name] = _fill_host(t, self.host)
        return codec.encode_batch(tables, compression=compression)

    def split(self) -> tuple[Batch, Batch]:
        """Two batches with the first and second half of the valid frames (for bisecting).

        Per file, the first half's frames precede the second half's, and skipped frames
        go with the second half, so committing the halves in order never moves an offset
        past a frame that is still to be sent.
        """
        mid = len(self.frames) // 2
        return (make_batch(self.host, self.frames[:mid], []),
                make_batch(self.host, self.frames[mid:], self.bad))


def batch_key(host: str, ranges: Iterable[Range]) -> str:
    h = hashlib.sha256(host.encode())
    for r in sorted(ranges, key=lambda r: (r.file, r.start)):
        h.update(f"\n{r.file}@{r.ino}:{r.start}-{r.end}".encode())
    return "fsa1-" + h.hexdigest()[:40]


def merge_ranges(frames: Iterable[ReadFrame]) -> tuple[Range, ...]:
    """Per file, the contiguous byte ranges the frames cover."""
    out: list[Range] = []
    for fr in sorted(frames, key=lambda f: (f.segment.key, f.start)):
        seg = fr.segment
        if out and out[-1].file == seg.key and out[-1].ino == seg.ino and out[-1].end == fr.start:
            out[-1] = Range(seg.key, seg.ino, out[-1].start, fr.end)
        else:
            out.append(Range(seg.key, seg.ino, fr.start, fr.end))
    return tuple(out)


def make_batch(host: str, frames: list[Decoded], bad: list[tuple[ReadFrame, str]]) -> Batch:
    ranges = merge_ranges([d.frame for d in frames] + [b[0] for b in bad])
    return Batch(host, ranges, frames, list(bad))


def decode_frame(fr: ReadFrame) -> tuple[Decoded | None, str]:
    """Decode and validate one frame; (None, reason) for a corrupt or invalid one.

    Never raises: any damage in the bytes (a checksum that matched by chance, a writer
    bug, invalid UTF-8 in a string or in the metadata) makes the frame bad, with the
    reason, instead of stopping the agent.
    """
    if fr.payload is None:
        return None, "corrupt bytes (bad header or checksum, or truncated)"
    try:
        return _decode(fr)
    except Exception as e:  # noqa: BLE001 - a bad frame costs only itself
        return None, f"undecodable frame: {type(e).__name__}: {str(e)[:200]}"


def _decode(fr: ReadFrame) -> tuple[Decoded | None, str]:
    try:
        table = codec.ipc_to_table(fr.payload)
    except (pa.ArrowException, OSError) as e:
        return None, f"payload is not an Arrow IPC stream: {e}"
    raw_name = (table.schema.metadata or {}).get(b"fleetscope.record", b"")
    try:
        name = raw_name.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"record type {raw_name[:60]!r} in schema metadata is not UTF-8"
    rt = RECORD_TYPES.get(name)
    if rt is None:
        return None, f"unknown record type {name!r} in schema metadata"
    if not (table.schema.equals(_canonical_schema(name), check_metadata=False)
            and not any(c.null_count for c in table.columns)):
        try:  # not already canonical (e.g. an older writer): full check and cast
            table = codec.conform(rt, table)
        except codec.BatchError as e:
            return None, f"invalid {name} table: {e}"
    for field_, col in zip(table.schema, table.columns):
        if pa.types.is_string(field_.type) or pa.types.is_large_string(field_.type):
            try:
                col.validate(full=True)  # UTF-8: the server would refuse the whole batch
            except pa.ArrowInvalid:
                return None, f"invalid {name} table: column {field_.name!r} is not valid UTF-8"
    return Decoded(fr, name, table), ""


@functools.cache
def _canonical_schema(name: str) -> pa.Schema:
    return RECORD_TYPES[name].arrow_schema()


def build_batch(host: str, frames: list[ReadFrame], ranks: RankRegistry | None) -> Batch:
    """Decode the frames into a batch; bad ones are kept aside (skipped, counted)."""
    good: list[Decoded] = []
    bad: list[tuple[ReadFrame, str]] = []
    last: dict[tuple[str, int, str], Decoded] = {}
    for fr in frames:
        d, reason = decode_frame(fr)
        if d is None:
            bad.append((fr, reason))
            continue
        good.append(d)
        if fr.segment.rank >= 0 and d.table.num_rows:
            last[(fr.segment.job, fr.segment.rank, d.record)] = d
    if ranks is not None:  # a rank's frames come in time order: its last one says it all
        for d in last.values():
            try:
                _observe(ranks, d.frame.segment, d)
            except Exception as e:  # noqa: BLE001 - liveness facts are best effort
                log.debug("cannot read liveness facts of %s: %s", d.frame.segment.key, e)
    batch = make_batch(host, good, bad)
    for (job, rank, record), d in last.items():
        if record == "inflight":
            batch.inflight_ns[(job, rank)] = int(pc.max(d.table.column("ts_ns")).as_py())
    return batch


def frames_for_ranges(ranges: Iterable[Range], paths: dict[str, Path]) -> list[ReadFrame] | None:
    """Re-read exactly the frames of recorded ranges (resending a pending batch).

    Returns ``None`` if a file is gone or was replaced (different inode).
    """
    out: list[ReadFrame] = []
    for r in ranges:
        p = paths.get(r.file)
        if p is None:
            return None
        try:
            st = p.stat()
            if st.st_ino != r.ino:
                return None
            with spool.open_nofollow(p) as f:
                f.seek(r.start)
                data = f.read(r.end - r.start)
        except (FileNotFoundError, spool.SpoolError):
            return None
        if len(data) != r.end - r.start:
            return None
        seg = Segment(r.file, p, r.ino, st.st_size, st.st_mtime_ns, True, "", -1)
        out += [ReadFrame(seg, s, e, pl) for s, e, pl in scan_frames(data, r.start, final=True)]
    return out


def _fill_host(table: pa.Table, host: str) -> pa.Table:
    if "host" not in table.column_names or not host:
        return table
    i = table.column_names.index("host")
    col = table.column(i)
    if not pc.any(pc.equal(col, "")).as_py():
        return table
    return table.set_column(i, table.schema.field(i), pc.if_else(pc.equal(col, ""), host, col))


def _observe(ranks: RankRegistry, seg: Segment, d: Decoded) -> None:
    """Liveness facts from a frame's last row (rows are appended in time order): O(1)."""
    rt = RECORD_TYPES[d.record]
    t = d.table
    last = t.num_rows - 1
    last_ns = max(t.column(c)[last].as_py() for c in rt.time_columns)
    last_step = t.column("step")[last].as_py() if d.record == "steps" else -1
    inflight = None
    if d.record == "inflight":
        row = {c: t.column(c)[last].as_py() for c in ("ts_ns", "kind", "op", "group_id", "seq", "peer")}
        inflight = (row["ts_ns"], describe_inflight(row["kind"], row["op"], row["group_id"],
                                                    row["seq"], row["peer"]))
    ranks.observe(seg.job, seg.rank, seg.path.parent, d.record, last_ns, last_step, inflight)
