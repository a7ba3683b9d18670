"""The full pass's per-step reduction (``rollups.RANK_GROUP_STEP_SQL``) against its previous
form, at 12,288 ranks (DP 192 x PP 8 x TP 8), on one store.

The exclusive communication of each op (the part of it that the rank's earlier ops do not
already cover) takes a window over each rank's ops in start order. The previous form ran
that window over every column of every op (``SELECT *, ... OVER (PARTITION BY rank ...)``
on the arrivals, strings included), so ClickHouse sorted all of them; the current one runs
it over (rank, step, start, end) only, and the rank sums and the sections' nested
communication read that narrow result. Everything else is the same query.

The store holds ``--steps`` steps of the fleet simulator's job (``bench/full_pass.py``'s
builder). For each of the last ``--marks`` complete steps both queries run
``--repeat`` times, interleaved, on the same store; prints per step the p50 of each and the
ratio, and checks that both return the same rows (exit 1 if not).

    .venv/bin/python bench/rank_step_sql.py                  # 12,288 ranks, 6 steps, 3 marks
    .venv/bin/python bench/rank_step_sql.py --world 1024 --repeat 3   # quick
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
from _shared import interleaved  # noqa: E402

PREVIOUS_ARR = """arr0 AS (
  SELECT rank, step, group_id, axis, seq, op, bytes, enqueued_ns, comm_ns, wait_ns, lateness_ns,
         is_last, transfer_ns, waited_on_rank FROM coll
  UNION ALL
  SELECT rank, step, group_id, axis, seq, op, bytes, enqueued_ns, comm_ns, wait_ns, lateness_ns,
         is_last, transfer_ns, waited_on_rank FROM p2p
),
arr AS MATERIALIZED (
  SELECT *, greatest(enqueued_ns + comm_ns, enqueued_ns) AS end_,
         max(end_) OVER (PARTITION BY rank ORDER BY enqueued_ns
                         ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS covered,
         greatest(end_ - greatest(enqueued_ns, covered), 0) AS excl_ns
  FROM arr0
)"""


def previous_sql(sql: str, arrivals: str) -> str:
    """``sql`` (the current reduction) as it was before the narrow window."""
    cut = arrivals.index("arr AS MATERIALIZED (")
    edits = [
        (arrivals, arrivals[:cut] + PREVIOUS_ARR),
        ("  FROM ex AS o\n", "  FROM (SELECT rank, enqueued_ns, excl_ns FROM arr) AS o\n"),
        ("  SELECT rank, step, sum(wait_ns) AS wait_ns,", "  SELECT rank, step, sum(excl_ns) AS comm_ns, sum(wait_ns) AS wait_ns,"),
        ("rc AS (SELECT rank, step, sum(excl_ns) AS comm_ns FROM ex GROUP BY rank, step),\n", ""),
        ("rc.comm_ns AS comm_ns", "ra.comm_ns AS comm_ns"),
        ("LEFT JOIN rc ON st.rank = rc.rank AND st.step = rc.step\n", ""),
    ]
    for old, new in edits:
        if sql.count(old) != 1:
            raise SystemExit(f"rank_step_sql: the reduction changed; {old[:60]!r} is not in it once "
                             "(update this bench's previous form)")
        sql = sql.replace(old, new)
    return sql


def _canon(df):
    """Rows in a fixed order, array cells as tuples (comparable)."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = df[c].map(lambda v: tuple(np.asarray(v).tolist()) if not isinstance(v, str) else v)
    return df.sort_values(["part", "rank", "step", "group_id", "axis"]).reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sim_store_args(ap, steps=6, marks_help="complete steps reduced, the newest ones")
    args = ap.parse_args(argv)
    check_sim_store_args(ap, args, spare_steps=2)  # the newest step stored is incomplete

    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.store import Store
    from full_pass import JOB, Builder  # the simulated job, step by step

    cur = rollups.RANK_GROUP_STEP_SQL
    prev = previous_sql(cur, rollups._ARRIVALS)
    tmp = Path(tempfile.mkdtemp(prefix="fs-rank-step-sql-"))
    store = Store.open(f"chdb://{tmp}", ttl_days=0)
    print(f"rank_step_sql: {args.world:,} ranks (DP {args.world // 64} x PP 8 x TP 8), {args.microbatches} "
          f"micro-batches, K = {args.tp_ops}; load average {os.getloadavg()}", flush=True)
    try:
        b = Builder(store, args.world, args.microbatches, args.tp_ops,
                    time.time_ns() - (args.steps + 2) * 2 * 10**9)
        b.fill(args.steps)
        print(f"  {'step':>5} {'raw rows':>10} {'previous p50':>13} {'current p50':>12} {'cur/prev':>9}  same")
        ratios, same = [], True
        last = args.steps - 2  # the newest complete step (the last one stored is in progress)
        for step in range(last - args.marks + 1, last + 1):
            p = {"job": JOB, "attempt": 0, "from_step": step, "to_step": step, "num_mb": args.microbatches}
            raw = sum(store.query_rows(f"SELECT count() AS n FROM {t} WHERE job = {{job:String}} "
                                       "AND step = {s:Int64}", {"job": JOB, "s": step})[0]["n"]
                      for t in ("collectives", "sections"))
            times, got = interleaved({"prev": lambda p=p: store.query_df(prev, p),
                                      "cur": lambda p=p: store.query_df(cur, p)}, args.repeat)
            ok = len(got["cur"]) > 0 and _canon(got["prev"]).equals(_canon(got["cur"]))
            same &= ok
            tp, tc = float(np.median(times["prev"])), float(np.median(times["cur"]))
            ratios.append(tc / tp)
            print(f"  {step:>5} {raw:>10,} {tp:>11.3f} s {tc:>10.3f} s {tc / tp:>9.3f}  {'yes' if ok else 'NO'}",
                  flush=True)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"median ratio current/previous {float(np.median(ratios)):.3f}; same rows: {'yes' if same else 'NO'}; "
          f"load average {os.getloadavg()}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
