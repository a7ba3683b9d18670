"""The what-if against the simulator's own schedule (issue 14, item 2): a straggler's
predicted job slowdown is its measured one, in any layout and stage.

Measured: the job's median step time with the straggler over the same job's without
it, played by the simulator's step model (tests/helpers/synthetic.py) without noise,
so the only difference left is the model's."""

from __future__ import annotations

import pytest
from fleetscope.server.diagnosis.whatif import StepProfile, fix_group, typical

from fleetscope.topology import Topology
from tests.helpers.synthetic import whatif_vs_measured


@pytest.mark.parametrize("layout,stage,factor", [
    # each one off by 17-44% before the what-if compared TP links only within a stage
    ((2, 2, 2), 0, 1.2),   # 0.0445 predicted vs 0.0310 measured
    ((2, 2, 2), 0, 1.4),   # 0.1387 vs 0.1240
    ((1, 4, 2), 0, 1.2),   # 0.0452 vs 0.0315
    ((2, 2, 3), 0, 1.4),   # 0.0649 vs 0.0554
    ((2, 2, 3), 1, 1.2),   # 0.0368 vs 0.0310
    # and ones that were right, which must stay right
    ((2, 1, 4), 2, 1.4),
    ((4, 1, 2), 1, 1.2),
    ((1, 2, 4), 3, 1.4),
])
def test_whatif_matches_the_measured_slowdown_in_any_stage(layout, stage, factor):
    dp, tp, pp = layout
    predicted, measured, rank = whatif_vs_measured(Topology(dp=dp, tp=tp, pp=pp), stage, factor)
    assert predicted is not None, f"the {factor}x rank {rank} was not found"
    assert predicted == pytest.approx(measured, rel=0.12), (rank, predicted, measured)


def _profile(topo: Topology, links: dict[str, float]) -> StepProfile:
    import numpy as np

    n = topo.world_size
    return StepProfile(topo, 2, np.full((n, 2), 10.0), np.full((n, 2), 20.0), np.zeros(n),
                       np.zeros(n), links)


def test_links_are_compared_with_their_own_stage_only():
    # the last stage's TP groups carry the LM head's extra all-reduces: twice the time
    topo = Topology(dp=2, tp=2, pp=2)
    links = {topo.group_id("tp", r): (2.0 if topo.stage(r) == 1 else 1.0) for r in topo.ranks()}
    links[topo.group_id("tp", 0)] = 5.0  # one slow stage-0 TP link
    links.update({topo.group_id("dp", r): 3.0 + topo.stage(r) for r in topo.ranks()})
    p = _profile(topo, links)
    fixed = fix_group(p, topo.group_id("tp", 0))
    assert fixed.link_ns[topo.group_id("tp", 0)] == 1.0  # its stage's peer, not 2.0 (all)
    t = typical(p, keep_groups=[topo.group_id("tp", 0)])
    assert t.link_ns[topo.group_id("tp", 0)] == 5.0
    assert {t.link_ns[topo.group_id("tp", r)] for r in topo.ranks() if topo.stage(r) == 1} == {2.0}
    assert {t.link_ns[topo.group_id("dp", r)] for r in topo.ranks()} == {3.0, 4.0}
    # a group id the topology does not name is compared with its axis
    odd = _profile(topo, {"tp.custom": 9.0, **links})
    assert fix_group(odd, "tp.custom").link_ns["tp.custom"] == 2.0  # median of 5, 1, 2, 2
