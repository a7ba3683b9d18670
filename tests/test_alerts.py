"""Alerts without a server: Alertmanager payloads, HMAC signatures, rules, outbox dedup,
backoff and incidents lifecycle on a real SQLite DB migrated by Alembic."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from fleetscope.server.alerts.dispatcher import AlertDispatcher
from fleetscope.server.alerts.guard import WebhookGuard
from fleetscope.server.alerts.outbox import backoff_ns, due_groups, enqueue_incident
from fleetscope.server.alerts.payload import build_payload, fingerprint, incident_alert, rfc3339
from fleetscope.server.alerts.rules import install_defaults, rule_matches
from fleetscope.server.alerts.signing import sign_headers, verify
from fleetscope.server.db import open_db
from fleetscope.server.db.diagnosis_models import AlertOutbox, AlertRule, Incident, Webhook
from fleetscope.server.diagnosis.findings import Finding, FindingKind, Severity
from fleetscope.server.diagnosis.incidents import sync_incidents
from sqlalchemy import select

from tests.helpers.webhooks import WebhookReceiver

NOW = 1_764_460_800_000_000_000
PUBLIC_DNS = WebhookGuard(resolver=lambda host, port: ["93.184.216.34"])
"""recv.test resolves to a public address (the mock transport never connects)."""


@pytest.fixture
def db(tmp_path):
    maker = open_db(f"sqlite:///{tmp_path / 'c.db'}")
    with maker() as s:
        assert install_defaults(s) == 6
        assert install_defaults(s) == 0  # idempotent
    return maker


def straggler(slowdown=0.2, first=10, last=30, ranks=(5,)):
    return Finding(FindingKind.SLOW_COMPUTE, "j", ranks, 3.0, "rank 5 slow", Severity.WARNING,
                   hosts=("h1",), first_step=first, last_step=last, est_slowdown=slowdown,
                   evidence={"busy_ms": 12.5})


def test_signature_roundtrip_and_replay():
    body = b'{"a":1}'
    h = sign_headers("k" * 20, body, now_s=1000)
    assert h["X-Fleetscope-Signature"].startswith("sha256=")
    assert verify("k" * 20, h, body, now_s=1010)
    assert not verify("k" * 20, h, body + b" ", now_s=1010)
    assert not verify("k" * 20, h, body, now_s=5000)  # stale timestamp
    assert sign_headers("", body) == {}


def test_incident_lifecycle_and_payload(db):
    with db() as s:
        ch = sync_incidents(s, "j", [straggler()], NOW, resolve_after_s=10)
        assert [c.what for c in ch] == ["opened"]
        ch = sync_incidents(s, "j", [straggler(last=31)], NOW + 10**9, resolve_after_s=10)
        assert [c.what for c in ch] == ["updated"]
        ch = sync_incidents(s, "j", [straggler(last=31)], NOW + 2 * 10**9, resolve_after_s=10)
        assert ch == []  # nothing material changed
        assert sync_incidents(s, "j", [], NOW + 5 * 10**9, resolve_after_s=10) == []
        ch = sync_incidents(s, "j", [], NOW + 20 * 10**9, resolve_after_s=10)
        assert [c.what for c in ch] == ["resolved"]
        inc = ch[0].incident
        assert s.scalar(select(Incident).where(Incident.id == inc.id)).status == "resolved"
        rule = s.scalar(select(AlertRule).where(AlertRule.name == "straggler-5pct"))
        alert = incident_alert(inc, rule, "resolved", "http://ctl:8000")
        assert alert["endsAt"] == rfc3339(inc.resolved_ns) and alert["startsAt"].endswith("Z")
        assert json.loads(alert["annotations"]["culprit_ranks"]) == [5]
        assert alert["fingerprint"] == fingerprint(alert["labels"])
        p = build_payload("oncall", [alert, {**alert, "status": "firing"}], "http://ctl:8000")
        assert p["version"] == "4" and p["status"] == "firing" and p["receiver"] == "oncall"
        assert p["groupLabels"] == {"alertname": "FleetscopeStraggler", "job": "j"}
        assert p["groupKey"] == '{}:{alertname="FleetscopeStraggler", job="j"}'


def test_rules_thresholds(db):
    with db() as s:
        rule = s.scalar(select(AlertRule).where(AlertRule.name == "straggler-5pct"))
        inc = Incident(job="j", key="k", kind="slow_compute", est_slowdown=0.2, first_step=10, last_step=30)
        assert rule_matches(rule, inc)
        inc.est_slowdown = 0.01
        assert not rule_matches(rule, inc)
        inc.est_slowdown, inc.last_step = 0.2, 12
        assert not rule_matches(rule, inc)  # not persistent enough yet
        # a rank that waits for a core slows the job like a straggler: the same rule
        assert rule_matches(rule, Incident(job="j", kind="host_contention", est_slowdown=0.2,
                                           first_step=10, last_step=30))
        rule.job = "other"
        assert not rule_matches(rule, Incident(job="j", kind="slow_compute", est_slowdown=0.2,
                                               first_step=0, last_step=30))


def test_outbox_dedup_grouping_and_backoff(db):
    with db() as s:
        s.add_all([Webhook(name="a", url="http://127.0.0.1:1/a", secret="x" * 16),
                   Webhook(name="b", url="http://127.0.0.1:1/b", filter_kinds='["hang"]')])
        s.commit()
        ch = sync_incidents(s, "j", [straggler(), straggler(ranks=(2,))], NOW, 10)
        n = sum(enqueue_incident(s, c.incident, NOW) for c in ch)
        assert n == 2  # both incidents to webhook a only (b filters to hangs)
        assert sum(enqueue_incident(s, c.incident, NOW) for c in ch) == 0  # dedup
        groups = due_groups(s, NOW)
        assert len(groups) == 1 and len(next(iter(groups.values()))) == 2  # grouped into one payload
        delays = [backoff_ns(a, 1.0, 60.0) / 1e9 for a in (1, 2, 3, 10)]
        assert 0.5 <= delays[0] <= 1 and 1 <= delays[1] <= 2 and 2 <= delays[2] <= 4 and delays[3] <= 60


def test_dispatcher_retries_then_delivers(db):
    got = []
    fail = {"n": 2}

    def handler(request: httpx.Request) -> httpx.Response:
        if fail["n"] > 0:
            fail["n"] -= 1
            return httpx.Response(500, text="boom")
        got.append(request)
        return httpx.Response(200)

    with db() as s:
        s.add(Webhook(name="a", url="http://recv.test/hook", secret="s" * 16, max_attempts=5))
        s.commit()
        for c in sync_incidents(s, "j", [straggler()], NOW, 10):
            enqueue_incident(s, c.incident, 0)
    d = AlertDispatcher(db, retry_base_s=0.01, retry_max_s=0.02, guard=PUBLIC_DNS)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            for _ in range(20):
                await d.deliver_due(client)
                if got:
                    return
                await asyncio.sleep(0.03)

    asyncio.run(go())
    assert len(got) == 1 and verify("s" * 16, dict(got[0].headers), got[0].content, now_s=time.time())
    with db() as s:
        row = s.scalar(select(AlertOutbox))
        assert row.status == "delivered" and row.attempts == 3
        assert row.last_error == "HTTP 500"  # the answer's status only, never its body ("boom")


def test_dispatcher_woken_from_a_worker_thread_delivers_at_once(db):
    """The diagnosis pass runs in a worker thread: its wake must not wait for the poll."""
    rx = WebhookReceiver()
    with db() as s:
        s.add(Webhook(name="a", url=rx.url))
        s.commit()
    d = AlertDispatcher(db, poll_s=60.0, guard=WebhookGuard("127.0.0.1"))

    def queue_and_wake():
        with db() as s:
            for c in sync_incidents(s, "j", [straggler()], NOW, 10):
                enqueue_incident(s, c.incident, 0)
        d.wake()

    async def go():
        await d.start()
        await asyncio.sleep(0.3)  # the first pass found an empty outbox; next poll in 60 s
        t0 = time.monotonic()
        await asyncio.to_thread(queue_and_wake)
        await asyncio.to_thread(rx.wait_for_deliveries, 1, 5.0)
        await d.stop()
        return t0

    try:
        t0 = asyncio.run(go())
    finally:
        rx.close()
    assert rx.num_posts == 1 and rx.deliveries[0].at_monotonic_s - t0 < 3.0


def test_final_pass_of_a_finished_job_is_never_seen_open(db, tmp_path, monkeypatch):
    """A finished job's final pass stores what it finds already resolved, in one
    transaction: a reader between two commits (the API, a test polling it) must never see
    the incident open, and nothing pages for it."""
    from types import SimpleNamespace

    from fleetscope.server.alerts.outbox import OutboxSink
    from fleetscope.server.db.models import Job
    from fleetscope.server.diagnosis import loop as loop_mod
    from fleetscope.server.settings import Settings
    from sqlalchemy import event

    with db() as s:
        s.add(Job(id="j", attempt=0, status="finished", dp=2, tp=2, pp=2, updated_ns=NOW))
        s.commit()
        row = s.get(Job, "j")
    result = SimpleNamespace(findings=[straggler()])  # what close_job reads of a pass
    monkeypatch.setattr(loop_mod, "diagnose_job", lambda *a, **k: result)
    app = SimpleNamespace(state=SimpleNamespace(settings=Settings(), db=db, store=None,
                                                alert_dispatcher=None))
    diag = loop_mod.DiagnosisLoop(app, OutboxSink())
    seen: list[list[str]] = []

    def look(session):  # what another connection sees at each commit of the loop's session
        with db() as other:
            seen.append([i.status for i in other.scalars(select(Incident).where(Incident.job == "j"))])

    event.listen(db, "after_commit", look)
    try:
        assert diag.close_job(row) == 0  # nothing pages for a job that is over
    finally:
        event.remove(db, "after_commit", look)
    with db() as s:
        [inc] = s.scalars(select(Incident).where(Incident.job == "j"))
        assert inc.status == "resolved" and inc.resolution == "job finished"
        assert s.scalars(select(AlertOutbox)).all() == []
    assert seen and all(state in ([], ["resolved"]) for state in seen), seen
    diag._pool.shutdown(wait=False)


def test_pass_series_count_the_passes_of_one_job_not_the_empty_rounds(db, monkeypatch):
    """``/metrics``'s ``pass="job"``/``"hang_job"`` time one job's pass; a round whose job
    was locked by the other thread's pass counts in ``tick_due`` only (it took no time and
    diagnosed nothing: the fleet bench read such rounds as 0.00 s hang passes)."""
    from types import SimpleNamespace

    from fleetscope.server.alerts.outbox import OutboxSink
    from fleetscope.server.db.models import Job
    from fleetscope.server.diagnosis import loop as loop_mod
    from fleetscope.server.settings import Settings

    app = SimpleNamespace(state=SimpleNamespace(settings=Settings(), db=db, store=None, alert_dispatcher=None))
    diag = loop_mod.DiagnosisLoop(app, OutboxSink())
    try:
        monkeypatch.setattr(diag, "_claim", lambda job: True)
        monkeypatch.setattr(diag, "run_job", lambda row: time.sleep(0.05) or 0)
        monkeypatch.setattr(diag, "run_hang_job", lambda row: time.sleep(0.02) or 0)
        row = Job(id="j", attempt=0, status="running", dp=2, tp=2, pp=2, updated_ns=NOW)
        diag._run_jobs([row])
        diag._run_jobs([row], full=False)
        n, total, latest = diag.pass_seconds["job"]
        assert n == 1 and 0.05 <= total < 1.0
        assert diag.pass_seconds["hang_job"][0] == 1 and diag.pass_seconds["hang_job"][1] >= 0.02
        with diag._locks.setdefault("j", threading.Lock()):  # the full pass holds the job
            assert diag._run_jobs([row], full=False) == 0
        assert diag.pass_seconds["hang_job"][0] == 1  # the locked round is not a pass
    finally:
        diag._pool.shutdown(wait=False)
