"""Webhook hardening without a server: the SSRF guard and address pinning, one bad URL
isolated in the delivery pass, signatures that never raise, sealed secrets, redaction."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest
from fleetscope.server.alerts.dispatcher import AlertDispatcher
from fleetscope.server.alerts.guard import (
    AllowList,
    WebhookGuard,
    WebhookURLError,
    check_target,
    redact_url,
)
from fleetscope.server.alerts.secrets import SecretBox, SecretKeyError, seal_legacy
from fleetscope.server.alerts.signing import sign_headers, verify
from fleetscope.server.db import open_db
from fleetscope.server.db.diagnosis_models import AlertOutbox, Webhook
from fleetscope.server.settings import Settings
from pydantic import ValidationError
from sqlalchemy import select

from tests.helpers.webhooks import WebhookReceiver

KEY = "k" * 40


@pytest.mark.parametrize("url,reason", [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),  # cloud metadata
    ("http://127.0.0.1:8000/api/v1/alerts/rules", "loopback"),
    ("http://[::1]:8000/", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "loopback"),  # IPv4-mapped IPv6
    ("http://10.0.0.7/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://[fd00::1]/", "private"),
    ("http://[fe80::1]/", "link-local"),
    ("http://0.0.0.0:8000/", "unspecified"),
    ("http://100.64.0.1/", "not globally routable"),  # shared address space (CGNAT)
    ("http://224.0.0.1/", "multicast"),
    ("http://localhost:9090/", "localhost"),
    ("http://2130706433:8000/", "loopback"),  # 127.0.0.1 as one number, as the C resolver reads it
    ("http://0x7f.1/", "loopback"),
    ("http://0177.0.0.1/", "not a valid URL"),  # httpx refuses octal quads outright
    ("https://ops:hunter2@hooks.example.com/x", "credentials"),
    ("https://x:abc/", "not a valid URL"),
    ("ftp://hooks.example.com/", "scheme"),
    ("https://hooks.example.com/x#frag", "fragment"),
    ("https://hooks.example.com/\ud800", "UTF-8"),  # a lone surrogate, as JSON can carry
])  # fmt: skip
def test_guard_refuses_internal_targets_credentials_and_malformed_urls(url, reason):
    with pytest.raises(WebhookURLError, match=reason) as e:
        check_target(url, AllowList())
    assert "hunter2" not in str(e.value)


def test_allow_list_admits_named_networks_addresses_and_hosts():
    allow = AllowList.parse("127.0.0.1, 10.20.0.0/16 alertmanager.internal")
    assert check_target("http://127.0.0.1:9/h", allow)
    assert check_target("http://10.20.3.4/h", allow)
    assert check_target("http://alertmanager.internal/h", allow)
    with pytest.raises(WebhookURLError, match="private"):
        check_target("http://10.21.0.1/h", allow)
    with pytest.raises(WebhookURLError, match="loopback"):
        check_target("http://127.0.0.2/h", allow)
    assert check_target("https://hooks.example.com/services/T/B/X", AllowList())  # public names pass
    with pytest.raises(ValidationError, match="webhook_allow"):
        Settings(webhook_allow="10.0.0.0/8, not a host!")
    with pytest.raises(ValidationError, match="32 characters"):
        Settings(webhook_secret_key="short")


def test_every_resolved_address_is_checked_and_the_connection_is_pinned_to_it():
    calls = []

    def rebinding_dns(host, port):  # public for the check, loopback for a second lookup
        calls.append(host)
        return ["93.184.216.34"] if len(calls) == 1 else ["127.0.0.1"]

    g = WebhookGuard(resolver=rebinding_dns)
    t = g.pin("https://hooks.example.com:8443/services/x?token=1")
    assert len(calls) == 1 and t.address == "93.184.216.34"
    assert str(t.url) == "https://93.184.216.34:8443/services/x?token=1"  # connect to what was checked
    assert t.headers == {"Host": "hooks.example.com:8443"} and t.extensions == {"sni_hostname": "hooks.example.com"}
    with pytest.raises(WebhookURLError, match="loopback"):
        g.pin("https://hooks.example.com/")  # the next lookup answers loopback: refused
    mixed = WebhookGuard(resolver=lambda h, p: ["93.184.216.34", "169.254.169.254"])
    with pytest.raises(WebhookURLError, match="link-local"):
        mixed.pin("https://hooks.example.com/")
    with pytest.raises(WebhookURLError, match="does not resolve") as e:
        WebhookGuard(resolver=lambda h, p: (_ for _ in ()).throw(OSError("nxdomain"))).pin("http://nx.test/")
    assert e.value.transient


@pytest.fixture
def db(tmp_path):
    return open_db(f"sqlite:///{tmp_path / 'c.db'}")


def queue(db, hook: Webhook, n: int = 1) -> list[int]:
    ids = []
    with db() as s:
        s.add(hook)
        s.flush()
        for i in range(n):
            alert = {"status": "firing", "labels": {"alertname": "FleetscopeHang", "job": hook.name},
                     "annotations": {"summary": "s"}}  # fmt: skip
            row = AlertOutbox(webhook_id=hook.id, incident_id=i, rule_id=1, dedup_key=f"{hook.name}:{i}",
                              group_key=hook.name, alert_status="firing", alert=json.dumps(alert),
                              status="pending", next_attempt_ns=0, created_ns=0)  # fmt: skip
            s.add(row)
            s.flush()
            ids.append(row.id)
        s.commit()
    return ids


def one_pass(d: AlertDispatcher) -> int:
    async def go():
        async with httpx.AsyncClient() as client:
            return await d.deliver_due(client)

    return asyncio.run(go())


def rows_of(db, hook_name: str) -> list[AlertOutbox]:
    with db() as s:
        return list(s.scalars(select(AlertOutbox).join(Webhook).where(Webhook.name == hook_name)))


def test_one_invalid_webhook_url_fails_alone_and_is_not_reposted(db):
    rx = WebhookReceiver()
    try:
        queue(db, Webhook(name="broken", url="https://x:abc/"), 2)  # stored before URLs were validated
        queue(db, Webhook(name="good", url=f"http://hooks.test:{rx.port}/hook"), 1)
        d = AlertDispatcher(db, guard=WebhookGuard("127.0.0.1", resolver=lambda h, p: ["127.0.0.1"]))
        assert one_pass(d) == 1
        assert len(rx.deliveries) == 1 and rx.deliveries[0].headers["Host"] == f"hooks.test:{rx.port}"  # pinned, sent by name
        broken = rows_of(db, "broken")
        assert [r.status for r in broken] == ["failed", "failed"] and "not a valid URL" in broken[0].last_error
        assert [r.status for r in rows_of(db, "good")] == ["delivered"]
        assert one_pass(d) == 0 and len(rx.deliveries) == 1  # nothing is posted again
    finally:
        rx.close()


def test_refused_targets_get_no_request_and_fail_at_once(db, caplog):
    rx = WebhookReceiver()
    try:
        queue(db, Webhook(name="loop", url=f"http://127.0.0.1:{rx.port}/hook", max_attempts=12))
        queue(db, Webhook(name="rebind", url=f"http://evil.test:{rx.port}/services/T0/B0/SECRETTOKEN"))
        d = AlertDispatcher(db, guard=WebhookGuard(resolver=lambda h, p: ["127.0.0.1"]))
        with caplog.at_level(logging.WARNING):
            assert one_pass(d) == 0
        assert rx.deliveries == []
        for name in ("loop", "rebind"):
            (row,) = rows_of(db, name)
            assert row.status == "failed" and row.attempts == 1 and "loopback" in row.last_error
        assert "SECRETTOKEN" not in caplog.text and "evil.test" in caplog.text  # logs show the URL redacted
    finally:
        rx.close()


def test_answers_are_recorded_by_status_only(db):
    rx = WebhookReceiver(status=500, answer=b"internal receiver detail: db password is hunter2")
    try:
        queue(db, Webhook(name="r", url=f"http://127.0.0.1:{rx.port}/hook"))
        assert one_pass(AlertDispatcher(db, guard=WebhookGuard("127.0.0.1"))) == 0
        (row,) = rows_of(db, "r")
        assert row.last_error == "HTTP 500" and row.status == "pending"
    finally:
        rx.close()


def test_payload_alerts_carry_a_stable_notification_id(db):
    rx = WebhookReceiver(status=503)
    try:
        queue(db, Webhook(name="r", url=f"http://127.0.0.1:{rx.port}/hook"), 3)
        d = AlertDispatcher(db, guard=WebhookGuard("127.0.0.1"), retry_base_s=0.001, retry_max_s=0.001)
        one_pass(d)
        time.sleep(0.01)
        one_pass(d)  # a retry: same ids, same delivery header
        assert len(rx.deliveries) == 2
        ids = [[a["annotations"]["notification_id"] for a in d.json()["alerts"]] for d in rx.deliveries]
        assert ids[0] == ids[1] and len(set(ids[0])) == 3
        assert rx.deliveries[0].headers["X-Fleetscope-Delivery"] == rx.deliveries[1].headers["X-Fleetscope-Delivery"]
    finally:
        rx.close()


@pytest.mark.parametrize("signature", ["sha256=é", "ü" * 71, "sha256=" + "0" * 63 + "\u0660"])
def test_verify_returns_false_on_non_ascii_signature(signature):
    h = sign_headers("s" * 20, b"{}", now_s=1000)
    h["X-Fleetscope-Signature"] = signature
    assert verify("s" * 20, h, b"{}", now_s=1000) is False
    h = sign_headers("s" * 20, b"{}", now_s=1000)
    h["X-Fleetscope-Timestamp"] = "\u0661\u0660\u0660\u0660"  # Arabic-Indic digits that int() accepts
    assert verify("s" * 20, h, b"{}", now_s=1000) is False


def test_secrets_are_sealed_at_rest_and_legacy_plaintext_gets_sealed(db):
    box = SecretBox(KEY)
    sealed = box.seal("a-long-shared-secret")
    assert "a-long-shared-secret" not in sealed and box.open(sealed) == "a-long-shared-secret"
    assert box.seal("") == "" and box.open("") == ""
    with pytest.raises(SecretKeyError, match="FLEETSCOPE_WEBHOOK_SECRET_KEY"):
        SecretBox("z" * 40).open(sealed)
    with db() as s:
        s.add(Webhook(name="old", url="https://hooks.example.com/", secret="plaintext-secret-123"))
        s.commit()
        assert seal_legacy(s, box) == 1 and seal_legacy(s, box) == 0
    with db() as s:
        stored = s.scalar(select(Webhook.secret))
    assert "plaintext-secret-123" not in stored and box.open(stored) == "plaintext-secret-123"


def test_redacted_urls_show_no_path_query_or_credentials():
    assert redact_url("https://hooks.slack.com/services/T0/B0/XXXXSECRET") == "https://hooks.slack.com/…"
    assert redact_url("https://u:p@h.example:8443/a?token=1") == "https://h.example:8443/…"
    assert redact_url("http://[::1]:9/") == "http://[::1]:9/"
    assert "abc" not in redact_url("https://x:abc/")


def test_send_now_applies_the_guard_and_opens_the_sealed_secret(db):
    rx = WebhookReceiver()
    box = SecretBox(KEY)
    try:
        ok_hook = Webhook(name="ok", url=f"http://127.0.0.1:{rx.port}/hook", secret=box.seal("s" * 20))
        refused = Webhook(name="no", url="http://169.254.169.254/latest/meta-data/")
        d = AlertDispatcher(db, guard=WebhookGuard("127.0.0.1"), secrets=box)

        async def go():
            async with httpx.AsyncClient() as client:
                return await d.send_now(client, ok_hook, b"{}"), await d.send_now(client, refused, b"{}")

        ok, no = asyncio.run(go())
        assert ok.ok and verify("s" * 20, rx.deliveries[0].headers, rx.deliveries[0].body)  # signed with the opened secret
        assert not no.ok and no.permanent and "link-local" in no.error and len(rx.deliveries) == 1
    finally:
        rx.close()


def test_errors_recorded_by_older_versions_show_only_the_status():
    from fleetscope.server.alerts.outbox import public_error

    assert public_error("HTTP 500: internal receiver detail: db password is hunter2") == "HTTP 500"
    assert public_error("HTTP 503") == "HTTP 503"
    assert public_error("ConnectError") == "ConnectError"
