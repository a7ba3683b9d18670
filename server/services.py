"""Background services started by the app's lifespan, wired here explicitly.

:func:`service_factories` lists the factories ``callable(app) -> service`` in start
order; a service has ``async start()`` and ``async stop()``. The lifespan calls the
factories after the store, the control-plane DB and the ingest writer are up (so
``app.state`` is complete), starts the services in that order and stops them in
reverse. A new service is one more line in the list (nothing registers itself on
import).

This is also where the layers meet: diagnosis opens and resolves incidents and hands
each changed one to an :class:`~fleetscope.server.diagnosis.incidents.IncidentSink`;
the sink given here is the alert outbox, so the diagnosis package never imports the
alerting one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class DisabledService:
    """Stands in for a service turned off by settings."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def _outbox(app: Any) -> Any:
    from fleetscope.server.alerts.outbox import OutboxSink

    return OutboxSink(str(app.state.settings.public_url or ""))


def alert_dispatcher(app: Any) -> Service:
    """The webhook dispatcher (off with diagnosis); the diagnosis services wake it."""
    if not app.state.settings.diagnosis_enabled:
        return DisabledService()
    from fleetscope.server.alerts.service import build_dispatcher

    dispatcher = build_dispatcher(app)
    app.state.alert_dispatcher = dispatcher
    return dispatcher


def diagnosis_loop(app: Any) -> Service:
    """The diagnosis worker process (``diagnosis_worker=process``, the default), the loop
    in this process (``thread``), or nothing (``off``: workers run elsewhere, ``fleetscope
    worker``)."""
    s = app.state.settings
    mode = str(s.diagnosis_worker)
    if not s.diagnosis_enabled or mode == "off":
        return DisabledService()
    if mode == "process" and int(s.port or 0) > 0:
        from fleetscope.server.diagnosis.worker import WorkerProcess

        return WorkerProcess(app, _outbox(app))
    if mode == "process":
        log.warning("diagnosis_worker=process needs a fixed --port; running the loop in this process")
    from fleetscope.server.diagnosis.loop import DiagnosisLoop

    return DiagnosisLoop(app, _outbox(app))


def selfcheck_alerts(app: Any) -> Service:
    """Fleet self-check scoring into incidents and alerts (off with diagnosis)."""
    if not app.state.settings.diagnosis_enabled:
        return DisabledService()
    from fleetscope.server.diagnosis.selfcheck_alerts import SelfcheckAlerts

    return SelfcheckAlerts(app, _outbox(app))


def service_factories() -> list[Callable[[Any], Service]]:
    """The server's background services, in start order: the alert dispatcher first (the
    diagnosis loop wakes it), then the diagnosis loop (in this process, a worker process,
    or none: see ``diagnosis_worker``), then the self-check alerts."""
    return [alert_dispatcher, diagnosis_loop, selfcheck_alerts]
