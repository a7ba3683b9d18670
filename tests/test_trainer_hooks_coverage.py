"""Every way of calling a c10d collective is traced, on real gloo ranks.

Module-qualified calls, ``distributed_c10d.*``, names imported before and after
``init``, ``ProcessGroup`` methods, async work, functional collectives (waited on
explicitly, implicitly, or by group name), ``_coalescing_manager``,
``batch_isend_irecv``, DTensor redistribution; the torchtitan-style example (DTensor TP
+ FSDP2) end to end; and the hang localisation for a rank stuck before a functional
collective.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pandas as pd
import pytest
from fleetscope.server.diagnosis.findings import HangClass
from fleetscope.server.diagnosis.hangs import HangConfig, localise, rank_states
from fleetscope.trainer_hooks.reader import read_job

from fleetscope.topology import Topology
from tests.helpers.ranks import ROOT, run_ranks

WORLD = 2


@pytest.fixture(scope="module")
def every_way(tmp_path_factory):
    return run_ranks("tests.helpers.collective_scenarios:every_call_path", WORLD,
                     tmp_path_factory.mktemp("cov"), timeout_s=180)


def test_each_way_of_calling_a_collective_gives_one_completed_record(every_way):
    ways = every_way[0]["ways"]
    rows = every_way[0]["rows"]
    by_step = defaultdict(list)
    for r in rows:
        by_step[r["step"]].append(r)
    expected = {
        "dist.all_reduce": ["all_reduce"],
        "distributed_c10d.all_reduce": ["all_reduce"],
        "from-import after init": ["all_reduce"],
        "from-import before init": ["all_reduce"],
        "ProcessGroup.allreduce": ["all_reduce"],
        "async dist.all_reduce": ["all_reduce"],
        "funcol.all_reduce + wait": ["all_reduce"],
        "funcol all_gather, implicit wait": ["all_gather_into_tensor"],
        "funcol by group name": ["all_reduce"],
        "_coalescing_manager": ["all_reduce_coalesced"],  # one op on the wire, 2 tensors
        "batch_isend_irecv": ["recv", "send"],
        "DDP with the default comm hook": ["all_reduce"],  # one bucket (DDP's own broadcast is at construction)
    }
    for step, way in enumerate(ways):
        got = by_step[step]
        assert got, f"{way}: not traced"
        assert all(r["state"] == "completed" and r["completed_ns"] >= r["enqueued_ns"] for r in got), (way, got)
        if way in expected:
            assert sorted(r["op"] for r in got) == expected[way], (way, got)
    assert by_step[ways.index("_coalescing_manager")][0]["bytes"] == 2 * 8 * 4
    dtensor = by_step[ways.index("DTensor redistribute")]
    assert {r["op"] for r in dtensor} >= {"all_gather_into_tensor"}, dtensor
    p2p = {r["op"]: r for r in by_step[ways.index("batch_isend_irecv")]}
    assert p2p["send"]["peer"] == 1 and p2p["recv"]["peer"] == 1


def test_collective_numbering_is_one_sequence_per_group_agreed_by_every_rank(every_way):
    sigs = []
    for result in every_way:
        coll = [r for r in result["rows"] if r["op"] not in ("send", "recv")]
        seqs = [r["seq"] for r in coll if r["group_id"] == "world"]
        assert seqs == list(range(1, len(seqs) + 1))  # no gap, no repeat, whatever the path
        sigs.append([(r["group_id"], r["seq"], r["op"], r["bytes"], r["dtype"]) for r in coll])
    assert sigs[0] == sigs[1]


def test_hang_before_a_functional_collective_names_the_stuck_rank(tmp_path):
    run_ranks("tests.helpers.collective_scenarios:hang_before_functional", WORLD, tmp_path,
              timeout_s=180)
    data = read_job(tmp_path / "spool", "hang")
    stuck = [s for s in data["sections"] if s["rank"] == 1 and s["step"] == 2][0]
    inflight = pd.DataFrame(data["inflight"])
    # the moment just before rank 1 left its section: what the server would have seen
    now = stuck["end_ns"] - 300_000_000
    topo = Topology(dp=WORLD)
    states = rank_states(topo, inflight[inflight["ts_ns"] <= now], pd.DataFrame(), now, HangConfig())
    assert states[0].kind == "collective" and states[0].op == "all_reduce", states
    assert states[1].kind == "section" and states[1].op == "forward", states
    culprits, cls, _, chain, _ = localise(topo, states, pd.DataFrame(columns=["rank", "group_id", "last_seq"]))
    assert culprits == (1,) and cls == HangClass.STUCK_IN_COMPUTE
    assert chain and chain[0][:2] == (0, 1) and f"world#{states[0].seq}" in chain[0][2]
    # and it completed once rank 1 arrived
    done = [c for c in data["collectives"] if c["rank"] == 0 and c["seq"] == states[0].seq]
    assert done and done[0]["state"] == "completed" and done[0]["duration_ns"] >= 4e9


@pytest.mark.slow
def test_torchtitan_style_example_traces_tp_and_fsdp2_collectives(tmp_path):
    spool = tmp_path / "spool"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "torchtitan_style.py"),
                           "--dp", "2", "--tp", "2", "--steps", "2", "--job", "titan",
                           "--spool", str(spool)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = read_job(spool, "titan")
    coll = pd.DataFrame(data["collectives"])
    assert set(coll["rank"]) == {0, 1, 2, 3}
    assert (coll["state"] == "completed").all()
    tp = coll[coll["axis"] == "tp"]
    dp = coll[coll["axis"] == "dp"]
    # DTensor TP: the row-wise output all-reduce (functional), in the tp groups
    assert set(tp["group_id"]) == {"tp.pp0.dp0", "tp.pp0.dp1"}
    assert (tp["op"] == "all_reduce").sum() >= 4 * 2 * 1
    # FSDP2: parameter all-gathers and gradient reduce-scatters in the dp groups
    assert set(dp["group_id"]) == {"dp.pp0.tp0", "dp.pp0.tp1"}
    assert {"all_gather_single", "reduce_scatter_single"} <= set(dp["op"])
    # every member of a group agrees on what its n-th collective was
    sig = coll.groupby(["group_id", "seq"]).agg(ops=("op", "nunique"), sizes=("bytes", "nunique"),
                                                members=("rank", "nunique"))
    assert (sig["ops"] == 1).all() and (sig["sizes"] == 1).all() and (sig["members"] == 2).all()
    assert len(data["steps"]) == 4 * 2 and {s["name"] for s in data["sections"]} == {
        "forward", "backward", "optimizer"}
