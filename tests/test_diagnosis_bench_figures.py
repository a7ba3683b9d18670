"""The measured-slowdown figures of bench/diagnosis.py (issue 14, what-if vs measured):
the faulty/clean slowdown, the same with each run against its own steps before onset,
and the peers' compute ratio, read from spools written by the hooks' spool sink."""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetscope.trainer_hooks.sinks import SpoolSink

from tests.helpers.bench_module import load_bench

MS = 1_000_000


@pytest.fixture(scope="module")
def bench():
    return load_bench("diagnosis", "bench_diagnosis_figures")


def write_job(spool_dir: Path, job: str, step_ms: list[list[float]], compute_ms: list[list[float]]) -> None:
    """Rank r's step s lasts ``step_ms[r][s]``, with one forward section of ``compute_ms[r][s]``."""
    for rank, (steps, computes) in enumerate(zip(step_ms, compute_ms)):
        sink = SpoolSink(spool_dir)
        sink.open({"job": job, "rank": rank, "host": "h0", "attempt": 0, "local_rank": rank})
        t = 1_000 * MS
        step_rows, sec_rows = [], []
        base = {"job": job, "attempt": 0, "rank": rank, "host": "h0"}
        for n, (dur, comp) in enumerate(zip(steps, computes)):
            step_rows.append({**base, "step": n, "start_ns": t, "end_ns": t + int(dur * MS),
                              "duration_ns": int(dur * MS), "num_microbatches": 1, "tokens": 0,
                              "loss": 0.0})
            sec_rows.append({**base, "step": n, "microbatch": 0, "name": "forward", "kind": "compute",
                             "start_ns": t, "end_ns": t + int(comp * MS), "duration_ns": int(comp * MS),
                             "device_ns": -1})
            t += int(dur * MS)
        sink.write("steps", step_rows)
        sink.write("sections", sec_rows)
        sink.close()


def test_slowdown_against_the_clean_twin_and_against_the_steps_before_onset(bench, tmp_path):
    # 12 steps, onset at step 4. The clean twin ran on a machine 10% faster throughout
    # (a load shift between the two runs); the fault adds 20% to the faulty job's steps
    # from its onset. The peers (rank 1) compute 5% less in the faulty run after onset.
    onset, n = 4, 12
    faulty_steps = [[100.0 * (1.2 if s >= onset else 1.0) for s in range(n)]] * 2
    clean_steps = [[90.0] * n] * 2
    faulty_compute = [[60.0 * (1.2 if s >= onset else 1.0) for s in range(n)],
                      [60.0 * (0.95 if s >= onset else 1.0) for s in range(n)]]
    clean_compute = [[60.0] * n, [60.0] * n]
    write_job(tmp_path, "faulty", faulty_steps, faulty_compute)
    write_job(tmp_path, "clean", clean_steps, clean_compute)
    results = []
    for job in ("faulty", "clean"):
        r = bench.Result(job)
        r.step_s = bench.job_step_s(tmp_path, job, 2, onset + 2)
        r.pre_step_s = bench.job_step_s(tmp_path, job, 2, 1, onset)
        r.peers_compute_s = bench.peers_compute_s(tmp_path, job, (1, 1, 2), {0}, onset + 2)
        results.append(r)
    faulty, clean = results
    assert faulty.step_s == pytest.approx(0.120) and faulty.pre_step_s == pytest.approx(0.100)
    assert clean.step_s == pytest.approx(0.090) and clean.pre_step_s == pytest.approx(0.090)
    bench.set_measured(faulty, clean)
    assert faulty.measured == pytest.approx(120 / 90 - 1, abs=1e-4)  # the load shift counts in it
    assert faulty.measured_pre == pytest.approx(0.20, abs=1e-4)  # ... and cancels out of this one
    assert faulty.peers_ratio == pytest.approx(0.95, abs=1e-3)


def test_no_figure_without_steps_before_onset_or_a_clean_twin(bench):
    faulty, clean = bench.Result("f"), bench.Result("c")
    faulty.step_s, clean.step_s = 1.2, 1.0
    bench.set_measured(faulty, clean)
    assert faulty.measured == pytest.approx(0.2)
    assert faulty.measured_pre is None and faulty.peers_ratio is None
    lone = bench.Result("f")
    bench.set_measured(lone, bench.Result("c"))
    assert lone.measured is None and lone.measured_pre is None


def test_the_measured_slowdowns_interval_narrows_with_the_noise(bench):
    import numpy as np

    rng = np.random.default_rng(3)
    clean = list(1.0 * np.exp(rng.normal(0, 0.02, 30)))
    faulty = list(1.2 * np.exp(rng.normal(0, 0.02, 30)))
    lo, hi = bench.slowdown_interval(faulty, clean)
    assert lo < 0.2 < hi and hi - lo < 0.05
    noisy_clean = list(1.0 * np.exp(rng.normal(0, 0.3, 30)))
    noisy_faulty = list(1.2 * np.exp(rng.normal(0, 0.3, 30)))
    nlo, nhi = bench.slowdown_interval(noisy_faulty, noisy_clean)
    assert nhi - nlo > 4 * (hi - lo)  # at 30% step noise, a 20% slowdown is barely pinned down


def test_the_interval_is_set_with_the_measured_slowdown(bench):
    faulty, clean = bench.Result("f"), bench.Result("c")
    faulty.step_times, clean.step_times = [1.2, 1.21, 1.19, 1.2], [1.0, 1.01, 0.99, 1.0]
    faulty.step_s, clean.step_s = 1.2, 1.0
    bench.set_measured(faulty, clean)
    lo, hi = faulty.measured_ci
    assert lo <= faulty.measured <= hi and hi - lo < 0.05


def test_summary_judges_the_what_if_and_factor_against_what_was_measured(bench, capsys):
    sc = next(s for s in bench.SCENARIOS if s.name == "dataloader-3x")
    faulty = bench.Result(sc.name, injected=[2], culprits=[2], kinds=["slow_dataloader"])
    faulty.factors, faulty.noise = {2: 2.66}, {"sigma": 0.6, "ratio": 2.667, "cusum_steps_1.2x": 400}
    faulty.whatif, faulty.measured, faulty.measured_ci = 0.013, 0.004, (-0.054, 0.074)
    faulty.ok = True
    clean = bench.Result(sc.name, clean=True, ok=True)
    status = bench.summarize([(sc, faulty), (sc, clean)])
    out = capsys.readouterr().out
    # 2.66 is 11% off the injected 3x (a target missed), but it is the ratio the spool shows
    assert "factor within +-10% of injected: 0/1" in out
    assert "against the ratio the spool shows over the same steps: 1/1 within +-10%" in out
    assert "what-if inside the measured slowdown's 90% interval: 1/1" in out
    assert status == 1  # the factor target stays missed
