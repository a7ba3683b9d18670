"""Cost of the rollup's communication union (store schema version 2) against the plain sum
of version 1, at 12,288 ranks (DP 192 x PP 8 x TP 8).

Two stores in one chDB (one database each), the same raw collectives inserted into both,
in the insert blocks an ingest would make: every rank-step's ops split over
``--blocks-per-step`` blocks, each 1F1B paired exchange (isend + irecv, in flight
together) split at every block boundary, as a flush would split it. Prints:

1. insert time per block (wall and process CPU), version 1 vs version 2 (the collectives
   view now also folds each rank-step's intervals and looks up the edges already stored
   for the block's keys);
2. the grid's per-rank scores (median own work over ``--steps`` steps, ``FINAL``) and
   the heat-map's own-work cells, each read on both stores, and the ratio;
3. the communication both stores report against the true union (computed by ClickHouse
   from the raw rows), so the figures are checked, not just timed.

    .venv/bin/python bench/rollup_union.py [--steps 20] [--ops 20] [--blocks-per-step 3] [--runs 3]

Exits 1 when version 2's communication is not the true union, or version 1's is not the
plain sum (the bench would then time the wrong thing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import clickhouse_connect
import numpy as np
import pyarrow as pa
from fleetscope.server.store import Store, StoreURL, view_queries
from fleetscope.server.store import migrations as mig
from fleetscope.server.store.ddl import BATCH_COLUMN

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from fleetscope.topology import Topology

MS = 1_000_000


def block_rows(topo: Topology, step: int, num_ops: int, blocks: int, t0: int) -> list[pa.Table]:
    """The collectives of one step of every rank, as ``blocks`` insert blocks.

    Each rank's step: ``num_ops`` pairs (isend [s, s+4 ms], irecv [s+1 ms, s+6 ms]) every
    10 ms; the k-th block holds the ops completed in the k-th slice of the step, so the
    pairs at slice boundaries are split between two blocks."""
    n = topo.world_size
    rank = np.repeat(np.arange(n, dtype=np.int32), 2 * num_ops)
    pair = np.tile(np.repeat(np.arange(num_ops), 2), n)
    is_recv = np.tile(np.array([0, 1] * num_ops), n).astype(bool)
    start = t0 + step * 10 * num_ops * MS + pair * 10 * MS + is_recv * MS
    dur = np.where(is_recv, 5 * MS, 4 * MS)
    done = start + dur
    # block k: the ops completed in slice k of the step (the boundary falls inside a pair)
    slice_ns = (10 * num_ops * MS) // blocks
    block = np.minimum((done - (t0 + step * 10 * num_ops * MS) - 5 * MS) // slice_ns, blocks - 1)
    cols = {
        "job": np.full(rank.size, "union-bench"), "attempt": np.zeros(rank.size, np.int32), "rank": rank,
        "host": np.char.add("node-", (rank // 8).astype(str)), "step": np.full(rank.size, step, np.int64),
        "microbatch": pair.astype(np.int32), "group_id": np.char.add("pp.", (rank % 8).astype(str)),
        "axis": np.full(rank.size, "pp"), "seq": (step * num_ops + pair).astype(np.int64),
        "op": np.where(is_recv, "irecv", "isend"), "bytes": np.full(rank.size, 1 << 20, np.int64),
        "dtype": np.full(rank.size, "bfloat16"), "peer": ((rank + 8) % n).astype(np.int32),
        "state": np.full(rank.size, "completed"), "enqueued_ns": start, "started_ns": start,
        "completed_ns": done, "duration_ns": dur,
    }  # fmt: skip
    rt = RECORD_TYPES["collectives"]
    out = []
    for k in range(blocks):
        m = block == k
        t = codec.conform(rt, pa.table({name: c[m] for name, c in cols.items()}))
        out.append(t.append_column(BATCH_COLUMN, pa.array([f"b-{step}-{k}"] * t.num_rows, pa.string())))
    return out


def open_db(path: str, name: str) -> Store:
    client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    client.command(f"CREATE DATABASE IF NOT EXISTS `{name}`")
    client.close()
    return Store(StoreURL("chdb", path=path), clickhouse_connect.get_client(dsn=f"chdb://{path}", database=name))


def timed(f) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - w, time.process_time() - c


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="steps of 12,288 ranks inserted (default 20)")
    p.add_argument("--ops", type=int, default=20, help="paired exchanges per rank-step (default 20)")
    p.add_argument("--blocks-per-step", type=int, default=3, help="insert blocks per step (default 3)")
    p.add_argument("--runs", type=int, default=3, help="reads of each kind; the least CPU is reported")
    args = p.parse_args()
    if min(args.steps, args.ops, args.blocks_per_step, args.runs) < 1:
        p.error("--steps, --ops, --blocks-per-step and --runs must be >= 1")
    topo = Topology(dp=192, tp=8, pp=8)
    path = tempfile.mkdtemp(prefix="fleetscope-union-bench-")
    v1, v2 = open_db(path, "v1"), open_db(path, "v2")
    saved = mig.MIGRATIONS
    mig.MIGRATIONS = saved[:1]
    mig.migrate(v1.client, 0)
    mig.MIGRATIONS = saved
    mig.migrate(v2.client, 0)
    ins = {"v1": [], "v2": []}
    t0 = time.time_ns() - 3600 * 10**9
    for step in range(args.steps):
        for block in block_rows(topo, step, args.ops, args.blocks_per_step, t0):
            for name, store in (("v1", v1), ("v2", v2)):
                ins[name].append(timed(lambda s=store, b=block: s.insert_arrow("collectives", b)))
        print(f"\rinserted step {step + 1}/{args.steps}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr, flush=True)
    num_rows = args.steps * topo.world_size * 2 * args.ops
    scores_sum = view_queries.RANK_SCORES.replace(view_queries._COMM, "comm_ns")
    params = {"job": "union-bench", "attempt": 0, "world": topo.world_size, "from_step": 0, "to_step": args.steps - 1}
    # the steps view never fired (no step markers): own work falls back to the parts, so
    # time the comm metric, which is what the union changes
    comm_sum = view_queries.Metric("comm", "comm (plain sum)", "ms", "comm_ns / 1e6")
    reads = {}
    for label, store, metric, scores in (("v1", v1, comm_sum, scores_sum),
                                         ("v2", v2, view_queries.METRICS["comm"], view_queries.RANK_SCORES)):  # fmt: skip
        hm = [timed(lambda s=store, m=metric: view_queries.heatmap_cells(s, "union-bench", 0, topo, m, "max", 0,
                                                                         args.steps - 1, 64, 1))
              for _ in range(args.runs)]  # fmt: skip
        gr = [timed(lambda s=store, q=scores: s.query_df(q, params)) for _ in range(args.runs)]
        reads[label] = {"heatmap": min(hm, key=lambda x: x[1]), "grid": min(gr, key=lambda x: x[1])}
    truth = v2.query_df(
        "SELECT sum(u) AS u, sum(s) AS s FROM (SELECT intervalLengthSum(enqueued_ns, completed_ns) AS u, "
        "sum(duration_ns) AS s FROM collectives GROUP BY step, rank)")  # fmt: skip
    got = {name: int(s.query_df(f"SELECT sum({view_queries._COMM if name == 'v2' else 'comm_ns'}) AS c "
                                "FROM step_rollup FINAL")["c"][0]) for name, s in (("v1", v1), ("v2", v2))}  # fmt: skip
    union_ns, sum_ns = int(truth["u"][0]), int(truth["s"][0])
    load = os.getloadavg()[0]
    print(f"{topo.world_size:,} ranks x {args.steps} steps x {2 * args.ops} ops ({num_rows:,} collectives), "
          f"{args.blocks_per_step} blocks per step; 1-min load average {load:.1f} on {os.cpu_count()} CPUs")
    for name in ("v1", "v2"):
        w = sum(x[0] for x in ins[name]) / len(ins[name])
        c = sum(x[1] for x in ins[name]) / len(ins[name])
        print(f"insert per block ({num_rows // len(ins[name]):,} rows), {name}: {w:.3f} s wall, {c:.3f} s CPU")
    c1 = sum(x[1] for x in ins["v1"]) / len(ins["v1"])
    c2 = sum(x[1] for x in ins["v2"]) / len(ins["v2"])
    print(f"insert CPU ratio v2 / v1: {c2 / c1:.2f}")
    for kind in ("heatmap", "grid"):
        a, b = reads["v1"][kind], reads["v2"][kind]
        print(f"{kind} read over {topo.world_size:,} x {args.steps}: v1 {a[0]:.3f} s wall / {a[1]:.3f} s CPU, "
              f"v2 {b[0]:.3f} s wall / {b[1]:.3f} s CPU; CPU ratio {b[1] / max(a[1], 1e-9):.2f}")
    print(f"communication: true union {union_ns / 1e9:.3f} s, plain sum {sum_ns / 1e9:.3f} s; "
          f"v1 reads {got['v1'] / 1e9:.3f} s, v2 reads {got['v2'] / 1e9:.3f} s")
    for s in (v1, v2):
        s.close()
    failures = []
    if got["v2"] != union_ns:
        failures.append(f"v2 communication {got['v2']} != the true union {union_ns}")
    if got["v1"] != sum_ns:
        failures.append(f"v1 communication {got['v1']} != the plain sum {sum_ns}")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    shutil.rmtree(path, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
