"""Scenario jobs for the operator-facing tests (metrics, RCA CLI, Prometheus): a
generated straggler job and a generated hung job, posted through ``POST /ingest`` of a
real server (with its bearer token, if it has one)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.synthetic import MS, SynthJob

HTTP = httpx.Client(timeout=120)


def post_records(url: Any, records: dict[str, list[dict]], key: str) -> None:
    """One Arrow batch of ``records`` (record type -> rows) to ``url`` (a RunningServer)."""
    tables = {n: codec.rows_to_table(RECORD_TYPES[n], rows) for n, rows in records.items() if rows}
    r = HTTP.post(f"{url.api}/ingest", content=codec.encode_batch(tables), headers={
        "Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": key, **url.auth_headers})
    assert r.status_code == 200, r.text


def job_record(job: str, t_ns: int, status: str = "running", peak_flops: float = 1e13) -> dict:
    return {"ts_ns": t_ns, "job": job, "dp": 2, "tp": 2, "pp": 2, "num_microbatches": 4,
            "model_flops_per_step": 1e12, "device_peak_flops": peak_flops, "status": status, "host": "h0"}


def synth_records(job: SynthJob) -> dict[str, list[dict]]:
    out = {}
    for name, df in job.build().items():
        rows = df.to_dict("records")
        if name == "steps":
            for r in rows:
                r.pop("loss", None)
        out[name] = rows
    return out


def post_straggler_job(url: Any, job: str = "strag", rank: int = 5, num_steps: int = 30) -> dict[str, list[dict]]:
    """A 2x2x2 job whose rank ``rank`` computes 30% slower from step 8; returns its records."""
    now = time.time_ns()
    sj = SynthJob(job=job, num_steps=num_steps, t0_ns=now - num_steps * 200 * MS,
                  compute_factor=lambda r, s: 1.3 if r == rank and s >= 8 else 1.0)
    recs = synth_records(sj)
    recs["jobs"] = [job_record(job, now - 10 * 10**9)]
    post_records(url, recs, f"{job}-1")
    return recs


def post_hung_job_beat(url: Any, job: str, t_hang_ns: int, i: int) -> None:
    """One liveness beat of a job hung since ``t_hang_ns``: rank 3 stuck in forward, its TP
    peer rank 2 waiting in the collective, every process alive."""
    ts = time.time_ns()
    inflight = [{"ts_ns": ts, "job": job, "rank": 3, "host": "h0", "step": 12, "kind": "section",
                 "op": "forward", "since_ns": t_hang_ns},
                {"ts_ns": ts, "job": job, "rank": 2, "host": "h0", "step": 12, "kind": "collective",
                 "op": "all_reduce", "group_id": "tp.pp0.dp1", "axis": "tp", "seq": 10**6, "since_ns": t_hang_ns}]
    hb = [{"ts_ns": ts, "job": job, "host": f"h{r // 4}", "rank": r, "pid": 100 + r, "alive": True} for r in range(8)]
    post_records(url, {"inflight": inflight, "heartbeats": hb}, f"{job}-hb-{i}")


def post_hung_job(url: Any, job: str = "hung", ago_s: float = 0.0) -> int:
    """12 good steps, then the hang ``ago_s`` seconds ago; returns the hang time (keep
    beating with :func:`post_hung_job_beat` until the server calls it)."""
    t_hang = time.time_ns() - int(ago_s * 1e9)
    sj = SynthJob(job=job, num_steps=12, t0_ns=t_hang - 12 * 200 * MS)
    recs = synth_records(sj)
    recs["jobs"] = [job_record(job, t_hang - 10 * 10**9)]
    post_records(url, recs, f"{job}-1")
    return t_hang


class HungJob:
    """A hung job kept alive: a thread posts a liveness beat every ``every_s`` (as the
    hooks and the agent of a hung job would) until :meth:`stop`."""

    def __init__(self, url: Any, job: str = "hung", every_s: float = 0.5, ago_s: float = 0.0) -> None:
        import threading

        self.url, self.job = url, job
        self.t_hang = post_hung_job(url, job, ago_s)
        self._stop = threading.Event()
        self._every_s = every_s
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                post_hung_job_beat(self.url, self.job, self.t_hang, i)
            except (AssertionError, httpx.HTTPError):  # a busy server: the next beat retries
                pass
            i += 1
            self._stop.wait(self._every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
