"""Each rank's heartbeat state as a job ages: the raw table against ``heartbeats_latest``.

The hang pass reads, per rank, its newest heartbeat (alive, pid, when it died, its newest
step, the agent's acknowledged prefix) and, per host, its newest heartbeat time. Agents
write one heartbeat row per rank and one per host every 2 s, so over the 10-minute
lookback the raw ``heartbeats`` table holds 4.1 M rows at 12,288 ranks. Schema version 5
keeps one state per rank process at insert time (``heartbeats_latest``, an
``AggregatingMergeTree`` fed by a materialized view).

This bench writes ``--minutes`` of heartbeats for ``--world`` ranks (8 per host, one
insert block of every row per beat, as agents ship them; one rank dies half way) into
an embedded store and after each ``--every`` minutes times, alternately, the baseline
(what the fast pass ran before: ``loader.HEARTBEATS_LATEST`` and :data:`HOSTS_LAST_IN`
over raw rows) and the new queries
(``HEARTBEATS_NEWEST`` + ``HOSTS_LAST_NEWEST``). It checks both give the same rows and
prints the raw rows stored, p50 seconds of each pair, the ratio and the state rows kept;
then the same for the job page's heartbeat query (``view_queries.LATEST_HEARTBEATS``
against :data:`PAGE_BEFORE`).
Exit 1 if they differ or the new pair's time at the last age is over twice the first's
plus 20 ms.

    .venv/bin/python bench/heartbeats_latest.py                     # 12,288 ranks, 0-15 min
    .venv/bin/python bench/heartbeats_latest.py --world 1024 --minutes 3 --every 1   # quick
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

BEAT_S = 2
HOSTS_LAST_IN = """
SELECT host, max(ts_ns) AS last_ns FROM heartbeats
WHERE ts_ns >= {since_ns:Int64} AND host IN {hosts:Array(String)}
GROUP BY host
"""
"""The fast pass's per-host query before schema version 5 (``loader.HOSTS_LAST`` with
``IN``, which uses the table's key; ``has()`` does not)."""
PAGE_BEFORE = """
SELECT rank, argMax(h.host, h.ts_ns) AS hb_host, max(h.ts_ns) AS hb_ts_ns, argMax(h.alive, h.ts_ns) AS hb_alive,
       argMax(h.last_step, h.ts_ns) AS hb_last_step, argMax(h.inflight_op, h.ts_ns) AS hb_inflight_op
FROM heartbeats AS h WHERE h.job = {job:String} AND h.rank >= 0
GROUP BY rank
"""
"""The job page's heartbeat query before schema version 5 (every heartbeat of the job,
no time bound)."""


