"""The op-progress hang rule on synthetic frames: it fires when no rank completes any traced
op while ranks wait in ops, long before the step-stall rule, localises like the step rule,
and stays quiet through legitimate quiet phases (seen in history, warm-up, data it cannot
certify, ranks that all compute). One incident per hang whichever rule fires first."""

from __future__ import annotations

import pandas as pd
import pytest
from fleetscope.server.diagnosis.findings import HangClass
from fleetscope.server.diagnosis.hangs import HangConfig, analyse_hang
from fleetscope.server.diagnosis.progress import (
    CERTIFY_MARGIN_NS,
    completions,
    progress_stall,
    step_gaps,
)

from fleetscope.topology import Topology
from tests.helpers.synthetic import MS, SynthJob

S = 10**9
CFG = HangConfig()  # defaults: hang_min_s 30, hang_k 5, hang_op_min_s 20
TOPO = Topology(dp=2, tp=2, pp=2)


def _frames(**kw):
    job = SynthJob(num_steps=kw.pop("num_steps", 12), **kw)
    return job.build()


def _last(f) -> int:
    return int(max(f["collectives"]["completed_ns"].max(), f["sections"]["end_ns"].max()))


def _hang_inflight(quiet_end_ns, culprit_section="forward", culprit=3, since_ns=None, stale=None):
    """Rank ``culprit`` is stuck in a section; everyone else waits in a collective/p2p op.

    Records are fresh as of ``quiet_end_ns``; ranks in ``stale`` last reported 15 s earlier.
    """
    since = since_ns if since_ns is not None else quiet_end_ns - 25 * S
    rows = []
    for r in range(8):
        ts = quiet_end_ns - (15 * S if stale and r in stale else 0)
        if r == culprit:
            kind, op, gid, peer = "section", culprit_section, "", -1
        elif r in (6, 7):
            kind, op, gid, peer = "p2p", "recv", TOPO.group_id("pp", r), r - 4
        elif r == 2:
            kind, op, gid, peer = "collective", "all_reduce", "tp.pp0.dp1", -1
        else:
            kind, op, gid, peer = "collective", "all_reduce", TOPO.group_id("dp", r), -1
        rows.append({"rank": r, "ts_ns": ts, "step": 12, "kind": kind, "op": op, "group_id": gid,
                     "seq": 500, "peer": peer, "since_ns": since})
    return pd.DataFrame(rows)


def _hb(ts_ns, dead=()):
    return pd.DataFrame([{"rank": r, "host": f"h{r // 4}", "ts_ns": ts_ns, "alive": int(r not in dead),
                          "pid": 100 + r, "caught_up": 1} for r in range(8)])


def _stall(f, now_ns, inflight, hb=None, first_step=0, cfg=CFG):
    return progress_stall(now_ns, list(range(8)), f["collectives"], f["sections"], inflight,
                          _hb(now_ns) if hb is None else hb, int(f["steps"]["step"].max()), first_step,
                          hang_op_min_s=cfg.hang_op_min_s, hang_k=cfg.hang_k,
                          min_history_steps=cfg.op_min_history_steps, min_blocked_s=cfg.min_blocked_s)


def _analyse(f, now_ns, inflight, op):
    step_times = f["steps"].groupby("step").agg(duration_ns=("duration_ns", "max"), end_ns=("end_ns", "max"))
    return analyse_hang("j", TOPO, now_ns, step_times.reset_index(), inflight, _hb(now_ns),
                        pd.DataFrame(columns=["rank", "group_id", "last_seq"]), config=CFG, progress_stall=op)


def _at_quiet(f, quiet_s, **kw):
    """(now, inflight) where the certified silence after the last completion is ``quiet_s``."""
    now = _last(f) + int(quiet_s * S) + CERTIFY_MARGIN_NS
    return now, _hang_inflight(now, **kw)


def test_fires_on_job_wide_silence_and_localises_before_the_step_rule():
    f = _frames()
    now, inf = _at_quiet(f, 21)
    op = _stall(f, now, inf)
    assert op.armed and op.stalled and op.threshold_s == pytest.approx(20.0)
    assert op.quiet_s == pytest.approx(21.0) and 0 < op.history_gap_s < 0.1
    assert op.blocked_ranks == (0, 1, 2, 4, 5, 6, 7)
    a = _analyse(f, now, inf, op)
    # the step rule alone would wait for 30 s; the op rule fired at 21 s
    assert a.stalled and a.evidence["detected_by"] == "op_progress" and a.threshold_s == pytest.approx(20.0)
    assert a.culprits == (3,) and a.hang_class == HangClass.STUCK_IN_COMPUTE
    fnd = a.to_finding()
    assert fnd.ranks == (3,) and "no traced op completed anywhere" in fnd.summary
    assert fnd.evidence["op_progress"]["quiet_s"] == pytest.approx(21.0)


