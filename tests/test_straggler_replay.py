"""``bench/straggler_replay.py`` (issue 14): its ``replay`` half reads real spool files back
and replays the straggler detector pass by pass - the culprit of a known job is named a
few steps after onset with its factor, the clean twin gives no finding on any pass - and
its ``--case`` values are checked, naming the bad one."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from fleetscope import trainer_hooks as hooks
from fleetscope.topology import Topology
from tests.helpers.synthetic import SynthJob

_BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def replay():
    spec = importlib.util.spec_from_file_location("straggler_replay", _BENCH / "straggler_replay.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["straggler_replay"] = mod  # its dataclasses look their module up there
    before = list(sys.path)
    try:
        spec.loader.exec_module(mod)  # puts bench/ on sys.path for its sibling diagnosis.py
    finally:
        sys.path[:] = before
    return mod


def _spool(root: Path, job: SynthJob) -> None:
    """Write a synthetic job's records into per-rank spool files, as the hooks do."""
    frames = job.build()
    for rank in range(job.topo.world_size):
        sink = hooks.SpoolSink(root)
        sink.open({"job": job.job, "rank": rank, "pid": 1, "local_rank": rank % 8})
        failed = sink.write_many({k: f[f["rank"] == rank].to_dict("records") for k, f in frames.items()})
        sink.close()
        assert not failed


def test_replay_names_the_straggler_after_onset_and_nothing_on_the_clean_twin(replay, tmp_path):
    topo = Topology(dp=2, tp=2, pp=2)
    onset, culprit = replay.ONSET, 6
    _spool(tmp_path / "spool", SynthJob(topo=topo, num_steps=30, noise=0.05, seed=3, job="replay-fault",
                                        compute_factor=lambda r, s: 1.5 if r == culprit and s >= onset else 1.0))
    _spool(tmp_path / "spool", SynthJob(topo=topo, num_steps=30, noise=0.05, seed=3, job="replay-clean"))

    got = replay.replay_job(tmp_path / "spool", "replay-fault", (2, 2, 2), culprit, onset)
    assert got["named_steps"] is not None and 1 <= got["named_steps"] <= 8, got
    assert 0 < got["named_s"] < 30 and got["component"] == "compute"
    assert abs(got["factor"] - 1.5) <= 0.15 and not got["false"], got
    assert got["noise"]["sigma"] < 0.2 and got["noise"]["ratio"] > 1.3

    twin = replay.replay_job(tmp_path / "spool", "replay-clean", (2, 2, 2), None, onset)
    assert twin["passes"] >= 20 and twin["false"] == []

    manifest = {"onset_step": onset, "steps": 30, "cpus": 2, "load_before": [0, 0, 0], "load_after": [0, 0, 0],
                "runs": [{"job": "replay-fault", "clean": False, "rank": culprit, "factor": 1.5, "seed": 3,
                          "layout": [2, 2, 2]},
                         {"job": "replay-clean", "clean": True, "rank": culprit, "factor": 1.5, "seed": 3,
                          "layout": [2, 2, 2]}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert replay.replay(tmp_path) == 0  # named, and no false finding: the exit status says so


def test_replay_fails_when_the_culprit_is_never_named(replay, tmp_path):
    topo = Topology(dp=2, tp=2, pp=2)
    _spool(tmp_path / "spool", SynthJob(topo=topo, num_steps=24, noise=0.05, seed=1, job="replay-nothing"))
    (tmp_path / "manifest.json").write_text(json.dumps({
        "onset_step": 8, "steps": 24, "cpus": 2, "load_before": [0, 0, 0], "load_after": [0, 0, 0],
        "runs": [{"job": "replay-nothing", "clean": False, "rank": 6, "factor": 1.2, "seed": 1,
                  "layout": [2, 2, 2]}]}))
    assert replay.replay(tmp_path) == 1


@pytest.mark.parametrize(("text", "says"), [
    ("6:1.2", "RANK:FACTOR:SEED"),
    ("x:1.2:0", "'x:1.2:0'"),
    ("8:1.2:0", "rank 8 is not in 0..7"),
    ("6:0.9:0", "factor 0.9 must be > 1"),
    ("3:1.2:0:2x2", "layout '2x2' is not DPxTPxPP"),
    ("9:1.2:0:2x1x4", "rank 9 is not in 0..7"),
])
def test_a_bad_case_is_a_usage_error_naming_it(replay, text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says.replace(".", r"\.")):
        replay.parse_case(text)
    assert replay.parse_case("3:1.2:2:2x1x4").layout == (2, 1, 4)


def _kept_run(replay, work: Path, tag: str, job: SynthJob) -> None:
    """A run as ``bench/diagnosis.py --keep`` leaves it: ``spool/<tag>/bench-<...>/``."""
    _spool(work / "spool" / tag, job)


def test_suite_replays_a_kept_work_dir_with_and_without_a_setting(replay, tmp_path, capsys):
    sc = next(s for s in replay.suite.SCENARIOS if s.name == "compute-stage1")
    (culprit,) = sc.culprits
    topo = Topology(*sc.layout)
    _kept_run(replay, tmp_path, "compute-stage1-s0", SynthJob(
        topo=topo, num_steps=30, noise=0.05, seed=3, job="bench-compute-stage1-s0-1",
        compute_factor=lambda r, s: 1.5 if r == culprit and s >= sc.onset_step else 1.0))
    _kept_run(replay, tmp_path, "compute-stage1-clean-s0", SynthJob(
        topo=topo, num_steps=30, noise=0.05, seed=3, job="bench-compute-stage1-clean-s0-1"))
    assert replay.replay_suite(tmp_path, ["confirm_steps=0"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":")[0]: line for line in out.splitlines() if "clean twins with" in line}
    assert set(lines) == {"default", "confirm_steps=0"}, out
    for line in lines.values():
        assert "clean twins with a straggler finding on some pass 0/1" in line and "never named 0" in line, line
    # the confirmation names a new straggler one step later than the window alone
    named = {label: int(line.split("onset -> named median ")[1].split()[0]) for label, line in lines.items()}
    assert named["default"] == named["confirm_steps=0"] + 1, out

    with pytest.raises(SystemExit, match="no_such_field"):
        replay.replay_suite(tmp_path, ["no_such_field=1"])
    with pytest.raises(SystemExit, match="no spool"):
        replay.replay_suite(tmp_path / "missing", [])


def test_suite_fails_when_a_kept_runs_culprit_is_never_named(replay, tmp_path):
    sc = next(s for s in replay.suite.SCENARIOS if s.name == "compute-stage1")
    _kept_run(replay, tmp_path, "compute-stage1-s0", SynthJob(
        topo=Topology(*sc.layout), num_steps=24, noise=0.05, seed=1, job="bench-compute-stage1-s0-1"))
    assert replay.replay_suite(tmp_path, []) == 1
