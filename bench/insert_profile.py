"""Where chDB's insert CPU goes: per record table and per materialized view.

The same Arrow blocks (a DP x PP 8 x TP 8 job from the simulator, one block per table
per step, as one insert group of the writer would carry) are inserted into several
scratch databases of one chDB, each with a different set of views attached:

* ``full``: the store as migrated (every view, union collectives view of version 2);
* ``v1``: schema version 1 only (the collectives view sums, no union or edge lookup);
* ``no_rollup``: ``full`` without the three ``step_rollup`` views;
* ``no_batches``: ``full`` without the ``ingest_batches`` views;
* ``bare``: no views at all (the MergeTree insert alone).

Per table it prints the process CPU per insert (median over the steps) in each
database, so ``full - no_rollup`` is the rollup view's cost, ``full - no_batches`` the
batch registry view's, ``full - v1`` the union's, and ``bare`` the table's own.

    .venv/bin/python bench/insert_profile.py [--dp 4] [--steps 6] [--tp-ops 4]

Exits 1 when a database did not store every row (the bench would time nothing).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

import clickhouse_connect
import pyarrow as pa
import pyarrow.compute as pc
from fleetscope.collector.writer import with_batch_column
from fleetscope.server.store import migrations as mig
from fleetscope.server.store.ddl import BATCHES_TABLE, ROLLUP_TABLE
from fleetscope.sim.offline import job_tables

from fleetscope.topology import Topology

CONFIGS = ("full", "v1", "no_rollup", "no_batches", "bare")
ROLLED = ("sections", "collectives", "steps")


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def open_db(path: str, name: str):
    c = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    c.command(f"CREATE DATABASE IF NOT EXISTS `{name}`")
    c.close()
    return clickhouse_connect.get_client(dsn=f"chdb://{path}", database=name)


def prepare(client, config: str, tables: list[str]) -> None:
    saved = mig.MIGRATIONS
    mig.MIGRATIONS = saved[:1] if config == "v1" else saved
    try:
        mig.migrate(client, 0)
    finally:
        mig.MIGRATIONS = saved
    if config in ("no_rollup", "bare"):
        for t in ROLLED:
            client.command(f"DROP VIEW IF EXISTS `{ROLLUP_TABLE}_{t}_mv`")
    if config in ("no_batches", "bare"):
        for t in tables:
            client.command(f"DROP VIEW IF EXISTS `{BATCHES_TABLE}_{t}_mv`")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dp", type=int, default=4, help="data-parallel width (ranks = 64 x dp; default 4)")
    p.add_argument("--steps", type=int, default=6, help="steps, one insert group each (default 6)")
    p.add_argument("--tp-ops", type=int, default=4, help="TP ops per micro-batch (default 4)")
    p.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                   help="an extra insert setting (repeatable), e.g. optimize_on_insert=0")
    args = p.parse_args()
    try:
        extra = dict(kv.split("=", 1) for kv in args.setting)
    except ValueError:
        p.error(f"--setting takes NAME=VALUE, got {args.setting}")
    if min(args.dp, args.steps, args.tp_ops) < 1:
        p.error("--dp, --steps and --tp-ops must be >= 1")
    topo = Topology(dp=args.dp, tp=8, pp=8)
    t0 = time.time_ns() - 3600 * 10**9
    tabs = {k: t for k, t in job_tables(topo, args.steps, t0, job="prof", step_ms=2000, tp_ops=args.tp_ops,
                                         gpus_per_host=8, num_mb=4).items() if k != "jobs"}
    names = sorted(tabs)
    # one block per table per step (tables without a step column: an equal slice)
    blocks: dict[str, list[pa.Table]] = {}
    for n, t in tabs.items():
        if "step" in t.column_names:
            blocks[n] = [t.filter(pc.equal(t["step"], s)) for s in range(args.steps)]
        else:
            per = -(-t.num_rows // args.steps)
            blocks[n] = [t.slice(i * per, per) for i in range(args.steps)]
    path = tempfile.mkdtemp(prefix="fleetscope-insert-profile-")
    clients = {c: open_db(path, c) for c in CONFIGS}
    for c, cl in clients.items():
        prepare(cl, c, names)
    cost: dict[tuple[str, str], list[float]] = {}
    for s in range(args.steps):
        for c, cl in clients.items():
            for n in names:
                b = with_batch_column([(f"k{s}", blocks[n][s])])
                c0 = cpu_s()
                cl.insert_arrow(n, b, settings={"insert_deduplication_token": f"{n}-{s}", **extra})
                cost.setdefault((c, n), []).append(cpu_s() - c0)
        print(f"\rstep {s + 1}/{args.steps}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    bad = 0
    for c, cl in clients.items():
        for n in names:
            got = int(cl.query(f"SELECT count() FROM `{n}`").result_rows[0][0])
            if got != tabs[n].num_rows:
                print(f"{c}.{n}: stored {got} of {tabs[n].num_rows} rows", file=sys.stderr)
                bad += 1
    med = {k: statistics.median(v[1:] if len(v) > 2 else v) * 1e3 for k, v in cost.items()}
    print(f"{topo.world_size:,} ranks, {args.steps} steps, tp-ops {args.tp_ops}; load average "
          f"{os.getloadavg()}; settings {extra}; CPU per insert (ms, median; first step skipped)")
    print(f"{'table':<12} {'rows/block':>10} " + " ".join(f"{c:>10}" for c in CONFIGS)
          + f" {'rollup MV':>10} {'batches MV':>10} {'union':>8} {'us/row':>7}")
    tot = dict.fromkeys(CONFIGS, 0.0)
    for n in names:
        rows = blocks[n][min(1, args.steps - 1)].num_rows
        for c in CONFIGS:
            tot[c] += med[(c, n)]
        f = med[("full", n)]
        print(f"{n:<12} {rows:>10,} " + " ".join(f"{med[(c, n)]:>10.1f}" for c in CONFIGS)
              + f" {f - med[('no_rollup', n)]:>10.1f} {f - med[('no_batches', n)]:>10.1f}"
              f" {f - med[('v1', n)]:>8.1f} {1e3 * f / max(rows, 1):>7.2f}")
    print(f"{'group':<12} {'':>10} " + " ".join(f"{tot[c]:>10.1f}" for c in CONFIGS))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
