"""Time sources: CPU ``perf_counter_ns`` mapped to epoch ns, and CUDA event timestamps.

The training thread only reads ``perf_counter_ns`` or records CUDA events; converting
to absolute time (ns since the Unix epoch, so ranks on different hosts line up) is done
later by the background thread.
"""

from __future__ import annotations

import time
from typing import Any


class CpuClock:
    """Maps ``time.perf_counter_ns()`` readings to ns since the epoch."""

    def __init__(self) -> None:
        self.offset_ns = 0
        self.reanchor()

    def reanchor(self) -> None:
        """Re-measure the perf-counter -> wall-clock offset (cheap; follows NTP slews)."""
        p0 = time.perf_counter_ns()
        wall = time.time_ns()
        p1 = time.perf_counter_ns()
        self.offset_ns = wall - (p0 + p1) // 2

    def to_epoch(self, perf_ns: int) -> int:
        """Epoch ns of a ``perf_counter_ns`` reading."""
        return perf_ns + self.offset_ns


class CudaTimer:
    """CUDA timing events whose absolute times are resolved off the training thread.

    ``event()`` (training thread) records a timing event on the current stream and
    never synchronises. ``reanchor()`` and ``to_epoch()`` run on the background thread:
    an anchor event is recorded on an idle side stream and waited for *there*, which
    pins one device timestamp to a wall-clock reading; every other event's absolute
    time is the anchor's plus ``anchor.elapsed_time(event)``. Re-anchoring every few
    seconds keeps the float32 milliseconds of ``cudaEventElapsedTime`` precise.
    """

    def __init__(self, torch_module: Any, device: Any, max_errors: int = 1) -> None:
        self._torch = torch_module
        self.device = device
        self.errors = 0
        """CUDA errors raised by event creation/recording (never passed on)."""
        self.max_errors = max(1, int(max_errors))
        self.disabled = False
        """Set after ``max_errors`` errors: :meth:`event` returns ``None`` (CPU timing)."""
        self._side: Any = None
        self._anchor: Any = None
        self._anchor_ns = 0

    def event(self) -> Any:
        """Record a timing event on the current stream (training thread; no sync).

        Never raises: a CUDA error (device lost, out of memory, a sticky error from the
        trainer's own kernels) is counted and gives ``None``, which every caller treats
        as "no device timing" (the record keeps its CPU times); after ``max_errors``
        errors no more events are attempted.
        """
        if self.disabled:
            return None
        try:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        except Exception:
            self.errors += 1
            if self.errors >= self.max_errors:
                self.disabled = True
            return None

    @property
    def anchored(self) -> bool:
        return self._anchor is not None

    def bind_thread(self) -> None:
        """Make the rank's device current on the calling (background) thread."""
        self._torch.cuda.set_device(self.device)

    def reanchor(self) -> None:
        """Pin device time to wall-clock time (background thread only)."""
        cuda = self._torch.cuda
        with cuda.device(self.device):
            if self._side is None:
                self._side = cuda.Stream(self.device)
            ev = cuda.Event(enable_timing=True)
            ev.record(self._side)
            before = time.time_ns()
            ev.synchronize()  # waits on the side stream, in this thread only
            after = time.time_ns()
        self._anchor, self._anchor_ns = ev, (before + after) // 2

    @staticmethod
    def done(ev: Any) -> bool:
        """Whether the device has passed ``ev`` (non-blocking)."""
        return bool(ev.query())

    def to_epoch(self, ev: Any) -> int:
        """Epoch ns of a completed event."""
        return self._anchor_ns + int(self._anchor.elapsed_time(ev) * 1e6)

    @staticmethod
    def elapsed_ns(start: Any, end: Any) -> int:
        """Device time between two completed events."""
        return int(start.elapsed_time(end) * 1e6)
