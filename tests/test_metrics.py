"""GET /metrics through a real server: Prometheus text format that ``promtool check
metrics`` accepts, behind the bearer token, with per-job step time, straggler suspects and
incidents read from the store and the DB; a fixed number of series per job at 12,288
ranks however many straggler incidents the job has."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_diagnosis_api import wait_for

from tests.helpers.ops_jobs import HungJob, post_records, post_straggler_job
from tests.helpers.server import running_server

TOKEN = "metrics-token-0123456789"
HTTP = httpx.Client(timeout=120)


def scrape(url: str, token: str | None = TOKEN) -> str:
    r = HTTP.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return r.text


def samples(text: str) -> dict[str, list[tuple[dict, float]]]:
    """sample name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(sm: dict, name: str, **labels: str) -> float | None:
    for lab, v in sm.get(name, []):
        if all(lab.get(k) == want for k, want in labels.items()):
            return v
    return None


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; see `make prometheus-deps`)")
    r = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()


def test_metrics_are_valid_prometheus_text_behind_the_token(tmp_path):
    # diagnosis in a worker child process (the default): it reports its pass times to the
    # server, whose /metrics exports them under service "diagnosis-worker"
    with running_server(tmp_path, token=TOKEN, diagnosis_tick_s=0.5, metrics_cache_s=0) as url:
        assert HTTP.get(f"{url}/metrics").status_code == 401
        assert HTTP.get(f"{url}/metrics", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
        recs = post_straggler_job(url)
        post_records(url, recs, "strag-1")  # a duplicate batch: counted as such, its rows not again

        def straggler_in_metrics():
            sm = samples(scrape(url))
            return sm if value(sm, "fleetscope_straggler_rank", job_id="strag", position="1") is not None else None

        sm = wait_for(straggler_in_metrics, 90, "straggler suspect in /metrics")
        # runtime control: the job-wide level is 'full' until changed; then one series per level
        assert value(sm, "fleetscope_job_instrumentation_level", job_id="strag", level="full") == 1
        assert value(sm, "fleetscope_job_instrumentation_ranks", job_id="strag", level="full") == 8
        auth = {"Authorization": f"Bearer {TOKEN}"}
        HTTP.put(f"{url.api}/jobs/strag/instrumentation", json={"level": "steps"}, headers=auth).raise_for_status()
        HTTP.put(f"{url.api}/jobs/strag/instrumentation", json={"level": "off", "ranks": [2, 5]},
                 headers=auth).raise_for_status()
        text = scrape(url)
        sm = samples(text)
        assert {lab["level"]: v for lab, v in sm["fleetscope_job_instrumentation_level"]
                if lab["job_id"] == "strag"} == {"off": 0, "steps": 1, "sections": 0, "full": 0}
        assert {lab["level"]: v for lab, v in sm["fleetscope_job_instrumentation_ranks"]
                if lab["job_id"] == "strag"} == {"off": 2, "steps": 6, "sections": 0, "full": 0}
        promtool_check(text)
        sm = samples(text)
        assert value(sm, "fleetscope_straggler_rank", job_id="strag", position="1") == 5
        assert value(sm, "fleetscope_straggler_est_slowdown_ratio", job_id="strag", position="1") > 0.05
        assert value(sm, "fleetscope_incidents_active", job_id="strag", kind="slow_compute", status="open") >= 1
        assert value(sm, "fleetscope_job_world_size", job_id="strag") == 8
        assert value(sm, "fleetscope_job_status", job_id="strag", status="running") == 1
        assert value(sm, "fleetscope_job_status", job_id="strag", status="failed") == 0
        assert value(sm, "fleetscope_job_hung", job_id="strag") == 0
        assert value(sm, "fleetscope_job_hang_culprit_rank", job_id="strag") is None
        # every synthetic step is 200 ms-ish; the histogram counts the 30 steps (+ the newest
        # one only once all 8 ranks reported it)
        n = value(sm, "fleetscope_job_step_duration_seconds_count", job_id="strag")
        assert 29 <= n <= 30, n
        mean_s = value(sm, "fleetscope_job_step_duration_seconds_sum", job_id="strag") / n
        assert 0.05 < mean_s < 1.0, mean_s
        assert value(sm, "fleetscope_job_step_duration_seconds_bucket", job_id="strag", le="+Inf") == n
        assert value(sm, "fleetscope_job_steps_per_second", job_id="strag") > 0
        assert 0 < value(sm, "fleetscope_job_mfu_ratio", job_id="strag") < 1
        assert value(sm, "fleetscope_job_last_step", job_id="strag") == 29
        assert value(sm, "fleetscope_job_seconds_since_last_step", job_id="strag") > 0
        assert value(sm, "fleetscope_ingest_records_total", type="sections") == len(recs["sections"])
        assert value(sm, "fleetscope_ingest_duplicate_batches_total") == 1
        assert value(sm, "fleetscope_ingest_rejected_batches_total", reason="queue_full") == 0
        # the straggler incident may be committed before its diagnosis pass returns and is counted
        wait_for(lambda: (value(samples(scrape(url)), "fleetscope_diagnosis_pass_seconds_count",
                                service="diagnosis-worker", **{"pass": "tick"}) or 0) > 0, 60,
                 "a counted diagnosis pass in /metrics")
        wait_for(lambda: (value(samples(scrape(url)), "fleetscope_diagnosis_pass_seconds_count",
                                service="diagnosis-worker", **{"pass": "job"}) or 0) > 0, 60,
                 "a counted pass of one job in /metrics")
        assert value(sm, "fleetscope_alert_outbox_rows", status="pending") is not None
        # nothing is labelled by rank or host
        assert not any({"rank", "host"} & set(lab) for series in sm.values() for lab, _ in series)
        # a hung job: hang state, culprit, seconds since its last step
        hung = HungJob(url, "hung", ago_s=60)
        try:
            wait_for(lambda: value(samples(scrape(url)), "fleetscope_job_hung", job_id="hung") == 1, 90,
                     "the hang in /metrics")
            sm = samples(scrape(url))
            assert value(sm, "fleetscope_job_hang_culprit_rank", job_id="hung") == 3
            assert value(sm, "fleetscope_incidents_active", job_id="hung", kind="hang") == 1
            assert value(sm, "fleetscope_job_seconds_since_last_step", job_id="hung") > 50
        finally:
            hung.stop()


def test_series_per_job_stay_fixed_at_12288_ranks(tmp_path):
    from fleetscope.server.db.diagnosis_models import Incident
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from tests.helpers.rollup_fixture import ScaleJob, write_scale_job

    job = write_scale_job(f"chdb://{tmp_path / 'store'}", ScaleJob(num_steps=60, t0_ns=time.time_ns() - 120 * 10**9))
    with running_server(tmp_path, diagnosis_enabled=False, metrics_cache_s=0, metrics_top_k=5) as url:
        HTTP.post(f"{url.api}/ingest", json={"records": {"jobs": [job.jobs_record()]}}).raise_for_status()
        engine = create_engine(f"sqlite:///{tmp_path / 'control.db'}")

        def add_straggler_incidents(first_rank: int, n: int) -> None:
            now = time.time_ns()
            with Session(engine) as s:
                s.add_all(Incident(job=job.job, key=f"slow_compute:{r}", kind="slow_compute", status="open",
                                   severity="warning", ranks=json.dumps([r]), score=1.0 + r / 1e5,
                                   est_slowdown=0.01 + r / 1e6, opened_ns=now, updated_ns=now, last_seen_ns=now)
                          for r in range(first_rank, first_rank + n))
                s.commit()

        def job_series() -> tuple[int, dict]:
            sm = samples(scrape(url, None))
            return sum(1 for series in sm.values() for lab, _ in series if lab.get("job_id") == job.job), sm

        before, sm = job_series()
        assert value(sm, "fleetscope_job_world_size", job_id=job.job) == 12288
        assert value(sm, "fleetscope_job_step_duration_seconds_count", job_id=job.job) == 60
        add_straggler_incidents(0, 1000)
        after_1000, sm = job_series()
        add_straggler_incidents(1000, 3000)
        after_4000, sm = job_series()
        # top-k: 5 suspects x (rank, score, slowdown) and one incidents_active series
        assert after_1000 == after_4000 == before + 5 * 3 + 1
        assert value(sm, "fleetscope_job_straggler_suspects", job_id=job.job) == 4000
        assert value(sm, "fleetscope_straggler_rank", job_id=job.job, position="1") == 3999  # biggest slowdown
        assert value(sm, "fleetscope_straggler_rank", job_id=job.job, position="6") is None
        total = sum(len(v) for v in sm.values())
        print(f"\n12,288-rank job: {after_4000} series for the job, {total} in the whole scrape, "
              f"collect {value(sm, 'fleetscope_metrics_collect_seconds'):.3f} s")
