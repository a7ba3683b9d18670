"""Fault test with real processes: the server is killed (SIGKILL) during alert delivery.

A real server (uvicorn subprocess) delivers a queued outbox to a loopback receiver that
answers some payloads at once and holds the others open. Once the prompt ones are
recorded as delivered and the held ones are in flight, the server's process group gets
SIGKILL. After a restart on the same database every notification must arrive at least
once, each with the same ``notification_id`` as before (what the receiver deduplicates
by); the duplicates are counted and may only be the notifications that were in flight.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleetscope.server.db import open_db
from fleetscope.server.db.diagnosis_models import AlertOutbox, Webhook
from sqlalchemy import func, select

from tests.helpers.server import ServerProcess

NUM_GROUPS = 8
ALERTS_PER_GROUP = 3
HELD_GROUPS = frozenset({"j0", "j1", "j2"})
"""Jobs whose payloads the receiver holds open during the first run (in flight at the kill)."""
LEASE_S = 4.0


class Receiver:
    """Counts notification ids on receipt; holds the payloads of HELD_GROUPS while ``hold``."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.held_in_flight = 0
        self.hold = threading.Event()
        self.hold.set()
        self.release = threading.Event()
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                job = body["groupLabels"]["job"]
                with outer.lock:
                    for a in body["alerts"]:
                        outer.counts[a["annotations"]["notification_id"]] += 1
                    held = outer.hold.is_set() and job in HELD_GROUPS
                    outer.held_in_flight += held
                if held:
                    outer.release.wait(60)  # the server dies meanwhile; this answer goes nowhere
                time.sleep(delay_s)
                try:
                    self.send_response(200)
                    self.end_headers()
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{proc.log() if proc else ''}")


def test_kill_9_during_delivery_delivers_each_notification_at_least_once(tmp_path):
    rx = Receiver()
    db_url = f"sqlite:///{tmp_path / 'control.db'}"
    queue_outbox(db_url, rx.url)
    total = NUM_GROUPS * ALERTS_PER_GROUP
    prompt = (NUM_GROUPS - len(HELD_GROUPS)) * ALERTS_PER_GROUP
    server = ServerProcess(tmp_path, db_url=db_url, webhook_allow="127.0.0.1", alert_lease_s=LEASE_S)
    try:
        server.start()
        wait_until(lambda: rx.held_in_flight == len(HELD_GROUPS) and delivered(db_url) == prompt, 60,
                   "prompt payloads recorded, held ones in flight", server)  # fmt: skip
        first_ids = set(rx.counts)
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
    assert set(rx.counts) == first_ids  # the same stable ids: the receiver can deduplicate
    assert all(n >= 1 for n in rx.counts.values())  # at least once
    duplicates = sum(n - 1 for n in rx.counts.values())
    in_flight = len(HELD_GROUPS) * ALERTS_PER_GROUP
    print(f"\nkill -9 during delivery: {total} notifications, {prompt} acknowledged before the kill, "
          f"{in_flight} in flight; after restart {duplicates} duplicate(s), 0 lost; "
          f"all delivered {recovered_s:.1f} s after the kill (lease {LEASE_S} s)")
    held = _held_ids(db_url)
    assert len(held) == in_flight and duplicates <= in_flight  # only what was in flight is sent again
    assert all(rx.counts[i] == 1 for i in first_ids - held)  # acknowledged before the kill: never resent


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
    rx = Receiver(delay_s=0.3)
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
        received_at_kill = sum(rx.counts.values())
        server.start()
        wait_until(lambda: delivered(db_url) == total, 60, "every row delivered after the restart", server)
    finally:
        server.stop()
        rx.close()
    duplicates = sum(n - 1 for n in rx.counts.values())
    print(f"\nkill -9 mid-stream: {total} notifications, {acked_at_kill} recorded delivered and "
          f"{received_at_kill} received at the kill; {duplicates} duplicate(s) after restart, 0 lost")
    assert len(rx.counts) == total and min(rx.counts.values()) >= 1  # at least once, stable ids
    assert duplicates <= total - acked_at_kill  # only rows not yet recorded can come again
