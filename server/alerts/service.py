"""The alert dispatcher built from the app's settings (wired by :mod:`fleetscope.server.services`)."""

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
        retry_base_s=float(s.alert_retry_base_s),
        retry_max_s=float(s.alert_retry_max_s),
        external_url=str(s.public_url or ""),
        guard=WebhookGuard(str(s.webhook_allow or "")),
        secrets=box_for(s),
        lease_s=float(s.alert_lease_s),
    )
