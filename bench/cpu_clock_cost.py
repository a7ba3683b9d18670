"""What the sections' CPU clock (``sections.cpu_ns``, store schema 7) costs a pass at
12,288 ranks (DP 192 x PP 8 x TP 8), before and after, on one store.

Two parts, each interleaved on the same data:

* **reduction** - ``rollups.RANK_GROUP_STEP_SQL`` (the full pass's per-step reduction,
  which now also sums the compute sections' ``cpu_ns``) against the same query without
  the CPU column (the reduction before it), on ``--steps`` steps of the fleet
  simulator's job (``bench/full_pass.py``'s builder: GPU ranks, ``cpu_ns`` = -1). For
  each of the last ``--marks`` complete steps both run ``--repeat`` times; prints the p50
  of each and the ratio, and checks that both return the same rows apart from the new
  column (exit 1 if not).
* **detector** - ``stragglers.detect_stragglers`` on a 24-step reduced window of the same
  size: a GPU job (``compute_cpu_ns`` all 0: the stream is not run, as before the change;
  only the matrix is built and found empty) against a CPU-device job (the stream runs:
  one more component test per rank), ``--repeat`` times each, interleaved.

    .venv/bin/python bench/cpu_clock_cost.py                  # 12,288 ranks (~5 min on 2 cores)
    .venv/bin/python bench/cpu_clock_cost.py --world 1024     # quick
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import add_sim_store_args, check_sim_store_args  # noqa: E402  (a sibling: bench/ is on sys.path)
from _shared import breakdown_frame, interleaved  # noqa: E402

CPU_EDITS = (
    (", duration_ns, cpu_ns FROM sections", ", duration_ns FROM sections"),
    (", duration_ns, cpu_ns FROM s1", ", duration_ns FROM s1"),
    ("         sumIf(t.cpu_ns, t.kind = 'compute' AND t.cpu_ns >= 0) AS compute_cpu_ns,\n", ""),
    (" sec.compute_cpu_ns AS compute_cpu_ns,", ""),
    ("         sumIf(t.cpu_ns, t.kind = 'optimizer' AND t.cpu_ns >= 0) AS optimizer_cpu_ns,\n", ""),
    ("\n       sec.optimizer_cpu_ns AS optimizer_cpu_ns,", ""),
)
CPU_COLS = ("compute_cpu_ns", "optimizer_cpu_ns")
"""The sections' CPU-clock columns of the reduction (compute since store schema 7, the
optimizer's since 2026-12-07)."""


def previous_sql() -> str:
    """``rollups.RANK_GROUP_STEP_SQL`` as it was before the CPU column."""
    from fleetscope.server.diagnosis import rollups

    sql = rollups.RANK_STEP_SQL
    for old, new in CPU_EDITS:
        if sql.count(old) != 1:
            raise SystemExit(f"cpu_clock_cost: the reduction changed; {old.strip()[:60]!r} is not in it once "
                             "(update this bench's previous form)")
        sql = sql.replace(old, new)
    saved = rollups.RANK_STEP_SQL, rollups._RS_COLS
    try:
        rollups.RANK_STEP_SQL = sql
        rollups._RS_COLS = tuple(c for c in saved[1] if c not in CPU_COLS)
        return rollups._rank_group_sql()
    finally:
        rollups.RANK_STEP_SQL, rollups._RS_COLS = saved


def _canon(df):
    df = df.drop(columns=[c for c in CPU_COLS if c in df.columns]).copy()
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = df[c].map(lambda v: tuple(np.asarray(v).tolist()) if not isinstance(v, str) else v)
    return df.sort_values(["part", "rank", "step", "group_id", "axis"]).reset_index(drop=True)


def reduction(args: argparse.Namespace) -> tuple[list[float], bool]:
    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.store import Store
    from full_pass import JOB, Builder  # the simulated job, step by step

    cur, prev = rollups.RANK_GROUP_STEP_SQL, previous_sql()
    tmp = Path(tempfile.mkdtemp(prefix="fs-cpu-clock-"))
    store = Store.open(f"chdb://{tmp}", ttl_days=0)
    ratios, same = [], True
    try:
        b = Builder(store, args.world, args.microbatches, args.tp_ops, time.time_ns() - (args.steps + 2) * 2 * 10**9)
        b.fill(args.steps)
        print(f"reduction (RANK_GROUP_STEP_SQL), {args.world:,} ranks:")
        print(f"  {'step':>5} {'before p50':>11} {'with cpu p50':>13} {'ratio':>7}  same rows")
        last = args.steps - 2  # the newest complete step (the last one stored is in progress)
        for step in range(last - args.marks + 1, last + 1):
            p = {"job": JOB, "attempt": 0, "from_step": step, "to_step": step, "num_mb": args.microbatches}
            times, got = interleaved({"prev": lambda p=p: store.query_df(prev, p),
                                      "cur": lambda p=p: store.query_df(cur, p)}, args.repeat)
            ok = len(got["cur"]) > 0 and _canon(got["prev"]).equals(_canon(got["cur"]))
            ok &= all(c in got["cur"] and bool((got["cur"][c] == 0).all()) for c in CPU_COLS)
            same &= ok
            tp, tc = float(np.median(times["prev"])), float(np.median(times["cur"]))
            ratios.append(tc / tp)
            print(f"  {step:>5} {tp:>9.3f} s {tc:>11.3f} s {tc / tp:>7.3f}  {'yes' if ok else 'NO'}", flush=True)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return ratios, same


def detector(args: argparse.Namespace) -> tuple[float, float]:
    import pandas as pd
    from fleetscope.server.diagnosis.stragglers import detect_stragglers

    from fleetscope.topology import Topology

    topo = Topology(dp=args.world // 64, tp=8, pp=8)
    n, steps = topo.world_size, 24
    rng = np.random.default_rng(0)
    comp = 30e6 * np.exp(0.3 * rng.standard_normal((n, steps)))
    cpu = 8e6 * np.exp(0.05 * rng.standard_normal((n, steps)))
    gpu = breakdown_frame(comp, rng)
    frames = {"gpu": gpu, "cpu": gpu.assign(compute_cpu_ns=cpu.ravel())}
    times, found = interleaved({k: lambda f=f: detect_stragglers("bench", topo, f, pd.DataFrame())
                                for k, f in frames.items()}, args.repeat)
    tg, tc = float(np.median(times["gpu"])), float(np.median(times["cpu"]))
    print(f"detector (detect_stragglers, {steps}-step window), {n:,} ranks: GPU job (no CPU stream) p50 {tg:.3f} s, "
          f"CPU-device job (one more stream) p50 {tc:.3f} s, ratio {tc / tg:.3f}; findings "
          f"{len(found['gpu'])} / {len(found['cpu'])} (clean frames: 0 expected)")
    return tg, tc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sim_store_args(ap, steps=6, marks_help="complete steps reduced, the newest ones")
    args = ap.parse_args(argv)
    check_sim_store_args(ap, args, spare_steps=2)
    print(f"cpu_clock_cost: {args.world:,} ranks; load average {os.getloadavg()}", flush=True)
    ratios, same = reduction(args)
    print(f"  median ratio with cpu / before {float(np.median(ratios)):.3f}; same rows: {'yes' if same else 'NO'}",
          flush=True)
    detector(args)
    print(f"load average at the end {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
