"""Issue 14: the carried straggler test on 8-rank jobs, pass by pass as the diagnosis loop
runs it - the two ways the real-trainer e2e test (tests/test_diagnosis_e2e.py) failed with
the carried CUSUM and per-step scan levels merged, reproduced without processes:

* the straggler not named at all (twice in 240 s): on 8 ranks the straggler is 1/8 of
  the rank-steps, and the pooled noise scale (an upper percentile) and the pooled moment
  that sets the CUSUM's weights read the straggler itself, so it hid itself;
* the straggler named with factor 0.755 (a slowdown finding must read > 1, near the
  measured ratio).

``real8-*.csv.gz`` are the per-rank-per-step breakdowns (the rollups' columns, plus each
rank-step's end time in ms from the job's first step end) of two real runs of the
e2e test's job on this 2-core host, taken from their spools: `fleetscope train --dp 2
--tp 2 --pp 2 --hidden 128 --seq-len 64 --global-batch 8 --microbatches 4 --steps 80`,
once with `--inject straggler:rank=5:factor=1.6:from_step=4` and once clean (load ~8-11;
per-step compute noise sigma ~0.45 per rank; the straggler's measured ratio ~1.84). The
replay shows the detector what the loop's loader would: at each 1 s tick, the rank-steps
that had ended, up to the newest step less one, the latest 24 steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fleetscope.server.diagnosis.breakdown import BREAKDOWN_COLUMNS
from fleetscope.server.diagnosis.stragglers import (
    StragglerState,
    detect_stragglers,
    stage_log_ratios,
)

from fleetscope.topology import Topology
from tests.helpers.synthetic import MS

DATA = Path(__file__).parent / "data" / "sequential"
TOPO8 = Topology(dp=2, tp=2, pp=2)
ONSET = 4


def _real(name: str) -> pd.DataFrame:
    return pd.read_csv(DATA / f"real8-{name}.csv.gz")


def _measured_ratio(bd: pd.DataFrame, topo: Topology, rank: int, onset: int, column: str = "compute_ns") -> float:
    """The straggler's true slowdown as its own records show it: the median over steps
    after onset of its component's ratio to its stage peers' median."""
    ranks, steps, lr, _ = stage_log_ratios(topo, bd[bd.step >= onset], column)
    return float(np.exp(np.median(lr[ranks.index(rank)])))


def _replay(bd: pd.DataFrame, topo: Topology, tick_ms: float = 1000.0, window: int = 24):
    """(tick, newest step, findings) per diagnosis pass, one carried state for the job."""
    state = StragglerState()
    for t in np.arange(tick_ms, bd["end_ms"].max() + 2 * tick_ms, tick_ms):
        seen = bd[bd["end_ms"] <= t]
        if seen.empty:
            continue
        last = int(seen["step"].max())
        win = seen[seen["step"].between(last - window, last - 1)]
        if win.empty:
            continue
        yield t, last, detect_stragglers("j", topo, win[list(BREAKDOWN_COLUMNS)], pd.DataFrame(), state=state)


def _check_straggler(passes, rank: int, true_ratio: float, onset: int, within_steps: int) -> int:
    """The rank is named within ``within_steps`` of onset, nobody else ever, and every pass
    that names it reads a factor > 1 within 25% of ``true_ratio``; returns the first step."""
    first = None
    for t, last, findings in passes:
        wrong = [(f.kind.value, f.ranks) for f in findings if f.ranks != (rank,)]
        assert not wrong, (t, last, wrong)
        for f in findings:
            assert f.kind.value == "slow_compute" and f.component == "compute", (t, last, f.kind, f.component)
            assert f.factor > 1 and abs(f.factor / true_ratio - 1) <= 0.25, (t, last, f.factor, true_ratio)
            first = last if first is None else first
    assert first is not None and first - onset <= within_steps, (first, onset)
    return first


def test_real_8_rank_1_6x_compute_straggler_is_named_with_its_measured_factor_on_every_pass():
    bd = _real("strag")
    ratio = _measured_ratio(bd, TOPO8, 5, ONSET)
    assert 1.5 <= ratio <= 2.2, ratio  # the fixture is what it says
    _check_straggler(_replay(bd, TOPO8), 5, ratio, ONSET, within_steps=40)


def test_real_8_rank_clean_job_gives_no_finding_on_any_pass():
    for t, last, findings in _replay(_real("clean"), TOPO8):
        assert findings == [], (t, last, [(f.kind.value, f.ranks, f.factor) for f in findings])


def _synth(topo: Topology, steps: int, sigma: float, seed: int, slow: dict[int, float], onset: int = ONSET,
           spiky: float = 0.15) -> pd.DataFrame:
    """A job like the real 8-rank one: per-rank-per-step compute lognormal ``sigma`` plus
    ``spiky`` of the rank-steps 1.5-2.5x slow at random (a loaded host), data loader,
    optimizer and untimed work; ``slow``: rank -> compute factor from ``onset``; each
    step 0.5 s long, every rank's row ending with the step. At ``sigma`` 0.3 the compute
    log ratios' noise is the real fixtures' (robust scale 0.46 vs 0.45-0.47, step-to-step
    0.42 vs 0.43-0.48)."""
    rng = np.random.default_rng(seed)
    n = topo.world_size
    comp = 30 * MS * np.exp(sigma * rng.standard_normal((n, steps)))
    comp *= np.where(rng.random((n, steps)) < spiky, rng.uniform(1.5, 2.5, (n, steps)), 1.0)
    for r, f in slow.items():
        comp[r, onset:] *= f
    dl = 1 * MS * (1 + rng.exponential(0.5, (n, steps)))
    opt = 6 * MS * np.exp(0.3 * rng.standard_normal((n, steps)))
    unt = 1 * MS * np.exp(0.3 * rng.standard_normal((n, steps)))
    busy = comp + dl + opt + unt
    step = np.broadcast_to(busy.max(axis=0) * 1.5, (n, steps))
    rk, st = np.meshgrid(np.arange(n), np.arange(steps), indexing="ij")
    cols = {"rank": rk.ravel(), "step": st.ravel(), "step_ns": step.ravel(), "comm_ns": (step - busy).ravel(),
            "wait_ns": (step - busy).ravel(), "busy_ns": busy.ravel(), "compute_ns": comp.ravel(),
            "dataloader_ns": dl.ravel(), "optimizer_ns": opt.ravel(), "other_ns": 0.0,
            "untimed_ns": unt.ravel(), "wait_caused_ns": 0.0, "num_last_arrivals": 0, "num_collectives": 10,
            "end_ms": (st.ravel() + 1) * 500.0 + rk.ravel()}
    return pd.DataFrame(cols)[[*BREAKDOWN_COLUMNS, "end_ms"]]


@pytest.mark.parametrize("layout,rank,seed,factor,within", [
    # 1 of 4 stage peers, 1/8 of the rank-steps; a 2-rank stage (half its stage); 1 of 4 of 8
    ((2, 2, 2), 5, 0, 1.6, 110), ((2, 2, 2), 5, 1, 1.6, 110), ((2, 2, 2), 0, 2, 1.6, 110),
    ((1, 2, 2), 3, 3, 1.6, 110), ((4, 1, 2), 6, 4, 1.6, 110),
    # what the e2e test's "1.6x" measured on this loaded host (the real fixture: 1.84x),
    # inside that job's 76 steps after onset
    ((2, 2, 2), 5, 0, 1.84, 75), ((2, 2, 2), 5, 1, 1.84, 75), ((1, 2, 2), 1, 2, 1.84, 75),
])
def test_synthetic_small_jobs_name_a_slow_rank_with_a_true_factor_on_every_pass(layout, rank, seed, factor,
                                                                                 within):
    # measured (seeds as listed): 1.6x named 47-107 steps after onset, 1.84x 47-71; before the
    # straggler-robust noise scale and moment: never in 120 steps. At this noise (sigma
    # ~0.45 per step) and 1e-4 false findings per step of a 12,288-rank fleet a 1.6x rank
    # needs ~38 steps of evidence even with Gaussian noise
    dp, tp, pp = layout
    topo = Topology(dp=dp, tp=tp, pp=pp)
    bd = _synth(topo, 140, 0.3, seed, {rank: factor})
    ratio = _measured_ratio(bd, topo, rank, ONSET)
    _check_straggler(_replay(bd, topo), rank, ratio, ONSET, within_steps=within)


@pytest.mark.parametrize("layout,seed", [((2, 2, 2), 0), ((2, 2, 2), 1), ((1, 2, 2), 2), ((4, 1, 2), 3)])
def test_synthetic_small_clean_jobs_give_no_finding_on_any_pass(layout, seed):
    dp, tp, pp = layout
    topo = Topology(dp=dp, tp=tp, pp=pp)
    for t, last, findings in _replay(_synth(topo, 120, 0.3, seed, {}), topo):
        assert findings == [], (layout, seed, t, last, [(f.kind.value, f.ranks, f.factor) for f in findings])
