"""Fault injection: spec parsing, and each fault's effect on a real multi-process job."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
from fleetscope.trainer.faults import parse_fault
from fleetscope.trainer_hooks.reader import read_job

from fleetscope import cli
from fleetscope.spool import rank_dir, read_rank_info


def train_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetscope.cli", "train", *args]


def assert_ranks_gone(spool_dir, job, world):
    for r in range(world):
        pid = read_rank_info(rank_dir(spool_dir, job, r)).get("pid")
        if pid:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


# ---------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("spec,kind,values", [
    ("straggler:rank=5:factor=1.3:from_step=10", "straggler",
     {"rank": 5, "factor": 1.3, "from_step": 10, "section": "compute"}),
    ("straggler:rank=1:factor=2:section=dataloader", "straggler", {"section": "dataloader"}),
    ("hang:rank=3:step=20:where=collective", "hang", {"step": 20, "where": "collective"}),
    ("crash:rank=2:step=15", "crash", {"rank": 2, "step": 15}),
    ("slowlink:group=tp:rank=1:delay_ms=5", "slowlink", {"group": "tp", "delay_ms": 5.0}),
    ("gc:rank=0:every=3:pause_ms=200", "gc", {"every": 3, "pause_ms": 200.0}),
])
def test_specs_parse(spec, kind, values):
    f = parse_fault(spec, world_size=8)
    assert f.kind == kind
    for k, v in values.items():
        assert f.get(k) == v


@pytest.mark.parametrize("spec,named", [
    ("slow:rank=1", "'slow'"),
    ("straggler:rank=x:factor=2", "'x'"),
    ("straggler:rank=1", "factor"),
    ("straggler:rank=1:factor=0.5", "factor=0.5"),
    ("hang:rank=1:step=2:where=gpu", "'gpu'"),
    ("crash:rank=9:step=1", "rank=9"),
    ("slowlink:group=ep:rank=1:delay_ms=3", "'ep'"),
    ("gc:rank=1:every=0:pause_ms=3", "every=0"),
    ("gc:rank=1:often=2", "'often=2'"),
])
def test_bad_specs_name_the_bad_value(spec, named):
    with pytest.raises(ValueError) as e:
        parse_fault(spec, world_size=8)
    assert named in str(e.value)


def test_cli_rejects_bad_values_before_launching(capsys):
    assert cli.main(["train", "--dp", "2", "--inject", "crash:rank=7:step=1"]) == 2
    assert "rank=7" in capsys.readouterr().err
    assert cli.main(["train", "--tp", "3", "--heads", "4"]) == 2
    assert "num_heads=4" in capsys.readouterr().err


# ---------------------------------------------------------------------------- effects
@pytest.fixture(scope="module")
def slow_job(tmp_path_factory):
    """One 8-rank run with a straggler, a GC-pausing rank and a slow TP link."""
    spool_dir = tmp_path_factory.mktemp("spool")
    proc = subprocess.run(train_cmd(
        "--dp", "2", "--tp", "2", "--pp", "2", "--steps", "5", "--job", "slow",
        "--spool", str(spool_dir), "--timeout-s", "170",
        "--inject", "straggler:rank=5:factor=3:from_step=1",
        "--inject", "gc:rank=2:every=2:pause_ms=150",
        "--inject", "slowlink:group=tp:rank=1:delay_ms=30"),
        capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr
    return read_job(spool_dir, "slow")


def _median(rows: list, **match) -> float:
    vals = [r["duration_ns"] for r in rows if all(r[k] == v for k, v in match.items())]
    assert vals, match
    return statistics.median(vals)


def test_straggler_sections_take_about_factor_times_longer(slow_job):
    # rank 5 vs the other replica's ranks of the same stage (6, 7: not in rank 5's TP
    # group), paired by (step, micro-batch) so they saw the same machine load. A section's
    # own work is its duration minus the communication inside it (the TP all-reduces wait
    # for the slower peer): that is what the injection stretches, whatever the waits.
    colls = {}
    for c in slow_job["collectives"]:
        colls.setdefault(c["rank"], []).append((c["enqueued_ns"], c["completed_ns"]))

    def own(s):
        inside = sum(max(0, min(b, s["end_ns"]) - max(a, s["start_ns"])) for a, b in colls.get(s["rank"], ())
                     if s["start_ns"] <= a < s["end_ns"])
        return s["duration_ns"] - inside

    dur = {(s["rank"], s["name"], s["step"], s["microbatch"]): own(s)
           for s in slow_job["sections"] if s["step"] >= 1}
    keys = [k for k in dur if k[0] == 5 and k[1] in ("forward", "backward")]
    assert len(keys) == 2 * 4 * 2
    # On a CPU device compute is stretched with work: the thread burns (F - 1)x the CPU
    # time the section used, so the sections' thread CPU time (``cpu_ns``) is F x its
    # peers', whatever the machine's load (the peers' own compute is the same work), and
    # more (probably its own compute running from caches the burn cooled; the suite's
    # factors read 1.04-1.09x the injected one; 3.52 and 3.99 for 3x were seen in full CI
    # runs, 2026-12-05). The bounds still fail a sleep (~1x) or a doubled burn (~5x)
    cpu = {(s["rank"], s["name"], s["step"], s["microbatch"]): s["cpu_ns"]
           for s in slow_job["sections"] if s["step"] >= 1}
    mine = sum(cpu[k] for k in keys)
    peers = sum((cpu[(6, *k[1:])] + cpu[(7, *k[1:])]) / 2 for k in keys)
    assert 2.6 < mine / peers < 4.5, mine / peers
    # on the wall clock the own work grows by more than F: the burn competes for the 2
    # shared cores with the other 7 ranks (and waits for one), as a rank doing more work
    # on an oversubscribed host does
    mine = sum(dur[k] for k in keys)
    peers = sum((dur[(6, *k[1:])] + dur[(7, *k[1:])]) / 2 for k in keys)
    assert mine / peers > 1.6, mine / peers


def test_straggler_sleep_pays_back_lateness(monkeypatch):
    """Each sleep wakes 7 ms late (an oversubscribed host): the stretches still add up to
    the asked delay, within one sleep's lateness, instead of 7 ms more per stretch."""
    from fleetscope.trainer import faults

    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

        def sleep(self, s: float) -> None:
            self.now += s + 0.007

    clock = Clock()
    monkeypatch.setattr(faults, "time", clock)
    inj = faults.FaultInjector([], rank=0)
    asked = 0.0
    for _ in range(200):
        inj._sleep(0.002)
        asked += 0.002
    assert abs(clock.now - asked) <= 0.007 + 1e-9, (clock.now, asked)


