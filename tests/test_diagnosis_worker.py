"""The diagnosis worker's parts: per-job leases in the SQL DB, and the server's internal
query route through which a worker process reaches an embedded store."""

from __future__ import annotations

import time

import httpx
import pytest
from fleetscope.server.db import open_db
from fleetscope.server.db.leases import DiagnosisLease, claim, release_all
from fleetscope.server.diagnosis import rollups
from fleetscope.server.diagnosis.engine import JobInfo, diagnose
from fleetscope.server.diagnosis.loader import load_reduced_frames
from fleetscope.server.diagnosis.worker import RemoteStore
from test_diagnosis_api import ingest, job_record, synth_records

from tests.helpers.server import running_server
from tests.helpers.synthetic import SynthJob

S = 1_000_000_000
KINDS = {"slow_compute", "slow_dataloader", "late_arrival", "slow_link", "gc_pause", "host_contention"}


def test_two_workers_never_hold_one_job(tmp_path):
    db = open_db(f"sqlite:///{tmp_path / 'c.db'}")
    with db() as a, db() as b:
        assert claim(a, "j1", "w1", 0, 30)
        assert not claim(b, "j1", "w2", 10 * S, 30)  # held
        assert claim(b, "j2", "w2", 10 * S, 30)      # another job: fine
        assert claim(a, "j1", "w1", 20 * S, 30)      # renewal by its owner
        assert not claim(b, "j1", "w2", 49 * S, 30)  # renewed until 50 s
        assert claim(b, "j1", "w2", 51 * S, 30)      # expired: taken over
        assert not claim(a, "j1", "w1", 52 * S, 30)
        assert release_all(b, "w2") == 2
        assert claim(a, "j1", "w1", 53 * S, 30)
        assert {r.job: r.owner for r in a.query(DiagnosisLease)} == {"j1": "w1"}


@pytest.mark.slow
def test_worker_reaches_the_embedded_store_through_the_server(tmp_path):
    with running_server(tmp_path, diagnosis_worker="off") as url:
        job = SynthJob(job="remote", t0_ns=time.time_ns() - 60 * S,  # inside the store TTL
                       compute_factor=lambda r, s: 1.3 if r == 5 and s >= 10 else 1.0)
        recs = synth_records(job)
        recs["jobs"] = [job_record("remote", int(recs["steps"][0]["start_ns"]))]
        ingest(url.api, recs, "remote-1")
        rs = RemoteStore(str(url))
        now = max(r["end_ns"] for r in recs["steps"]) + S
        frames = load_reduced_frames(rs, "remote", now, rollups.StepCache(), 8, job.num_mb)
        d = diagnose(JobInfo("remote", job.topo, job.num_mb), frames, now)
        assert [(f.kind.value, f.ranks) for f in d.findings if f.kind.value == "slow_compute"] == [
            ("slow_compute", (5,))]
        assert 0 < rs.bytes_received < 2_000_000  # reductions, not raw events
        r = httpx.post(f"{url.api}/internal/diagnosis/query", json={"name": "DROP TABLE steps", "params": {}})
        assert r.status_code == 422 and "not a diagnosis query" in r.text
        r = httpx.post(f"{url.api}/internal/diagnosis/query", json={"name": "last_step", "params": {"job": "x"}})
        assert r.status_code == 422 and "attempt" in r.text  # a missing parameter is named
        assert httpx.get(f"{url.api}/internal/diagnosis/host-seen").status_code == 200
        # a worker's verdict is what /stragglers and /hang answer while it is fresh
        d.computed_ns = time.time_ns()
        rs.publish(d, 0.5)
        got = httpx.get(f"{url.api}/jobs/remote/stragglers").json()
        assert got["computed_ns"] == d.computed_ns
        assert [(i["kind"], i["ranks"], i["factor"]) for i in got["items"]] == [
            (f.kind.value, list(f.ranks), f.factor) for f in d.findings if f.kind.value in KINDS]
        hang = httpx.get(f"{url.api}/jobs/remote/hang").json()
        assert hang["stalled"] == d.hang.stalled and hang["last_step"] == d.hang.last_step
        older = {"job": "remote", "computed_ns": d.computed_ns - S, "took_s": 0.1, "findings": [], "hang": {}}
        assert httpx.post(f"{url.api}/internal/diagnosis/verdict", json=older).status_code == 200
        assert httpx.get(f"{url.api}/jobs/remote/stragglers").json()["computed_ns"] == d.computed_ns  # kept
        bad = {**older, "computed_ns": time.time_ns(), "findings": [{"kind": "nope", "job": "remote"}]}
        r = httpx.post(f"{url.api}/internal/diagnosis/verdict", json=bad)
        assert r.status_code == 422 and "nope" in r.text
