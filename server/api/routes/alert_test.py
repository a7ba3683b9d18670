"""``POST /alerts/webhooks/{id}/test``: send one test notification to a webhook now.

The body is an Alertmanager ``version: "4"`` payload with one firing alert named
``FleetscopeTestNotification`` (labels ``severity=info``, ``test=true``), signed with the
webhook's secret and POSTed through the alert dispatcher's own delivery call, so the
receiver sees exactly what a real alert would bring (and the dispatcher's URL checks
apply). Nothing is queued in the outbox: the answer says at once whether it arrived.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from fastapi import APIRouter, HTTPException, Request
from fleetscope.server.alerts.dispatcher import AlertDispatcher
from fleetscope.server.alerts.payload import build_payload, fingerprint, rfc3339
from fleetscope.server.alerts.service import build_dispatcher
from fleetscope.server.api.deps import SessionDep
from fleetscope.server.db.diagnosis_models import Webhook
from pydantic import BaseModel, Field

router = APIRouter(tags=["alerts"])


class TestNotificationOut(BaseModel):
    webhook_id: int
    delivered: bool = Field(description="the receiver answered 2xx")
    error: str = Field(description="why not, '' when delivered")
    elapsed_ms: float


def test_alert(hook: Webhook, base_url: str) -> dict[str, Any]:
    labels = {"alertname": "FleetscopeTestNotification", "job": "", "severity": "info", "kind": "test",
              "rule": "", "service": "fleetscope", "test": "true", "webhook": hook.name}
    now = time.time_ns()
    return {
        "status": "firing",
        "labels": labels,
        "annotations": {"summary": f"fleetscope test notification for webhook {hook.name!r}",
                        "description": "Sent from the fleetscope incidents page or "
                                       "POST /api/v1/alerts/webhooks/{id}/test; no incident is open."},
        "startsAt": rfc3339(now), "endsAt": rfc3339(None),
        "generatorURL": f"{base_url.rstrip('/')}/ui/incidents" if base_url else "",
        "fingerprint": fingerprint(labels),
    }


@router.post("/alerts/webhooks/{hook_id}/test", response_model=TestNotificationOut)
async def send_test_notification(hook_id: int, request: Request, session: SessionDep) -> dict[str, Any]:
    """Deliver a test notification to the webhook now and report whether it arrived."""
    hook = session.get(Webhook, hook_id)
    if hook is None:
        raise HTTPException(404, detail=f"webhook {hook_id} not found")
    base = str(request.app.state.settings.public_url or "")
    body = json.dumps(build_payload(hook.name, [test_alert(hook, base)], base), separators=(",", ":")).encode()
    dispatcher = request.app.state.alert_dispatcher
    if not isinstance(dispatcher, AlertDispatcher):  # alerts disabled: the same delivery code
        dispatcher = build_dispatcher(request.app)
    t0 = time.perf_counter()
    async with httpx.AsyncClient(follow_redirects=False) as client:
        outcome = await dispatcher.send_now(client, hook, body)
    ok, err = outcome.ok, outcome.error
    return {"webhook_id": hook_id, "delivered": ok, "error": err, "elapsed_ms": (time.perf_counter() - t0) * 1000}