def test_gc_pauses_hit_the_chosen_rank_every_n_steps(slow_job):
    fwd = [s for s in slow_job["sections"] if s["rank"] == 2 and s["name"] == "forward"]
    for step in (2, 4):
        assert max(s["duration_ns"] for s in fwd if s["step"] == step) >= 150e6
        # a collector's pause runs on the CPU, not a sleep (which would read as the host
        # taking the core away); on 2 shared cores the thread gets a share of the 150 ms
        assert max(s["cpu_ns"] for s in fwd if s["step"] == step) >= max(
            25e6, 4 * max(s["cpu_ns"] for s in fwd if s["step"] == 3))


def test_slowlink_delays_that_groups_collectives(slow_job):
    tp = [c for c in slow_job["collectives"] if c["axis"] == "tp"]
    # every op of rank 1 on its TP group waited out the 30 ms delay; its partner waits too
    assert min(c["duration_ns"] for c in tp if c["rank"] == 1) >= 29e6
    assert _median(tp, rank=0) >= 25e6
    # the other TP group of the stage is not delayed: its fastest ops are far below 30 ms
    other = sorted(c["duration_ns"] for c in tp if c["group_id"] == "tp.pp0.dp1")
    assert other[len(other) // 4] < 15e6
    # and rank 1's ops on other axes are not delayed
    assert min(c["duration_ns"] for c in slow_job["collectives"]
               if c["rank"] == 1 and c["axis"] != "tp") < 29e6


def _stuck(rows: dict, rank: int, kind: str, min_step: int) -> list:
    return [r for r in rows.get("inflight", ()) if r["rank"] == rank and r["kind"] == kind
            and r["step"] >= min_step]


def test_hangs_stop_steps_while_inflight_records_keep_coming(tmp_path):
    """Rank 3 hangs inside a collective, rank 5 (other replica) inside a p2p op."""
    spool_dir = tmp_path / "spool"
    proc = subprocess.Popen(train_cmd(
        "--dp", "2", "--tp", "2", "--pp", "2", "--steps", "50", "--job", "hang",
        "--spool", str(spool_dir), "--timeout-s", "170",
        "--inject", "hang:rank=3:step=2:where=in_collective",
        "--inject", "hang:rank=5:step=2:where=in_p2p"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 150
        coll = p2p = []
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1.0)
            rows = read_job(spool_dir, "hang") if spool_dir.exists() else {}
            coll, p2p = _stuck(rows, 3, "collective", 2), _stuck(rows, 5, "p2p", 2)
            if all(x and x[-1]["ts_ns"] - x[0]["ts_ns"] >= 2.5e9 for x in (coll, p2p)):
                break
        assert proc.poll() is None, proc.communicate()[1]
        proc.send_signal(signal.SIGTERM)  # stopping the launcher stops its ranks
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    for stuck in (coll, p2p):  # the same op, again and again, while nothing progresses
        assert len(stuck) >= 4
        assert len({(r["op"], r["group_id"], r["seq"]) for r in stuck}) == 1
        since = [r["since_ns"] for r in stuck]  # re-anchoring the clock moves it by ~us
        assert max(since) - min(since) < 1e6
    assert coll[0]["axis"] in ("tp", "dp")
    assert p2p[0]["axis"] == "pp" and p2p[0]["peer"] == 1 and p2p[0]["op"] == "recv"
    rows = read_job(spool_dir, "hang")
    assert max(s["step"] for s in rows["steps"]) <= 2
    assert_ranks_gone(spool_dir, "hang", 8)


def test_job_timeout_kills_a_hung_job(tmp_path):
    """``--timeout-s``: launched from this process (torch already imported: fast)."""
    from fleetscope.trainer.config import TrainConfig
    from fleetscope.trainer.launcher import EXIT_TIMEOUT, launch

    cfg = TrainConfig(steps=100, job="timeout", spool=str(tmp_path),
                      injections=("hang:rank=0:step=0:where=compute",))
    lines: list[str] = []
    result = launch(cfg, timeout_s=10, echo=lines.append)
    assert result.timed_out and result.returncode == EXIT_TIMEOUT
    assert any("timeout" in line for line in lines)
    assert 10 <= result.duration_s < 40
    rows = read_job(tmp_path, "timeout")
    stuck = _stuck(rows, 0, "section", 0)
    assert stuck and {r["op"] for r in stuck} == {"forward"}
    assert_ranks_gone(tmp_path, "timeout", 1)


def test_crash_exits_nonzero_and_stops_the_others(tmp_path):
    spool_dir = tmp_path / "spool"
    proc = subprocess.run(train_cmd(
        "--dp", "2", "--pp", "2", "--steps", "30", "--job", "crash", "--spool", str(spool_dir),
        "--timeout-s", "150", "--failure-grace-s", "1", "--inject", "crash:rank=2:step=2"),
        capture_output=True, text=True, timeout=200)
    assert proc.returncode == 1, proc.stderr
    assert "rank 2 exited with code 1" in proc.stderr
    rows = read_job(spool_dir, "crash")
    # a hard crash loses what was not flushed yet, but nothing past the crash exists
    assert all(s["step"] <= 1 for s in rows["steps"] if s["rank"] == 2)
    assert max(s["step"] for s in rows["steps"]) >= 1
    assert {s["rank"] for s in rows["steps"]} - {2}  # survivors flushed (error or SIGTERM)
    assert all(s["step"] <= 1 for s in rows["steps"])  # step 2 never completed anywhere
    assert "finished" not in {j["status"] for j in rows.get("jobs", ())}
    assert_ranks_gone(spool_dir, "crash", 4)
