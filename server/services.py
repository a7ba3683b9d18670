"""Background services started by the app's lifespan, wired here explicitly.

:func:`service_factories` lists the factories ``callable(app) -> service`` in start
order; a service has ``async start()`` and ``async stop()``. The lifespan calls the
factories after the store, the control-plane DB and the ingest writer are up (so
``app.state`` is complete), starts the services in that order and stops them in
reverse. A new service is one more line in the list (nothing registers itself on
import).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def service_factories() -> list[Callable[[Any], Service]]:
    """The server's background services, in start order: the alert dispatcher first (the
    diagnosis loop wakes it), then the diagnosis loop (in this process, a worker process,
    or none: see ``diagnosis_worker``), then the self-check alerts."""
    from fleetscope.server.alerts.service import alert_dispatcher
    from fleetscope.server.diagnosis.loop import diagnosis_loop
    from fleetscope.server.diagnosis.selfcheck_alerts import selfcheck_alerts

    return [alert_dispatcher, diagnosis_loop, selfcheck_alerts]
