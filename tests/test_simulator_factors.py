"""The simulator's step model driven by explicit parts and per-step factors (the one
synthetic-job generator): factors act where they say and nowhere else, no factors is
the fault-plan model unchanged, and its front ends (SynthJob frames, the demo's tables,
the rollup fixture's parameters) carry the model's numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fleetscope.sim.offline import DEMO_STRAGGLER, demo_tables
from fleetscope.sim.schedule import SECTIONS, StepFactors, StepModel, Timing

from fleetscope import codec
from fleetscope.topology import Topology
from tests.helpers.rollup_fixture import ScaleJob
from tests.helpers.synthetic import MS, T0, SynthJob

TOPO = Topology(dp=2, tp=2, pp=2)


def _model(**kw) -> StepModel:
    return StepModel(TOPO, 4, 1, Timing(step_ms=200.0, noise=0.0, rank_spread=0.0), seed=1, **kw)


def _sections(out) -> pd.DataFrame:
    return pd.DataFrame(out.sections).assign(dur=lambda d: d["end"] - d["start"])


def test_neutral_factors_are_the_plain_model():
    a, b = _model(), _model()
    n = TOPO.world_size
    ones = StepFactors(compute=np.ones(n), dataloader=np.ones(n), pause_ns=np.zeros(n),
                       link=np.ones(len(a.layout.group_names)))
    ca = cb = np.zeros(a.layout.shape)
    for step in range(3):
        oa, ob = a.play(step, ca), b.play(step, cb, ones)
        for k in ("sections", "collectives", "steps"):
            for c in getattr(oa, k):
                assert np.array_equal(getattr(oa, k)[c], getattr(ob, k)[c]), (k, c)
        ca, cb = oa.end, ob.end


def test_compute_and_dataloader_factors_scale_that_rank_only():
    n = TOPO.world_size
    comp, dl = np.ones(n), np.ones(n)
    comp[5], dl[2] = 2.0, 3.0
    base = _sections(_model().play(0, np.zeros((2, 2, 2))))
    got = _sections(_model().play(0, np.zeros((2, 2, 2)), StepFactors(compute=comp, dataloader=dl)))
    dl_name, fwd_name = SECTIONS.index("dataloader"), SECTIONS.index("forward")

    def dur(frame, rank, name):
        return frame[(frame["rank"] == rank) & (frame["name"] == name)]["dur"].to_numpy()

    assert dur(got, 2, dl_name) == pytest.approx(3.0 * dur(base, 2, dl_name))
    assert dur(got, 3, dl_name) == pytest.approx(dur(base, 3, dl_name))
    # rank 5's forward sections grow by its own extra compute (the TP all-reduce inside
    # waits for it, so its TP peer's sections grow too, but rank 5 is the one that computed)
    assert (dur(got, 5, fwd_name) > 1.5 * dur(base, 5, fwd_name)).all()


def test_pause_is_untimed_and_link_factor_slows_one_group():
    model = _model()
    n = TOPO.world_size
    pause = np.zeros(n)
    pause[3] = 40 * MS
    link = np.ones(len(model.layout.group_names))
    gid = TOPO.group_id("tp", 0)
    link[model.layout.group_names.index(gid)] = 8.0
    out = model.play(0, np.zeros((2, 2, 2)), StepFactors(pause_ns=pause, link=link))
    sec = pd.DataFrame(out.sections)
    first = sec.groupby("rank")["start"].min()
    steps = pd.DataFrame(out.steps).set_index("rank")
    assert steps.loc[3, "start"] == 0.0 and first[3] == pytest.approx(40 * MS)  # nothing covers the pause
    assert first[2] == 0.0
    col = pd.DataFrame(out.collectives)
    col["group"] = np.array(model.layout.group_names)[col["gidx"]]
    tp = col[col["axis"] == 0]
    # link time of an op = completion after the last member arrived
    link_ns = tp.groupby(["group", "seq"]).apply(lambda g: g["done"].max() - g["enq"].max(), include_groups=False)
    slow, other = link_ns.loc[gid].median(), link_ns.drop(index=gid, level=0).median()
    assert slow == pytest.approx(8.0 * other, rel=1e-6)


def test_unknown_part_is_refused():
    with pytest.raises(ValueError, match="fwd"):
        _model(parts_ns={"fwd": 1.0})


def test_synthjob_frames_carry_the_schema_columns_and_the_topology_group_ids():
    f = SynthJob(num_steps=3, compute_factor=lambda r, s: 2.0 if r == 6 and s == 2 else 1.0).build()
    sec, col, st = f["sections"], f["collectives"], f["steps"]
    assert set(sec["name"]) == {"dataloader", "forward", "backward", "grad_sync", "optimizer"}
    assert {c: str(sec[c].dtype) for c in ("rank", "step", "microbatch", "start_ns", "duration_ns")} == dict.fromkeys(
        ("rank", "step", "microbatch", "start_ns", "duration_ns"), "int64")
    want = {TOPO.group_id(a, r) for a in ("tp", "dp", "pp") for r in range(8)}
    assert set(col["group_id"]) == want
    assert (col["completed_ns"] >= col["enqueued_ns"]).all() and (sec["duration_ns"] > 0).all()
    assert st["start_ns"].min() == T0 and len(st) == 3 * 8 and st["host"].tolist()[:8] == ["h0"] * 4 + ["h1"] * 4
    # each rank's step starts where its previous step ended
    s = st.sort_values(["rank", "step"])
    assert (s.groupby("rank")["start_ns"].shift(-1).dropna().to_numpy()
            == s.groupby("rank")["end_ns"].head(2).to_numpy()).all()
    fwd = sec[(sec["name"] == "forward") & (sec["rank"] == 6)].groupby("step")["duration_ns"].median()
    assert fwd[2] > 1.6 * fwd[1]


def test_demo_tables_are_the_simulator_job_with_its_straggler():
    t0 = 1_800_000_000_000_000_000
    tables = demo_tables("demo-t", 16, t0)
    assert set(tables) >= {"sections", "collectives", "steps", "jobs", "inflight"}
    decoded = codec.decode_batch(codec.encode_batch(tables))  # they are valid wire records
    steps = decoded["steps"].to_pandas()
    assert steps["step"].max() == 15 and steps["rank"].nunique() == 8
    assert set(steps["host"]) == {"demo-host-0", "demo-host-1"} and steps["start_ns"].min() == t0
    sec = decoded["sections"].to_pandas()
    fwd = sec[sec["name"] == "forward"]
    mine = fwd[fwd["rank"] == 5].groupby(fwd["step"] >= 10)["duration_ns"].median()
    assert "rank=5" in DEMO_STRAGGLER and mine[True] > 1.2 * mine[False]
    job = decoded["jobs"].to_pylist()[0]
    assert (job["dp"], job["tp"], job["pp"], job["num_microbatches"]) == (2, 2, 2, 2)


def test_rollup_fixture_numbers_are_the_simulator_timing():
    job = ScaleJob(num_steps=5)
    p = job.params()
    parts = Timing(step_ms=job.step_ms).parts_ns(job.num_mb, job.topo.pp, job.tp_ops)
    assert p["compute_ns"] == pytest.approx(job.num_mb * (parts["forward"] + parts["backward"]))
    assert p["dl_ns"] == parts["dataloader"] and p["opt_ns"] == parts["optimizer"]
    busy = p["compute_ns"] + p["dl_ns"] + p["opt_ns"] + p["other_ns"]
    assert busy + p["wait_ns"] == pytest.approx(job.step_ms * MS)  # the calibrated step time
    assert p["dp_share"] + p["tp_share"] + p["pp_share"] == pytest.approx(1.0)
    assert dict(zip(p["slow_ranks"], p["slow_factors"])) == {100: 1.2, 7777: 1.35}
    assert set(p["slow_from"]) == {50}
