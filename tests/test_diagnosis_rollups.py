"""The ClickHouse-reduced diagnosis path (server/diagnosis/rollups.py) against the pandas
one over raw events: the same synthetic jobs, written to a real chdb store, give the same
per-rank-per-step breakdown, link times and op gaps, and the same findings and culprits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from fleetscope.server.diagnosis import rollups
from fleetscope.server.diagnosis.breakdown import group_transfer, rank_step_breakdown
from fleetscope.server.diagnosis.engine import JobInfo, diagnose
from fleetscope.server.diagnosis.loader import load_job_frames, load_reduced_frames
from fleetscope.server.diagnosis.progress import completions, step_gaps
from fleetscope.server.store import Store

from fleetscope.topology import Topology
from tests.helpers.synthetic import SynthJob

SCENARIOS = {
    "clean": {},
    "slow-compute-5": {"compute_factor": lambda r, s: 1.3 if r == 5 and s >= 10 else 1.0},
    "slow-compute-1": {"compute_factor": lambda r, s: 1.3 if r == 1 and s >= 10 else 1.0},
    "ten-percent-6": {"compute_factor": lambda r, s: 1.1 if r == 6 and s >= 8 else 1.0},
    "dataloader-2": {"dl_factor": lambda r, s: 4.0 if r == 2 and s >= 10 else 1.0},
    "late-3": {"pause_ms": lambda r, s: 15.0 if r == 3 and s >= 5 else 0.0},
    "gc-4": {"pause_ms": lambda r, s: 80.0 if r == 4 and s % 5 == 2 else 0.0},
    "link-tp": {"link_factor": lambda g, s: 8.0 if g == "tp.pp0.dp1" and s >= 6 else 1.0},
    "link-dp": {"link_factor": lambda g, s: 8.0 if g == "dp.pp0.tp1" and s >= 6 else 1.0},
    "link-pp": {"link_factor": lambda g, s: 8.0 if g == "pp.dp1.tp0" and s >= 6 else 1.0},
    "two-0-7": {"compute_factor": lambda r, s: 1.3 if r in (0, 7) and s >= 8 else 1.0},
    "cpu-clock-5": {"compute_factor": lambda r, s: 1.3 if r == 5 and s >= 10 else 1.0, "cpu_clock": True},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store.open(f"chdb://{tmp_path_factory.mktemp('rollups') / 'store'}", ttl_days=0)
    yield st
    st.close()


def _write(store, frames: dict[str, pd.DataFrame]) -> None:
    for table in ("sections", "collectives", "steps"):
        store.insert_arrow(table, pa.Table.from_pandas(frames[table], preserve_index=False))


def _job(store, name: str, **kw) -> tuple[SynthJob, dict[str, pd.DataFrame]]:
    job = SynthJob(job=name, **kw)
    frames = job.build()
    _write(store, frames)
    return job, frames


def _info(job: SynthJob) -> JobInfo:
    return JobInfo(job=job.job, topology=job.topo, num_microbatches=job.num_mb)


def _sig(findings):
    return sorted((f.kind.value, f.ranks, f.group_id) for f in findings)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_reduced_findings_match_pandas_over_raw_events(store, name):
    job, f = _job(store, f"rollup-{name}", **SCENARIOS[name])
    now = int(f["steps"]["end_ns"].max()) + 10**9
    raw = diagnose(_info(job), load_job_frames(store, job.job, now), now)
    red_frames = load_reduced_frames(store, job.job, now, rollups.StepCache(), job.topo.world_size, job.num_mb)
    assert red_frames.sections.empty and red_frames.collectives.empty  # no raw events left the store
    red = diagnose(_info(job), red_frames, now)
    assert _sig(red.findings) == _sig(raw.findings)
    if name != "clean":
        assert red.findings, name
    for a, b in zip(sorted(raw.findings, key=lambda x: x.key), sorted(red.findings, key=lambda x: x.key)):
        assert b.est_slowdown == pytest.approx(a.est_slowdown, abs=1e-3)
        assert (b.first_step, b.last_step) == (a.first_step, a.last_step)
        for k in ("last_arrival_frac", "peers_waited_ms_per_step", "busy_ms", "peer_busy_ms"):
            if k in a.evidence:
                assert b.evidence[k] == pytest.approx(a.evidence[k], rel=1e-3, abs=1e-3), k
        if "waited_in_groups" in a.evidence:
            assert b.evidence["waited_in_groups"][:1] == a.evidence["waited_in_groups"][:1]
    cols = ["rank", "step", "busy_ns", "comm_ns", "wait_ns", "compute_ns", "dataloader_ns", "wait_caused_ns",
            "compute_cpu_ns", "optimizer_cpu_ns"]
    m = raw.breakdown[cols].merge(red.breakdown[cols], on=["rank", "step"], suffixes=("", "_r"))
    assert len(m) == len(raw.breakdown) == len(red.breakdown)
    for c in cols[2:]:
        assert (m[c] - m[c + "_r"]).abs().max() == 0, c
    assert (raw.breakdown["compute_cpu_ns"] > 0).all() == SCENARIOS[name].get("cpu_clock", False)
    np.testing.assert_allclose(red.profile.fwd_ns, raw.profile.fwd_ns)
    np.testing.assert_allclose(red.profile.bwd_ns, raw.profile.bwd_ns)
    assert red.profile.link_ns == pytest.approx(raw.profile.link_ns)
    assert red.profile.noise == pytest.approx(raw.profile.noise, rel=1e-9, abs=1e-12)


def test_reductions_match_and_are_incremental(store):
    job, f = _job(store, "rollup-incr", num_steps=14, topo=Topology(dp=2, tp=2, pp=3))
    bd, arr = rank_step_breakdown(f["sections"], f["collectives"], f["steps"])
    cache = rollups.StepCache()
    jc = cache.get(job.job, 0, job.num_mb)
    first = rollups.refresh(store, jc, job.job, 0, 13, 0)
    assert first["computed"] == 15 and first["reused"] == 0
    red = rollups.assemble(jc, job.topo.world_size, 0, 13)
    arr = arr[arr["step"] < 13]  # complete steps only: the newest (13) may still be arriving
    gt = group_transfer(arr).merge(group_transfer(rollups_arrivals(red)), on=["group_id", "axis", "step"])
    assert len(gt) == len(group_transfer(arr)) == len(red.groups)
    assert (gt["transfer_ns_x"] - gt["transfer_ns_y"]).abs().max() == 0
    assert (gt["num_ops_x"] - gt["num_ops_y"]).abs().max() == 0
    # the typical op: a collective group's median, a pipeline group's upper quartile
    assert (gt["op_transfer_ns_x"] - gt["op_transfer_ns_y"]).abs().max() < 1e-6
    assert (gt["axis"] == "pp").any() and (gt["axis"] != "pp").any()
    ev = completions(f["collectives"], f["sections"])
    want = step_gaps(ev[(ev["step"] > 0) & (ev["step"] <= 13)])
    assert red.gaps.sort_index().to_numpy() == pytest.approx(want.sort_index().to_numpy())
    # a second pass recomputes only the incomplete steps; late rows of an old step recompute it
    again = rollups.refresh(store, jc, job.job, 0, 13, 0)
    assert again["computed"] == 2 and again["reused"] == 13
    late = f["sections"][(f["sections"]["step"] == 4) & (f["sections"]["rank"] == 0)].head(1).copy()
    late["start_ns"] += 1
    store.insert_arrow("sections", pa.Table.from_pandas(late, preserve_index=False))
    third = rollups.refresh(store, jc, job.job, 0, 13, 0)
    assert third["computed"] == 3


def rollups_arrivals(red):
    from fleetscope.server.diagnosis.breakdown import reduced_arrivals

    return reduced_arrivals(red.groups)


def test_failed_ops_are_read_once_every_rank_is_dead(store):
    """The crash evidence of the hang analysis: once every rank's latest heartbeat says
    its process is gone, both loaders read each rank's first failed op of the latest
    steps (``loader.FAILED_OPS`` in ClickHouse, the raw frames in pandas); before, none."""

    job = SynthJob(job="failed-ops")
    f = job.build()
    c = f["collectives"]
    last = int(c["step"].max())
    victims = [0, 1, 2, 3, 4, 5, 6]
    for r in victims:  # each victim's last op of the last step failed under it
        i = c.index[(c["rank"] == r) & (c["step"] == last)][-1]
        c.loc[i, "state"] = "failed"
    _write(store, f)
    now = int(f["steps"]["end_ns"].max()) + 10**9

    def beats(alive: bool) -> None:
        hb = pd.DataFrame({"ts_ns": [now - 10**9] * 8, "job": [job.job] * 8, "host": ["h0"] * 8,
                           "rank": list(range(8)), "pid": [100 + r for r in range(8)], "alive": [alive] * 8,
                           "last_step": [last] * 8})
        store.insert_arrow("heartbeats", pa.Table.from_pandas(hb, preserve_index=False))

    beats(True)
    red = load_reduced_frames(store, job.job, now, rollups.StepCache(), job.topo.world_size, job.num_mb)
    assert red.failed_ops == {} and load_job_frames(store, job.job, now).failed_ops == {}
    beats(False)
    red = load_reduced_frames(store, job.job, now + 10**9, rollups.StepCache(), job.topo.world_size, job.num_mb)
    raw = load_job_frames(store, job.job, now + 10**9)
    assert sorted(red.failed_ops) == victims and red.failed_ops == raw.failed_ops


def test_hardware_events_before_the_job_started_are_not_its_findings(store):
    """A host's GPU that throttled before this job ran on it (the previous job's fault, say)
    gives this job no ``hardware_error`` finding; a throttle during the job does. Both
    loaders bound the hardware reads at the job's start (``started_ns``); without it the
    600 s lookback alone would let back-to-back jobs on one host inherit each other's
    hardware findings (seen in ``bench/diagnosis.py``: the clean twin of the thermal
    scenario, run right after it on the same host, got the throttle finding)."""
    job = SynthJob(job="hw-after-another")
    f = job.build()
    for table in ("sections", "collectives", "steps"):  # hosts of its own: other tests' jobs see no throttle
        f[table]["host"] = "hw-" + f[table]["host"].astype(str)
    _write(store, f)
    started = int(f["steps"]["start_ns"].min())
    now = int(f["steps"]["end_ns"].max()) + 10**9
    host = str(f["steps"].loc[f["steps"]["rank"] == 5, "host"].iloc[0])

    def throttle(ts: int) -> None:
        row = {"ts_ns": [ts], "job": [""], "host": [host], "rank": [5], "source": ["nvml"], "device": ["gpu5"],
               "name": ["gpu.throttle_reasons"], "value": [float(0x40)]}  # HW thermal slowdown
        store.insert_arrow("metrics", pa.Table.from_pandas(pd.DataFrame(row), preserve_index=False))

    def hw_findings(frames) -> list:
        return [x for x in diagnose(_info(job), frames, now).findings if x.kind.value == "hardware_error"]

    throttle(started - 60 * 10**9)  # a minute before the job started, on its host
    loads = {
        "reduced": lambda s: load_reduced_frames(store, job.job, now, rollups.StepCache(), job.topo.world_size,
                                                 job.num_mb, started_ns=s),
        "raw": lambda s: load_job_frames(store, job.job, now, started_ns=s),
    }
    for name, load in loads.items():
        assert load(0).metrics.shape[0] == 1, name  # the lookback alone reaches it
        assert hw_findings(load(0)), name
        assert load(started).metrics.empty, name
        assert not hw_findings(load(started)), name
    throttle(started + 5 * 10**9)  # during the job
    for name, load in loads.items():
        fr = load(started)
        assert fr.metrics.shape[0] == 1, name
        (hw,) = hw_findings(fr)
        assert hw.ranks == (5,) and hw.hosts == (host,), name


def test_the_reduced_pass_gives_the_detector_the_ranks_arrival_evidence(store, monkeypatch):
    """The reduced frames hold no per-op arrival rows; the detector's question "do peers
    wait on this rank?" is answered from the reductions (``arrival_evidence``), with the
    same figures the finding's evidence reports."""
    from fleetscope.server.diagnosis import engine

    job, f = _job(store, "rollup-evidence", **SCENARIOS["slow-compute-5"])
    now = int(f["steps"]["end_ns"].max()) + 10**9
    seen = {}
    real = engine.detect_stragglers

    def spy(*args, **kwargs):
        seen["arrival_evidence"] = kwargs.get("arrival_evidence")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "detect_stragglers", spy)
    red = diagnose(_info(job), load_reduced_frames(store, job.job, now, rollups.StepCache(),
                                                   job.topo.world_size, job.num_mb), now)
    ask = seen["arrival_evidence"]
    assert callable(ask)
    top = next(x for x in red.findings if x.ranks == (5,))
    steps = list(range(top.last_step - 7, top.last_step + 1))
    ev = ask([5, 4], steps)
    assert set(ev) == {4, 5}
    assert ev[5]["median_lateness_ms"] == top.evidence["median_lateness_ms"] > 0
    assert ev[5]["last_arrival_frac"] == top.evidence["last_arrival_frac"]
    raw_seen = {}

    def spy_raw(*args, **kwargs):
        raw_seen["arrival_evidence"] = kwargs.get("arrival_evidence")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "detect_stragglers", spy_raw)
    diagnose(_info(job), load_job_frames(store, job.job, now), now)
    assert raw_seen["arrival_evidence"] is None  # raw rows: the detector reads them itself
