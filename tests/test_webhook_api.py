"""Webhooks through a real server (uvicorn subprocess, SQLite): 422s that name the field,
the SSRF guard with and without FLEETSCOPE_WEBHOOK_ALLOW, redacted URLs, sealed secrets,
and delivery errors shown by status only in /alerts/outbox and /incidents/{id}."""

from __future__ import annotations

import json
import sqlite3
import time

import httpx
import pytest

from tests.helpers.server import running_server
from tests.helpers.webhooks import WebhookReceiver

HTTP = httpx.Client(timeout=60)
ANSWER = b"receiver internals: token=rx-private-0001"


@pytest.fixture(scope="module")
def rx():
    # answers 500 with a body that must never be shown back
    r = WebhookReceiver(status=500, answer=ANSWER, path="/hook/rx-path-token")
    yield r
    r.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, rx):
    work = tmp_path_factory.mktemp("webhook-api")
    with running_server(work, webhook_allow="127.0.0.1", alert_retry_base_s=30, alert_retry_max_s=60) as url:
        yield url, work


def _loc(r: httpx.Response) -> list[str]:
    return [".".join(map(str, d["loc"])) for d in r.json()["detail"]]


@pytest.mark.parametrize("url,says", [
    ("https://x:abc/", "not a valid URL"),
    ("http://169.254.169.254/latest/meta-data/iam", "link-local"),
    ("http://10.0.0.7:8080/hook", "private"),
    ("http://127.0.0.2:8080/hook", "loopback"),  # 127.0.0.1 only is allowed
    ("http://localhost:8000/api/v1/alerts/rules", "localhost"),
    ("https://ops:pw-0123456789@hooks.example.com/x", "credentials"),
])  # fmt: skip
def test_refused_webhook_urls_get_422_naming_the_field(server, url, says):
    base, _ = server
    r = HTTP.post(f"{base.api}/alerts/webhooks", json={"name": f"bad-{abs(hash(url))}", "url": url})
    assert r.status_code == 422, r.text
    assert "body.url" in _loc(r) and says in r.text
    assert "pw-0123456789" not in r.text and "meta-data" not in r.text  # the URL is shown redacted
    r = HTTP.patch(f"{base.api}/alerts/webhooks/1", json={"url": url})
    assert r.status_code in (404, 422)


def test_short_secret_gets_422_naming_the_field(server):
    base, _ = server
    r = HTTP.post(f"{base.api}/alerts/webhooks", json={"name": "s", "url": "https://hooks.example.com/x",
                                                       "secret": "x"})  # fmt: skip
    assert r.status_code == 422 and "body.secret" in _loc(r) and "16 to 500 characters" in r.text
    long_secret = "S3CRET" * 100
    r = HTTP.post(f"{base.api}/alerts/webhooks", json={"name": "s", "url": "https://hooks.example.com/x",
                                                       "secret": long_secret})  # fmt: skip
    assert r.status_code == 422 and "body.secret" in _loc(r) and "S3CRET" not in r.text  # never echoed
    long_url = "https://hooks.example.com/" + "TOKEN" * 500
    r = HTTP.post(f"{base.api}/alerts/webhooks", json={"name": "l", "url": long_url})
    assert r.status_code == 422 and "body.url" in _loc(r) and "TOKEN" not in r.text


def test_urls_are_redacted_and_secrets_sealed(server):
    base, work = server
    url = "https://hooks.example.com/services/T0/B0/PATHTOKEN123?key=QUERYTOKEN"
    r = HTTP.post(f"{base.api}/alerts/webhooks", json={"name": "slackish", "url": url,
                                                       "secret": "shared-secret-0123456789"})  # fmt: skip
    assert r.status_code == 201, r.text
    hid = r.json()["id"]
    for answer in (r, HTTP.get(f"{base.api}/alerts/webhooks"), HTTP.get(f"{base.api}/alerts/webhooks/{hid}")):
        assert "PATHTOKEN123" not in answer.text and "QUERYTOKEN" not in answer.text
        assert "shared-secret-0123456789" not in answer.text
    assert r.json()["url"] == "https://hooks.example.com/…" and r.json()["has_secret"]
    with sqlite3.connect(work / "control.db") as c:
        stored_url, stored_secret = c.execute("SELECT url, secret FROM webhooks WHERE id = ?", (hid,)).fetchone()
    assert stored_url == url  # deliveries need the full URL...
    assert stored_secret.startswith("fernet:") and "shared-secret" not in stored_secret  # ...not the secret
    assert "PATHTOKEN123" not in base.log() and "shared-secret" not in base.log()


def test_receiver_answers_are_never_echoed_back(server, rx):
    base, work = server
    r = HTTP.post(f"{base.api}/alerts/webhooks", json={"name": "failing", "url": rx.url})
    assert r.status_code == 201, r.text
    hid = r.json()["id"]
    now = time.time_ns()
    alert = {"status": "firing", "labels": {"alertname": "FleetscopeHang", "job": "j"}, "annotations": {}}
    with sqlite3.connect(work / "control.db", timeout=30) as c:
        iid = c.execute(
            "INSERT INTO incidents (job, key, kind, status, severity, summary, ranks, hosts, group_id, score, "
            "est_slowdown, first_step, last_step, evidence, opened_ns, updated_ns, last_seen_ns, acknowledged_by, "
            "resolution, num_updates) VALUES ('j', 'hang', 'hang', 'open', 'critical', 'x', '[3]', '[]', '', 1, 1, "
            "5, 5, '{}', ?, ?, ?, '', '', 0)", (now, now, now)).lastrowid  # fmt: skip
        c.execute(
            "INSERT INTO alert_outbox (webhook_id, incident_id, rule_id, dedup_key, group_key, alert_status, alert, "
            "status, attempts, next_attempt_ns, last_error, created_ns) "
            "VALUES (?, ?, 1, ?, 'g', 'firing', ?, 'pending', 0, 0, '', ?)",
            (hid, iid, f"{hid}:{iid}:1:firing", json.dumps(alert), now))  # fmt: skip
    rx.wait_for_deliveries(1, timeout_s=60)
    deadline = time.monotonic() + 60
    rows = []
    while time.monotonic() < deadline and not rows:
        rows = [o for o in HTTP.get(f"{base.api}/alerts/outbox", params={"webhook_id": hid}).json() if o["attempts"]]
        time.sleep(0.2)
    assert rows and rows[0]["last_error"] == "HTTP 500"
    detail = HTTP.get(f"{base.api}/incidents/{iid}")
    assert detail.status_code == 200 and detail.json()["notifications"][0]["last_error"] == "HTTP 500"
    for text in (HTTP.get(f"{base.api}/alerts/outbox").text, detail.text, base.log()):
        assert "rx-private-0001" not in text and "receiver internals" not in text
    assert "rx-path-token" not in base.log()  # the failure is logged with the URL redacted