def test_below_threshold_is_quiet_and_says_when_it_is_due():
    f = _frames()
    now, inf = _at_quiet(f, 18.5)
    op = _stall(f, now, inf)
    assert op.armed and not op.stalled and op.due_in_s() == pytest.approx(1.5)
    a = _analyse(f, now, inf, op)
    assert not a.stalled and a.due_in_s == pytest.approx(1.5)


@pytest.mark.parametrize("what", ["dataloader", "compute"])
def test_long_legitimate_phase_seen_in_history_stays_quiet(what):
    # step 7 had a 6 s job-wide quiet phase: every rank loading data (shared filesystem
    # pause), or stage 0 computing 6 s while stage 1 waited in its p2p recv (the TP
    # all-reduce inside every forward completes half-way through it: 1200 x 5 ms)
    if what == "dataloader":
        f = _frames(dl_factor=lambda r, s: 1200.0 if s == 7 else 1.0)
    else:
        f = _frames(compute_factor=lambda r, s: 1200.0 if s == 7 and TOPO.coords(r).pp == 0 else 1.0)
    for quiet in (21, 25):  # beyond the floor, but not beyond k x what the job did before
        now, inf = _at_quiet(f, quiet)
        op = _stall(f, now, inf)
        assert op.armed and not op.stalled and op.history_gap_s > 5 and op.threshold_s > 25, (quiet, op)
    now, inf = _at_quiet(f, 5 * op.history_gap_s + 1)
    assert _stall(f, now, inf).stalled  # and it still fires beyond k x the history


def test_warm_up_slow_first_step_stays_quiet():
    # the first step (compile, communicator setup) took 40 s; only two steps after it
    f = _frames(num_steps=3, pause_ms=lambda r, s: 40_000.0 if s == 0 else 0.0)
    now, inf = _at_quiet(f, 25)
    op = _stall(f, now, inf)
    assert not op.armed and not op.stalled and "history" in op.reason
    # once there is history, the warm-up step's long gap is not part of it
    f = _frames(num_steps=8, pause_ms=lambda r, s: 40_000.0 if s == 0 else 0.0)
    now, inf = _at_quiet(f, 25)
    op = _stall(f, now, inf)
    assert op.armed and op.threshold_s == pytest.approx(20.0) and op.stalled


def test_silence_it_cannot_certify_stays_quiet():
    f = _frames()
    # rank 5's agent stopped shipping 15 s ago: its last 15 s are unknown, so the
    # certified silence is only ~10 s although the server saw nothing for 25 s
    now, inf = _at_quiet(f, 25, stale={5})
    op = _stall(f, now, inf)
    assert op.armed and not op.stalled and op.quiet_s == pytest.approx(10.0)
    # a rank with no in-flight record at all disarms the rule
    op = _stall(f, now, inf[inf["rank"] != 5])
    assert not op.armed and not op.stalled and "rank(s) [5]" in op.reason
    # ... unless its process is known gone (and its records are in): it cannot progress
    op = _stall(f, now, inf[inf["rank"] != 5], hb=_hb(now, dead=(5,)))
    assert op.armed and op.stalled


