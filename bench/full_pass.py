"""The diagnosis loop's full pass at fleet size, old and new side by side on one store.

Builds (or reuses, ``--store-dir``) an embedded chDB store holding a simulated
DP x PP 8 x TP 8 job (default 12,288 ranks on 1,536 hosts): the fleet simulator's step
model and row builder (``fleetscope.sim``, the rows ``fleetscope simulate`` ships), every
record type, written step by step. Then, for each of ``--passes`` new steps: the step's
rows are inserted and one full pass runs with the cost cuts off (``old``:
``loader.fast_pass(False)``, the previous pass) and one with them on
(``new``), on the same store state, in alternating order. A pass is what
``loop.diagnose_job`` does: the loader's store reads (reductions computed by ClickHouse)
and ``engine.diagnose``. Prints per pass the seconds per phase (each store query, the
assembly of the reduced frames, the detectors), then p50/max of each and the ratio,
checks that both gave the same findings and hang verdict, and exits 1 when the new p50
exceeds ``--target`` (2 s, issue #12) or they differ. After each full pass pair the loop's
hang-only pass runs ``--hang-repeat`` times old and new (old: the rank-by-rank hang
analysis and the previous queries), timed per phase like the full pass (target 0.5 s);
``--stall-check`` adds the hang analysis of a stalled job of the same size.

    .venv/bin/python bench/full_pass.py                       # 12,288 ranks, 6 passes (~10 min)
    .venv/bin/python bench/full_pass.py --world 1024 --passes 3   # quick (~1 min)
    .venv/bin/python bench/full_pass.py --store-dir /tmp/fp12k    # keep the store for the next run
    .venv/bin/python bench/full_pass.py --profile new              # + cProfile of one new pass
    .venv/bin/python bench/full_pass.py --hang-repeat 5 --stall-check --profile-hang new   # the hang pass
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import fleet_world  # noqa: E402  (a sibling: bench/ is on sys.path)

JOB = "fullpass"
META = "fullpass-meta.json"


class TimedStore:
    """A store whose query methods record seconds and rows per named query."""

    def __init__(self, store: Any) -> None:
        from fleetscope.server.diagnosis.loader import named_queries

        self.store = store
        self.names = {sql: name for name, sql in named_queries().items()}
        self.t: dict[str, float] = defaultdict(float)
        self.rows: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.t.clear()
        self.rows.clear()

    def _timed(self, kind: str, sql: str, params: Any) -> Any:
        t = time.perf_counter()
        out = getattr(self.store, kind)(sql, params)
        name = self.names.get(sql, "other")
        self.t[name] += time.perf_counter() - t
        self.rows[name] += len(out) if out is not None else 0
        return out

    def query_df(self, sql: str, params: Any = None) -> Any:
        return self._timed("query_df", sql, params)

    def query_rows(self, sql: str, params: Any = None) -> Any:
        return self._timed("query_rows", sql, params)

    def query_arrow(self, sql: str, params: Any = None) -> Any:
        return self._timed("query_arrow", sql, params)


def topology(world: int):
    from fleetscope.topology import Topology

    if world % 64:
        raise SystemExit(f"--world {world}: expected a multiple of 64 (DP x PP 8 x TP 8)")
    return Topology(dp=world // 64, pp=8, tp=8)


class Builder:
    """Plays the simulated job step by step into the store (the simulator's generator)."""

    def __init__(self, store: Any, world: int, num_mb: int, tp_ops: int, t0_ns: int, seed: int = 1) -> None:
        from fleetscope.sim.faults import FaultPlan
        from fleetscope.sim.schedule import StepModel, Timing
        from fleetscope.sim.stream import Fleet, Periods

        topo = topology(world)
        self.store, self.topo = store, topo
        plan = FaultPlan([], topo.world_size, 8)
        self.model = StepModel(topo, num_mb, tp_ops, Timing(step_ms=2000), plan, seed=seed)
        hosts = [f"fp-h{h:04d}" for h in range(-(-topo.world_size // 8))]
        self.fleet = Fleet(self.model.layout, JOB, t0_ns, 8, hosts, num_mb, 1024, Periods(), seed=seed)
        self.fleet.set_phase(self.model.phase)
        self.fleet.add_job_row(0.0, name=JOB, dp=topo.dp, tp=topo.tp, pp=topo.pp, num_microbatches=num_mb,
                               status="running")
        self.clock = np.zeros(self.model.layout.shape)
        self.t0_ns = t0_ns
        self.step = 0
        self.rows = 0

    def add(self) -> float:
        """Play and store the next step; returns seconds spent inserting."""
        o = self.model.play(self.step, self.clock)
        self.fleet.add_step(o)
        self.clock = o.end
        data = self.fleet.take(float(self.clock.max()))
        t = time.perf_counter()
        for name, (table, _) in data.items():
            self.store.insert_arrow(name, table)
            self.rows += table.num_rows
        self.step += 1
        return time.perf_counter() - t

    def fill(self, steps: int) -> None:
        """Play and store ``steps`` steps, with a progress line."""
        for s in range(steps):
            self.add()
            print(f"\r  stored step {s + 1}/{steps}: {self.rows:,} rows", end="", flush=True)
        print(flush=True)

    def now_ns(self) -> int:
        return self.t0_ns + int(self.clock.max()) + int(1e9)


def one_pass(store: TimedStore, info: Any, now: int, cache: Any, config: Any, fast: bool) -> tuple[Any, dict]:
    """One full pass as the loop runs it; its result and seconds per phase."""
    from fleetscope.server.diagnosis import loader, rollups
    from fleetscope.server.diagnosis.engine import diagnose

    store.reset()
    t0 = time.perf_counter()
    with loader.fast_pass(fast):
        frames = loader.load_reduced_frames(store, info.job, now, cache, info.topology.world_size,
                                            info.num_microbatches, window_steps=config.stragglers.window_steps)
        t1 = time.perf_counter()
        result = diagnose(info, frames, now, config)
    t2 = time.perf_counter()
    del rollups
    return result, _phases(store, t0, t1, t2, "diagnose")


def hang_pass(store: TimedStore, info: Any, now: int, cache: Any, config: Any, fast: bool) -> tuple[Any, dict]:
    """The loop's hang-only pass (``run_hang_job``): its hang analysis and seconds per phase
    (each store query, the rest of the load, the hang analysis)."""
    from fleetscope.server.diagnosis import loader
    from fleetscope.server.diagnosis.engine import diagnose_hang

    store.reset()
    t0 = time.perf_counter()
    with loader.fast_pass(fast):
        frames = loader.load_reduced_frames(store, info.job, now, cache, info.topology.world_size,
                                            info.num_microbatches, window_steps=config.stragglers.window_steps,
                                            hardware=False, hang_only=True)
        t1 = time.perf_counter()
        hang, _ = diagnose_hang(info, frames, now, config)
    t2 = time.perf_counter()
    return hang, _phases(store, t0, t1, t2, "diagnose_hang")


def _phases(store: TimedStore, t0: float, t1: float, t2: float, analysis: str) -> dict[str, float]:
    """Seconds per phase of one pass: each store query, the rest of the load (t0..t1), the
    analysis (t1..t2), the total; and the rows the queries moved."""
    phases = {f"q:{k}": v for k, v in sorted(store.t.items())}
    phases["store_total"] = sum(store.t.values())
    phases["load_other"] = (t1 - t0) - phases["store_total"]
    phases[analysis] = t2 - t1
    phases["total"] = t2 - t0
    phases["rows_moved"] = float(sum(store.rows.values()))
    return phases


def stalled_analysis(topo: Any) -> tuple[bool, float, float, tuple]:
    """The hang analysis at the moment of a hang at this size, old (rank by rank) and new:
    synthetic frames where one rank is stuck in forward, its TP peers wait for it in a TP
    collective and every other rank waits in its DP group's collective (the wait-for graph
    and localisation a stalled pass adds to the quiet one). Same verdict, seconds old, new."""
    import pandas as pd
    from fleetscope.server.diagnosis.hangs import analyse_hang

    now, s = 10**18, 10**9
    w = topo.world_size
    stuck = 1234 % w
    peers = set(topo.group_ranks("tp", stuck))
    kind = np.where(np.arange(w) == stuck, "section", "collective")
    gid = [("" if r == stuck else topo.group_id("tp" if r in peers else "dp", r)) for r in range(w)]
    inflight = pd.DataFrame({"rank": np.arange(w), "kind": kind, "op": np.where(kind == "section", "forward", "all_reduce"),
                             "group_id": gid, "seq": np.where(kind == "section", -1, 42), "ts_ns": now - s, "step": 10,
                             "peer": -1, "since_ns": now - 40 * s})
    hb = pd.DataFrame({"rank": np.arange(w), "host": [f"h{r // 8}" for r in range(w)], "ts_ns": now - s, "alive": 1,
                       "pid": 1, "dead_since_ns": now - s})
    progress = pd.DataFrame([(r, topo.group_id(a, r), 41) for r in range(w) for a in ("tp", "dp", "pp")],
                            columns=["rank", "group_id", "last_seq"])
    steps = pd.DataFrame({"step": np.arange(10), "duration_ns": 2 * s, "end_ns": now - 45 * s - (9 - np.arange(10)) * 2 * s})
    out = {}
    took = {}
    for ref in (True, False):
        t = time.perf_counter()
        a = analyse_hang("stall", topo, now, steps, inflight, hb, progress, reference=ref)
        took[ref] = time.perf_counter() - t
        out[ref] = (a.stalled, a.culprits, a.hang_class, a.group_id, a.chain)
    return out[True] == out[False] and out[False][1] == (stuck,), took[True], took[False], out[False][:3]


def verdict(result: Any) -> tuple:
    h = result.hang
    return (sorted((f.kind.value, tuple(f.ranks), f.group_id or "") for f in result.findings),
            (h.stalled, tuple(h.culprits), h.hang_class, h.group_id))


def want_meta(args: argparse.Namespace) -> dict[str, int]:
    return {"world": args.world, "steps": args.steps, "mb": args.microbatches, "k": args.tp_ops}


def build(base: Path, args: argparse.Namespace, want: dict[str, int]) -> int:
    """Write the pristine store at ``base`` (this process owns it)."""
    from fleetscope.server.store import Store

    store = Store.open(f"chdb://{base}", ttl_days=0)
    b = Builder(store, args.world, args.microbatches, args.tp_ops, args._t0)
    tb, ins = time.perf_counter(), 0.0
    try:
        for s in range(args.steps):
            ins += b.add()
            print(f"\r  built step {s + 1}/{args.steps}: {b.rows:,} rows ({ins:.0f} s inserting, "
                  f"{time.perf_counter() - tb:.0f} s)", end="", flush=True)
        print(flush=True)
    finally:
        store.close()
    (base.parent / (META + ".new")).write_text(json.dumps({**want, "rows": b.rows, "t0_ns": b.t0_ns}))
    return 0


def print_phases(title: str, per: dict[str, list[dict[str, float]]]) -> None:
    """The median of each phase over the passes, old beside new."""
    print(f"\n{title}")
    keys = sorted({k for k in per["old"][0]} | {k for k in per["new"][0]}, key=lambda k: (not k.startswith("q:"), k))
    print(f"  {'phase':<24} {'old':>9} {'new':>9}")
    for k in keys:
        o = np.median([p.get(k, 0.0) for p in per["old"]])
        n = np.median([p.get(k, 0.0) for p in per["new"]])
        print(f"  {k:<24} {o:>9.3f} {n:>9.3f}" if k != "rows_moved" else f"  {k:<24} {o:>9,.0f} {n:>9,.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=fleet_world, default=12288, help="world size, a multiple of 64 (default 12288)")
    ap.add_argument("--steps", type=int, default=26, help="steps stored before the timed passes (default 26; "
                    "the window is 24)")
    ap.add_argument("--passes", type=int, default=6, help="timed passes of each kind, one new step before "
                    "each (default 6)")
    ap.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    ap.add_argument("--tp-ops", type=int, default=4, help="TP collectives per micro-batch (default 4, "
                    "fleet_scale's)")
    ap.add_argument("--store-dir", help="keep the store here and reuse it when it holds the same job "
                    "(default: a temp dir, removed)")
    ap.add_argument("--target", type=float, default=2.0, help="new pass p50 limit in s (default 2.0)")
    ap.add_argument("--profile", choices=("old", "new"), help="cProfile the last pass of this kind")
    ap.add_argument("--profile-hang", choices=("old", "new"), help="cProfile the last hang-only pass of this kind")
    ap.add_argument("--hang-repeat", type=int, default=1, help="hang-only passes of each kind after each new "
                    "step (default 1; more for a steadier hang-pass p50 at little cost)")
    ap.add_argument("--stall-check", action="store_true", help="also time the hang analysis of a stalled "
                    "job of this size (synthetic frames, old and new, same verdict required)")
    ap.add_argument("--json", metavar="FILE", help="write the per-pass phases as JSON")
    ap.add_argument("--_build", help=argparse.SUPPRESS)
    ap.add_argument("--_t0", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._build:
        return build(Path(args._build), args, want_meta(args))

    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.diagnosis.engine import JobInfo
    from fleetscope.server.diagnosis.loop import config_from_settings
    from fleetscope.server.settings import Settings
    from fleetscope.server.store import Store

    topo = topology(args.world)
    print(f"full_pass: {topo.world_size:,} ranks ({topo.dp} x {topo.tp} x {topo.pp}), "
          f"{-(-topo.world_size // 8):,} hosts, {args.microbatches} micro-batches, K={args.tp_ops}; "
          f"load average {os.getloadavg()}", flush=True)
    stall_ok = True
    if args.stall_check:
        stall_ok, so, sn, sv = stalled_analysis(topo)
        print(f"  stalled hang analysis (one rank stuck, {topo.world_size:,} ranks, synthetic frames): "
              f"old {so:.3f} s, new {sn:.3f} s, ratio new/old {sn / so:.3f}; verdict {sv}; same {stall_ok}",
              flush=True)
    tmp = Path(args.store_dir) if args.store_dir else Path(tempfile.mkdtemp(prefix="fs-fullpass-"))
    want = want_meta(args)
    meta_path = tmp / META
    reuse = meta_path.exists() and {k: v for k, v in json.loads(meta_path.read_text()).items() if k in want} == want
    tmp.mkdir(parents=True, exist_ok=True)
    base, run = tmp / "base", tmp / "run"
    t0 = time.time_ns() - int((args.steps + args.passes + 2) * 2.2e9)
    if not reuse:  # the pristine store (steps 0 .. --steps - 1), copied for each run
        shutil.rmtree(base, ignore_errors=True)
        # its own process: chdb opens one store directory per process
        rc = subprocess.call([sys.executable, __file__, "--_build", str(base), "--world", str(args.world),
                              "--steps", str(args.steps), "--microbatches", str(args.microbatches),
                              "--tp-ops", str(args.tp_ops), "--_t0", str(t0)])
        if rc:
            return rc
        meta_path.write_text((base.parent / (META + ".new")).read_text())
    meta = json.loads(meta_path.read_text())
    print(f"store: {meta['rows']:,} rows of {args.steps} steps ({'reused' if reuse else 'built'}, {base})", flush=True)
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(base, run, symlinks=True)
    store = Store.open(f"chdb://{run}", ttl_days=0)
    try:
        b = Builder(_NoInsert(), args.world, args.microbatches, args.tp_ops, meta["t0_ns"])
        for _ in range(args.steps):  # the generator to the same point, without inserting
            b.add()
        b.store, b.rows = store, meta["rows"]
        settings = Settings()
        config = config_from_settings(settings)
        info = JobInfo(job=JOB, topology=topo, num_microbatches=args.microbatches, model_flops_per_step=1e15,
                       device_peak_flops=989e12, start_ns=b.t0_ns)
        ts = TimedStore(store)
        caches = {"old": rollups.StepCache(), "new": rollups.StepCache()}
        now = b.now_ns()
        # warm: both caches hold the window (the loop's steady state); one cold pass, its cache copied
        t = time.perf_counter()
        one_pass(ts, info, now, caches["old"], config, False)
        caches["new"]._jobs = copy.deepcopy(caches["old"]._jobs)  # (the cache object holds a lock)
        print(f"  warm-up pass (old, cold cache, {args.steps} steps reduced): {time.perf_counter() - t:.2f} s",
              flush=True)
        per: dict[str, list[dict]] = {"old": [], "new": []}
        hang_per: dict[str, list[dict]] = {"old": [], "new": []}
        profiles: dict[str, Any] = {}
        same = True
        for i in range(args.passes):
            ins = b.add()
            now = b.now_ns()
            got = {}
            for kind in (("old", "new") if i % 2 == 0 else ("new", "old")):
                prof = cProfile.Profile() if args.profile == kind and i == args.passes - 1 else None
                if prof:
                    prof.enable()
                res, ph = one_pass(ts, info, now, caches[kind], config, kind == "new")
                if prof:
                    prof.disable()
                    print(f"--- cProfile of the last {kind} pass (cumulative, top 40)")
                    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
                per[kind].append(ph)
                got[kind] = verdict(res)
            for j in range(args.hang_repeat):  # the hang-only pass, old and new alternating
                for kind in (("old", "new") if (i + j) % 2 == 0 else ("new", "old")):
                    last = i == args.passes - 1 and j == args.hang_repeat - 1
                    prof = cProfile.Profile() if args.profile_hang == kind and last else None
                    if prof:
                        prof.enable()
                    h, hph = hang_pass(ts, info, now, caches[kind], config, kind == "new")
                    if prof:
                        prof.disable()
                        profiles[kind] = prof
                    hang_per[kind].append(hph)
                    per[kind][-1]["hang_pass"] = hph["total"]
                    hv = (h.stalled, tuple(h.culprits), h.hang_class, h.group_id)
                    if j == 0:
                        got[kind] = (*got[kind], hv)
                    elif hv != got[kind][-1]:
                        got[kind] = (*got[kind], hv)  # a later repeat disagreed: not the same
            ok = got["old"] == got["new"]
            same &= ok
            print(f"  pass {i + 1}/{args.passes} after step {b.step - 1} ({ins:.1f} s insert): "
                  f"old {per['old'][-1]['total']:.2f} s, new {per['new'][-1]['total']:.2f} s, "
                  f"same verdict {ok}; findings {len(got['new'][0])}", flush=True)
        print_phases("seconds per phase (median over passes; q: = one named store query):", per)
        print_phases("hang-only pass, seconds per phase (median over its passes):", hang_per)
        for kind, prof in profiles.items():
            print(f"--- cProfile of the last {kind} hang-only pass (cumulative, top 40)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
            print("--- the same, by own time (top 25)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        po = float(np.median([p["total"] for p in per["old"]]))
        pn = float(np.median([p["total"] for p in per["new"]]))
        mo = max(p["total"] for p in per["old"])
        mn = max(p["total"] for p in per["new"])
        print(f"\nfull pass at {topo.world_size:,} ranks, {args.passes} passes each:")
        print(f"  old p50 {po:.2f} s, max {mo:.2f} s")
        print(f"  new p50 {pn:.2f} s, max {mn:.2f} s   ratio new/old p50 {pn / po:.2f}")
        ho = float(np.median([p["total"] for p in hang_per["old"]]))
        hn = float(np.median([p["total"] for p in hang_per["new"]]))
        print(f"  hang pass ({len(hang_per['new'])} each): old p50 {ho:.3f} s, max "
              f"{max(p['total'] for p in hang_per['old']):.3f} s; new p50 {hn:.3f} s, max "
              f"{max(p['total'] for p in hang_per['new']):.3f} s   ratio new/old p50 {hn / ho:.2f}"
              f" ({'PASS' if hn <= 0.5 else 'FAIL'} <= 0.5 s)")
        print(f"  same findings and hang verdict on every pass: {same}")
        ok = pn <= args.target and same and stall_ok
        print(f"  {'PASS' if pn <= args.target else 'FAIL'}  new full pass p50 <= {args.target} s")
        print(f"load average at the end: {os.getloadavg()}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"full": per, "hang": hang_per}, indent=1))
        return 0 if ok else 1
    finally:
        store.close()
        shutil.rmtree(run, ignore_errors=True)
        if not args.store_dir:
            shutil.rmtree(tmp, ignore_errors=True)


class _NoInsert:
    def insert_arrow(self, *a: Any, **k: Any) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())
