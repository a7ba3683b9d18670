"""The in-job overhead figure of ``bench/hook_overhead.py`` (issue 15): its CPU-share
estimate, and the hooks' flush counter it relies on to charge each block's background
work to that block."""

from __future__ import annotations

import importlib.util
import random
import time
from pathlib import Path

import pytest

from fleetscope import trainer_hooks as hooks

_SPEC = importlib.util.spec_from_file_location(
    "hook_overhead", Path(__file__).resolve().parents[1] / "bench" / "hook_overhead.py")
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _docs(ranks: int, pairs: int, block: int, train_us: float, bg_us: float,
          wall_noise: float, seed: int = 1) -> list[dict]:
    """Ranks' timings of a job whose hooks cost ``train_us`` on the training thread and
    ``bg_us`` on the background thread per step, at a 10 ms wall / 4 ms CPU step;
    wall times carry heavy multiplicative noise, CPU times a little."""
    rng = random.Random(seed)
    docs = []
    for _ in range(ranks):
        times, blocks = [], []
        for p in range(pairs):
            machine = rng.uniform(0.7, 1.5)  # the pair's share of a noisy machine
            for lv in ("off", "full"):
                extra = lv == "full"
                for _ in range(block):
                    wall = 0.010 * machine * rng.uniform(0.9, 1.1 + wall_noise)
                    cpu = 0.004 + extra * train_us * 1e-6 + rng.gauss(0, 2e-6)
                    times.append((p, lv, wall, cpu))
                idle = 200_000 + rng.gauss(0, 2_000)  # control polls: ns per block
                blocks.append((p, lv, idle + extra * bg_us * 1e3 * block))
        docs.append({"times": times, "blocks": blocks})
    return docs


@pytest.mark.parametrize("train_us,bg_us", [(20.0, 30.0), (60.0, 90.0), (0.0, 0.0)])
def test_cpu_share_recovers_the_hooks_cost_under_wall_noise(train_us, bg_us):
    docs = _docs(ranks=4, pairs=40, block=20, train_us=train_us, bg_us=bg_us, wall_noise=0.5)
    cost = bench.cpu_cost(docs, 40, 20, seed=0)
    machine_mean = 0.010 * 1.1 * (1.0 + 0.25)  # E[uniform(.7,1.5)] * E[uniform(.9,1.6)]
    want = (train_us + bg_us) * 1e-6 / machine_mean
    assert cost["lo"] <= cost["ratio"] <= cost["hi"]
    assert cost["ratio"] - 1 == pytest.approx(want, rel=0.25, abs=2e-4)
    assert cost["hi"] - cost["lo"] < 0.004  # resolves a fraction of a percent
    assert cost["train_us"] == pytest.approx(train_us, abs=2.0)
    assert cost["bg_us"] == pytest.approx(bg_us, abs=1.0)
    # the wall ratio of the same runs cannot decide 1%
    wall = bench.analyse([(p, lv, w) for p, lv, w, _ in docs[0]["times"]], 40, 0)
    assert wall["hi"] - wall["lo"] > 0.02


def test_cpu_share_needs_both_blocks_of_a_pair():
    docs = _docs(ranks=1, pairs=2, block=4, train_us=10, bg_us=10, wall_noise=0)
    docs[0]["blocks"] = [b for b in docs[0]["blocks"] if b[1] == "off"]
    with pytest.raises(SystemExit, match="no pair"):
        bench.cpu_cost(docs, 2, 4, seed=0)


def test_two_flushes_after_a_point_have_written_everything_before_it():
    sink = hooks.MemorySink()
    cfg = hooks.HookConfig(poll_interval_s=0.05, flush_interval_s=0.05)
    rec = hooks.init(job="j", rank=0, sink=sink, config=cfg, trace_collectives=False)
    try:
        for i in range(5):
            with hooks.step(i), hooks.section("forward"):
                pass
        f = rec.flushes
        deadline = time.monotonic() + 10
        while rec.flushes < f + 2:
            assert time.monotonic() < deadline, "the hooks' thread did not flush"
            time.sleep(0.01)
        assert len(sink.rows("sections")) == 5
        assert len(sink.rows("steps")) == 5  # each `with hooks.step` ends its step
        assert hooks.stats()["worker_flushes"] >= f + 2
    finally:
        hooks.shutdown()
