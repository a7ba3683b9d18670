"""Spool tailing: find every rank's segments and read new frames from them.

Sources are ``<spool>/<job>/rank-*/`` directories (new jobs, ranks and segments may
appear at any time) and the agent's own outbox. Each file is read from an in-memory
position that runs ahead of the durable, acknowledged offset in
:class:`agent.offsets.OffsetStore`; after a restart reading resumes at the latter.

A segment is *sealed* when a newer segment exists in its directory, or when the
process that wrote it (``rank.json`` pid, on this host) is gone and the file has not
changed for a grace period. Only in a sealed segment is a truncated tail final (and
reported as corrupt); in a live one it is the writer's next frame, still being written.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.ranks import RankRegistry, rank_from_dirname

from fleetscope import spool

OUTBOX_KEY = "@outbox"
MIN_WINDOW = 1 << 20


@dataclass
class Segment:
    key: str
    """Stable name: path relative to the spool, or ``@outbox/seg-...`` for the agent's own."""
    path: Path
    ino: int
    size: int
    mtime_ns: int
    sealed: bool
    job: str
    rank: int
    """Global rank of the writer; -1 for the agent's outbox."""


@dataclass(frozen=True)
class ReadFrame:
    segment: Segment
    start: int
    end: int
    payload: bytes | None
    """``None`` for a corrupt stretch ``[start, end)`` that is skipped."""


