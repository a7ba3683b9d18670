"""Reference trainer: one rank on gloo in-process, and an 8-rank 2x2x2 job as real processes.

The 8-rank job runs once per module (``job8``) and several tests read its spool.
Loss tolerance: the 3D-parallel loss (mean over DP replicas of the last stage's loss)
equals the single-process loss within 1e-4 relative (only float summation order differs).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist
from fleetscope.trainer.config import TrainConfig
from fleetscope.trainer.launcher import LOG_NAME, free_port
from fleetscope.trainer.train import run_rank
from fleetscope.trainer_hooks.reader import read_job

from fleetscope import trainer_hooks as hooks
from fleetscope.spool import rank_dir, read_rank_info
from fleetscope.topology import Topology

STEPS = 4
LOSS_RTOL = 1e-4
TOPO = Topology(dp=2, tp=2, pp=2)


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", "train", *args],
                          capture_output=True, text=True, timeout=timeout)


def run_in_process(cfg: TrainConfig, sink=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return run_rank(cfg, 0, 1, sink=sink)


@pytest.fixture(scope="module")
def reference():
    """Single process, same model and seed, hooks to memory."""
    sink = hooks.MemorySink()
    result = run_in_process(TrainConfig(steps=STEPS, job="ref"), sink)
    return result, sink


@pytest.fixture(scope="module")
def job8(tmp_path_factory):
    spool_dir = tmp_path_factory.mktemp("spool")
    proc = run_cli("--dp", "2", "--tp", "2", "--pp", "2", "--steps", str(STEPS), "--job", "j8",
                   "--spool", str(spool_dir), "--timeout-s", "150")
    assert proc.returncode == 0, proc.stderr
    return spool_dir, read_job(spool_dir, "j8")


# ---------------------------------------------------------------------------- one rank
def test_one_rank_gloo_run_records_everything_and_learns(reference):
    result, sink = reference
    assert len(result.losses) == STEPS and result.losses[-1] < result.losses[0]
    assert [s["step"] for s in sink.rows("steps")] == list(range(STEPS))
    names = {s["name"] for s in sink.rows("sections")}
    assert {"dataloader", "forward", "backward", "grad_sync", "optimizer"} <= names
    (running, finished) = sink.rows("jobs")
    assert running["status"] == "running" and finished["status"] == "finished"
    assert finished["model_flops_per_step"] > 0 and finished["dp"] == 1
    assert result.hook_stats["dropped_records"] == 0


def test_training_survives_a_crashing_sink_with_identical_losses(reference):
    class Crashing(hooks.MemorySink):
        def write(self, record_type, rows):
            raise OSError("no space left on device")

    result = run_in_process(TrainConfig(steps=STEPS, job="crash-sink"), Crashing())
    assert result.losses == reference[0].losses
    assert result.hook_stats["sink_errors"] > 0 and result.hook_stats["dropped_records"] > 0


def test_dataloader_path_with_load_cost_and_forked_workers(reference):
    sink = hooks.MemorySink()
    cfg = TrainConfig(steps=2, job="loader", data="loader", load_cost_ms=40)
    result = run_in_process(cfg, sink)
    assert result.losses == reference[0].losses[:2]  # same batches as the synthetic path
    loads = [s for s in sink.rows("sections") if s["name"] == "dataloader"]
    assert len(loads) == 2 and all(s["kind"] == "dataloader" and s["duration_ns"] >= 40e6
                                   for s in loads)
    # DataLoader worker processes are forked from a hooked rank: they must stay silent
    workers = run_in_process(TrainConfig(steps=2, job="loader2", data="loader",
                                         loader_workers=1), hooks.MemorySink())
    assert workers.losses == reference[0].losses[:2]
    assert workers.hook_stats["dropped_records"] == 0


def test_one_rank_collectives_seq_states_and_async_completion():
    sink = hooks.MemorySink()
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        hooks.init(job="c", rank=0, topology=Topology(), sink=sink)
        t = torch.ones(16)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.all_gather([torch.empty(16)], t)
        work = dist.all_reduce(t, async_op=True)
        assert not any(r["seq"] == 4 for r in sink.rows("collectives"))
        work.wait()
        dist.barrier()
        dist.P2POp(dist.isend, t, 0)  # still accepted after wrapping
        hooks.shutdown()
    finally:
        dist.destroy_process_group()
    rows = sink.rows("collectives")
    assert [(r["seq"], r["op"]) for r in rows] == [
        (1, "all_reduce"), (2, "broadcast"), (3, "all_gather"), (4, "all_reduce"), (5, "barrier")]
    assert all(r["state"] == "completed" and r["group_id"] == "world" for r in rows)
    assert all(r["enqueued_ns"] <= r["completed_ns"] and r["duration_ns"] >= 0 for r in rows)
    assert rows[0]["bytes"] == 64 and rows[0]["dtype"] == "float32"


# ---------------------------------------------------------------------------- 8 ranks
def test_3d_loss_equals_single_process_and_decreases(job8, reference):
    _, rec = job8
    by_step = defaultdict(list)
    for s in rec["steps"]:
        if not math.isnan(s["loss"]):
            assert TOPO.is_last_stage(s["rank"])
            by_step[s["step"]].append(s["loss"])
    assert sorted(by_step) == list(range(STEPS))
    # every last-stage rank (2 TP ranks x 2 replicas) reports; replicas differ in data
    losses = [sum(v) / len(v) for _, v in sorted(by_step.items())]
    assert all(len(v) == 4 for v in by_step.values())
    ref = reference[0].losses
    for got, want in zip(losses, ref):
        assert got == pytest.approx(want, rel=LOSS_RTOL)
    assert losses[-1] < losses[0]


def test_each_group_agrees_on_seq_op_and_bytes(job8):
    _, rec = job8
    ops = defaultdict(dict)
    for c in rec["collectives"]:
        if c["op"] in ("send", "recv"):
            continue
        key = (c["group_id"], c["seq"])
        ops[key][c["rank"]] = (c["op"], c["bytes"], c["step"])
    assert ops
    axes = {gid.split(".")[0] for gid, _ in ops}
    assert axes == {"tp", "dp"}
    for (gid, seq), members in ops.items():
        axis, ranks = TOPO.parse_group_id(gid)
        assert sorted(members) == sorted(ranks), (gid, seq)
        assert len(set(members.values())) == 1, (gid, seq, members)
    for gid in {g for g, _ in ops}:  # seq is 1..n without gaps on every rank
        seqs = sorted(s for g, s in ops if g == gid)
        assert seqs == list(range(1, len(seqs) + 1))


def test_every_collective_enqueued_and_completed_with_its_group(job8):
    _, rec = job8
    rows = rec["collectives"]
    assert len(rows) > 100
    for c in rows:
        assert c["state"] == "completed", c
        assert 0 < c["enqueued_ns"] <= c["started_ns"] <= c["completed_ns"], c
        assert c["duration_ns"] >= 0
        if c["axis"] != "world":
            assert c["group_id"] == TOPO.group_id(c["axis"], c["rank"])
            assert c["group_size"] == 2
    per_rank_dp = defaultdict(int)
    for c in rows:
        if c["axis"] == "dp":
            per_rank_dp[c["rank"]] += 1
    assert sorted(per_rank_dp) == list(range(8))  # every rank all-reduced its gradients


def test_p2p_sends_and_recvs_pair_up(job8):
    _, rec = job8
    sends = {(c["rank"], c["peer"], c["group_id"], c["seq"]): c for c in rec["collectives"]
             if c["op"] == "send"}
    recvs = {(c["peer"], c["rank"], c["group_id"], c["seq"]): c for c in rec["collectives"]
             if c["op"] == "recv"}
    assert sends and set(sends) == set(recvs)
    for key, s in sends.items():
        r = recvs[key]
        assert s["bytes"] == r["bytes"] and s["axis"] == r["axis"] == "pp"
        assert TOPO.stage(s["rank"]) != TOPO.stage(r["rank"])
    # forward activations and backward gradients: 2 micro-batches x 2 directions x steps
    assert len(sends) == 4 * 2 * 2 * STEPS


def test_sections_steps_jobs_metrics_and_rank_files(job8):
    spool_dir, rec = job8
    steps = defaultdict(list)
    for s in rec["steps"]:
        steps[s["rank"]].append(s["step"])
    assert {r: sorted(v) for r, v in steps.items()} == {r: list(range(STEPS)) for r in range(8)}
    fwd = [(s["rank"], s["step"], s["microbatch"]) for s in rec["sections"] if s["name"] == "forward"]
    assert len(fwd) == len(set(fwd)) == 8 * STEPS * 2
    statuses = [j["status"] for j in rec["jobs"]]
    assert statuses == ["running", "finished"]
    job = rec["jobs"][-1]
    assert (job["dp"], job["tp"], job["pp"], job["num_microbatches"]) == (2, 2, 2, 2)
    assert job["model_flops_per_step"] > 0 and "train" in job["command"]
    hook_metrics = {(m["rank"], m["name"]) for m in rec["metrics"] if m["source"] == "hooks"}
    assert {(r, "hooks.overhead_ns_total") for r in range(8)} <= hook_metrics
    for r in range(8):
        d = rank_dir(spool_dir, "j8", r)
        info = read_rank_info(d)
        assert info["rank"] == r and info["job"] == "j8" and info["pid"] > 0
        assert (d / LOG_NAME).exists()
    assert "loss" in (rank_dir(spool_dir, "j8", 4) / LOG_NAME).read_text()


def test_pin_cpus_puts_each_rank_on_a_core_of_its_own(tmp_path):
    """``--pin-cpus``: rank r runs on the (r % n)-th usable CPU (with as many cores as
    ranks, no rank takes another's core, as no GPU takes another's)."""
    cpus = sorted(os.sched_getaffinity(0))
    proc = run_cli("--dp", "2", "--steps", "1", "--job", "pin", "--spool", str(tmp_path), "--pin-cpus",
                   "--timeout-s", "120")
    assert proc.returncode == 0, proc.stderr
    for r in range(2):
        log = (rank_dir(str(tmp_path), "pin", r) / LOG_NAME).read_text()
        assert f"rank {r} pinned to CPU {cpus[r % len(cpus)]}" in log, log
