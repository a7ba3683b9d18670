"""Background services started by the app's lifespan.

Each entry of :data:`SERVICES` is a factory ``callable(app) -> service`` where the
service has ``async start()`` and ``async stop()``. The lifespan calls the factories
after the store, the control-plane DB and the ingest writer are up (so ``app.state``
is complete), starts the services in list order and stops them in reverse order.
Components append one line each, e.g. ``SERVICES.append(diagnosis_loop)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


SERVICES: list[Callable[[Any], Service]] = []

from fleetscope.server.alerts.service import alert_dispatcher  # noqa: E402
from fleetscope.server.diagnosis.loop import diagnosis_loop  # noqa: E402
from fleetscope.server.diagnosis.selfcheck_alerts import selfcheck_alerts  # noqa: E402

SERVICES.append(alert_dispatcher)
SERVICES.append(diagnosis_loop)
SERVICES.append(selfcheck_alerts)
