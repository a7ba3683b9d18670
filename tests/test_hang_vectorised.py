"""The hang path over arrays (issue #12: the hang-only pass at 12,288 ranks) decides what
the rank-by-rank definitions decide: :func:`hangs.rank_states` against
:func:`hangs.rank_states_reference`, the op-progress horizon against its reference, and
the hosts' last arrival against the per-host loop it replaced, on synthetic fleets that
mix dead, stale, stuck, young, idle and unknown ranks; and the whole hang analysis gives
the same verdict, chain and evidence either way."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fleetscope.server.diagnosis import hangs, health, progress
from fleetscope.server.diagnosis.findings import HangClass
from fleetscope.server.diagnosis.hangs import HangConfig, RankStateKind, analyse_hang

from fleetscope.topology import Topology

TOPO = Topology(dp=4, tp=2, pp=2)  # 16 ranks
NOW = 10**18
S = 10**9
CFG = HangConfig()


def _fleet(seed: int, topo: Topology = TOPO) -> tuple[pd.DataFrame, pd.DataFrame]:
    """In-flight and heartbeat rows of a fleet where every rank draws its own situation."""
    rng = np.random.default_rng(seed)
    inf, hb = [], []
    for r in topo.ranks():
        host = f"h{r // 4}"
        what = rng.choice(["stuck", "young", "stale", "idle_row", "none"])
        if what != "none":
            # ages and holding times on both sides of (and at) the thresholds (10 s, 2 s)
            ts = NOW - int(rng.choice([0, 1, 9, 10]) * S + rng.integers(0, 2) * rng.integers(0, S)) \
                if what != "stale" else NOW - int(rng.choice([10, 11, 60])) * S - int(rng.integers(0, 2))
            held = int(rng.choice([2, 3, 40])) * S if what in ("stuck", "stale") else \
                int(rng.choice([0, 1, 2])) * S - int(rng.integers(0, 2))
            kind = rng.choice(["collective", "p2p", "section"]) if what != "idle_row" else "idle"
            axis = rng.choice(["tp", "dp", "pp"])
            inf.append({"rank": r, "ts_ns": ts, "step": 7, "kind": kind,
                        "op": {"collective": "all_reduce", "p2p": "recv", "section": "forward"}.get(kind, ""),
                        "group_id": topo.group_id(axis, r) if kind != "section" else "",
                        "axis": axis, "seq": int(rng.integers(1, 50)),
                        "peer": int(rng.integers(0, topo.world_size)) if kind == "p2p" else -1,
                        "since_ns": ts - held})
            if rng.random() < 0.3:  # an older record of the same rank: never the one used
                inf.append({**inf[-1], "ts_ns": inf[-1]["ts_ns"] - 5 * S, "kind": "section", "op": "backward"})
        beat = rng.choice(["alive", "dead", "stale", "none", "moved"])
        if beat != "none":
            ts = NOW - (int(rng.choice([15, 16, 90])) * S + int(rng.integers(0, 2)) if beat == "stale"
                        else int(rng.choice([0, 1, 14, 15])) * S)  # (15 s: the heartbeat threshold)
            row = {"rank": r, "host": host, "ts_ns": ts, "alive": int(beat != "dead"), "pid": 100 + r,
                   "dead_since_ns": ts - int(rng.integers(0, 9)) * S if beat == "dead" else ts,
                   "spool_last_step": 7, "caught_up": int(rng.random() < 0.8),
                   # the agent's acknowledged prefix: not said (older agent), none yet, or a time
                   "acked_through_ns": int(rng.choice([-1, 0, NOW, NOW - 2 * S, NOW - 30 * S]))}
            hb.append(row)
            if beat == "moved":  # the rank's newest heartbeat comes from another host
                hb.append({**row, "host": "h-new", "ts_ns": ts + S,
                           "acked_through_ns": int(rng.choice([-1, NOW - S]))})
    for h in range(topo.world_size // 4):  # the agents' own heartbeats (rank -1)
        hb.append({"rank": -1, "host": f"h{h}", "ts_ns": NOW - S, "alive": 1, "pid": 0,
                   "dead_since_ns": NOW - S, "spool_last_step": 7, "caught_up": 1, "acked_through_ns": -1})
    inf.append({"rank": topo.world_size + 3, "ts_ns": NOW, "step": 7, "kind": "collective", "op": "all_reduce",
                "group_id": "world", "axis": "world", "seq": 1, "peer": -1, "since_ns": NOW - 9 * S})
    return pd.DataFrame(inf), pd.DataFrame(hb)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("ignore_death", [False, True])
def test_rank_states_match_the_rank_by_rank_definition(seed, ignore_death):
    inflight, heartbeats = _fleet(seed)
    got = hangs.rank_states(TOPO, inflight, heartbeats, NOW, CFG, ignore_death=ignore_death)
    want = hangs.rank_states_reference(TOPO, inflight, heartbeats, NOW, CFG, ignore_death=ignore_death)
    assert dict(got) == want
    assert len(got) == TOPO.world_size and list(got) == list(TOPO.ranks())
    for kind in RankStateKind:  # the arrays say the same as the entries
        assert got.ranks_in(kind) == [r for r, s in want.items() if s.kind == kind]


def test_the_mix_covers_every_state_and_each_follows_its_rule():
    inflight, heartbeats = _fleet(0, Topology(dp=32, tp=2, pp=2))
    topo = Topology(dp=32, tp=2, pp=2)
    states = hangs.rank_states(topo, inflight, heartbeats, NOW, CFG)
    assert {s.kind for s in states.values()} == set(RankStateKind)
    inf = inflight.sort_values("ts_ns").groupby("rank").tail(1).set_index("rank")
    hb = heartbeats[heartbeats["rank"] >= 0].sort_values("ts_ns").groupby("rank").tail(1).set_index("rank")
    for r, s in states.items():
        row = inf.loc[r] if r in inf.index else None
        beat = hb.loc[r] if r in hb.index else None
        assert s.host == (beat["host"] if beat is not None else "")
        if beat is not None and not beat["alive"]:
            assert s.kind == RankStateKind.DEAD and s.since_ns == beat["dead_since_ns"]
        elif s.kind in hangs.TRACED:  # fresh, and held long enough to be waiting
            assert row is not None and s.kind.value == row["kind"] and s.seq == row["seq"]
            assert NOW - row["ts_ns"] <= CFG.inflight_stale_s * S
            assert row["ts_ns"] - row["since_ns"] >= CFG.min_blocked_s * S and s.since_ns == row["since_ns"]
        elif s.kind == RankStateKind.IDLE:
            assert beat is not None and NOW - beat["ts_ns"] <= CFG.heartbeat_stale_s * S
        else:
            assert s.kind == RankStateKind.UNKNOWN
            assert beat is None or NOW - beat["ts_ns"] > CFG.heartbeat_stale_s * S


def test_rank_states_mapping_is_read_only_and_bounded():
    inflight, heartbeats = _fleet(3)
    states = hangs.rank_states(TOPO, inflight, heartbeats, NOW, CFG)
    assert TOPO.world_size + 3 not in states and -1 not in states and "0" not in states
    with pytest.raises(KeyError):
        states[TOPO.world_size]
    assert states[np.int64(2)] == states[2] and states.get(99) is None
    empty = hangs.rank_states(TOPO, pd.DataFrame(), pd.DataFrame(), NOW, CFG)
    assert dict(empty) == hangs.rank_states_reference(TOPO, pd.DataFrame(), pd.DataFrame(), NOW, CFG)
    assert empty.ranks_in(RankStateKind.UNKNOWN) == list(TOPO.ranks())


def _steps(last_end_ns: int) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "step": s, "end_ns": last_end_ns - (9 - s) * 200_000_000,
                          "duration_ns": 200_000_000} for r in TOPO.ranks() for s in range(10)])


def _progress(last: int = 41) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "group_id": TOPO.group_id(a, r), "last_seq": last}
                         for r in TOPO.ranks() for a in ("tp", "dp", "pp")])


def _inf(rank, kind, op="", gid="", seq=-1, peer=-1, ts=NOW - S):
    return {"rank": rank, "ts_ns": ts, "step": 10, "kind": kind, "op": op, "group_id": gid,
            "seq": seq, "peer": peer, "since_ns": NOW - 40 * S}


def _hb(dead=(), ts=NOW - S, dead_since=None) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "host": f"h{r // 4}", "ts_ns": ts, "alive": int(r not in dead), "pid": r,
                          "dead_since_ns": (dead_since or {}).get(r, ts)} for r in TOPO.ranks()])


def _same(a, b) -> None:
    assert (a.stalled, a.culprits, a.hang_class, a.group_id, a.chain, a.threshold_s, a.due_in_s) == \
        (b.stalled, b.culprits, b.hang_class, b.group_id, b.chain, b.threshold_s, b.due_in_s)
    assert a.evidence == b.evidence


def _both(*args, **kw):
    return (analyse_hang("j", TOPO, NOW, *args, **kw, reference=True),
            analyse_hang("j", TOPO, NOW, *args, **kw))


def test_hang_analysis_is_the_same_either_way():
    # rank 3 stuck in forward, its TP peer waits in a collective, the rest wait in DP
    # collectives or p2p on the stages that wait for it; rank 9 stale, rank 12 idle
    rows = [_inf(3, "section", "forward"), _inf(2, "collective", "all_reduce", TOPO.group_id("tp", 2), 42),
            _inf(9, "collective", "all_reduce", TOPO.group_id("dp", 9), 42, ts=NOW - 30 * S),
            _inf(12, "idle")]
    rows += [_inf(r, "collective", "all_reduce", TOPO.group_id("dp", r), 42)
             for r in TOPO.ranks() if r not in (2, 3, 9, 12)]
    old, new = _both(_steps(NOW - 45 * S), pd.DataFrame(rows), _hb(), _progress())
    _same(old, new)
    assert new.stalled and 3 in new.culprits and new.chain
    # the same job before the threshold: not stalled, the same due time
    _same(*_both(_steps(NOW - 10 * S), pd.DataFrame(rows), _hb(), _progress()))


def test_dead_and_all_dead_verdicts_are_the_same_either_way():
    rows = [_inf(r, "collective", "all_reduce", TOPO.group_id("tp", r), 42) for r in TOPO.ranks() if r != 5]
    old, new = _both(_steps(NOW - 45 * S), pd.DataFrame(rows), _hb(dead=(5,)), _progress())
    _same(old, new)
    assert new.culprits == (5,) and new.hang_class == HangClass.PROCESS_DEAD
    everyone = tuple(TOPO.ranks())
    first = _hb(dead=everyone, dead_since={r: NOW - (40 if r == 7 else 39) * S for r in everyone})
    # the survivors' last records: waiting in DP collectives rank 7 never joined
    late = [_inf(r, "collective", "all_reduce", TOPO.group_id("dp", r), 9, ts=NOW - 30 * S) for r in everyone
            if r != 7]
    old, new = _both(_steps(NOW - 45 * S), pd.DataFrame(late), first, _progress(last=8),
                     last_seen={r: NOW - 39 * S for r in everyone})
    _same(old, new)
    assert new.culprits == (7,) and new.hang_class == HangClass.PROCESS_DEAD
    ended = _hb(dead=everyone, dead_since={r: NOW - 39 * S for r in everyone})
    old, new = _both(_steps(NOW - 45 * S), pd.DataFrame([_inf(r, "idle", ts=NOW - 30 * S) for r in everyone]),
                     ended, _progress())
    _same(old, new)
    assert not new.stalled


@pytest.mark.parametrize("seed", range(8))
def test_progress_horizon_matches_the_rank_by_rank_definition(seed):
    inflight, heartbeats = _fleet(seed)
    ranks = list(TOPO.ranks())
    assert progress._horizon(ranks, inflight, heartbeats) == progress._horizon_reference(ranks, inflight, heartbeats)
    full = inflight[inflight["rank"] < TOPO.world_size]
    full = pd.concat([full, pd.DataFrame([{**full.iloc[0].to_dict(), "rank": r} for r in ranks])])
    got = progress._horizon(ranks, full, heartbeats)
    assert got == progress._horizon_reference(ranks, full, heartbeats) and not got[1]
    assert progress._horizon(ranks, full, heartbeats.drop(columns="acked_through_ns"))[0] > 0
    assert progress._horizon([], full, heartbeats) == progress._horizon_reference([], full, heartbeats)


def _host_last_arrival_loop(frames, host_seen_ns=None, job_only=False) -> dict[str, int]:
    """The per-host loop :func:`health.host_last_arrival` replaced (its definition)."""
    hosts = frames.hosts
    out: dict[str, int] = {}

    def put(h, t):
        if h in out and t > 0:
            out[h] = max(out[h], int(t))

    for h in set(hosts.values()):
        out.setdefault(h, 0)
    for r, t in (frames.last_seen or {}).items():
        put(hosts.get(int(r), ""), t)
    hb = frames.heartbeats
    if hb is not None and not hb.empty:
        mine = hb[hb["rank"] >= 0] if job_only else hb
        for h, t in mine.groupby("host")["ts_ns"].max().items():
            put(str(h), int(t))
    if not job_only:
        for h, t in (frames.host_last_ns or {}).items():
            put(h, t)
        for h, t in (host_seen_ns or {}).items():
            put(h, t)
    if not frames.steps.empty and "end_ns" in frames.steps:
        for h, t in frames.steps.groupby("host")["end_ns"].max().items():
            put(str(h), int(t))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_host_last_arrival_matches_the_per_host_loop(seed):
    from fleetscope.server.diagnosis.loader import JobFrames

    rng = np.random.default_rng(seed)
    _, heartbeats = _fleet(seed)
    steps = pd.DataFrame([{"rank": r, "host": f"h{r // 4}" if r != 6 else "", "step": 9,
                           "start_ns": NOW - 9 * S, "end_ns": NOW - int(rng.integers(0, 20)) * S,
                           "duration_ns": S} for r in TOPO.ranks() if rng.random() < 0.8])
    e = pd.DataFrame()
    frames = JobFrames(attempt=0, last_step=9, steps=steps, sections=e, collectives=e, step_times=e,
                       inflight=e, heartbeats=heartbeats, progress=e, log_events=e, metrics=e,
                       last_seen={r: NOW - int(rng.integers(0, 30)) * S for r in TOPO.ranks() if rng.random() < 0.7},
                       host_last_ns={"h1": NOW - 2 * S, "elsewhere": NOW})
    seen = {"h0": NOW - S, "h3": 0, "nowhere": NOW}
    for job_only in (False, True):
        assert health.host_last_arrival(frames, seen, job_only) == _host_last_arrival_loop(frames, seen, job_only)


def _blocked_fleet(seed: int, topo: Topology) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Most ranks wait in collectives (some a sequence behind or ahead) or p2p ops, a few
    compute, are idle or dead: a wait-for graph with many edges, roots and chains."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in topo.ranks():
        what = rng.choice(["coll", "coll", "coll", "p2p", "section", "none"])
        if what == "coll":
            axis = rng.choice(["tp", "dp", "pp"])
            op = "all_reduce" if rng.random() < 0.95 else "all_gather"
            rows.append(_inf(r, "collective", op, topo.group_id(axis, r), int(rng.integers(41, 44))))
        elif what == "p2p":
            peer = int(rng.integers(0, topo.world_size))
            rows.append(_inf(r, "p2p", rng.choice(["send", "recv", "isend", "irecv"]), topo.group_id("pp", r),
                             int(rng.integers(1, 5)), peer=peer))
        elif what == "section":
            rows.append(_inf(r, "section", rng.choice(["forward", "dataloader"])))
    rows.append(_inf(0, "collective", "all_reduce", "bogus.group", 42))  # unparsable: no edges, as before
    hb = pd.DataFrame([{"rank": r, "host": f"h{r // 8}", "ts_ns": NOW - S, "alive": int(rng.random() > 0.03),
                        "pid": r, "dead_since_ns": NOW - S} for r in topo.ranks()])
    return pd.DataFrame(rows).drop_duplicates("rank", keep="last"), hb


@pytest.mark.parametrize("seed", range(6))
def test_wait_for_graph_and_localisation_match_the_member_by_member_definition(seed):
    topo = Topology(dp=8, tp=4, pp=4)
    inflight, hb = _blocked_fleet(seed, topo)
    rng = np.random.default_rng(seed)
    prog = pd.DataFrame([{"rank": r, "group_id": topo.group_id(a, r), "last_seq": int(rng.integers(40, 43))}
                         for r in topo.ranks() for a in ("tp", "dp", "pp")])
    states = hangs.rank_states(topo, inflight, hb, NOW, CFG)
    plain = dict(states)
    partial = {r: s for r, s in plain.items() if r % 5}  # a hand-made mapping with gaps
    for st in (states, plain, partial):
        assert hangs.wait_for_graph(topo, st, prog) == hangs.wait_for_graph_reference(topo, st, prog)
    for st in (states, plain):  # (localise needs every rank's state)
        assert hangs.localise(topo, st, prog) == hangs.localise(topo, st, prog, reference=True)
    edges = hangs.wait_for_graph(topo, states, prog)
    assert edges, "the fleet has waiting ranks"
    roots = sorted({q for outs in edges.values() for q, _ in outs} - set(edges))
    assert hangs._upstream_counts(roots, edges) == {r: hangs._count_upstream(r, edges) for r in roots}
    steps = pd.DataFrame([{"rank": r, "step": s, "end_ns": NOW - 45 * S - (9 - s) * 200_000_000,
                           "duration_ns": 200_000_000} for r in topo.ranks() for s in range(10)])
    old = analyse_hang("j", topo, NOW, steps, inflight, hb, prog, reference=True)
    new = analyse_hang("j", topo, NOW, steps, inflight, hb, prog)
    _same(old, new)
    assert new.stalled and new.culprits
