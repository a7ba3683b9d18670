"""Clock alignment: NTP-style offset of this host's clock to the server's.

One exchange: the agent notes ``t0`` (send), the server ``t1`` (receive) and ``t2``
(send) in ``GET /api/v1/clock``, the agent ``t3`` (receive). Then::

    offset = ((t1 - t0) + (t2 - t3)) / 2      # add to host time to get server time
    delay  = (t3 - t0) - (t2 - t1)             # network round trip
    uncertainty = delay / 2                    # the true offset is within +- this

Of several exchanges the one with the smallest delay wins (its offset is the least
disturbed by queueing). The offset travels as ``X-Fleetscope-Clock-Offset-Ns`` with
every batch, the uncertainty as ``X-Fleetscope-Clock-Uncertainty-Ns``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import httpx

from fleetscope.config import API_PREFIX

log = logging.getLogger("fleetscope.agent")


@dataclass(frozen=True)
class ClockEstimate:
    offset_ns: int
    uncertainty_ns: int
    """Half the round trip of the best exchange; -1 when never measured."""
    measured_ns: int
    num_samples: int


def exchange_offset(t0: int, t1: int, t2: int, t3: int) -> tuple[int, int]:
    """(offset, delay) of one NTP-style exchange, all in ns."""
    return ((t1 - t0) + (t2 - t3)) // 2, (t3 - t0) - (t2 - t1)


class ClockSync:
    """Keeps the current estimate; :meth:`measure` refreshes it."""

    def __init__(self, client: httpx.Client | None, num_rounds: int = 8, enabled: bool = True):
        self.client = client
        self.num_rounds = num_rounds
        self.enabled = enabled and client is not None
        self._lock = threading.Lock()
        self._est = ClockEstimate(0, -1, 0, 0)
        self._warned = False

    @property
    def estimate(self) -> ClockEstimate:
        with self._lock:
            return self._est

    def measure(self) -> ClockEstimate | None:
        """Run the exchanges; keep and return the best, or ``None`` if the server is unreachable."""
        if not self.enabled or self.client is None:
            return None
        best: tuple[int, int] | None = None
        n = 0
        for _ in range(self.num_rounds):
            try:
                t0 = time.time_ns()
                r = self.client.get(f"{API_PREFIX}/clock", timeout=5.0)
                t3 = time.time_ns()
            except httpx.HTTPError:
                return None
            if r.status_code != 200:
                if not self._warned:
                    log.warning("server has no usable %s/clock (HTTP %s); clock offset stays %d ns",
                                API_PREFIX, r.status_code, self.estimate.offset_ns)
                    self._warned = True
                return None
            d = r.json()
            off, delay = exchange_offset(t0, int(d["receive_ns"]), int(d["send_ns"]), t3)
            n += 1
            if best is None or delay < best[1]:
                best = (off, delay)
        if best is None:
            return None
        est = ClockEstimate(best[0], max(0, best[1]) // 2, time.time_ns(), n)
        with self._lock:
            self._est = est
        log.debug("clock offset %d ns +- %d ns (%d rounds)", est.offset_ns, est.uncertainty_ns, n)
        return est
