"""Fault test with real processes: the server is killed (SIGKILL) during alert delivery.

A real server (uvicorn subprocess) delivers a queued outbox to a loopback receiver that
answers some payloads at once and holds the others open. Once the prompt ones are
recorded as delivered and the held ones are in flight, the server's process group gets
SIGKILL. After a restart on the same database every notification must arrive at least
once, each with the same ``notification_id`` as before (what the receiver deduplicates
by); the duplicates are counted and may only be the notifications that were in flight.
"""

from __future__ import annotations

import json
import threading
import time

from fleetscope.server.db import open_db
from fleetscope.server.db.diagnosis_models import AlertOutbox, Webhook
from sqlalchemy import func, select

from tests.helpers.server import ServerProcess
from tests.helpers.waiting import wait_for
from tests.helpers.webhooks import Delivery, WebhookReceiver

NUM_GROUPS = 8
ALERTS_PER_GROUP = 3
HELD_GROUPS = frozenset({"j0", "j1", "j2"})
"""Jobs whose payloads the receiver holds open during the first run (in flight at the kill)."""
LEASE_S = 4.0


class HoldingReceiver(WebhookReceiver):
    """Holds the payloads of HELD_GROUPS open while ``hold`` is set (counted on receipt)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.held_in_flight = 0
        self.hold = threading.Event()
        self.hold.set()
        self.release = threading.Event()
        self._held_lock = threading.Lock()
        super().__init__(delay_s=delay_s, on_post=self._maybe_hold)

    def _maybe_hold(self, delivery: Delivery) -> None:
        with self._held_lock:
            held = self.hold.is_set() and delivery.json()["groupLabels"]["job"] in HELD_GROUPS
            self.held_in_flight += held
        if held:
            self.release.wait(60)  # the server dies meanwhile; this answer goes nowhere

    def close(self) -> None:
        self.release.set()
        super().close()


def queue_outbox(db_url: str, url: str, num_groups: int = NUM_GROUPS) -> None:
    maker = open_db(db_url)  # the product's migrations
    with maker() as s:
        hook = Webhook(name="rx", url=url, timeout_s=30)
        s.add(hook)
        s.flush()
        for g in range(num_groups):
            for k in range(ALERTS_PER_GROUP):
                alert = {"status": "firing", "labels": {"alertname": "FleetscopeHang", "job": f"j{g}",
                                                        "incident": str(g * 10 + k)},
                         "annotations": {"summary": f"hang {g}.{k}"}}  # fmt: skip
                s.add(AlertOutbox(webhook_id=hook.id, incident_id=g * 10 + k, rule_id=2,
                                  dedup_key=f"{hook.id}:{g * 10 + k}:2:firing",
                                  group_key=f'{{}}:{{alertname="FleetscopeHang", job="j{g}"}}',
                                  alert_status="firing", alert=json.dumps(alert), status="pending",
                                  next_attempt_ns=0, created_ns=time.time_ns()))  # fmt: skip
        s.commit()
    maker.kw["bind"].dispose()


def delivered(db_url: str) -> int:
    maker = open_db(db_url, migrate=False)
    try:
        with maker() as s:
            return int(s.scalar(select(func.count()).select_from(AlertOutbox).where(AlertOutbox.status == "delivered")))
    finally:
        maker.kw["bind"].dispose()


def wait_until(fn, timeout_s: float, what: str, proc: ServerProcess | None = None):
    """:func:`wait_for`, with the server's log in the failure."""
    try:
        return wait_for(fn, timeout_s, what)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{proc.log() if proc else ''}") from None


def test_kill_9_during_delivery_delivers_each_notification_at_least_once(tmp_path):
    rx = HoldingReceiver()
    db_url = f"sqlite:///{tmp_path / 'control.db'}"
    queue_outbox(db_url, rx.url)
    total = NUM_GROUPS * ALERTS_PER_GROUP
    prompt = (NUM_GROUPS - len(HELD_GROUPS)) * ALERTS_PER_GROUP
    server = ServerProcess(tmp_path, db_url=db_url, webhook_allow="127.0.0.1", alert_lease_s=LEASE_S)
    try:
        server.start()
        wait_until(lambda: rx.held_in_flight == len(HELD_GROUPS) and delivered(db_url) == prompt, 60,
                   "prompt payloads recorded, held ones in flight", server)  # fmt: skip
        first_ids = set(rx.notification_counts())
        assert len(first_ids) == total  # everything was sent once before the crash
        server.kill()  # SIGKILL to the process group, mid-delivery
        rx.hold.clear()  # after the restart the receiver answers everything at once
        rx.release.set()
        killed_at = time.monotonic()
        server.start()  # same database, new process: the dead one's claims must expire first
        wait_until(lambda: delivered(db_url) == total, 60, "every row delivered after the restart", server)
        recovered_s = time.monotonic() - killed_at
    finally:
        server.stop()
        rx.close()
    counts = rx.notification_counts()
    assert set(counts) == first_ids  # the same stable ids: the receiver can deduplicate
    assert all(n >= 1 for n in counts.values())  # at least once
    duplicates = sum(n - 1 for n in counts.values())
    in_flight = len(HELD_GROUPS) * ALERTS_PER_GROUP
    print(f"\nkill -9 during delivery: {total} notifications, {prompt} acknowledged before the kill, "
          f"{in_flight} in flight; after restart {duplicates} duplicate(s), 0 lost; "
          f"all delivered {recovered_s:.1f} s after the kill (lease {LEASE_S} s)")
    held = _held_ids(db_url)
    assert len(held) == in_flight and duplicates <= in_flight  # only what was in flight is sent again
    assert all(counts[i] == 1 for i in first_ids - held)  # acknowledged before the kill: never resent


def _held_ids(db_url: str) -> set[str]:
    from fleetscope.server.alerts.outbox import notification_id

    maker = open_db(db_url, migrate=False)
    try:
        with maker() as s:
            rows = list(s.scalars(select(AlertOutbox)))
            return {notification_id(r) for r in rows if json.loads(r.alert)["labels"]["job"] in HELD_GROUPS}
    finally:
        maker.kw["bind"].dispose()


def test_kill_9_at_an_arbitrary_moment_loses_nothing_and_resends_only_unrecorded_rows(tmp_path):
    """No held payloads: every answer takes a moment, and the kill falls mid-stream."""
    num_groups = 40
    rx = HoldingReceiver(delay_s=0.3)
    rx.hold.clear()
    db_url = f"sqlite:///{tmp_path / 'control.db'}"
    queue_outbox(db_url, rx.url, num_groups)
    total = num_groups * ALERTS_PER_GROUP
    server = ServerProcess(tmp_path, db_url=db_url, webhook_allow="127.0.0.1", alert_lease_s=LEASE_S)
    try:
        server.start()
        wait_until(lambda: 0 < delivered(db_url) < total, 60, "deliveries under way", server)
        server.kill()
        acked_at_kill = delivered(db_url)
        received_at_kill = sum(rx.notification_counts().values())
        server.start()
        wait_until(lambda: delivered(db_url) == total, 60, "every row delivered after the restart", server)
    finally:
        server.stop()
        rx.close()
    counts = rx.notification_counts()
    duplicates = sum(n - 1 for n in counts.values())
    print(f"\nkill -9 mid-stream: {total} notifications, {acked_at_kill} recorded delivered and "
          f"{received_at_kill} received at the kill; {duplicates} duplicate(s) after restart, 0 lost")
    assert len(counts) == total and min(counts.values()) >= 1  # at least once, stable ids
    assert duplicates <= total - acked_at_kill  # only rows not yet recorded can come again
