"""A server background service that runs a blocking ``tick()`` every ``tick_s`` seconds.

Shared by the diagnosis loop and the self-check alerting: ``tick()`` runs in a worker
thread and returns how many alert rows it queued; when that is non-zero the alert
dispatcher (``app.state.alert_dispatcher``) is woken so delivery starts at once.

Between regular ticks a subclass may ask for an early, narrower pass: ``due_in_s()``
says when (e.g. the moment a stall threshold will be crossed) and ``tick_due()`` does
only the work that is due then.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)


class PeriodicAlertingService(abc.ABC):
    """Base class: subclasses set ``name`` and implement ``tick() -> int``."""

    name = "fleetscope-periodic"

    def __init__(self, app: Any, tick_s: float) -> None:
        self.app = app
        self.tick_s = float(tick_s)
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    @abc.abstractmethod
    def tick(self) -> int:
        """One blocking pass; returns the number of alert rows it queued."""

    def due_in_s(self) -> float:
        """Seconds until ``tick_due()`` has work (default: never)."""
        return float("inf")

    def tick_due(self) -> int:
        """Only the work due now (runs in a worker thread); returns alert rows queued."""
        return 0

    async def prepare(self) -> None:
        """Work before the first tick (runs in the event loop; default: nothing)."""
        return None

    async def start(self) -> None:
        await self.prepare()
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task:
            try:
                await asyncio.wait_for(self._task, timeout=30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()

    async def _run(self) -> None:
        next_regular = time.monotonic()
        while not self._stopping.is_set():
            regular = time.monotonic() >= next_regular
            if regular:
                next_regular = time.monotonic() + self.tick_s
            try:
                if await asyncio.to_thread(self.tick if regular else self.tick_due):
                    dispatcher = getattr(self.app.state, "alert_dispatcher", None)
                    if dispatcher is not None:
                        dispatcher.wake()
            except Exception:
                log.exception("%s: tick failed", self.name)
            delay = max(min(next_regular - time.monotonic(), self.due_in_s()), 0.05)
            try:
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            except asyncio.TimeoutError:
                pass