def beat(world: int, ts_ns: int, n: int, dead_rank: int, dead_from: int) -> pa.Table:
    """One heartbeat of every host and rank (host rows first, as an agent writes them)."""
    from fleetscope.server.store.ddl import BATCH_COLUMN

    from fleetscope.schema import RECORD_TYPES

    hosts = world // 8
    rank = np.concatenate([np.full(hosts, -1), np.arange(world)]).astype(np.int32)
    host = np.concatenate([np.arange(hosts), np.arange(world) // 8])
    rows = len(rank)
    alive = np.ones(rows, np.uint8)
    if n >= dead_from:
        alive[hosts + dead_rank] = 0
    names = np.array([f"h{h:05d}" for h in range(hosts)], dtype=object)
    cols = {"ts_ns": np.full(rows, ts_ns, np.int64), "job": np.full(rows, "bench", dtype=object),
            "host": names[host], "rank": rank, "local_rank": np.where(rank >= 0, rank % 8, -1).astype(np.int32),
            "ip": np.full(rows, "", dtype=object), "node": np.full(rows, "", dtype=object),
            "agent_version": np.full(rows, "bench", dtype=object), "num_gpus": np.full(rows, 8, np.int32),
            "pid": np.where(rank >= 0, 1000 + rank, 0).astype(np.int32), "alive": alive,
            "last_record_ns": np.full(rows, ts_ns, np.int64), "last_step": np.full(rows, n // 2, np.int64),
            "inflight_op": np.full(rows, "", dtype=object),
            "acked_through_ns": np.where(rank >= 0, ts_ns - 10**9, -1).astype(np.int64)}
    rt = RECORD_TYPES["heartbeats"]
    schema = rt.arrow_schema()
    t = pa.Table.from_arrays([pa.array(cols[c.name]).cast(schema.field(c.name).type) for c in rt.columns],
                             schema=schema)
    return t.append_column(BATCH_COLUMN, pa.array([f"b{n}"] * rows, pa.string()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=12288, help="ranks, a multiple of 8 (default 12288)")
    ap.add_argument("--minutes", type=float, default=15.0, help="minutes of heartbeats written (default 15)")
    ap.add_argument("--every", type=float, default=5.0, help="time the queries after every this many minutes (default 5)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each pair per age (default 5)")
    args = ap.parse_args(argv)
    if args.world < 8 or args.world % 8 or args.minutes <= 0 or args.every <= 0 or args.repeat < 1:
        ap.error("--world must be a positive multiple of 8; --minutes, --every and --repeat positive")

    from fleetscope.server.diagnosis import loader
    from fleetscope.server.store import Store, view_queries

    tmp = Path(tempfile.mkdtemp(prefix="fs-heartbeats-"))
    store = Store.open(f"chdb://{tmp}", ttl_days=0)
    num = int(args.minutes * 60 / BEAT_S)
    t0 = time.time_ns() - num * BEAT_S * 10**9
    hosts = [f"h{h:05d}" for h in range(args.world // 8)]
    print(f"heartbeats_latest: {args.world:,} ranks, {len(hosts):,} hosts, {args.minutes:g} min of heartbeats "
          f"(one row per rank and host every {BEAT_S} s); load average {os.getloadavg()}", flush=True)
    print(f"  {'age':>7} {'raw rows':>12} {'baseline p50':>13} {'new p50':>9} {'new/base':>9} {'kept rows':>10}"
          f" {'page before':>12} {'page new':>9}")
    marks = sorted({int(m * 60 / BEAT_S) for m in np.arange(args.every, args.minutes + 1e-9, args.every)} | {30})
    base_q = (loader.HEARTBEATS_LATEST, HOSTS_LAST_IN)
    new_q = (loader.HEARTBEATS_NEWEST, loader.HOSTS_LAST_NEWEST)
    news: list[float] = []
    same = True
    try:
        for n in range(num):
            store.insert_arrow("heartbeats", beat(args.world, t0 + n * BEAT_S * 10**9, n, args.world // 2 + 3, num // 2))
            if n + 1 not in marks:
                continue
            now = t0 + n * BEAT_S * 10**9
            p = {"job": "bench", "hosts": hosts, "since_ns": now - 600 * 10**9}
            times: dict[str, list[float]] = {"b": [], "n": []}
            got: dict[str, tuple] = {}
            for i in range(args.repeat):
                for kind in (("b", "n") if i % 2 == 0 else ("n", "b")):
                    a = time.perf_counter()
                    hb_sql, host_sql = base_q if kind == "b" else new_q
                    df = loader._df(store, hb_sql, p, loader.HEARTBEAT_COLUMNS)
                    hl = store.query_rows(host_sql, p)
                    times[kind].append(time.perf_counter() - a)
                    got[kind] = (df, hl)
            page: dict[str, list[float]] = {"b": [], "n": []}
            for i in range(args.repeat):
                for kind in (("b", "n") if i % 2 == 0 else ("n", "b")):
                    a = time.perf_counter()
                    pdf = store.query_df(PAGE_BEFORE if kind == "b" else view_queries.LATEST_HEARTBEATS, p)
                    page[kind].append(time.perf_counter() - a)
                    got["p" + kind] = (pdf.sort_values("rank").reset_index(drop=True), None)
            a, b = (got[k][0].sort_values(["rank", "host"]).reset_index(drop=True) for k in ("b", "n"))
            ok = len(a) == args.world + len(hosts) and a.astype(str).equals(b[list(a.columns)].astype(str)) \
                and sorted(map(str, got["b"][1])) == sorted(map(str, got["n"][1])) \
                and got["pb"][0].astype(str).equals(got["pn"][0][list(got["pb"][0].columns)].astype(str))
            same &= ok
            raw = store.query_rows("SELECT count() AS n FROM heartbeats")[0]["n"]
            kept = store.query_rows("SELECT count() AS n FROM heartbeats_latest")[0]["n"]
            bp, nps = float(np.median(times["b"])), float(np.median(times["n"]))
            news.append(nps)
            print(f"  {(n + 1) * BEAT_S / 60:>5.1f} m {raw:>12,} {bp:>11.3f} s {nps:>7.3f} s {nps / bp:>9.3f} "
                  f"{kept:>10,} {np.median(page['b']):>10.3f} s {np.median(page['n']):>7.3f} s"
                  f"{'' if ok else '  DIFFERENT ROWS'}", flush=True)
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    grows = len(news) > 1 and news[-1] > 2 * news[0] + 0.02  # (20 ms: below it, noise)
    print(f"same rows at every age: {same}; new queries {'GROW' if grows else 'flat'} with age "
          f"({news[0]:.3f} -> {news[-1]:.3f} s); load average at the end {os.getloadavg()}")
    return 0 if same and not grows else 1


if __name__ == "__main__":
    sys.exit(main())
