"""Silent jobs and hosts (issue #13) through a real server and its diagnosis worker process.

* A host (agent and ranks) goes silent while the job's other host keeps reporting: a
  ``heartbeat_lost`` incident (``host_down``) naming that host; the job stays running.
  Then every host goes silent: a job-silence incident, status ``lost``; telemetry
  resumes: status ``running`` again. Driven through the real ingest API (Arrow).
* A real reference job crash (``fleetscope train --inject crash:rank=R:step=N``) takes
  down every rank and the agent at once: the job becomes ``lost`` with an incident
  naming the hosts and ranks as last seen and the last step, for rank 0 and other ranks
  (when rank 0 survives the crash long enough to report the job failed, the status is
  ``failed`` and the hang analysis names the crashed rank instead).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest
from test_diagnosis_api import wait_for

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.server import running_server

HTTP = httpx.Client(timeout=60)
SILENT_S = 4


def post(api: str, host: str, records: dict[str, list[dict]], key: str) -> None:
    tables = {n: codec.rows_to_table(RECORD_TYPES[n], rows) for n, rows in records.items() if rows}
    r = HTTP.post(f"{api}/ingest", content=codec.encode_batch(tables), headers={
        "Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": key, "X-Fleetscope-Host": host})
    assert r.status_code == 200, r.text


class Feeder:
    """One agent per host: every 0.5 s its ranks' step markers, in-flight rows and heartbeats."""

    def __init__(self, api: str, job: str, hosts: dict[str, list[int]], lag_s: float = 0.0) -> None:
        self.api, self.job, self.hosts = api, job, hosts
        self.lag_ns = int(lag_s * 1e9)  # records this much older than when they are sent
        self.live = set(hosts)
        self.step = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Feeder:
        now = time.time_ns()
        post(self.api, "ha", {"jobs": [{"ts_ns": now, "job": self.job, "dp": 2, "tp": 2, "pp": 1,
                                        "num_microbatches": 1, "status": "running", "host": "ha"}]},
             f"{self.job}-job")
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time_ns() - self.lag_ns
            for host in sorted(self.live):
                ranks = self.hosts[host]
                recs = {
                    "steps": [{"job": self.job, "rank": r, "host": host, "step": self.step, "start_ns": t - 400_000_000,
                               "end_ns": t, "duration_ns": 400_000_000} for r in ranks],
                    "inflight": [{"ts_ns": t, "job": self.job, "rank": r, "host": host, "step": self.step + 1,
                                  "kind": "idle", "since_ns": t} for r in ranks],
                    "heartbeats": [{"ts_ns": t, "job": self.job, "host": host, "rank": r, "pid": 100 + r,
                                    "alive": True} for r in ranks]
                    + [{"ts_ns": t, "job": "", "host": host, "rank": -1, "pid": 99, "alive": True}],
                }
                post(self.api, host, recs, f"{self.job}-{host}-{self.step}")
            self.step += 1
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(30)


def incidents(api: str, job: str) -> list[dict]:
    return HTTP.get(f"{api}/incidents", params={"job": job, "status": "open"}).json()["items"]


def job_status(api: str, job: str) -> str:
    return HTTP.get(f"{api}/jobs/{job}").json()["status"]


