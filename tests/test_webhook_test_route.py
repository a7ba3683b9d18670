"""``POST /api/v1/alerts/webhooks/{id}/test`` through a real server: a signed Alertmanager
payload reaches a loopback receiver at once (nothing queued in the outbox); a failing
receiver is reported, not retried; an unknown webhook is a 404."""

from __future__ import annotations

import json

import httpx
from fleetscope.server.alerts.signing import verify
from test_diagnosis_api import Receiver

from tests.helpers.server import running_server

SECRET = "route-signing-secret-0123"


def test_test_notification_is_delivered_signed_and_failures_reported(tmp_path):
    ok_rx, bad_rx = Receiver(), Receiver(fail=True)
    try:
        with running_server(tmp_path, webhook_allow="127.0.0.1") as url:
            http = httpx.Client(base_url=url.api, timeout=60)
            good = http.post("/alerts/webhooks", json={"name": "good", "url": ok_rx.url, "secret": SECRET}).json()
            bad = http.post("/alerts/webhooks", json={"name": "bad", "url": bad_rx.url}).json()
            r = http.post(f"/alerts/webhooks/{good['id']}/test")
            assert r.status_code == 200, r.text
            assert r.json()["delivered"] is True and r.json()["error"] == ""
            headers, body, _ = ok_rx.got[0]
            assert verify(SECRET, headers, body)
            p = json.loads(body)
            assert p["receiver"] == "good" and p["status"] == "firing"
            assert p["alerts"][0]["labels"]["alertname"] == "FleetscopeTestNotification"
            r = http.post(f"/alerts/webhooks/{bad['id']}/test").json()
            assert r["delivered"] is False and "503" in r["error"], r
            assert http.get("/alerts/outbox").json() == []  # a test is not an alert
            r = http.post("/alerts/webhooks/9999/test")
            assert r.status_code == 404 and "webhook 9999 not found" in r.text
    finally:
        ok_rx.close()
        bad_rx.close()
