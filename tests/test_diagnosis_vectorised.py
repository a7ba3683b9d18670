"""The vectorised straggler/what-if helpers give bit-identical results to their
per-rank definitions (leave-one-out medians, peer medians, one 1F1B loop per replica)."""

from __future__ import annotations

import numpy as np
import pytest
from fleetscope.server.diagnosis import stragglers as S
from fleetscope.server.diagnosis.whatif import (
    StepProfile,
    _simulate_step_per_replica,
    fix_ranks,
    peer_ranks,
    rank_stages,
    simulate_step,
)

from fleetscope.topology import Topology


def _reference_naive(x, groups):
    ref = np.empty_like(x)
    for members in groups:
        for i in members:
            peers = [j for j in members if j != i]
            if peers:
                ref[i] = np.median(x[peers], axis=0)
            else:
                ref[i] = np.median(x[i, :max(x.shape[1] // 2, 1)])
    return ref


def _fix_ranks_naive(p, ranks, exclude=None):
    fwd, bwd, pre, post = p.fwd_ns.copy(), p.bwd_ns.copy(), p.pre_ns.copy(), p.post_ns.copy()
    bad = set(ranks) if exclude is None else set(exclude)
    for r in ranks:
        peers = [q for q in peer_ranks(p.topology, r) if q not in bad]
        if peers:
            fwd[r] = np.median(p.fwd_ns[peers], axis=0)
            bwd[r] = np.median(p.bwd_ns[peers], axis=0)
            pre[r] = np.median(p.pre_ns[peers])
            post[r] = np.median(p.post_ns[peers])
    return fwd, bwd, pre, post


@pytest.mark.parametrize("seed", range(4))
def test_leave_one_out_reference_matches_definition(seed):
    rng = np.random.default_rng(seed)
    for trial in range(60):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 30))
        x = rng.normal(size=(n, k))
        if trial % 3 == 0:
            x = np.round(x * 3)  # ties
        perm = rng.permutation(n)
        g = int(rng.integers(1, n + 1))
        groups = [m for m in (sorted(perm[:g].tolist()), sorted(perm[g:].tolist())) if m]
        assert np.array_equal(S._reference(x, groups), _reference_naive(x, groups))


def test_tail_medians_and_top_test_match_per_row():
    rng = np.random.default_rng(7)
    x = rng.exponential(size=(50, 24))
    run = rng.integers(1, 25, size=50)
    want = np.array([np.median(x[i, -n:]) for i, n in enumerate(run)])
    assert np.array_equal(S._tail_medians(x, run), want)
    x[3, -12:] *= 3  # a persistently slowest rank
    top = S._top_test(x, {0: list(range(25)), 1: list(range(25, 50))}, S.StragglerConfig())
    assert top[3] and top.sum() == 1


@pytest.mark.parametrize("order", ["tp-dp-pp", "pp-tp-dp", "dp-pp-tp"])
def test_fix_ranks_and_simulate_match_per_rank_loops(order):
    rng = np.random.default_rng(len(order) + ord(order[0]))
    for trial in range(30):
        dp, tp, pp = (int(v) for v in rng.integers(1, 5, 3))
        mb = int(rng.integers(1, 5))
        t = Topology(dp=dp, tp=tp, pp=pp, order=order)
        n = t.world_size
        assert rank_stages(t).tolist() == [t.stage(r) for r in t.ranks()]
        links = {g: float(rng.exponential(1e5)) for ax in ("tp", "pp", "dp") for g in t.groups(ax)
                 if rng.random() < 0.7}
        p = StepProfile(t, mb, rng.exponential(1e6, (n, mb)), rng.exponential(1e6, (n, mb)),
                        np.round(rng.exponential(1e6, n)), rng.exponential(1e6, n), links,
                        ["1f1b", "gpipe"][trial % 2])
        assert simulate_step(p) == _simulate_step_per_replica(p)
        ranks = sorted(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False).tolist())
        keep = sorted(rng.choice(n, size=int(rng.integers(0, n)), replace=False).tolist())
        for args in ((ranks, None), ([r for r in t.ranks() if r not in keep], keep)):
            got = fix_ranks(p, *args)
            want = _fix_ranks_naive(p, *args)
            for a, b in zip((got.fwd_ns, got.bwd_ns, got.pre_ns, got.post_ns), want):
                assert np.array_equal(a, b)
