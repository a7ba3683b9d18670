"""Each rank's newest in-flight row as a job ages: the raw table against ``inflight_latest``.

The hang pass (and the job page) read every rank's newest in-flight record. Ranks write
one every 0.5 s, and the raw ``inflight`` table is keyed by (job, rank, ts_ns), so a query
over it reads every in-flight row of the job's day: its cost grows with the job's age.
Schema version 3 keeps the newest row per rank at insert time (``inflight_latest``, an
``AggregatingMergeTree`` fed by a materialized view).

This bench writes ``--minutes`` of in-flight rows for ``--world`` ranks (2 rows a second
per rank, in 1-second insert blocks of all ranks, as agents ship them) into an embedded
store, and after each ``--every`` minutes of rows times, alternately, the baseline (the
query the hang pass ran before: ``(rank, max ts)`` over the raw rows of the 10-minute
lookback, then those rows) and ``loader.INFLIGHT_NEWEST``. It checks both give the same
rows and prints the raw rows stored, p50 seconds of each query, the ratio and the rows
``inflight_latest`` holds (one per rank per part not yet merged). Exit 1 if they
differ or the new query's time at the last age is over twice the first's plus 20 ms.

    .venv/bin/python bench/inflight_latest.py                      # 12,288 ranks, 0-20 min
    .venv/bin/python bench/inflight_latest.py --world 1024 --minutes 4 --every 1   # quick
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
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASELINE = """
SELECT rank, ts_ns AS last_ts, step AS cur_step, kind AS cur_kind, op AS cur_op, group_id AS cur_group_id,
       axis AS cur_axis, seq AS cur_seq, peer AS cur_peer, since_ns AS cur_since_ns
FROM inflight
WHERE job = {job:String} AND attempt = {attempt:Int32} AND ts_ns >= {since_ns:Int64}
  AND (rank, ts_ns) IN (SELECT rank, max(ts_ns) FROM inflight
                        WHERE job = {job:String} AND attempt = {attempt:Int32} AND ts_ns >= {since_ns:Int64}
                        GROUP BY rank)
LIMIT 1 BY rank
"""
"""The hang pass's in-flight query before schema version 3 (``INFLIGHT_LATEST_IN``)."""


def block(world: int, ts_ns: int, second: int) -> pa.Table:
    """One second of in-flight rows of every rank (two samples each)."""
    from fleetscope.server.store.ddl import BATCH_COLUMN

    from fleetscope.schema import RECORD_TYPES

    ranks = np.repeat(np.arange(world, dtype=np.int32), 2)
    ts = ts_ns + np.tile(np.array([0, 500_000_000], dtype=np.int64), world) + ranks.astype(np.int64)
    n = len(ranks)
    cols = {"job": pa.array(["bench"] * n), "attempt": pa.array(np.zeros(n, np.int32)), "rank": pa.array(ranks),
            "host": pa.array([f"h{r // 8}" for r in ranks]), "ts_ns": pa.array(ts),
            "step": pa.array(np.full(n, second // 2, np.int64)), "kind": pa.array(["collective"] * n),
            "op": pa.array(["all_reduce"] * n), "group_id": pa.array([f"tp.g{r // 8}" for r in ranks]),
            "axis": pa.array(["tp"] * n), "seq": pa.array(np.full(n, second, np.int64) * 2 + np.tile([0, 1], world)),
            "peer": pa.array(np.full(n, -1, np.int32)), "since_ns": pa.array(ts - 1000)}
    rt = RECORD_TYPES["inflight"]
    t = pa.table({c.name: cols[c.name] for c in rt.columns})
    return t.append_column(BATCH_COLUMN, pa.array([f"b{second}"] * n, pa.string()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=12288, help="ranks (default 12288)")
    ap.add_argument("--minutes", type=float, default=20.0, help="minutes of in-flight rows written (default 20)")
    ap.add_argument("--every", type=float, default=5.0, help="time the queries after every this many minutes (default 5)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each query per age (default 5)")
    args = ap.parse_args(argv)
    if args.world < 1 or args.minutes <= 0 or args.every <= 0 or args.repeat < 1:
        ap.error("--world, --minutes, --every and --repeat must be positive")

    from fleetscope.server.diagnosis import loader
    from fleetscope.server.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="fs-inflight-"))
    store = Store.open(f"chdb://{tmp}", ttl_days=0)
    seconds = int(args.minutes * 60)
    t0 = time.time_ns() - seconds * 10**9
    print(f"inflight_latest: {args.world:,} ranks, {args.minutes:g} min of rows (2 per rank per second); "
          f"load average {os.getloadavg()}", flush=True)
    print(f"  {'age':>7} {'raw rows':>12} {'baseline p50':>13} {'new p50':>9} {'new/base':>9} {'kept rows':>10}")
    marks = sorted({int(m * 60) for m in np.arange(args.every, args.minutes + 1e-9, args.every)} | {60})
    news: list[float] = []
    same = True
    try:
        for s in range(seconds):
            store.insert_arrow("inflight", block(args.world, t0 + s * 10**9, s))
            if s + 1 not in marks:
                continue
            now = t0 + (s + 1) * 10**9
            p = {"job": "bench", "attempt": 0, "since_ns": now - 600 * 10**9}
            tb, tn = [], []
            for i in range(args.repeat):
                for kind in (("b", "n") if i % 2 == 0 else ("n", "b")):
                    a = time.perf_counter()
                    df = store.query_df(BASELINE if kind == "b" else loader.INFLIGHT_NEWEST, p)
                    (tb if kind == "b" else tn).append(time.perf_counter() - a)
                    if kind == "b":
                        base_df = df
                    else:
                        new_df = df
            a = base_df.sort_values("rank").reset_index(drop=True)
            b = new_df.sort_values("rank").reset_index(drop=True)[list(a.columns)]
            ok = len(a) == args.world and a.astype(str).equals(b.astype(str))
            same &= ok
            raw = store.query_rows("SELECT count() AS n FROM inflight")[0]["n"]
            kept = store.query_rows("SELECT count() AS n FROM inflight_latest")[0]["n"]
            bp, nps = float(np.median(tb)), float(np.median(tn))
            news.append(nps)
            print(f"  {(s + 1) / 60:>5.1f} m {raw:>12,} {bp:>11.3f} s {nps:>7.3f} s {nps / bp:>9.3f} {kept:>10,}"
                  f"{'' if ok else '  DIFFERENT ROWS'}", flush=True)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    grows = len(news) > 1 and news[-1] > 2 * news[0] + 0.02  # (20 ms: below it, noise)
    print(f"same rows at every age: {same}; new query {'GROWS' if grows else 'flat'} with age "
          f"({news[0]:.3f} -> {news[-1]:.3f} s); load average at the end {os.getloadavg()}")
    return 0 if same and not grows else 1


if __name__ == "__main__":
    sys.exit(main())
