"""The fleet simulator (``fleetscope simulate``): its batches are valid agent batches, its
wait-for structure is the reference trainer's (same groups, sequence numbers, peers,
sections and order as a real 2x2x2 gloo job), its faults behave like the trainer's, and
a real server takes it in; a 1,024-rank job with one hang is diagnosed end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import pytest
from fleetscope.collector.validate import prepare
from fleetscope.sim.agents import encode_body
from fleetscope.sim.faults import FaultPlan, parse_sim_fault
from fleetscope.sim.schedule import AXES, OPS, SECTION_KINDS, SECTIONS, StepModel, Timing
from fleetscope.sim.stream import Fleet, Periods
from fleetscope.trainer_hooks.reader import read_job

from fleetscope import codec
from fleetscope.topology import Topology

TOPO8 = Topology(dp=2, tp=2, pp=2)


def model(topo=TOPO8, injections=(), num_mb=4, tp_ops=4, step_ms=500.0, gph=8, seed=0):
    faults = [parse_sim_fault(s, topo.world_size, -(-topo.world_size // gph)) for s in injections]
    return StepModel(topo, num_mb, tp_ops, Timing(step_ms=step_ms), FaultPlan(faults, topo.world_size, gph),
                     seed=seed)


def play(m, num_steps):
    clock = np.zeros(m.layout.shape)
    outs = []
    for s in range(num_steps):
        o = m.play(s, clock)
        outs.append(o)
        clock = o.end
    return outs


def op_rows(m, outs):
    """(rank, step, mb, group, axis, group rank, size, seq, op, peer) of every op, with enq/done."""
    rows = []
    for o in outs:
        c = o.collectives
        for i in range(c["rank"].size):
            rows.append(((int(c["rank"][i]), int(c["step"][i]), int(c["microbatch"][i]),
                          m.layout.group_names[c["gidx"][i]], AXES[c["axis"][i]], int(c["group_rank"][i]),
                          int(c["group_size"][i]), int(c["seq"][i]), OPS[c["op"][i]], int(c["peer"][i])),
                         float(c["enq"][i]), float(c["done"][i])))
    return rows


# ---------------------------------------------------------------------------- vs the real job
@pytest.fixture(scope="module")
def real8(tmp_path_factory):
    """A real 2x2x2 gloo job: 2 steps, 4 micro-batches, the default model (4 layers)."""
    spool = tmp_path_factory.mktemp("spool")
    proc = subprocess.run([sys.executable, "-m", "fleetscope.cli", "train", "--dp", "2", "--tp", "2", "--pp", "2",
                           "--steps", "2", "--microbatches", "4", "--job", "r8", "--spool", str(spool),
                           "--timeout-s", "150"], capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr
    return read_job(spool, "r8")


def test_wait_for_structure_matches_a_real_2x2x2_job(real8):
    m = model()
    sim = op_rows(m, play(m, 2))
    real = [((c["rank"], c["step"], c["microbatch"], c["group_id"], c["axis"], c["group_rank"], c["group_size"],
              c["seq"], c["op"], c["peer"]), c["enqueued_ns"]) for c in real8["collectives"]]
    assert len(real) > 500
    assert sorted(k for k, _, _ in sim) == sorted(k for k, _ in real)
    # and in the same order on every rank (who waits for whom, op after op)
    def per_rank(rows):
        out = defaultdict(list)
        for key, _t in sorted(rows, key=lambda r: (r[0][0], r[1])):
            out[key[0]].append(key[3:])
        return out

    assert per_rank([(k, e) for k, e, _ in sim]) == per_rank(real)
    sections = sorted((s["rank"], s["step"], s["microbatch"], s["name"], s["kind"]) for s in real8["sections"])
    sim_sec = sorted((int(r), int(st), int(mb), SECTIONS[n], SECTION_KINDS[n]) for o in play(model(), 2)
                     for r, st, mb, n in zip(o.sections["rank"], o.sections["step"], o.sections["microbatch"],
                                             o.sections["name"]))
    assert sim_sec == sections


def test_collectives_complete_together_and_p2p_pairs_up():
    m = model(topo=Topology(dp=4, tp=2, pp=4), num_mb=6)
    rows = op_rows(m, play(m, 3))
    by_op = defaultdict(list)
    for key, enq, done in rows:
        if key[8] in ("send", "recv"):
            continue
        by_op[(key[3], key[7])].append((key[0], enq, done))
    for (gid, _seq), members in by_op.items():
        axis, ranks = m.topo.parse_group_id(gid)
        assert sorted(r for r, _, _ in members) == sorted(ranks)
        dones = {d for _, _, d in members}
        assert len(dones) == 1  # lock-step: the whole group completes at once ...
        assert min(dones) > max(e for _, e, _ in members)  # ... after its last member arrived
    sends = {(k[0], k[9], k[3], k[7]): (e, d) for k, e, d in rows if k[8] == "send"}
    recvs = {(k[9], k[0], k[3], k[7]): (e, d) for k, e, d in rows if k[8] == "recv"}
    assert sends and set(sends) == set(recvs)
    for key, (se, sd) in sends.items():
        re_, rd = recvs[key]
        assert sd >= max(se, re_) and rd >= max(se, re_)  # a transfer needs both sides


def test_a_late_rank_makes_its_peers_wait():
    base = op_rows(*(lambda m: (m, play(m, 4)))(model(topo=Topology(dp=2, tp=4, pp=2))))
    slow_m = model(topo=Topology(dp=2, tp=4, pp=2), injections=["straggler:rank=1:factor=1.5:from_step=2"])
    slow = op_rows(slow_m, play(slow_m, 4))

    def tp_wait(rows, rank, step):
        return sum(d - e for k, e, d in rows if k[0] == rank and k[1] == step and k[4] == "tp")

    # rank 0 shares rank 1's TP group: it waits in the all-reduces for rank 1's compute
    assert tp_wait(slow, 0, 3) > 3 * tp_wait(base, 0, 3)
    assert tp_wait(slow, 0, 1) == pytest.approx(tp_wait(base, 0, 1), rel=0.01)  # before from_step
    assert tp_wait(slow, 1, 3) < tp_wait(slow, 0, 3)  # the straggler itself barely waits


@pytest.mark.parametrize("where,kind,op", [("compute", "section", "forward"),
                                           ("collective", "section", "forward"),
                                           ("in_collective", "collective", "all_reduce"),
                                           ("p2p", "idle", ""),
                                           ("in_p2p", "p2p", "send")])
def test_hang_blocks_the_culprit_where_the_trainer_would_and_its_peers_wait_on_it(where, kind, op):
    topo = Topology(dp=2, tp=2, pp=2)
    culprit = 2  # stage 0, dp 1, tp 0
    m = model(topo=topo, injections=[f"hang:rank={culprit}:step=2:where={where}"])
    outs = play(m, 4)
    assert np.isfinite(outs[1].end).all() and not np.isfinite(outs[2].end).any()  # the whole job stalls
    b = outs[2].blocked
    assert sorted(b["rank"].tolist()) == list(range(8))
    i = int(np.nonzero(b["rank"] == culprit)[0][0])
    kinds = ("idle", "section", "collective", "p2p")
    assert kinds[b["kind"][i]] == kind
    if kind == "section":
        assert SECTIONS[b["op"][i]] == op
    elif kind != "idle":
        assert OPS[b["op"][i]] == op
    tp_peer = 3
    j = int(np.nonzero(b["rank"] == tp_peer)[0][0])
    if where in ("compute", "collective", "in_collective"):  # the TP peer waits in the group's op
        assert kinds[b["kind"][j]] == "collective" and m.layout.group_names[b["gidx"][j]] == "tp.pp0.dp1"
    assert outs[3].collectives["rank"].size == 0 and outs[3].steps["rank"].size == 0


def test_crash_and_host_down_silence_their_ranks():
    topo = Topology(dp=4, tp=2, pp=2)  # 16 ranks on 4 hosts of 4
    m = model(topo=topo, gph=4, injections=["crash:rank=5:step=2", "host_down:host=2:step=3"])
    outs = play(m, 4)
    assert 5 in outs[1].steps["rank"] and 5 not in outs[2].collectives["rank"]
    assert 5 not in outs[2].inflight["rank"] and 5 not in outs[2].blocked["rank"]
    assert not set(range(8, 12)) & set(outs[3].inflight["rank"].tolist())
    with pytest.raises(ValueError, match="host=9 out of range"):
        parse_sim_fault("host_down:host=9:step=1", 16, 4)
    with pytest.raises(ValueError, match="unknown fault"):
        parse_sim_fault("meteor:rank=1", 16, 4)


# ---------------------------------------------------------------------------- as batches
def fleet_batches(topo, steps, injections=(), gph=4):
    m = model(topo=topo, injections=injections, gph=gph)
    hosts = [f"sim-h{h}" for h in range(-(-topo.world_size // gph))]
    fleet = Fleet(m.layout, "sim-test", time.time_ns() - 60 * 10**9, gph, hosts, 4, 1024,
                  Periods(), seed=0)
    fleet.set_phase(m.phase)
    fleet.add_job_row(0.0, name="sim-test", dp=topo.dp, tp=topo.tp, pp=topo.pp, status="running")
    clock = np.zeros(m.layout.shape)
    for s in range(steps):
        o = m.play(s, clock)
        fleet.add_step(o)
        clock = o.end
    return fleet, fleet.take(steps * 0.6e9 + 1e9)  # 500 ms steps: all of them are due


def test_batches_are_valid_agent_batches_of_every_record_type():
    topo = Topology(dp=2, tp=2, pp=4)  # 16 ranks, 4 hosts
    _, data = fleet_batches(topo, 3)
    assert set(data) == {"jobs", "steps", "sections", "collectives", "inflight", "heartbeats", "metrics"}
    for h in range(4):
        tables = {name: t.slice(int(o[h]), int(o[h + 1] - o[h])) for name, (t, o) in data.items()}
        tables = {k: t for k, t in tables.items() if t.num_rows}
        body = encode_body(tables, "zstd")  # what the simulated agents send
        assert body == codec.encode_batch(tables, compression="zstd")  # the agent wire format
        decoded = codec.decode_batch(body)
        checked = prepare(decoded, host=f"sim-h{h}", clock_offset_ns=0)  # the collector's checks
        assert set(checked["heartbeats"].column("host").to_pylist()) == {f"sim-h{h}"}
        ranks = set(checked["collectives"].column("rank").to_pylist())
        assert ranks == set(range(4 * h, 4 * h + 4))  # a host ships its own ranks only
    infl = data["inflight"][0].to_pylist()
    assert {r["kind"] for r in infl} <= {"idle", "section", "collective", "p2p"}
    assert {r["rank"] for r in infl} == set(range(16))
    hb = data["heartbeats"][0].to_pylist()
    assert sum(1 for r in hb if r["rank"] == -1) == 4 and sum(1 for r in hb if r["rank"] >= 0) == 16
    assert {r["acked_through_ns"] for r in hb} == {-1}  # no agents: nothing said
    assert {r["source"] for r in data["metrics"][0].to_pylist()} == {"gpu", "host", "hooks"}


def test_simulated_agents_say_acked_through_of_the_acknowledged_prefix_only():
    """As the agent: a host's later batch acknowledged first moves nothing; when the gap
    closes, each rank gets the newest in-flight time of the prefix, into its heartbeats."""
    import numpy as np
    from fleetscope.sim.agents import SimAgents

    agents = SimAgents("http://127.0.0.1:9", ["h0", "h1"], "acked-test", clock_sync=False, world_size=4)
    try:
        for seq, ts in ((1, 100), (2, 200), (3, 300)):
            agents._inflight_of[(0, seq)] = (np.array([0, 1]), np.array([ts, ts + 1]))
        agents._inflight_of[(1, 1)] = (np.array([2, 3, 3]), np.array([50, 70, 60]))
        agents._advance_acked(0, [2, 3])  # batch 1 of host 0 still out
        assert agents.acked_through.tolist() == [0, 0, 0, 0]
        agents._advance_acked(1, [1])
        agents._advance_acked(0, [1])
        assert agents.acked_through.tolist() == [300, 301, 50, 70]
        fleet, _ = fleet_batches(Topology(dp=2, tp=2, pp=1), 1, gph=2)
        fleet.acked_through = agents.acked_through
        hb = fleet.take(60e9)["heartbeats"][0].to_pylist()
        assert {r["rank"]: r["acked_through_ns"] for r in hb} == {-1: -1, 0: 300, 1: 301, 2: 50, 3: 70}
    finally:
        agents.close()


def test_hung_ranks_keep_reporting_what_they_wait_in():
    topo = Topology(dp=2, tp=2, pp=2)
    fleet, _ = fleet_batches(topo, 3, injections=["hang:rank=6:step=1:where=compute"], gph=8)
    later = fleet.take(60e9)
    rows = later["inflight"][0].to_pylist()
    culprit = [r for r in rows if r["rank"] == 6]
    assert len(culprit) > 50 and {(r["kind"], r["op"]) for r in culprit} == {("section", "forward")}
    assert len({r["since_ns"] for r in culprit}) == 1  # since: when it entered, not each sample
    peer = [r for r in rows if r["rank"] == 7]
    assert {(r["kind"], r["group_id"]) for r in peer} == {("collective", "tp.pp1.dp1")}
    hb = [r for r in later["heartbeats"][0].to_pylist() if r["rank"] == 7]
    assert hb and hb[-1]["inflight_op"].startswith("collective:all_reduce tp.pp1.dp1 seq=")


# ---------------------------------------------------------------------------- real server
def simulate(url, *args, timeout=180):
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", "simulate", "--server", url, "--quiet", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_bad_flags_are_cli_errors():
    p = simulate("http://127.0.0.1:9", "--dp", "2", "--inject", "hang:rank=7:step=1")
    assert p.returncode == 2 and "rank=7 out of range [0, 2)" in p.stderr
    p = simulate("http://127.0.0.1:9", "--steps", "0")
    assert p.returncode == 2 and "steps must be a positive integer, got 0" in p.stderr


def test_a_real_server_takes_the_simulated_job_and_its_429s_lose_nothing(tmp_path):
    import httpx

    from tests.helpers.server import running_server

    # a writer queue of 1,000 rows: 8 agents' concurrent batches overflow it (429 + Retry-After)
    with running_server(tmp_path / "srv", max_queue_rows=1000) as url:
        res = tmp_path / "res"
        p = simulate(url, "--dp", "4", "--tp", "2", "--pp", "2", "--gpus-per-host", "2", "--steps", "6",
                     "--step-ms", "400", "--job", "simj", "--results", str(res), "--compression", "zstd",
                     "--inject", "straggler:rank=5:factor=1.3:from_step=2")
        assert p.returncode == 0, p.stderr + p.stdout
        summary = json.loads(p.stdout)
        assert summary["records_acked"] == summary["records_generated"] > 1000
        assert summary["rejected_batches"] == 0 and summary["status"] == "finished"
        assert summary["throttled_429"] > 0, summary
        api = httpx.Client(base_url=url.api, timeout=30)
        job = api.get("/jobs/simj").json()
        assert job["status"] == "finished" and job["num_ranks_reporting"] == 16 and job["last_step"] == 5
        steps = api.get("/jobs/simj/steps").json()["rows"]
        assert {(r["rank"], r["step"]) for r in steps} == {(r, s) for r in range(16) for s in range(6)}
        truth = json.loads((res / "ground_truth.json").read_text())
        assert truth["faults"][0]["culprit_ranks"] == [5] and truth["faults"][0]["onset_step"] == 2
        assert truth["num_hosts"] == 8


@pytest.mark.slow
def test_a_1024_rank_hang_is_diagnosed_end_to_end(tmp_path):
    """1,024 ranks on 128 simulated hosts, one rank never joins its next collective at
    step 4: the server names it and pages it by webhook."""
    import httpx
    from test_diagnosis_api import Receiver, wait_for

    from tests.helpers.server import running_server

    rx = Receiver()
    http = httpx.Client(timeout=60)
    try:
        with running_server(tmp_path / "srv", diagnosis_tick_s=1, hang_min_s=8,
                            webhook_allow="127.0.0.1") as url:
            http.post(f"{url.api}/alerts/webhooks", json={"name": "rx", "url": rx.url}).raise_for_status()
            res = tmp_path / "res"
            p = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "simulate", "--server", url, "--quiet",
                                  "--dp", "16", "--pp", "8", "--tp", "8", "--steps", "60", "--step-ms", "2000",
                                  "--microbatches", "2", "--tp-ops-per-microbatch", "1",  # ~8 k records/s
                                  "--batch-delay", "1", "--job", "h1k", "--results", str(res),
                                  "--inject", "hang:rank=517:step=4:where=collective"],
                                 stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sim.log", "wb"))
            try:
                # the first passes may judge with part of the fleet's data still on its way:
                # wait until the analysis names the rank (every other rank waits on it)
                def named():
                    try:
                        h = http.get(f"{url.api}/jobs/h1k/hang").json()
                    except httpx.TimeoutException:  # a loaded server: ask again
                        return None
                    return h.get("stalled") and h["culprits"] == [517] and h

                hang = wait_for(named, 150, "stall naming rank 517")
                assert hang["hang_class"] == "stuck_in_compute", hang
                payload = wait_for(lambda: [x for x in rx.payloads() if x["commonLabels"].get("job") == "h1k"
                                            and x["commonLabels"].get("alertname") == "FleetscopeHang"], 60,
                                   "hang webhook")[0]
                assert payload["alerts"][0]["annotations"]["culprit_ranks"] == "[517]"
                truth = json.loads((res / "ground_truth.json").read_text())
                onset_s = truth["faults"][0]["onset_ns"] / 1e9
                paged_s = [t for _, b, t in rx.got if b"h1k" in b][0]
                print(f"1,024 ranks: hang paged {paged_s - onset_s:.1f} s after onset")
            finally:
                p.terminate()
                p.wait(120)
    finally:
        rx.close()


# ---------------------------------------------------------------------------- diagnosable
def diagnose_simulated(tmp_path, injections, num_steps=12, tail_s=40):
    """A 128-rank (2 x 8 x 8) simulated job stored in chdb as the agents would deliver it
    (5 s batches), diagnosed by the server's own loader (the reductions ClickHouse
    computes, as the diagnosis loop reads them) and engine ``tail_s`` after the last step
    was due."""
    from fleetscope.server.diagnosis.engine import JobInfo, diagnose
    from fleetscope.server.diagnosis.loader import load_reduced_frames
    from fleetscope.server.diagnosis.rollups import StepCache
    from fleetscope.server.store.client import Store

    topo = Topology(dp=2, pp=8, tp=8)
    m = model(topo=topo, injections=injections, step_ms=2000.0, seed=1)
    hosts = [f"d-h{h:02d}" for h in range(16)]
    span_s = num_steps * 2 + tail_s
    t0 = time.time_ns() - span_s * 10**9
    fleet = Fleet(m.layout, "dj", t0, 8, hosts, 4, 1024, Periods(), seed=1)
    fleet.set_phase(m.phase)
    fleet.add_job_row(0.0, name="dj", dp=2, tp=8, pp=8, num_microbatches=4, status="running")
    clock = np.zeros(m.layout.shape)
    for s in range(num_steps):
        o = m.play(s, clock)
        fleet.add_step(o)
        clock = o.end
    store = Store.open(f"chdb://{tmp_path / 'store'}")
    try:
        for k in [*range(5, span_s, 5), span_s]:
            for name, (table, _) in fleet.take(k * 1e9).items():
                store.insert_arrow(name, table)
        now = t0 + span_s * 10**9
        info = JobInfo(job="dj", topology=topo, num_microbatches=4, model_flops_per_step=1e15,
                       device_peak_flops=989e12, start_ns=t0)
        frames = load_reduced_frames(store, "dj", now, StepCache(), topo.world_size, 4, window_steps=24)
        return diagnose(info, frames, now)
    finally:
        store.close()


@pytest.mark.parametrize("case", ["clean", "straggler", "hang"])
def test_the_servers_detectors_read_the_simulated_job_right(tmp_path, case):
    inject = {"clean": [], "straggler": ["straggler:rank=67:factor=1.2:from_step=3"],
              "hang": ["hang:rank=67:step=8:where=collective"]}[case]
    d = diagnose_simulated(tmp_path, inject, num_steps=12 if case != "hang" else 10,
                           tail_s=40 if case == "hang" else 2)
    kinds = [(str(f.kind.value), f.ranks) for f in d.findings]
    if case == "clean":
        assert kinds == [] and not d.hang.stalled
    elif case == "straggler":
        assert kinds == [("slow_compute", (67,))] and not d.hang.stalled
    else:
        assert d.hang.stalled and d.hang.culprits == (67,), d.hang
        assert d.hang.hang_class.value == "stuck_in_compute"
        assert d.hang.evidence["num_waiting_on_culprit"] == {"67": 127}
