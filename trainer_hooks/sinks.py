"""Pluggable sinks: where the background thread puts finished records.

A sink is any object with ``open(info)``, ``write(record_type, rows)``, ``flush()``
and ``close()``; it is only ever called from the hooks' background thread. A sink may
raise: the recorder counts the rows as dropped and carries on.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol

from fleetscope.trainer_hooks.batch import Columns
from fleetscope.trainer_hooks.encode import ipc_stream

from fleetscope import spool
from fleetscope.schema import record_type as lookup

_HEADER = spool.HEADER.pack  # a frame: header (magic, payload length, crc32), payload
_HEADER_SIZE = spool.HEADER.size


class Sink(Protocol):
    def open(self, info: dict[str, Any]) -> None:
        """Called once by the background thread before the first write."""

    def write(self, record_type: str, rows: list[dict[str, Any]]) -> None:
        """Persist rows of one record type (names and types per ``fleetscope.schema``)."""

    def flush(self) -> None: ...

    def close(self) -> None: ...

    # Optional: ``write_many({record_type: rows, ...}) -> {record_type: exception}``
    # writes several record types at once (the recorder uses it when present) and
    # returns the record types it could not write.


class MemorySink:
    """Keeps rows in memory, by record type; for tests and in-process consumers."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}
        self.records: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.closed = False
        self._lock = threading.Lock()

    def open(self, info: dict[str, Any]) -> None:
        self.info = dict(info)

    def write(self, record_type: str, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self.records[record_type].extend(rows)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def rows(self, record_type: str) -> list[dict[str, Any]]:
        """A copy of the rows written so far for one record type."""
        with self._lock:
            return list(self.records.get(record_type, ()))


class SpoolSink:
    """Writes ``<spool>/<job>/rank-XXXXX/seg-*.fsp`` frames plus ``rank.json``.

    Each record type of a flush is one frame (one uncompressed Arrow IPC stream of one
    record type, see :mod:`.encode`); the frames of a flush go out in a single ``write``
    call on an unbuffered file, so a tailing agent never sees half a frame unless the
    process dies mid-write (which the spool reader handles).
    A new process starts a new segment; segments rotate at ``segment_bytes``.
    """

    def __init__(self, directory: str | os.PathLike, segment_bytes: int = 8 << 20) -> None:
        self.root = Path(directory)
        self.segment_bytes = int(segment_bytes)
        self.dir: Path | None = None
        self._file: Any = None
        self._index = -1
        self._size = 0

    def open(self, info: dict[str, Any]) -> None:
        self.dir = spool.rank_dir(self.root, info["job"], int(info["rank"]))
        self.dir.mkdir(parents=True, exist_ok=True)
        spool.write_rank_info(self.dir, info)
        existing = spool.list_segments(self.dir)
        self._index = spool.segment_index(existing[-1]) if existing else -1
        self._rotate()

    def _rotate(self) -> None:
        assert self.dir is not None
        if self._file is not None:
            self._file.close()
            self._file = None
        self._index += 1
        self._file = open(self.dir / spool.segment_name(self._index), "ab", buffering=0)
        self._size = 0

    def write(self, record_type: str, rows: list[dict[str, Any]]) -> None:
        failed = self.write_many({record_type: rows})
        if failed:
            raise failed[record_type]

    def write_many(self, batches: dict[str, Any]) -> dict[str, Exception]:
        """One frame per record type, all appended with one ``write``.

        ``batches`` maps record types to lists of row dicts or to
        :class:`~fleetscope.trainer_hooks.batch.Columns` (encoded without row dicts).

        Returns the record types that were not written, with the reason: rows that
        cannot be encoded, or frames the file write did not complete (the frames before
        a failed write's end are on disk and count as written).
        """
        failed: dict[str, Exception] = {}
        frames: list[tuple[str, int]] = []  # (record type, frame size)
        parts: list[bytes] = []  # each frame's header and payload
        for name, rows in batches.items():
            if not rows:
                continue
            try:
                if rows.__class__ is Columns:
                    payload = rows.ipc_stream()
                else:
                    payload = ipc_stream(lookup(name), rows)
            except Exception as e:
                failed[name] = e
                continue
            parts += (_HEADER(spool.MAGIC, len(payload), zlib.crc32(payload)), payload)
            frames.append((name, _HEADER_SIZE + len(payload)))
        if not frames:
            return failed
        size = sum(n for _, n in frames)
        done = 0
        try:
            if self._file is None:
                if self.dir is None:
                    raise OSError("spool sink was never opened")
                self._rotate()
            if self._size and self._size + size > self.segment_bytes:
                self._rotate()
            data = memoryview(b"".join(parts))
            while done < size:  # an unbuffered write may be partial (e.g. interrupted)
                n = self._file.write(data[done:])
                if not n:
                    raise OSError("spool write made no progress")
                done += n
                self._size += n
        except OSError as e:
            end = 0
            for name, n in frames:
                end += n
                if end > done:
                    failed[name] = e
        return failed

    def flush(self) -> None:
        pass  # unbuffered: every frame is already in the OS page cache

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
