"""End to end with the real reference trainer (8 gloo ranks, 2x2x2), its host agent and a
real server: an injected compute straggler and an injected hang are found, with the
right culprit rank, while the job runs; the hang pages a real webhook receiver."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from test_diagnosis_api import Receiver, wait_for

from tests.helpers.bench_module import load_bench
from tests.helpers.server import running_server

pytestmark = pytest.mark.slow
HTTP = httpx.Client(timeout=60)
MODEL = ["--dp", "2", "--tp", "2", "--pp", "2", "--hidden", "128", "--seq-len", "64",
         "--global-batch", "8", "--microbatches", "4"]


def train(url: str, tmp_path, job: str, steps: int, timeout_s: int, *inject: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fleetscope.cli", "train", *MODEL, "--steps", str(steps), "--job", job,
           "--server", url, "--spool", str(tmp_path / "spool"), "--timeout-s", str(timeout_s)]
    for spec in inject:
        cmd += ["--inject", spec]
    return subprocess.Popen(cmd, stdout=open(tmp_path / f"{job}.log", "wb"), stderr=subprocess.STDOUT)


def stop(p: subprocess.Popen) -> None:
    """SIGTERM: the launcher stops its ranks and its agent; SIGKILL if it lingers."""
    p.terminate()
    try:
        p.wait(60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_real_trainer_straggler_then_hang(tmp_path):
    rx = Receiver()
    try:
        with running_server(tmp_path / "srv", diagnosis_tick_s=1, hang_min_s=8, webhook_allow="127.0.0.1") as url:
            HTTP.post(f"{url.api}/alerts/webhooks", json={"name": "rx", "url": rx.url}).raise_for_status()
            # 1. a compute straggler on rank 5 (stage 1) from step 4
            # 120 steps: on a 2-core host 36 slow steps were once too little evidence, and 80
            # once (1 of 3 fresh-clone runs, 2026-12-04: no compute finding while the job ran);
            # the wait ends at the first finding, so a longer job costs nothing when it is found
            p = train(url, tmp_path, "e2e-strag", 120, 300, "straggler:rank=5:factor=1.6:from_step=4")
            try:
                seen: list[dict] = []

                def found():
                    items = HTTP.get(f"{url.api}/jobs/e2e-strag/stragglers").json().get("items", [])
                    slow = [i for i in items if i["kind"] == "slow_compute"]
                    seen.extend(slow)
                    # the first ticks judge few slow steps: on a loaded 2-core host one once
                    # named rank 5's optimizer (score 1.1) before its compute; the finding
                    # the detector settles on is the one checked
                    # the magnitude is checked once it is judged on slow steps only: a finding
                    # named from 2 slow steps of a 6-step window (CI, 2026-12-05) measured its
                    # factor over all 6 and read 1.11
                    # and it is read once judged on 10 steps or more: a finding named from 3
                    # (CI, 2026-12-05) read 1.79, inside its own interval (evidence.factor_interval)
                    return [i for i in slow if i.get("component") == "compute (CPU time)"
                            and i["first_step"] >= 4 and i["evidence"]["judged_steps"] >= 10] or None

                items = wait_for(found, 240, "slow_compute finding for rank 5's compute (CPU time)")
                assert all(i["ranks"] == [5] for i in seen), [i for i in seen if i["ranks"] != [5]]
                assert items[0]["ranks"] == [5], items
                assert items[0]["evidence"]["stage"] == 1 and items[0]["est_slowdown"] > 0
                # the factor of its compute vs its stage peers, on the CPU clock (the trainer
                # burns 0.6x the CPU time each compute section used): the wait for a core,
                # which made the wall-clock factor 1.2-3.2 on a loaded 2-core host, is not in it
                f = items[0]
                ev = f["evidence"]  # the factor is the rank's own compute over its peers'
                assert ev["component_ms"] > ev["peer_component_ms"] * 1.1, json.dumps(f)
                lo, hi = ev["factor_interval"]
                assert lo < f["factor"] < hi and hi / lo < 1.5, json.dumps(f)
                # the injected 1.6x is of the rank's own work; its peers' work differs from
                # its own by a few % on a shared host (rank 5 read 1.05-1.10x before the
                # onset in one run, and 1.67-1.75x after it): the spool's records say which
                assert 1.6 * 0.85 <= f["factor"] <= 1.6 * 1.15, json.dumps(f)
                judged = (f["last_step"] - ev["judged_steps"] + 1, f["last_step"])
                incidents = HTTP.get(f"{url.api}/incidents", params={"job": "e2e-strag"}).json()["items"]
                wrong = [i for i in incidents if i["kind"] in ("slow_compute", "slow_dataloader", "late_arrival")
                         and i["ranks"] != [5]]
                assert not wrong, wrong
            finally:
                stop(p)
            # the whole path (hooks, spool, agent, server, store, detector) keeps the magnitude:
            # the factor is the ratio the ranks' own records show over the same steps
            bench = load_bench("diagnosis", "bench_diagnosis")  # its spool reader
            truth = bench.spool_noise(tmp_path / "spool", "e2e-strag", (2, 2, 2), 5, 4, "compute (CPU time)",
                                      judged)
            assert abs(f["factor"] / truth["ratio"] - 1) <= 0.05, (truth, json.dumps(f))
            # 2. rank 6 hangs in compute at step 4: found long before the job's own timeout
            p = train(url, tmp_path, "e2e-hang", 100, 300, "hang:rank=6:step=4:where=compute")
            try:
                hang = wait_for(lambda: (h := HTTP.get(f"{url.api}/jobs/e2e-hang/hang").json()).get("stalled") and h,
                                240, "stall detection")
                assert hang["culprits"] == [6] and hang["hang_class"] == "stuck_in_compute", hang
                assert p.poll() is None
                payload = wait_for(lambda: [x for x in rx.payloads() if x["commonLabels"].get("job") == "e2e-hang"
                                            and x["commonLabels"].get("alertname") == "FleetscopeHang"], 30,
                                   "hang webhook")[0]
                assert payload["alerts"][0]["annotations"]["culprit_ranks"] == "[6]"
                hangs = HTTP.get(f"{url.api}/incidents", params={"job": "e2e-hang", "kind": "hang"}).json()
                assert hangs["total"] == 1
            finally:
                stop(p)
    finally:
        rx.close()
