"""What a running server keeps on ``app.state``, declared once, with types.

:func:`fleetscope.server.app.create_app` puts a :class:`ServerState` on the app and
fills every field there or in its lifespan; nothing else adds attributes. Readers use
plain attribute access (a field that is not ready yet is ``None``, never missing) or
:func:`server_state` for the typed view.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.datastructures import State

if TYPE_CHECKING:
    from fleetscope.collector.writer import IngestWriter
    from fleetscope.server.alerts.dispatcher import AlertDispatcher
    from fleetscope.server.api.deps import Authority
    from fleetscope.server.api.diagnosis import OnDemand, Verdict
    from fleetscope.server.diagnosis.loop import DiagnosisLoop
    from fleetscope.server.metrics import FleetMetrics
    from fleetscope.server.settings import Settings
    from fleetscope.server.store import Store
    from sqlalchemy.orm import Session, sessionmaker


class ServerState(State):
    """The server's shared objects (Starlette keeps them in ``_state``; the annotations
    below are the list of what may be there)."""

    settings: Settings
    ready: bool
    """True between the end of start-up and the start of shutdown (``/readyz``)."""
    services: list[Any]
    """Started background services, in start order (stopped in reverse)."""
    store: Store | None
    """The ClickHouse store of the API and the collector (``None`` before start-up)."""
    diagnosis_store: Store | None
    """Its sibling handle for diagnosis queries (chdb serialises calls on one handle)."""
    db: sessionmaker[Session] | None
    """The control-plane DB's session factory."""
    collector: IngestWriter | None
    alert_dispatcher: AlertDispatcher | None
    """``None`` when diagnosis (and with it alerting) is off."""
    diagnosis: DiagnosisLoop | None
    """The diagnosis loop when it runs in this process (``diagnosis_worker=thread``)."""
    published_verdicts: dict[str, Verdict]
    """job -> the worker process' latest published verdict (bounded)."""
    diagnosis_on_demand: OnDemand
    """This process' own passes when the loop runs elsewhere."""
    worker_passes: dict[str, dict[str, list[float]]]
    """worker id -> its pass counters, for ``/metrics``."""
    authority: Authority
    fleet_metrics: FleetMetrics

    @classmethod
    def install(cls, app: Any, settings: Settings) -> ServerState:
        """Put a new state on ``app`` (before any request or the lifespan)."""
        from fleetscope.server.api.deps import Authority
        from fleetscope.server.api.diagnosis import OnDemand
        from fleetscope.server.metrics import FleetMetrics

        state = cls()
        state.settings = settings
        state.ready = False
        state.services = []
        state.store = None
        state.diagnosis_store = None
        state.db = None
        state.collector = None
        state.alert_dispatcher = None
        state.diagnosis = None
        state.published_verdicts = {}
        state.diagnosis_on_demand = OnDemand()
        state.worker_passes = {}
        app.state = state
        state.authority = Authority(app)  # both read app.state.settings
        state.fleet_metrics = FleetMetrics(app)
        return state


def server_state(app: Any) -> ServerState:
    """``app.state`` as the typed :class:`ServerState` (an app not made by
    :func:`~fleetscope.server.app.create_app` is a programming error)."""
    state = app.state
    if not isinstance(state, ServerState):
        raise TypeError(f"app.state is {type(state).__name__}, not ServerState: build the app with create_app")
    return state
