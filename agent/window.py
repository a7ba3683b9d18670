"""Batches in flight and the contiguous acknowledged prefix of every file.

Several batches are on the wire at once (``--in-flight``), so acknowledgements can
arrive in any order. A file's durable offset may only move over bytes that are *all*
acknowledged: if batch 2 of a file is acked while batch 1 is still out, the offset
stays at the start of batch 1. :class:`AckWindow` keeps, per file, the dispatched
ranges in file order and answers each ack with how far each file's offset may now move
and which batches lie entirely below the new offsets (*retired*: they can leave the
durable ``pending`` list). A batch acked beyond a gap stays pending until the gap
closes, so after a crash it is re-sent under its own key (the server answers
``duplicate``) instead of its bytes being re-read into a batch with another key.

It also bounds the pipeline: :meth:`has_slot` is false while ``limit`` batches are
unacknowledged, or while ``max_unretired`` batches are not yet retired (one batch the
server keeps failing must not let the pending list grow without bound).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from fleetscope.agent.offsets import Range


@dataclass
class _Batch:
    key: str
    ranges: tuple[Range, ...]
    remaining: int
    """Ranges of this batch not yet below the committed offset of their file."""
    acked: bool = False


@dataclass(frozen=True)
class Advance:
    """What one acknowledgement allows to be committed durably."""

    ranges: tuple[Range, ...]
    """Per file whose offset moves: the bytes ``[old offset, new offset)``."""
    retired: tuple[str, ...]
    """Keys of the batches now entirely committed (to drop from ``pending``)."""


class AckWindow:
    """Thread-safe; one thread adds (in file order), any thread acknowledges."""

    def __init__(self, limit: int, max_unretired: int | None = None):
        if limit < 1:
            raise ValueError(f"in-flight limit must be at least 1, got {limit}")
        self.limit = limit
        self.max_unretired = max(limit, max_unretired if max_unretired is not None else 4 * limit)
        self._cond = threading.Condition()
        self._files: dict[tuple[str, int], deque[tuple[Range, _Batch]]] = {}
        self._batches: dict[str, _Batch] = {}
        self._unacked = 0

    @property
    def unacked(self) -> int:
        """Batches added and not yet acknowledged (on the wire or about to be)."""
        with self._cond:
            return self._unacked

    def __len__(self) -> int:
        """Batches not yet retired (unacknowledged, or acknowledged beyond a gap)."""
        with self._cond:
            return len(self._batches)

    def has_slot(self) -> bool:
        with self._cond:
            return self._free()

    def _free(self) -> bool:
        return self._unacked < self.limit and len(self._batches) < self.max_unretired

    def wait_slot(self, stop: threading.Event, poll_s: float = 0.2) -> bool:
        """Block until a batch may be added; False if ``stop`` was set first."""
        with self._cond:
            while not self._free():
                if stop.is_set():
                    return False
                self._cond.wait(poll_s)
            return not stop.is_set()

    def add(self, key: str, ranges: Iterable[Range]) -> None:
        """Register a dispatched batch. Per file, ranges must follow the ones added before."""
        ranges = tuple(ranges)
        with self._cond:
            if key in self._batches:
                raise ValueError(f"batch {key} is already in flight")
            last: dict[tuple[str, int], int] = {}
            for r in ranges:
                fk = (r.file, r.ino)
                q = self._files.get(fk)
                prev = last.get(fk, q[-1][0].end if q else None)
                if r.end < r.start or (prev is not None and r.start < prev):
                    raise ValueError(f"range {r.file}@{r.ino}:{r.start}-{r.end} is not after "
                                     f"the bytes already in flight (up to {prev})")
                last[fk] = r.end
            b = _Batch(key, ranges, len(ranges))
            for r in ranges:
                self._files.setdefault((r.file, r.ino), deque()).append((r, b))
            self._batches[key] = b
            self._unacked += 1

    def ack(self, key: str) -> Advance:
        """The server acknowledged ``key``: the offsets that may move, the batches retired."""
        with self._cond:
            b = self._batches.get(key)
            if b is None or b.acked:
                raise ValueError(f"batch {key} is not in flight")
            b.acked = True
            self._unacked -= 1
            moved: list[Range] = []
            retired: list[str] = []
            if not b.ranges:
                retired.append(key)
                del self._batches[key]
            for fk in dict.fromkeys((r.file, r.ino) for r in b.ranges):
                q = self._files[fk]
                start, end = q[0][0].start, None
                while q and q[0][1].acked:
                    r, owner = q.popleft()
                    end = r.end
                    owner.remaining -= 1
                    if owner.remaining == 0:
                        retired.append(owner.key)
                        del self._batches[owner.key]
                if not q:
                    del self._files[fk]
                if end is not None:
                    moved.append(Range(fk[0], fk[1], start, end))
            self._cond.notify_all()
            return Advance(tuple(moved), tuple(retired))
