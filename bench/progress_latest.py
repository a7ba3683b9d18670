"""Each rank's newest work per group: the raw rows against ``progress_latest``.

The hang pass reads, per rank and process group, the highest completed sequence number
and the newest completion, and per rank its newest section end, over the job's last
three steps. Before schema version 6 that was ``loader.RECENT_WORK``: every collective
and section row of those steps (about 100 k rows a step at 12,288 ranks with K = 4 TP
ops per micro-batch). Schema version 6 keeps one state per (rank, group) at insert
time (``progress_latest``, an ``AggregatingMergeTree`` fed by two materialized views),
and the pass reads ``PROGRESS_NEWEST``.

This bench plays a simulated DP x PP 8 x TP 8 job step by step (the fleet simulator's
step model and row builder, as ``bench/full_pass.py``) into two embedded stores in one
chDB engine: one at schema version 5 (no views of version 6) and one at the newest
version, inserting each step into both in alternating order (so the extra insert cost of
the two views is measured side by side). After every ``--every`` steps it times the
two queries alternately (``--repeat`` runs each), checks that the hang pass gets the
same progress, last-seen times and quiet time from both (``loader._recent``), and
prints p50 seconds, the ratio, the state rows kept and the insert seconds per step of
each store. Exit 1 if the answers differ or the new query's time at the last mark is
over twice the first mark's plus 20 ms.

    .venv/bin/python bench/progress_latest.py                          # 12,288 ranks, 12 steps
    .venv/bin/python bench/progress_latest.py --world 1024 --steps 6 --every 2   # quick
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import fleet_world  # noqa: E402  (a sibling: bench/ is on sys.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=fleet_world, default=12288, help="ranks, a multiple of 64 (default 12288)")
    ap.add_argument("--steps", type=int, default=12, help="steps played (default 12)")
    ap.add_argument("--every", type=int, default=4, help="time the queries after every this many steps (default 4)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each query per mark (default 5)")
    ap.add_argument("--tp-ops", type=int, default=4, help="TP collectives per micro-batch (default 4)")
    ap.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    args = ap.parse_args(argv)
    if min(args.steps, args.every, args.repeat, args.tp_ops, args.microbatches) < 1:
        ap.error("--steps, --every, --repeat, --tp-ops and --microbatches must be positive")

    import clickhouse_connect
    from fleetscope.server.diagnosis import loader
    from fleetscope.server.store import Store, StoreURL
    from fleetscope.server.store import migrations as mig
    from full_pass import JOB, Builder  # the simulated job, step by step

    tmp = Path(tempfile.mkdtemp(prefix="fs-progress-"))
    new = Store.open(f"chdb://{tmp}", ttl_days=0)
    new.command("CREATE DATABASE IF NOT EXISTS `v5_store`")
    old = Store(StoreURL("chdb", path=str(tmp)),
                clickhouse_connect.get_client(dsn=f"chdb://{tmp}", database="v5_store"))
    every = mig.MIGRATIONS
    mig.MIGRATIONS = tuple(m for m in every if m.version <= 5)
    try:
        mig.migrate(old.client, 0)
    finally:
        mig.MIGRATIONS = every
    t0 = time.time_ns() - (args.steps + 2) * 2 * 10**9
    builder = Builder(new, args.world, args.microbatches, args.tp_ops, t0)
    print(f"progress_latest: {args.world:,} ranks (DP {args.world // 64} x PP 8 x TP 8), {args.microbatches} "
          f"micro-batches, K = {args.tp_ops} TP ops; load average {os.getloadavg()}", flush=True)
    print(f"  {'steps':>5} {'raw coll+sec':>13} {'raw p50':>9} {'new p50':>9} {'new/raw':>8} {'kept rows':>10}"
          f" {'insert v5':>10} {'insert v6':>10} {'v6/v5':>6}")
    news: list[float] = []
    ins: dict[str, list[float]] = {"v5": [], "v6": []}
    same = True
    try:
        for step in range(args.steps):
            o = builder.model.play(builder.step, builder.clock)
            builder.fleet.add_step(o)
            builder.clock = o.end
            data = builder.fleet.take(float(builder.clock.max()))
            builder.step += 1
            order = (("v5", old), ("v6", new)) if step % 2 == 0 else (("v6", new), ("v5", old))
            for name, store in order:
                a = time.perf_counter()
                for table_name, (table, _) in data.items():
                    store.insert_arrow(table_name, table)
                ins[name].append(time.perf_counter() - a)
            if (step + 1) % args.every and step + 1 != args.steps:
                continue
            last = new.query_rows(loader.LAST_STEP, {"job": JOB, "attempt": 0})[0]["last_step"]
            p = {"job": JOB, "attempt": 0, "from_step": max(int(last) - 2, 0),
                 "since_ns": builder.now_ns() - 600 * 10**9}
            inflight = loader._df(new, loader.INFLIGHT_NEWEST, p)
            times: dict[str, list[float]] = {"raw": [], "new": []}
            got: dict[str, tuple] = {}
            for i in range(args.repeat):
                for kind in (("raw", "new") if i % 2 == 0 else ("new", "raw")):
                    q = loader.RECENT_WORK if kind == "raw" else loader.PROGRESS_NEWEST
                    a = time.perf_counter()
                    got[kind] = loader._recent(new, p, inflight, q)
                    times[kind].append(time.perf_counter() - a)
            key = ["rank", "group_id"]
            a_, b_ = (got[k][0].sort_values(key).reset_index(drop=True) for k in ("raw", "new"))
            ok = len(a_) > 0 and a_.astype(str).equals(b_[list(a_.columns)].astype(str)) \
                and got["raw"][1:] == got["new"][1:]
            same &= ok
            raw = sum(new.query_rows(f"SELECT count() AS n FROM {t} WHERE job = {{job:String}}", {"job": JOB})[0]["n"]
                      for t in ("collectives", "sections"))
            kept = new.query_rows("SELECT count() AS n FROM progress_latest")[0]["n"]
            rp, nps = float(np.median(times["raw"])), float(np.median(times["new"]))
            news.append(nps)
            i5, i6 = float(np.median(ins["v5"])), float(np.median(ins["v6"]))
            print(f"  {step + 1:>5} {raw:>13,} {rp:>7.3f} s {nps:>7.3f} s {nps / rp:>8.3f} {kept:>10,}"
                  f" {i5:>8.2f} s {i6:>8.2f} s {i6 / i5:>6.2f}{'' if ok else '  DIFFERENT ANSWERS'}", flush=True)
    finally:
        old.close()
        new.close()
        shutil.rmtree(tmp, ignore_errors=True)
    i5, i6 = float(np.median(ins["v5"])), float(np.median(ins["v6"]))
    print(f"insert per step (median of {len(ins['v5'])}): v5 {i5:.2f} s, v6 {i6:.2f} s, ratio {i6 / i5:.3f}; "
          f"load average {os.getloadavg()}")
    flat = news[-1] <= 2 * news[0] + 0.02
    print(f"same answers: {'yes' if same else 'NO'}; new query {news[0]:.3f} s at the first mark, "
          f"{news[-1]:.3f} s at the last: {'flat' if flat else 'GROWS'}")
    return 0 if same and flat else 1


if __name__ == "__main__":
    sys.exit(main())