class SpoolTailer:
    """Discovers segments and hands out frames not yet read, oldest segment first."""

    def __init__(self, spool_dir: Path, outbox_dir: Path | None, offsets: OffsetStore,
                 ranks: RankRegistry, job: str | None = None, dead_writer_grace_s: float = 5.0):
        self.spool_dir = Path(spool_dir)
        self.outbox_dir = Path(outbox_dir) if outbox_dir else None
        self.offsets = offsets
        self.ranks = ranks
        self.job = job
        self.grace_ns = int(dead_writer_grace_s * 1e9)
        self._pos: dict[str, tuple[int, int]] = {}
        self._rotate = 0

    # -- discovery ---------------------------------------------------------------------
    def sources(self) -> list[tuple[str, Path, str, int]]:
        """(key prefix, directory, job, rank) of every segment directory."""
        out: list[tuple[str, Path, str, int]] = []
        if self.outbox_dir is not None and self.outbox_dir.is_dir():
            out.append((OUTBOX_KEY, self.outbox_dir, "", -1))
        try:
            jobs = sorted(os.scandir(self.spool_dir), key=lambda e: e.name)
        except FileNotFoundError:
            return out
        only = spool.job_dirname(self.job) if self.job is not None else None
        for j in jobs:
            # symbolic links are never followed: a link in the spool could point anywhere
            if j.name.startswith(".") or not j.is_dir(follow_symlinks=False):
                continue
            if only is not None and j.name != only:
                continue
            try:
                rank_dirs = sorted(os.scandir(j.path), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue
            job = spool.job_from_dirname(j.name)
            for r in rank_dirs:
                rank = rank_from_dirname(r.name)
                if rank is None or not r.is_dir(follow_symlinks=False):
                    continue
                out.append((f"{j.name}/{r.name}", Path(r.path), job, rank))
        return out

    def segments(self) -> list[Segment]:
        """Every segment now on disk, per source oldest first, with its sealed state."""
        now = time.time_ns()
        segs: list[Segment] = []
        for prefix, directory, job, rank in self.sources():
            paths = spool.list_segments(directory)
            writer_dead = False
            if rank >= 0 and paths:
                st = self.ranks.get(job, rank, directory)
                writer_dead = not self.ranks.writer_alive(st)
            for i, p in enumerate(paths):
                try:
                    stt = p.stat()
                except FileNotFoundError:
                    continue
                sealed = i < len(paths) - 1 or (
                    writer_dead and now - stt.st_mtime_ns > self.grace_ns)
                segs.append(Segment(f"{prefix}/{p.name}", p, stt.st_ino, stt.st_size,
                                    stt.st_mtime_ns, sealed, job, rank))
        return segs

    # -- reading -----------------------------------------------------------------------
    def position(self, seg: Segment) -> int:
        cur = self._pos.get(seg.key)
        if cur is None or cur[0] != seg.ino:
            return self.offsets.offset(seg.key, seg.ino)
        return cur[1]

    def rewind(self) -> None:
        """Forget read-ahead positions: the next read starts at the acknowledged offsets."""
        self._pos.clear()

    def backlog_bytes(self, segs: list[Segment]) -> int:
        """Bytes on disk not yet acknowledged."""
        return sum(max(0, s.size - self.offsets.offset(s.key, s.ino)) for s in segs)

    def read(self, max_bytes: int) -> list[ReadFrame]:
        """Frames after the read positions, up to about ``max_bytes`` of payload.

        Sources are visited round-robin from a rotating start so that no rank starves.
        """
        segs = self.segments()
        by_source: dict[str, list[Segment]] = {}
        for s in segs:
            by_source.setdefault(s.key.rsplit("/", 1)[0], []).append(s)
        keys = list(by_source)
        if not keys:
            return []
        self._rotate = (self._rotate + 1) % len(keys)
        keys = keys[self._rotate:] + keys[: self._rotate]
        out: list[ReadFrame] = []
        budget = max_bytes
        per_source = max(MIN_WINDOW // 4, max_bytes // len(keys))
        for k in keys:
            taken = 0
            for seg in by_source[k]:
                if budget <= 0 or taken >= per_source:
                    break
                pos = self.position(seg)
                if pos >= seg.size:
                    continue
                try:
                    for fr in self._read_segment(seg, pos, min(budget, per_source - taken)):
                        out.append(fr)
                        n = fr.end - fr.start
                        budget -= n
                        taken += n
                except FileNotFoundError:  # deleted by the disk budget policy meanwhile
                    self._pos.pop(seg.key, None)
                    continue
                if self.position(seg) < seg.size:
                    break  # keep this source's frames in order: finish a segment first
        return out

    def _read_segment(self, seg: Segment, pos: int, want: int) -> Iterator[ReadFrame]:
        window = max(MIN_WINDOW, want + spool.HEADER.size)
        try:
            f = spool.open_nofollow(seg.path)
        except spool.SpoolError:  # replaced by a symlink since it was listed
            return
        with f:
            while True:
                f.seek(pos)
                data = f.read(window)
                at_eof = pos + len(data) >= seg.size
                frames = list(scan_frames(data, pos, final=at_eof and seg.sealed,
                                          at_eof=at_eof))
                if not frames:
                    if at_eof or window >= seg.size - pos:
                        return
                    need = _frame_len(data)
                    window = max(window * 2, need)
                    continue
                got = 0
                for start, end, payload in frames:
                    yield ReadFrame(seg, start, end, payload)
                    self._pos[seg.key] = (seg.ino, end)
                    got += end - start
                    if got >= want:
                        return
                return


def _frame_len(data: bytes) -> int:
    if len(data) >= spool.HEADER.size:
        magic, length, _ = spool.HEADER.unpack_from(data, 0)
        if magic == spool.MAGIC:
            return spool.HEADER.size + length
    return 0


def scan_frames(data: bytes, base: int, final: bool,
                at_eof: bool = True) -> Iterator[tuple[int, int, bytes | None]]:
    """Frames in ``data`` (file bytes starting at offset ``base``).

    Same format and resynchronisation as :func:`fleetscope.spool.read_frames`, over a
    window: an incomplete frame at the end is left for later unless ``final``; garbage
    with no magic after it is reported only when ``at_eof`` (else the window grows).
    """
    pos, n = 0, len(data)
    while pos < n:
        if n - pos < spool.HEADER.size:
            if final:
                yield base + pos, base + n, None
            return
        magic, length, crc = spool.HEADER.unpack_from(data, pos)
        if magic == spool.MAGIC and length <= spool.MAX_FRAME_BYTES:
            end = pos + spool.HEADER.size + length
            if end > n:
                if final:
                    yield base + pos, base + n, None
                return
            payload = data[pos + spool.HEADER.size: end]
            if zlib.crc32(payload) == crc:
                yield base + pos, base + end, payload
                pos = end
                continue
        nxt = data.find(spool.MAGIC, pos + 1)
        if nxt < 0:
            if final:
                yield base + pos, base + n, None
            elif not at_eof and n - pos > len(spool.MAGIC):
                # garbage runs past the window: skip what is surely not a magic's start
                yield base + pos, base + n - len(spool.MAGIC) + 1, None
            return
        yield base + pos, base + nxt, None
        pos = nxt
