"""Start a page's first REST calls when the browser asks for the page, not when its
callbacks do.

Between the request for ``/ui/jobs/<job>`` and the heat-map and grid callbacks, a
cold browser spends a second or more loading and running Dash's bundles; the server is
idle meanwhile. :class:`Prefetcher` runs those calls in that gap. A result is used
once, by the first callback asking with the same key, and only while it is fresh; every
later call (live refresh, another browser) goes to the API as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

TTL_S = 10.0
"""A prefetched result older than this (from its start) is not used."""
MAX_PENDING = 8
"""At most this many unclaimed results are kept (oldest dropped), so page requests
that never run their callbacks (crawlers, curl) cost a bounded amount."""


class Prefetcher:
    """Single-use, short-lived results of calls started ahead of their callbacks."""

    def __init__(self, workers: int = 2, ttl_s: float = TTL_S, max_pending: int = MAX_PENDING,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        """``clock`` (seconds, monotonic) is injectable so tests need not sleep."""
        if ttl_s <= 0 or max_pending < 1 or workers < 1:
            raise ValueError("ttl_s must be > 0, max_pending and workers >= 1")
        self.ttl_s = ttl_s
        self.max_pending = max_pending
        self._clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetscope-ui-prefetch")
        self._lock = threading.Lock()
        self._pending: dict[Hashable, tuple[float, Future]] = {}

    def start(self, key: Hashable, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` in the background for a later :meth:`take` of ``key``; False when
        a fresh one for ``key`` is already pending."""
        now = self._clock()
        with self._lock:
            self._drop_stale(now)
            if key in self._pending:
                return False
            while len(self._pending) >= self.max_pending:
                self._pending.pop(next(iter(self._pending)))
            self._pending[key] = (now, self._pool.submit(fn))
        return True

    def take(self, key: Hashable) -> Any | None:
        """The result for ``key`` (waiting for it if still running), once; ``None`` when
        nothing fresh was started for it or the call raised."""
        with self._lock:
            entry = self._pending.pop(key, None)
        if entry is None or self._clock() - entry[0] > self.ttl_s:
            return None
        try:
            return entry[1].result(timeout=max(0.0, entry[0] + self.ttl_s - self._clock()))
        except Exception:  # noqa: BLE001 - the caller makes the call itself instead
            return None

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _drop_stale(self, now: float) -> None:
        for k in [k for k, (t, _) in self._pending.items() if now - t > self.ttl_s]:
            del self._pending[k]
