"""Diagnosis + alerts through a real server (uvicorn subprocess, chdb, SQLite) with a real
webhook receiver on loopback: straggler and hang incidents, RCA routes, signed
Alertmanager payloads, CRUD validation, and an outbox that survives a restart."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from fleetscope.server.alerts.signing import verify

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.server import free_port, running_server
from tests.helpers.synthetic import MS, SynthJob

SECRET = "test-secret-0123456789"
HTTP = httpx.Client(timeout=60)


class Receiver:
    """A webhook receiver on loopback that records (headers, body) and can fail on demand."""

    def __init__(self, port: int = 0, fail: bool = False) -> None:
        self.got: list[tuple[dict, bytes, float]] = []
        self.fail = fail
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fail:
                    self.send_response(503)
                else:
                    outer.got.append((dict(self.headers), body, time.time()))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def payloads(self) -> list[dict]:
        return [json.loads(b) for _, b, _ in self.got]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ingest(api: str, records: dict[str, list[dict]], key: str) -> None:
    tables = {name: codec.rows_to_table(RECORD_TYPES[name], rows) for name, rows in records.items() if rows}
    body = codec.encode_batch(tables)
    r = HTTP.post(f"{api}/ingest", content=body, timeout=60,
                   headers={"Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": key})
    assert r.status_code == 200, r.text


def job_record(job: str, t_ns: int, status: str = "running") -> dict:
    return {"ts_ns": t_ns, "job": job, "dp": 2, "tp": 2, "pp": 2, "num_microbatches": 4,
            "model_flops_per_step": 1e12, "device_peak_flops": 0.0, "status": status, "host": "h0"}


def synth_records(job: SynthJob) -> dict[str, list[dict]]:
    f = job.build()
    out = {}
    for name, df in f.items():
        rows = df.to_dict("records")
        if name == "steps":
            for r in rows:
                r.pop("loss", None)
        out[name] = rows
    return out


def wait_for(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_straggler_and_hang_incidents_alert_webhook(tmp_path, receiver):
    with running_server(tmp_path, diagnosis_tick_s=0.5, hang_min_s=4, webhook_allow="127.0.0.1") as url:
        api = url.api
        # CRUD + validation
        assert {r["name"] for r in HTTP.get(f"{api}/alerts/rules").json()} >= {"hang", "straggler-5pct"}
        bad = HTTP.post(f"{api}/alerts/webhooks", json={"name": "x", "url": "ftp://nope"})
        assert bad.status_code == 422 and "ftp://nope" in bad.text
        bad = HTTP.post(f"{api}/alerts/rules", json={"name": "r", "kind": "nonsense"})
        assert bad.status_code == 422 and "nonsense" in bad.text
        h = HTTP.post(f"{api}/alerts/webhooks", json={"name": "recv", "url": receiver.url, "secret": SECRET})
        assert h.status_code == 201 and h.json()["has_secret"] and "secret" not in h.json()

        now = time.time_ns()
        job = SynthJob(job="strag", num_steps=30, t0_ns=now - 30 * 200 * MS,
                       compute_factor=lambda r, s: 1.3 if r == 5 and s >= 8 else 1.0)
        recs = synth_records(job)
        recs["jobs"] = [job_record("strag", now - 10 * 10**9)]
        ingest(api, recs, "strag-1")

        def straggler_incident():
            items = HTTP.get(f"{api}/incidents", params={"job": "strag", "status": "open"}).json()["items"]
            return [i for i in items if i["kind"] == "slow_compute"]

        inc = wait_for(straggler_incident, 60, "straggler incident")[0]
        assert inc["ranks"] == [5] and inc["est_slowdown"] > 0.1
        s = HTTP.get(f"{api}/jobs/strag/stragglers").json()
        assert s["items"][0]["ranks"] == [5] and s["items"][0]["kind"] == "slow_compute"
        w = HTTP.get(f"{api}/jobs/strag/whatif", params={"rank": 5}).json()
        assert 0.1 < w["est_slowdown"] < 0.35 and w["step_ms_if_fixed"] < w["predicted_step_ms"]
        assert HTTP.get(f"{api}/jobs/strag/whatif", params={"rank": 99}).status_code == 422
        m = HTTP.get(f"{api}/jobs/strag/mfu").json()
        assert m["mfu"] is None and m["flops_per_s"] > 0 and len(m["steps"]) >= 20
        assert HTTP.get(f"{api}/jobs/nope/stragglers").status_code == 404

        got = wait_for(lambda: [(i, p) for i, p in enumerate(receiver.payloads())
                                if p["groupLabels"] == {"alertname": "FleetscopeStraggler", "job": "strag"}],
                       30, "straggler webhook")
        i, p = got[0]
        assert p["version"] == "4" and p["status"] == "firing"
        a = p["alerts"][0]
        assert a["labels"]["kind"] == "slow_compute" and json.loads(a["annotations"]["culprit_ranks"]) == [5]
        headers, body, _ = receiver.got[i]
        assert verify(SECRET, headers, body) and not verify("wrong-secret", headers, body)

        # a hang: steps stop; rank 3 stuck in forward, its TP peer waits in the collective
        t_hang = time.time_ns()
        hjob = SynthJob(job="hung", num_steps=12, t0_ns=t_hang - 12 * 200 * MS)
        recs = synth_records(hjob)
        recs["jobs"] = [job_record("hung", t_hang - 10 * 10**9)]
        # the agent ships in-flight records with the steps (a separate diagnosis worker may
        # pass between two ingests: a store with steps but no in-flight rows knows no culprit)
        recs["inflight"] = [{"ts_ns": t_hang, "job": "hung", "rank": r, "host": f"h{r // 4}", "step": 12,
                             "kind": "section" if r == 3 else "collective", "op": "forward" if r == 3 else "all_reduce",
                             "group_id": "" if r == 3 else "tp.pp0.dp1", "axis": "" if r == 3 else "tp",
                             "seq": -1 if r == 3 else 10**6, "since_ns": t_hang} for r in (2, 3)]
        recs["heartbeats"] = [{"ts_ns": t_hang, "job": "hung", "host": f"h{r // 4}", "rank": r, "pid": 100 + r,
                               "alive": True} for r in range(8)]
        ingest(api, recs, "hung-1")
        for i in range(12):
            ts = time.time_ns()
            inflight = [{"ts_ns": ts, "job": "hung", "rank": 3, "host": "h0", "step": 12, "kind": "section",
                         "op": "forward", "since_ns": t_hang}]
            inflight += [{"ts_ns": ts, "job": "hung", "rank": 2, "host": "h0", "step": 12, "kind": "collective",
                          "op": "all_reduce", "group_id": "tp.pp0.dp1", "axis": "tp", "seq": 10**6, "since_ns": t_hang}]
            hb = [{"ts_ns": ts, "job": "hung", "host": f"h{r // 4}", "rank": r, "pid": 100 + r, "alive": True}
                  for r in range(8)]
            ingest(api, {"inflight": inflight, "heartbeats": hb}, f"hb-{i}")
            hang = HTTP.get(f"{api}/jobs/hung/hang").json()
            if hang["stalled"]:
                break
            time.sleep(0.5)
        assert hang["stalled"] and hang["culprits"] == [3] and hang["hang_class"] == "stuck_in_compute"
        hang_alert = wait_for(lambda: [p for p in receiver.payloads() if p["commonLabels"].get("job") == "hung"],
                              30, "hang webhook")[0]
        assert hang_alert["alerts"][0]["labels"]["alertname"] == "FleetscopeHang"
        assert json.loads(hang_alert["alerts"][0]["annotations"]["culprit_ranks"]) == [3]
        hangs = HTTP.get(f"{api}/incidents", params={"job": "hung", "kind": "hang"}).json()
        assert hangs["total"] == 1  # one incident per hang, whatever the number of ticks

        # operator resolves -> a resolved notification; ack of a resolved incident is refused
        hid = hangs["items"][0]["id"]
        r = HTTP.post(f"{api}/incidents/{hid}/resolve", json={"by": "test"})
        assert r.status_code == 200 and r.json()["status"] == "resolved"
        assert HTTP.post(f"{api}/incidents/{hid}/acknowledge", json={}).status_code == 409
        wait_for(lambda: [p for p in receiver.payloads() if p["status"] == "resolved"], 20, "resolved webhook")
        detail = HTTP.get(f"{api}/incidents/{hid}").json()
        assert {n["alert_status"] for n in detail["notifications"]} == {"firing", "resolved"}
        assert HTTP.get(f"{api}/hosts/h0").json()["num_jobs"] >= 2


def test_outbox_survives_restart_and_retries(tmp_path):
    port = free_port()
    down = Receiver(port, fail=True)
    try:
        with running_server(tmp_path, diagnosis_tick_s=0.5, alert_retry_base_s=0.2, alert_retry_max_s=1,
                            webhook_allow="127.0.0.1") as url:
            api = url.api
            HTTP.post(f"{api}/alerts/webhooks", json={"name": "r", "url": f"http://127.0.0.1:{port}/hook"})
            now = time.time_ns()
            job = SynthJob(job="j2", num_steps=24, t0_ns=now - 24 * 200 * MS,
                           dl_factor=lambda r, s: 4.0 if r == 2 and s >= 4 else 1.0)
            recs = synth_records(job)
            recs["jobs"] = [job_record("j2", now - 10 * 10**9)]
            ingest(api, recs, "j2")
            rows = wait_for(lambda: [r for r in HTTP.get(f"{api}/alerts/outbox").json() if r["attempts"] >= 2],
                            60, "failed delivery attempts")
            assert rows[0]["status"] == "pending" and "503" in rows[0]["last_error"]
            url.process.kill()  # crash: nothing in memory survives
            down.fail = True
            down.fail = False
            url.process.start()
            delivered = wait_for(lambda: [r for r in HTTP.get(f"{api}/alerts/outbox",
                                                                params={"status": "delivered"}).json()], 30,
                                 "delivery after restart")
            assert delivered[0]["incident_id"] == rows[0]["incident_id"]
            assert len(down.got) == 1  # delivered once, not duplicated
            assert down.payloads()[0]["alerts"][0]["labels"]["kind"] == "slow_dataloader"
    finally:
        down.close()


def test_finished_job_gets_a_final_pass_that_pages_nobody(tmp_path, receiver):
    """A job whose data (and its end) arrive in one go, as from an agent that fell behind:
    the final pass records the straggler it holds, resolved at once, and sends no alert."""
    with running_server(tmp_path, diagnosis_tick_s=0.5, webhook_allow="127.0.0.1") as url:
        api = url.api
        assert HTTP.post(f"{api}/alerts/webhooks", json={"name": "recv", "url": receiver.url}).status_code == 201
        now = time.time_ns()
        job = SynthJob(job="short", num_steps=30, t0_ns=now - 30 * 200 * MS,
                       compute_factor=lambda r, s: 1.4 if r == 6 and s >= 6 else 1.0)
        recs = synth_records(job)
        recs["jobs"] = [job_record("short", now - 10 * 10**9, status="finished")]
        ingest(api, recs, "short-1")

        def final_incident():
            items = HTTP.get(f"{api}/incidents", params={"job": "short"}).json()["items"]
            return [i for i in items if i["kind"] == "slow_compute"]

        inc = wait_for(final_incident, 60, "post-mortem straggler incident")[0]
        assert inc["ranks"] == [6] and inc["status"] == "resolved"
        assert HTTP.get(f"{api}/incidents/{inc['id']}").json()["resolution"] == "job finished"
        assert HTTP.get(f"{api}/jobs/short/stragglers").json()["items"][0]["ranks"] == [6]
        time.sleep(2)  # the dispatcher had its chance: nothing paged for a job that is over
        assert not [p for p in receiver.payloads() if p["commonLabels"].get("job") == "short"]
