"""A server background service that runs a blocking ``tick()`` every ``tick_s`` seconds.

Shared by the diagnosis loop and the self-check alerting: ``tick()`` runs in a worker
thread and returns how many alert rows it queued; when that is non-zero the alert
dispatcher (``app.state.alert_dispatcher``) is woken so delivery starts at once.

Besides the regular ticks a subclass may ask for early, narrower passes: ``due_in_s()``
says when (e.g. the moment a stall threshold will be crossed) and ``tick_due()`` does
only the work that is due then. They run in their own task and worker thread, so a long
regular pass (a big job on a loaded host) does not hold them back; the subclass keeps
the two from working on the same thing at once.
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
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()
        self.pass_seconds: dict[str, list[float]] = {}
        """pass name (tick, tick_due) -> [count, total seconds, latest seconds], for /metrics."""

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
        self._tasks = [asyncio.create_task(self._run(), name=self.name),
                       asyncio.create_task(self._run_due(), name=self.name + "-due")]

    async def stop(self) -> None:
        self._stopping.set()
        for task in self._tasks:
            try:
                await asyncio.wait_for(task, timeout=30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                task.cancel()

    async def _pass(self, fn: Any) -> None:
        t0 = time.monotonic()
        try:
            queued = await asyncio.to_thread(fn)
            took_s = time.monotonic() - t0
            acc = self.pass_seconds.setdefault(getattr(fn, "__name__", "pass"), [0, 0.0, 0.0])
            acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + took_s, took_s
            if queued:
                dispatcher = self.app.state.alert_dispatcher
                if dispatcher is not None:
                    dispatcher.wake()
        except Exception:
            log.exception("%s: %s failed", self.name, getattr(fn, "__name__", "pass"))

    async def _sleep(self, delay_s: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=max(delay_s, 0.05))
        except asyncio.TimeoutError:
            pass

    async def _run(self) -> None:
        while not self._stopping.is_set():
            t0 = time.monotonic()
            await self._pass(self.tick)
            await self._sleep(self.tick_s - (time.monotonic() - t0))

    async def _run_due(self) -> None:
        while not self._stopping.is_set():
            due = self.due_in_s()
            if due <= 0:
                await self._pass(self.tick_due)
            else:  # re-read at least every 0.5 s: a pass may have set a nearer due time
                await self._sleep(min(due, 0.5))
