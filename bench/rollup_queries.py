"""The full pass's op-gap and mismatch queries against their previous forms, at 12,288
ranks (DP 192 x PP 8 x TP 8), on one store.

* ``rollups.STEP_GAPS_SQL`` - the longest job-wide gap between consecutive completions
  per step. The previous form ran a window (``lagInFrame`` over all completions of the
  range in time order); the current one aggregates them into 1 ms buckets (min, max and
  the first completion's step) and takes the gaps between buckets: exact from 1 ms up.
  "same" compares at that resolution.
* ``rollups.MISMATCH_SQL`` - the (group, seq) whose members disagree on op, size or
  dtype. The previous form counted distinct values exactly (``uniqExact``, a hash set per
  group); the current one compares min and max, which says the same.

The store holds ``--steps`` steps of the fleet simulator's job (``bench/full_pass.py``'s
builder). For each of the last ``--marks`` steps, as a steady-state pass asks them (the
gaps of the newest two steps with the one before as context, the mismatch check of the
last three), both forms run ``--repeat`` times, interleaved; prints the p50 of each, the
ratio, and whether both returned the same rows (exit 1 if not).

    .venv/bin/python bench/rollup_queries.py                  # 12,288 ranks, 6 steps, 3 marks
    .venv/bin/python bench/rollup_queries.py --world 1024     # quick
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

PREVIOUS_STEP_GAPS_SQL = """
SELECT step, max(gap) / 1e9 AS gap_s FROM (
  SELECT step, t - lagInFrame(t, 1, t) OVER (ORDER BY t ASC
                                             ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS gap
  FROM (
    SELECT step, completed_ns AS t FROM collectives
    WHERE job = {job:String} AND attempt = {attempt:Int32}
      AND step >= {ctx_step:Int64} AND step <= {to_step:Int64} AND state = 'completed'
    UNION ALL
    SELECT step, end_ns AS t FROM sections
    WHERE job = {job:String} AND attempt = {attempt:Int32}
      AND step >= {ctx_step:Int64} AND step <= {to_step:Int64}
  ) WHERE t > 0 AND step > {first_step:Int64}
)
WHERE step >= {from_step:Int64}
GROUP BY step
"""

_MINMAX = "HAVING min(op) != max(op) OR min(bytes) != max(bytes) OR min(dtype) != max(dtype)"
_DISTINCT = "HAVING uniqExact(op) > 1 OR uniqExact(bytes) > 1 OR uniqExact(dtype) > 1"


def previous_mismatch_sql() -> str:
    """:data:`rollups.MISMATCH_SQL` with its previous HAVING clause."""
    from fleetscope.server.diagnosis import rollups

    if _MINMAX not in rollups.MISMATCH_SQL:
        raise SystemExit("rollups.MISMATCH_SQL changed: update bench/rollup_queries.py")
    return rollups.MISMATCH_SQL.replace(_MINMAX, _DISTINCT)


def _canon(df):
    if df.empty:
        return df
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def _same(name: str, prev, cur, bucket_s: float) -> bool:
    a, b = _canon(prev), _canon(cur)
    if name != "gaps":
        return a.equals(b)
    if a["step"].tolist() != b["step"].tolist():
        return False
    return all(abs(x - y) < 1e-12 if x >= bucket_s else x - bucket_s < y <= x + 1e-12
               for x, y in zip(a["gap_s"], b["gap_s"]))


def main(argv: list[str] | None = None) -> int:
    # a sibling: bench/ is on sys.path when run as a script
    from _cli import add_sim_store_args, check_sim_store_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sim_store_args(ap, steps=6, marks_help="newest steps each query is asked about")
    args = ap.parse_args(argv)
    check_sim_store_args(ap, args, spare_steps=3)  # each mark reads the two steps before it

    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.store import Store
    from full_pass import JOB, Builder  # the simulated job, step by step

    forms = {"gaps": (PREVIOUS_STEP_GAPS_SQL, rollups.STEP_GAPS_SQL),
             "mismatch": (previous_mismatch_sql(), rollups.MISMATCH_SQL)}
    tmp = Path(tempfile.mkdtemp(prefix="fs-rollup-queries-"))
    store = Store.open(f"chdb://{tmp}", ttl_days=0)
    print(f"rollup_queries: {args.world:,} ranks (DP {args.world // 64} x PP 8 x TP 8), {args.microbatches} "
          f"micro-batches, K = {args.tp_ops}; load average {os.getloadavg()}", flush=True)
    ratios: dict[str, list[float]] = {k: [] for k in forms}
    same = True
    try:
        b = Builder(store, args.world, args.microbatches, args.tp_ops,
                    time.time_ns() - (args.steps + 2) * 2 * 10**9)
        b.fill(args.steps)
        print(f"  {'query':<9} {'step':>5} {'previous p50':>13} {'current p50':>12} {'cur/prev':>9}  same")
        last = args.steps - 1  # the step in progress
        for step in range(last - args.marks + 1, last + 1):
            # a steady-state pass: the gaps of the two newest steps (the one before as
            # context), the mismatch check of the three newest (see rollups.refresh)
            params = {"gaps": {"job": JOB, "attempt": 0, "from_step": step - 1, "to_step": step,
                               "ctx_step": step - 2, "first_step": 0},
                      "mismatch": {"job": JOB, "attempt": 0, "from_step": step - 2, "to_step": step}}
            for name, (prev, cur) in forms.items():
                times: dict[str, list[float]] = {"prev": [], "cur": []}
                got = {}
                for i in range(args.repeat):
                    for kind in (("prev", "cur") if i % 2 == 0 else ("cur", "prev")):
                        a = time.perf_counter()
                        got[kind] = store.query_df(prev if kind == "prev" else cur, params[name])
                        times[kind].append(time.perf_counter() - a)
                ok = _same(name, got["prev"], got["cur"], rollups.GAP_BUCKET_NS / 1e9)
                same &= ok
                tp, tc = float(np.median(times["prev"])), float(np.median(times["cur"]))
                ratios[name].append(tc / tp)
                print(f"  {name:<9} {step:>5} {tp:>11.3f} s {tc:>10.3f} s {tc / tp:>9.3f}  {'yes' if ok else 'NO'}",
                      flush=True)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    for name, r in ratios.items():
        print(f"{name}: median ratio current/previous {float(np.median(r)):.3f}")
    print(f"same rows: {'yes' if same else 'NO'}; load average {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
