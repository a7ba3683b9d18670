"""Pluggable sinks: where the background thread puts finished records.

A sink is any object with ``open(info)``, ``write(record_type, rows)``, ``flush()``
and ``close()``; it is only ever called from the hooks' background thread. A sink may
raise: the recorder counts the rows as dropped and carries on.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, Protocol

from fleetscope import spool


class Sink(Protocol):
    def open(self, info: dict[str, Any]) -> None:
        """Called once by the background thread before the first write."""

    def write(self, record_type: str, rows: list[dict[str, Any]]) -> None:
        """Persist rows of one record type (names and types per ``fleetscope.schema``)."""

    def flush(self) -> None: ...

    def close(self) -> None: ...


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

    Each write is one frame (one uncompressed Arrow IPC stream of one record type),
    written with a single ``write`` call on an unbuffered file so a tailing agent never
    sees half a frame unless the process dies mid-write (which the spool reader handles).
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
        if not rows:
            return
        if self._file is None:
            if self.dir is None:
                raise OSError("spool sink was never opened")
            self._rotate()
        from fleetscope import codec
        from fleetscope.schema import record_type as lookup

        frame = spool.encode_frame(
            codec.table_to_ipc(_table(lookup(record_type), rows), compression=None)
        )
        if self._size and self._size + len(frame) > self.segment_bytes:
            self._rotate()
        self._file.write(frame)
        self._size += len(frame)

    def flush(self) -> None:
        pass  # unbuffered: every frame is already in the OS page cache

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _table(rt: Any, rows: list[dict[str, Any]]) -> Any:
    """Column-wise table build (fast path for rows produced by the recorder itself)."""
    import pyarrow as pa

    from fleetscope import codec
    from fleetscope.schema import arrow_type

    arrays = []
    for c in rt.columns:
        default = c.default
        values = [r.get(c.name, default) for r in rows]
        try:
            arr = pa.array(values, type=arrow_type(c.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            arr = None
        if arr is None or arr.null_count:
            return codec.rows_to_table(rt, rows)  # slow path: raises naming the bad row
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=rt.arrow_schema())
