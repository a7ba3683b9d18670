"""The data behind the browser tests: a real 8-rank reference job (DP 2 x TP 2 x PP 2,
gloo on CPU) with an injected straggler (rank 5) and a hang (rank 3), shipped by the
real agent into a real server with the dashboard mounted at /ui.

If the reference trainer cannot be launched here, or its faults are not diagnosed in
time (a heavily loaded machine), a generated job with the same faults
(``tests/views_synth.py``) is ingested through ``POST /api/v1/ingest`` instead, its
in-flight records refreshed like a hung job's hooks would; ``source`` says which (and
``FLEETSCOPE_BROWSER_DATA=generated`` picks the generated job directly).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

JOB = "ref-browser"
STRAGGLER = 5
HANG_RANK = 3
HANG_STEP = 14
SERVER_SETTINGS = dict(
    ui=True,
    ui_refresh_s=3,
    hang_min_s=4,
    hang_k=3,
    incident_resolve_s=3600,
    diagnosis_tick_s=1,
)
TRAIN_ARGS = [
    "--dp", "2", "--tp", "2", "--pp", "2", "--steps", "40", "--microbatches", "4",
    "--inject", f"straggler:rank={STRAGGLER}:factor=1.6:from_step=2",
    "--inject", f"hang:rank={HANG_RANK}:step={HANG_STEP}",
    "--timeout-s", "240",
]  # fmt: skip


@dataclass
class ReferenceJob:
    url: str
    job: str
    source: str
    """``trainer`` (real reference job) or ``generated``."""
    proc: subprocess.Popen | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start_trainer(url: str, workdir: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fleetscope.cli", "train", "--job", JOB, "--spool", str(workdir / "spool"),
           "--server", url, *TRAIN_ARGS]  # fmt: skip
    log = open(workdir / "train.log", "wb")
    return subprocess.Popen(cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for_faults(api: str, job: str, timeout_s: float, proc: subprocess.Popen | None = None) -> dict:
    """Wait until the server names the hang culprit and has a straggler incident."""
    deadline = time.monotonic() + timeout_s
    state: dict = {}
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None and not state.get("hang"):
            raise RuntimeError(f"reference job exited with {proc.returncode} before hanging")
        try:
            hang = httpx.get(f"{api}/jobs/{job}/hang", timeout=30).json()
            inc = httpx.get(f"{api}/incidents", params={"job": job, "status": "active"}, timeout=30).json()
        except (httpx.HTTPError, ValueError):
            time.sleep(1)
            continue
        stragglers = [i for i in inc.get("items", []) if i["kind"] != "hang" and STRAGGLER in i["ranks"][:1]]
        state = {"hang": hang if hang.get("stalled") and hang.get("culprits") else None, "stragglers": stragglers}
        if state["hang"] and stragglers:
            return state
        time.sleep(1)
    raise TimeoutError(f"faults not diagnosed within {timeout_s}s: {state}")


def ingest_generated(url: str, rj: ReferenceJob) -> None:
    """Fallback: the same scenario generated, with in-flight records kept fresh."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.views_synth import SynthJob

    synth = SynthJob(job=rj.job, t0_ns=time.time_ns() - 60 * 10**9, straggler_rank=STRAGGLER,
                     straggler_factor=1.6, straggler_from_step=2, hang_rank=HANG_RANK, hang_step=HANG_STEP)  # fmt: skip
    records = synth.build()
    r = httpx.post(f"{url}/api/v1/ingest", json={"records": records}, headers={"Idempotency-Key": "gen-0"}, timeout=60)
    r.raise_for_status()

    def keep_fresh() -> None:
        i = 0
        while not rj._stop.wait(1.0):
            now = time.time_ns()
            fresh = {
                "inflight": [{**x, "ts_ns": now} for x in records["inflight"]],
                "heartbeats": [{**x, "ts_ns": now} for x in records["heartbeats"]],
            }
            i += 1
            try:
                httpx.post(f"{url}/api/v1/ingest", json={"records": fresh}, headers={"Idempotency-Key": f"gen-{i}"},
                           timeout=30)  # fmt: skip
            except httpx.HTTPError:  # a busy or stopping server: the next beat retries
                continue

    threading.Thread(target=keep_fresh, daemon=True).start()


def launch(url: str, workdir: Path, trainer_timeout_s: float = 100.0) -> ReferenceJob:
    """Run the scenario against the server at ``url`` and wait until it is diagnosed."""
    api = f"{url}/api/v1"
    want = os.environ.get("FLEETSCOPE_BROWSER_DATA", "trainer")
    try:
        import fleetscope.agent.cli  # noqa: F401
        import fleetscope.trainer.cli  # noqa: F401
    except ImportError:
        want = "generated"
    if want == "trainer":
        rj = ReferenceJob(url, JOB, "trainer", proc=start_trainer(url, workdir))
        try:
            wait_for_faults(api, JOB, trainer_timeout_s, rj.proc)
            return rj
        except (TimeoutError, RuntimeError) as e:
            rj.stop()
            log = (workdir / "train.log").read_text(errors="replace")[-1500:]
            print(f"\nreference job not diagnosed ({e}); using the generated job. train.log tail:\n{log}")
    rj = ReferenceJob(url, JOB + "-gen", "generated")
    ingest_generated(url, rj)
    wait_for_faults(api, rj.job, 120.0)
    return rj
