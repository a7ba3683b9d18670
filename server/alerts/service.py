"""Service factory of the alert dispatcher for :func:`fleetscope.server.services.service_factories`."""

from __future__ import annotations

from typing import Any

from .dispatcher import AlertDispatcher
from .guard import WebhookGuard
from .secrets import box_for


def build_dispatcher(app: Any) -> AlertDispatcher:
    """A dispatcher configured from the app's settings (guard, sealed secrets, lease)."""
    s = app.state.settings
    return AlertDispatcher(
        app.state.db,
        poll_s=float(getattr(s, "alert_poll_s", 1.0)),
        retry_base_s=float(getattr(s, "alert_retry_base_s", 1.0)),
        retry_max_s=float(getattr(s, "alert_retry_max_s", 300.0)),
        external_url=str(getattr(s, "public_url", "") or ""),
        guard=WebhookGuard(str(getattr(s, "webhook_allow", "") or "")),
        secrets=box_for(s),
        lease_s=float(getattr(s, "alert_lease_s", 60.0)),
    )


def alert_dispatcher(app: Any) -> AlertDispatcher | DisabledService:
    if not getattr(app.state.settings, "diagnosis_enabled", True):
        return DisabledService()
    d = build_dispatcher(app)
    app.state.alert_dispatcher = d
    return d


class DisabledService:
    """Stands in for a service turned off by settings."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