def test_silence_is_certified_only_up_to_what_the_agents_say_is_acknowledged():
    """A later batch stored before an earlier one (several requests of an agent on the
    wire, one of them throttled and retried): the store holds ranks' newest in-flight
    records but not the ops they completed before. The heartbeats' ``acked_through_ns``
    bound the certified silence, so no stall is declared from the hole; -1 (an older
    agent) keeps the stored in-flight time; the largest value any heartbeat said counts."""
    f = _frames()
    now, inf = _at_quiet(f, 25)
    hb = _hb(now)
    # host h1's prefix is acknowledged only up to 5 s after the last completion
    hb["acked_through_ns"] = [now if r < 4 else _last(f) + 5 * S for r in range(8)]
    for reference in (False, True):
        op = progress_stall(now, list(range(8)), f["collectives"], f["sections"], inf, hb,
                            int(f["steps"]["step"].max()), 0, hang_op_min_s=CFG.hang_op_min_s,
                            hang_k=CFG.hang_k, min_history_steps=CFG.op_min_history_steps,
                            min_blocked_s=CFG.min_blocked_s, reference=reference)
        assert op.armed and not op.stalled
        assert op.quiet_s == pytest.approx(5.0 - CERTIFY_MARGIN_NS / S)
        assert op.horizon_ns == _last(f) + 5 * S - CERTIFY_MARGIN_NS
    assert not _stall(f, now, inf, hb=hb).stalled
    # nothing of rank 6 acknowledged yet (0): nothing of the job is certified
    zero = hb.assign(acked_through_ns=[now if r != 6 else 0 for r in range(8)])
    assert not _stall(f, now, inf, hb=zero).stalled and _stall(f, now, inf, hb=zero).quiet_s == 0
    # an older agent says nothing (-1): its stored in-flight time stands, as before
    older = hb.assign(acked_through_ns=-1)
    assert _stall(f, now, inf, hb=older).stalled
    # heartbeats arrive in any order: each one was true when sent, so the maximum holds
    later = pd.concat([hb, hb.assign(ts_ns=now - 2 * S, acked_through_ns=now)], ignore_index=True)
    op = _stall(f, now, inf, hb=later)
    assert op.stalled and op.quiet_s == pytest.approx(25.0)


def test_every_rank_busy_outside_ops_is_not_a_hang():
    f = _frames()
    now, inf = _at_quiet(f, 25)
    inf = inf.assign(kind="section", op="dataloader", group_id="", peer=-1)  # all load data
    op = _stall(f, now, inf)
    assert op.armed and not op.stalled and op.blocked_ranks == ()


def test_one_incident_per_hang_whichever_rule_fires(tmp_path):
    from fleetscope.server.alerts.outbox import enqueue_incident
    from fleetscope.server.alerts.rules import install_defaults
    from fleetscope.server.db import open_db
    from fleetscope.server.db.diagnosis_models import AlertOutbox, Incident, Webhook
    from fleetscope.server.diagnosis.incidents import sync_incidents
    from sqlalchemy import func, select

    f = _frames()
    maker = open_db(f"sqlite:///{tmp_path / 'c.db'}")
    with maker() as s:
        install_defaults(s)
        s.add(Webhook(name="a", url="http://recv.test/hook"))
        s.commit()
    seen = []
    for quiet in (21, 25, 33, 40):  # op rule first, then the step rule too
        now, inf = _at_quiet(f, quiet)
        a = _analyse(f, now, inf, _stall(f, now, inf))
        seen.append(a.evidence["detected_by"])
        with maker() as s:
            for ch in sync_incidents(s, "j", [a.to_finding()], now, 20):
                enqueue_incident(s, ch.incident, now)
    # the op rule crossed its threshold first: the incident keeps saying so
    assert seen == ["op_progress"] * 4
    with maker() as s:
        incs = list(s.scalars(select(Incident)))
        assert len(incs) == 1 and incs[0].kind == "hang" and incs[0].ranks == "[3]"
        assert s.scalar(select(func.count()).select_from(AlertOutbox)) == 1


def test_step_gaps_take_each_steps_longest_job_wide_silence():
    # two ranks interleave; step 1 opens with a 3 s pause on both (data loading)
    ev = pd.DataFrame({"rank": [0, 1, 0, 1, 0, 1, 0], "step": [0, 0, 0, 1, 1, 1, 1],
                       "t_ns": [0, 10 * MS, 30 * MS, 3030 * MS, 3040 * MS, 3045 * MS, 3100 * MS]})
    g = step_gaps(ev)
    assert g.to_dict() == pytest.approx({0: 0.02, 1: 3.0})
    healthy = step_gaps(completions(_frames()["collectives"], _frames()["sections"]))
    assert len(healthy) == 12 and (healthy > 0).all() and (healthy < 0.05).all()


def test_periodic_service_wakes_early_when_work_is_due():
    """The diagnosis loop's base runs ``tick_due`` at the moment a stall becomes due, not
    at the next regular tick."""
    import asyncio
    import time
    from types import SimpleNamespace

    from fleetscope.server.diagnosis.periodic import PeriodicAlertingService

    class Svc(PeriodicAlertingService):
        def __init__(self):
            super().__init__(SimpleNamespace(state=SimpleNamespace()), tick_s=30.0)
            self.regular, self.early = [], []
            self.due_at = time.monotonic() + 0.4

        def tick(self):
            self.regular.append(time.monotonic())
            return 0

        def due_in_s(self):
            return self.due_at - time.monotonic() if self.due_at else float("inf")

        def tick_due(self):
            self.early.append(time.monotonic())
            self.due_at = None
            return 0

    async def go(svc):
        await svc.start()
        await asyncio.sleep(1.2)
        await svc.stop()

    svc = Svc()
    t0 = time.monotonic()
    asyncio.run(go(svc))
    assert len(svc.regular) == 1 and len(svc.early) == 1
    assert 0.35 <= svc.early[0] - t0 <= 1.0


