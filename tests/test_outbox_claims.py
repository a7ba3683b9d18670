"""Server replicas sharing one alert outbox: rows are claimed per row with a lease.

Two dispatchers (each with its own engine, as two replicas have) race on one outbox in
real threads against a real loopback receiver; no notification may arrive twice. On
SQLite always; on PostgreSQL where the machine has its server binaries (a throwaway
server on loopback, :mod:`tests.helpers.postgres`; skipped otherwise). The PostgreSQL
claim statement is also compiled with the postgresql dialect and must lock with
``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from fleetscope.server.alerts.dispatcher import AlertDispatcher
from fleetscope.server.alerts.guard import WebhookGuard
from fleetscope.server.alerts.outbox import claim_due, claim_statement, notification_id
from fleetscope.server.db import open_db
from fleetscope.server.db.diagnosis_models import AlertOutbox, Webhook
from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite

from tests.helpers.postgres import postgres_server
from tests.helpers.server import ServerProcess
from tests.helpers.webhooks import WebhookReceiver

NUM_ROWS = 120


def fill_outbox(maker, url: str, n: int, first: int = 0) -> None:
    with maker() as s:
        hook = s.scalar(select(Webhook).where(Webhook.name == "rx"))
        if hook is None:
            hook = Webhook(name="rx", url=url)
            s.add(hook)
            s.flush()
        for i in range(first, first + n):
            alert = {"status": "firing", "labels": {"alertname": "FleetscopeHang", "job": f"j{i}"},
                     "annotations": {"summary": f"hang {i}"}}  # fmt: skip
            s.add(AlertOutbox(webhook_id=hook.id, incident_id=i, rule_id=1, dedup_key=f"{hook.id}:{i}:1:firing",
                              group_key=f"g{i % 40}", alert_status="firing", alert=json.dumps(alert),
                              status="pending", next_attempt_ns=0, created_ns=0))  # fmt: skip
        s.commit()


def test_two_dispatchers_racing_on_one_sqlite_outbox_deliver_each_notification_once(tmp_path):
    race(f"sqlite:///{tmp_path / 'c.db'}")


def test_two_dispatchers_racing_on_one_postgresql_outbox_deliver_each_notification_once():
    with postgres_server() as url:
        race(url)  # FOR UPDATE SKIP LOCKED executed, not only compiled


def race(url: str) -> None:
    first = open_db(url)
    rx = WebhookReceiver(delay_s=0.005)  # a receiver that takes a moment widens the race
    fill_outbox(first, rx.url, NUM_ROWS)
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def replica(name: str, batch: int) -> None:
        maker = open_db(url, migrate=False)  # its own engine and connections, like another replica
        d = AlertDispatcher(maker, guard=WebhookGuard("127.0.0.1"), replica=name, batch=batch)

        async def run() -> None:
            async with httpx.AsyncClient() as client:
                start.wait()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    await d.deliver_due(client)
                    with maker() as s:
                        left = s.scalar(select(func.count()).select_from(AlertOutbox)
                                        .where(AlertOutbox.status != "delivered"))
                    if not left:
                        return

        try:
            asyncio.run(run())
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=replica, args=(f"replica-{i}", 7 + i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    rx.close()
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    with first() as s:
        rows = list(s.scalars(select(AlertOutbox)))
        expected = {notification_id(r) for r in rows}
    assert all(r.status == "delivered" and r.claim == "" for r in rows)
    counts = rx.notification_counts()
    assert set(counts) == expected  # every notification arrived...
    twice = {k: v for k, v in counts.items() if v > 1}
    assert not twice, f"{len(twice)} notifications delivered more than once"  # ...exactly once


def test_a_claim_holds_until_its_lease_expires_then_another_replica_takes_the_rows(tmp_path):
    claims_hold_until_their_lease_expires(f"sqlite:///{tmp_path / 'c.db'}")


def test_a_postgresql_claim_holds_until_its_lease_expires():
    with postgres_server() as url:
        claims_hold_until_their_lease_expires(url)


def claims_hold_until_their_lease_expires(url: str) -> None:
    maker = open_db(url)
    fill_outbox(maker, "http://127.0.0.1:9/hook", 5)
    lease = 10 * 10**9
    with maker() as s:
        a = claim_due(s, 1000, "a:1", lease)
        assert sum(len(v) for v in a.values()) == 5
        assert claim_due(s, 1000 + lease - 1, "b:1", lease) == {}  # held by a (a "crashed" replica)
        b = claim_due(s, 1000 + lease, "b:1", lease)  # a's lease ran out: b delivers them
        assert sum(len(v) for v in b.values()) == 5
    with maker() as s:
        assert {r.claim for r in s.scalars(select(AlertOutbox))} == {"b:1"}


def test_postgresql_claim_locks_rows_with_skip_locked():
    stmt = claim_statement(now_ns=5, token="r:1", lease_ns=10, limit=50)
    pg = str(stmt.compile(dialect=postgresql.dialect())).upper()
    assert pg.startswith("UPDATE ALERT_OUTBOX SET CLAIM=")
    assert "FOR UPDATE SKIP LOCKED" in pg  # concurrent replicas skip each other's rows
    assert pg.index("FOR UPDATE SKIP LOCKED") < pg.index("RETURNING")  # inside the subquery
    assert "ALERT_OUTBOX.LEASE_UNTIL_NS <=" in pg.split("FOR UPDATE")[1]  # re-checked by the UPDATE
    assert pg.rstrip().endswith("RETURNING ALERT_OUTBOX.ID")
    lite = str(stmt.compile(dialect=sqlite.dialect())).upper()
    assert "FOR UPDATE" not in lite and "RETURNING" in lite  # SQLite: one atomic UPDATE instead


@pytest.mark.parametrize("dialect", [postgresql.dialect(), sqlite.dialect()])
def test_claim_statement_binds_every_value_as_a_parameter(dialect):
    compiled = claim_statement(now_ns=123456789, token="host:42:abc:7", lease_ns=10, limit=50).compile(dialect=dialect)
    assert "host:42:abc:7" not in str(compiled) and "123456789" not in str(compiled)
    assert "host:42:abc:7" in compiled.params.values()


def test_two_server_processes_on_one_postgresql_deliver_each_notification_once(tmp_path):
    """Two whole replicas (uvicorn subprocesses, own embedded stores, one PostgreSQL DB)."""
    with postgres_server() as url:
        open_db(url).kw["bind"].dispose()  # schema first, so the replicas start side by side
        rx = WebhookReceiver(delay_s=0.3)  # claims stay visible while the posts are in flight
        servers = [ServerProcess(tmp_path / f"replica-{i}", db_url=url, webhook_allow="127.0.0.1") for i in (1, 2)]
        try:
            for s in servers:
                s.start()
            maker = open_db(url, migrate=False)
            claimers: set[str] = set()  # which processes held claims (token: host:pid:nonce:pass)
            waves, per_wave = 12, NUM_ROWS // 12
            next_wave, deadline = time.monotonic(), time.monotonic() + 60
            while time.monotonic() < deadline:
                if waves and time.monotonic() >= next_wave:  # rows keep arriving while both poll
                    fill_outbox(maker, rx.url, per_wave, first=(12 - waves) * per_wave)
                    waves, next_wave = waves - 1, time.monotonic() + 0.25
                with maker() as s:
                    claimers |= {c.split(":")[1] for c in s.scalars(select(AlertOutbox.claim).distinct()) if c}
                    left = s.scalar(select(func.count()).select_from(AlertOutbox).where(AlertOutbox.status != "delivered"))
                if not left and not waves:
                    break
                time.sleep(0.02)
            with maker() as s:
                rows = list(s.scalars(select(AlertOutbox)))
            maker.kw["bind"].dispose()
        finally:
            for s in servers:
                s.stop()
            rx.close()
    assert all(r.status == "delivered" and r.claim == "" for r in rows), [s.log()[-2000:] for s in servers]
    assert len(claimers) == 2, claimers  # both replicas delivered part of the outbox
    counts = rx.notification_counts()
    assert set(counts) == {notification_id(r) for r in rows}
    assert max(counts.values()) == 1, sum(n - 1 for n in counts.values())