def test_host_down_then_job_silent_then_recovers(tmp_path):
    with running_server(tmp_path, diagnosis_tick_s=0.5, silent_s=SILENT_S) as url:
        api = url.api
        feeder = Feeder(api, "quiet", {"ha": [0, 1], "hb": [2, 3]}).start()
        try:
            time.sleep(3)
            assert not [i for i in incidents(api, "quiet") if i["kind"] == "heartbeat_lost"]
            t_down = time.time()
            feeder.live.discard("hb")  # host hb (its agent and ranks 2, 3) goes silent
            inc = wait_for(lambda: [i for i in incidents(api, "quiet") if i["kind"] == "heartbeat_lost"], 30,
                           "host_down incident")[0]
            assert time.time() - t_down <= 30
            assert inc["hosts"] == ["hb"] and inc["ranks"] == [2, 3], inc
            full = HTTP.get(f"{api}/incidents/{inc['id']}").json()
            assert full["evidence"]["what"] == "host_down" and full["evidence"]["last_step"] >= 1, full
            assert job_status(api, "quiet") == "running"
            feeder.live.discard("ha")  # now nothing arrives from the job at all
            wait_for(lambda: job_status(api, "quiet") == "lost", 30, "status lost")
            silent = [i for i in incidents(api, "quiet") if i["kind"] == "heartbeat_lost" and
                      HTTP.get(f"{api}/incidents/{i['id']}").json()["evidence"].get("what") == "job_silent"]
            assert silent and set(silent[0]["hosts"]) == {"ha", "hb"} and set(silent[0]["ranks"]) == {0, 1, 2, 3}
            ev = HTTP.get(f"{api}/incidents/{silent[0]['id']}").json()["evidence"]
            assert ev["first_silent_ranks"] == [2, 3] and ev["last_seen_ranks"] == [0, 1], ev
            feeder.live.update({"ha", "hb"})  # telemetry resumes
            wait_for(lambda: job_status(api, "quiet") == "running", 30, "status running again")
        finally:
            feeder.stop()


def test_a_job_whose_records_arrive_late_is_not_silent(tmp_path):
    """Ingest running behind (a loaded server at scale): every record is older than
    silent_s when it arrives, but the job's batches keep arriving, so it is not silent."""
    with running_server(tmp_path, diagnosis_tick_s=0.5, silent_s=SILENT_S) as url:
        api = url.api
        feeder = Feeder(api, "behind", {"ha": [0, 1], "hb": [2, 3]}, lag_s=3 * SILENT_S).start()
        try:
            time.sleep(4 * SILENT_S)
            assert not [i for i in incidents(api, "behind") if i["kind"] == "heartbeat_lost"]
            assert job_status(api, "behind") == "running"
        finally:
            feeder.stop()


MODEL = ["--hidden", "64", "--seq-len", "32", "--global-batch", "4", "--microbatches", "2", "--layers", "2",
         "--load-cost-ms", "150"]  # slow steps: the agent ships several batches before the crash


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("crash"), diagnosis_tick_s=1, silent_s=5) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("layout,rank", [("tp", 0), ("tp", 1), ("pp", 1)])
def test_crash_of_every_rank_and_agent_makes_the_job_lost(server, tmp_path, layout, rank):
    api, job = server.api, f"crash-{layout}-{rank}"
    dims = ["--tp", "2"] if layout == "tp" else ["--pp", "2"]
    cmd = [sys.executable, "-m", "fleetscope.cli", "train", *dims, *MODEL, "--steps", "200", "--job", job,
           "--server", str(server), "--spool", str(tmp_path / "spool"), "--timeout-s", "120",
           "--inject", f"crash:rank={rank}:step=12"]
    p = subprocess.run(cmd, stdout=open(tmp_path / "train.log", "wb"), stderr=subprocess.STDOUT, timeout=240)
    assert p.returncode != 0  # the launcher ended every rank and its agent
    t_end = time.time()

    def settled():
        st = HTTP.get(f"{api}/jobs/{job}").json()
        return st if st.get("status") in ("lost", "failed") else None

    st = wait_for(settled, 60, f"{job} status lost (or failed, when a surviving rank 0 said so)")
    if st["status"] == "lost":  # nothing arrived from any rank or agent: a job-silence incident
        items = wait_for(lambda: [i for i in incidents(api, job) if i["kind"] == "heartbeat_lost"], 30,
                         "job-silence incident")
        full = HTTP.get(f"{api}/incidents/{items[0]['id']}").json()
        ev = full["evidence"]
        assert ev["what"] == "job_silent" and ev["last_step"] >= 3, ev
        assert set(full["ranks"]) == {0, 1} and full["hosts"], full
    else:  # rank 0 outlived the crash long enough to report failure: the hang names the crashed rank
        assert rank != 0
        items = wait_for(lambda: [i for i in incidents(api, job) if i["kind"] == "hang"], 30, "hang incident")
        assert items[0]["ranks"] == [rank], items
    assert time.time() - t_end <= 60