def test_hang_only_pass_leaves_the_other_incidents_alone(tmp_path):
    """The early pass runs the hang analysis alone: open straggler incidents it did not
    look at must not be resolved as 'not detected'."""
    from fleetscope.server.db import open_db
    from fleetscope.server.db.diagnosis_models import Incident
    from fleetscope.server.diagnosis.findings import Finding, FindingKind
    from fleetscope.server.diagnosis.incidents import sync_incidents
    from sqlalchemy import select

    f = _frames()
    maker = open_db(f"sqlite:///{tmp_path / 'c.db'}")
    strag = Finding(FindingKind.SLOW_COMPUTE, "j", (5,), 3.0, "rank 5 slow", first_step=2, last_step=9,
                    est_slowdown=0.2)
    now, inf = _at_quiet(f, 21)
    hang = _analyse(f, now, inf, _stall(f, now, inf)).to_finding()
    with maker() as s:
        sync_incidents(s, "j", [strag], now - 30 * S, 20)
        changes = sync_incidents(s, "j", [hang], now, 20, resolve_missing=False)
        assert [c.what for c in changes] == ["opened"]
        assert {i.kind: i.status for i in s.scalars(select(Incident))} == {"slow_compute": "open", "hang": "open"}
        changes = sync_incidents(s, "j", [hang], now, 20)  # a full pass does resolve it
        assert [(c.incident.kind, c.what) for c in changes] == [("slow_compute", "resolved")]


def test_step_rule_leaves_the_warm_up_step_out_of_its_p99():
    from fleetscope.server.diagnosis.hangs import stall_threshold_s

    steps = pd.DataFrame({"step": range(8), "duration_ns": [12 * S] + [200 * MS] * 7})
    assert stall_threshold_s(steps, CFG) > 50  # the slow first step would dominate the p99
    assert stall_threshold_s(steps, CFG, warmup_step=0) == pytest.approx(30.0)
    assert stall_threshold_s(steps.head(1), CFG, warmup_step=0) == pytest.approx(60.0)  # nothing else yet


def _start_up(now_ns, started_ns, inflight, hb):
    steps = pd.DataFrame(columns=["step", "duration_ns", "end_ns"])
    return analyse_hang("j", TOPO, now_ns, steps, inflight, hb, pd.DataFrame(columns=["rank", "group_id", "last_seq"]),
                        started_ns=started_ns, config=CFG)


def test_a_job_starting_up_is_not_hung_before_first_step_min_s():
    """8 ranks starting on 2 loaded cores took over 30 s to their first step, and a clean
    job was paged as hung "after step -1" with no culprit (bench, 2026-12-07). Before its
    first step a job is given first_step_min_s, unless a rank is blocked in an op (a hung
    rendezvous or first collective) or dead."""
    t0 = 1_000 * S
    quiet = pd.DataFrame(columns=["rank", "ts_ns", "step", "kind", "op", "group_id", "seq", "peer", "since_ns"])
    for after in (31, 60, 119):
        assert not _start_up(t0 + after * S, t0, quiet, _hb(t0 + after * S)).stalled, after
    late = _start_up(t0 + 121 * S, t0, quiet, _hb(t0 + 121 * S))
    assert late.stalled and late.threshold_s == CFG.first_step_min_s
    # ranks waiting in their first collective for 31 s: the usual 30 s
    now = t0 + 31 * S
    blocked = _start_up(now, t0, _hang_inflight(now, since_ns=t0 + S), _hb(now))
    assert blocked.stalled and blocked.threshold_s == CFG.hang_min_s and list(blocked.culprits) == [3], blocked
    # a rank process gone before the first step: dead_rank_min_s
    now = t0 + 40 * S
    hb = _hb(now, dead=(5,)).assign(dead_since_ns=now - 10 * S)
    dead = _start_up(now, t0, quiet, hb)
    assert dead.stalled and dead.threshold_s == CFG.dead_rank_min_s, dead
