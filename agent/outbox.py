"""The agent's own outbox: metrics, heartbeats and log events as spool segments.

Records the agent produces itself are written in the spool format to
``<state>/outbox/seg-*.fsp`` and shipped by the same tailer, batcher and offsets as
the trainer's records, so they survive an agent or server restart the same way.
Each agent process starts a new segment (older ones are then sealed) and rotates at a
size limit.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from fleetscope import codec, spool
from fleetscope.schema import record_type

log = logging.getLogger("fleetscope.agent")


class Outbox:
    """Thread-safe appender of frames to the agent's own segments."""

    def __init__(self, directory: Path, max_segment_bytes: int = 4 << 20):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_segment_bytes = max_segment_bytes
        self._lock = threading.Lock()
        existing = spool.list_segments(self.directory)
        self._index = spool.segment_index(existing[-1]) + 1 if existing else 0
        self._fd = -1
        self._size = 0
        self.num_records = 0

    def write(self, record: str, rows: list[Mapping[str, Any]] | pa.Table) -> None:
        """Append one frame of ``record`` rows (dicts or a table); errors are logged."""
        rt = record_type(record)
        try:
            table = rows if isinstance(rows, pa.Table) else codec.rows_to_table(rt, rows)
            if table.num_rows == 0:
                return
            frame = spool.encode_frame(codec.table_to_ipc(codec.conform(rt, table), compression=None))
        except (codec.BatchError, pa.ArrowException) as e:
            log.error("agent produced an invalid %s record, dropped: %s", record, e)
            return
        with self._lock:
            if self._fd < 0 or self._size >= self.max_segment_bytes:
                self._rotate()
            os.write(self._fd, frame)
            self._size += len(frame)
            self.num_records += table.num_rows

    def _rotate(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        path = self.directory / spool.segment_name(self._index)
        self._index += 1
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
