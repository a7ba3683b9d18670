"""The store and the collector in-process: migrations, rollup, exactly-once writes,
backpressure, jobs upserts. Real chDB and SQLite in a temp dir."""

from __future__ import annotations

import asyncio

import clickhouse_connect
import pandas as pd
import pyarrow as pa
import pytest
from fleetscope.collector import Backpressure, IngestWriter, prepare
from fleetscope.server.db import Job, open_db
from fleetscope.server.store import Store, StoreURL, queries, view_queries
from fleetscope.server.store import migrations as mig
from fleetscope.server.store.ddl import BATCH_COLUMN
from fleetscope.server.store.migrations import MIGRATIONS, migrate

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from fleetscope.topology import Topology
from tests.helpers.data import now_ns, sample_rows

MS = 1_000_000


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One chdb store + SQLite DB for the module (chdb allows one store path per process)."""
    d = tmp_path_factory.mktemp("store")
    store = Store.open(f"chdb://{d / 'store'}", ttl_days=30)
    db = open_db(f"sqlite:///{d / 'control.db'}")
    yield store, db
    store.close()


def run_writer(store, db, batches, **kw):
    """Submit (key, {type: rows}) batches concurrently to a fresh writer; return results."""

    async def main():
        w = IngestWriter(store, db, **kw)
        await w.start()
        try:
            tables = [(k, {n: codec.rows_to_table(RECORD_TYPES[n], r) for n, r in b.items()}) for k, b in batches]
            return await asyncio.gather(*(w.submit(k, t) for k, t in tables), return_exceptions=True)
        finally:
            await w.stop()

    return asyncio.run(main())


def count(store, table, job):
    return int(store.command(f"SELECT count() FROM `{table}` WHERE job = {{job:String}}", {"job": job}))


def test_migrations_are_versioned_and_idempotent(env):
    store, _ = env
    assert migrate(store.client, 30) == []  # already applied by Store.open
    versions = [r["version"] for r in store.query_rows("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == [m.version for m in MIGRATIONS]
    # a TTL change between restarts is applied to existing tables
    migrate(store.client, 7)
    q = store.query_rows("SELECT create_table_query AS q FROM system.tables WHERE name = 'steps'")[0]["q"]
    assert "toIntervalDay(7)" in q
    migrate(store.client, 30)
    q = store.query_rows("SELECT create_table_query AS q FROM system.tables WHERE name = 'steps'")[0]["q"]
    assert "toIntervalDay(30)" in q and "PARTITION BY toDate" in q


def test_same_key_written_once_even_in_one_group(env):
    store, db = env
    rows = {"steps": sample_rows("steps", 3, job="dedup-1"), "metrics": sample_rows("metrics", 2, job="dedup-1")}
    res = run_writer(store, db, [("k-dedup-1", rows), ("k-dedup-1", rows), ("k-dedup-2", rows)], linger_s=0.2)
    assert [r.duplicate for r in res] == [False, True, False]
    assert count(store, "steps", "dedup-1") == 6 and count(store, "metrics", "dedup-1") == 4
    res = run_writer(store, db, [("k-dedup-2", rows)])
    assert res[0].duplicate and res[0].rows == {"steps": 3, "metrics": 2}
    assert count(store, "steps", "dedup-1") == 6


def test_retry_writes_only_the_missing_tables(env):
    """A batch whose first attempt stored only some tables is completed, not doubled."""
    store, db = env
    steps = sample_rows("steps", 4, job="partial")
    metrics = sample_rows("metrics", 5, job="partial")
    run_writer(store, db, [("k-partial", {"steps": steps})])  # as if the metrics insert had failed
    res = run_writer(store, db, [("k-partial", {"steps": steps, "metrics": metrics})])
    assert not res[0].duplicate
    assert count(store, "steps", "partial") == 4 and count(store, "metrics", "partial") == 5
    from fleetscope.collector.writer import stored_batch_id

    batches = store.query_rows(
        "SELECT `table`, sum(rows) AS n FROM ingest_batches WHERE batch = {b:String} GROUP BY `table` ORDER BY `table`",
        {"b": stored_batch_id("", "k-partial", "-")},  # no host scope, no content digest given
    )
    assert [(b["table"], b["n"]) for b in batches] == [("metrics", 5), ("steps", 4)]


def test_backpressure_when_queue_full(env):
    store, db = env

    async def main():
        w = IngestWriter(store, db, max_queue_rows=1000, linger_s=0.5)
        await w.start()
        t = {"metrics": codec.rows_to_table(RECORD_TYPES["metrics"], sample_rows("metrics", 800, job="bp"))}
        first = asyncio.create_task(w.submit("bp-1", t))
        await asyncio.sleep(0.05)
        with pytest.raises(Backpressure) as e:
            await w.submit("bp-2", t)
        assert e.value.retry_after_s >= 1
        result = await first  # the accepted batch is still written
        await w.stop()
        return result

    assert asyncio.run(main()).rows == {"metrics": 800}
    assert count(store, "metrics", "bp") == 800


def test_linger_counts_from_the_oldest_batch_not_the_last_write(env):
    """A batch that queued up during a (slow) write has lingered already: its group
    starts when that write ends, not ``linger_s`` later (a busy writer must not idle
    between groups). An idle writer still gathers for ``linger_s``."""
    store, db = env
    import time

    async def main():
        w = IngestWriter(store, db, linger_s=0.6, min_insert_rows=10**6)
        starts: list[tuple[float, list[str]]] = []
        orig = w._write_group

        def slow_write(group):
            starts.append((time.monotonic(), [p.client_key for p in group]))
            time.sleep(1.0)  # a slow insert (in the writer's thread)
            return orig(group)

        w._write_group = slow_write  # type: ignore[method-assign]
        await w.start()
        try:
            t = {"metrics": codec.rows_to_table(RECORD_TYPES["metrics"], sample_rows("metrics", 3, job="linger"))}
            t0 = time.monotonic()
            first = asyncio.create_task(w.submit("linger-1", t))
            await asyncio.sleep(0.8)  # the first group is being written (0.6 .. 1.6 s)
            t1 = time.monotonic()
            second = asyncio.create_task(w.submit("linger-2", t))
            await asyncio.gather(first, second)
        finally:
            await w.stop()
        return t0, t1, starts

    t0, t1, starts = asyncio.run(main())
    assert [k for _, k in starts] == [["linger-1"], ["linger-2"]]
    assert starts[0][0] - t0 >= 0.55  # idle: gathered for linger_s
    # queued at 0.8 s, the write ends at ~1.6 s: the old rule lingered again until ~2.2 s
    assert starts[1][0] - t1 < 1.15, f"second group started {starts[1][0] - t1:.2f} s after its batch"
    assert count(store, "metrics", "linger") == 6


def test_clock_offset_and_host_header(env):
    t = {
        "collectives": codec.rows_to_table(
            RECORD_TYPES["collectives"],
            sample_rows("collectives", 2, t0_ns=2_000_000_000 * 10**9, host="", completed_ns=-1),
        )
    }
    out = prepare(t, host="node-7", clock_offset_ns=-5, now_ns=2_000_000_000 * 10**9)  # times in 2033
    c = out["collectives"]
    assert c["enqueued_ns"].to_pylist() == [2_000_000_000 * 10**9 - 5, 2_000_000_000 * 10**9 + MS - 5]
    assert c["completed_ns"].to_pylist() == [-1, -1]  # sentinels untouched
    assert c["host"].to_pylist() == ["node-7", "node-7"]
    assert t["collectives"]["host"].to_pylist() == ["", ""]  # input not modified


def test_jobs_upsert_is_order_independent(env):
    store, db = env
    t0 = now_ns()
    job = {"job": "lifecycle", "dp": 2, "tp": 2, "pp": 2, "model_flops_per_step": 1e12, "device_peak_flops": 1e11}
    end = dict(job, ts_ns=t0 + 10 * 10**9, status="finished")
    start = dict(job, ts_ns=t0, status="running", name="llama-tiny")
    run_writer(store, db, [("k-end", {"jobs": [end]})])  # the end record arrives first
    run_writer(store, db, [("k-start", {"jobs": [start]})])
    with db() as s:
        j = s.get(Job, "lifecycle")
        assert (j.status, j.start_ns, j.end_ns, j.world_size) == ("finished", t0, t0 + 10 * 10**9, 8)
    restart = dict(start, attempt=1, ts_ns=t0 + 20 * 10**9)
    run_writer(store, db, [("k-restart", {"jobs": [restart]})])
    with db() as s:
        j = s.get(Job, "lifecycle")
        assert (j.status, j.attempt, j.start_ns, j.end_ns) == ("running", 1, t0 + 20 * 10**9, None)


def _sec(rank, step, name, kind, dur_ms, t0, mb=-1):
    return dict(job="hand", rank=rank, step=step, name=name, kind=kind, microbatch=mb,
                start_ns=t0, end_ns=t0 + dur_ms * MS, duration_ns=dur_ms * MS)  # fmt: skip


def _coll(rank, step, axis, dur_ms, t0, seq, op="all_reduce", peer=-1):
    return dict(job="hand", rank=rank, step=step, group_id=f"{axis}.x", axis=axis, seq=seq, op=op,
                peer=peer, enqueued_ns=t0, started_ns=t0, completed_ns=t0 + dur_ms * MS,
                duration_ns=dur_ms * MS)  # fmt: skip


def hand_dataset(t0):
    """Two batches (so the rollup holds partial aggregates) of a 2-rank, 2-step job."""
    b1 = {
        "sections": [
            _sec(0, 1, "dataloader", "dataloader", 10, t0),
            _sec(0, 1, "forward", "compute", 30, t0, mb=0),
            _sec(1, 1, "dataloader", "dataloader", 20, t0),
            _sec(1, 1, "forward", "compute", 30, t0, mb=0),
        ],
        "collectives": [_coll(0, 1, "tp", 8, t0, 1), _coll(1, 1, "pp", 10, t0, 1, op="send", peer=0)],
        "steps": [
            dict(job="hand", rank=0, step=1, start_ns=t0, end_ns=t0 + 120 * MS, duration_ns=120 * MS),
            dict(job="hand", rank=1, step=1, start_ns=t0, end_ns=t0 + 100 * MS, duration_ns=100 * MS),
        ],
    }
    b2 = {
        "sections": [
            _sec(0, 1, "backward", "compute", 40, t0, mb=0),
            _sec(0, 1, "optimizer", "optimizer", 5, t0),
            _sec(1, 1, "backward", "compute", 50, t0, mb=0),
            _sec(1, 1, "optimizer", "optimizer", 5, t0),
            _sec(0, 2, "forward", "compute", 25, t0 + 200 * MS),
            _sec(0, 2, "log", "other", 3, t0 + 200 * MS),
        ],
        "collectives": [_coll(0, 1, "dp", 12, t0, 1), _coll(0, 2, "dp", 7, t0 + 200 * MS, 2)],
    }
    return b1, b2


# rank 0 step 1: compute 30+40, optimizer 5, data 10, comm tp 8 and dp 12 (in two batches,
#   both from t0: they overlap, so communication is their union, 12), step 120 -> idle 23
# rank 1 step 1: compute 30+50, optimizer 5, data 20, comm pp 10, step 100 -> busy 115, idle 0
# rank 0 step 2: no step marker -> total = busy = 25 + 3 + 7
EXPECTED = {
    (1, 0): dict(compute_ns=70, optimizer_ns=5, dataloader_ns=10, other_ns=0, comm_ns=12,
                 comm_dp_ns=12, comm_tp_ns=8, comm_pp_ns=0, total_ns=120, idle_ns=23),
    (1, 1): dict(compute_ns=80, optimizer_ns=5, dataloader_ns=20, other_ns=0, comm_ns=10,
                 comm_dp_ns=0, comm_tp_ns=0, comm_pp_ns=10, total_ns=100, idle_ns=0),
    (2, 0): dict(compute_ns=25, optimizer_ns=0, dataloader_ns=0, other_ns=3, comm_ns=7,
                 comm_dp_ns=7, comm_tp_ns=0, comm_pp_ns=0, total_ns=35, idle_ns=0),
}  # fmt: skip


def test_rollup_breakdown_matches_hand_computed(env):
    store, db = env
    t0 = now_ns()
    b1, b2 = hand_dataset(t0)
    run_writer(store, db, [("hand-1", b1)])
    run_writer(store, db, [("hand-2", b2)])
    df = queries.step_breakdown(store, "hand", 0, 0, 10, [], 100)
    got = {(int(r.step), int(r.rank)): {k: int(getattr(r, k)) // MS for k in EXPECTED[(1, 0)]} for r in df.itertuples()}
    assert got == EXPECTED
    only_rank1 = queries.step_breakdown(store, "hand", 0, 0, 10, [1], 100)
    assert only_rank1["rank"].tolist() == [1]
    assert queries.latest_attempt(store, "hand") == 0
    assert queries.latest_attempt(store, "no-such-job") is None


def test_store_rejects_bad_urls():
    from fleetscope.server.store import StoreURLError, parse_store_url

    with pytest.raises(StoreURLError, match="ftp"):
        Store.open("ftp://x/y")
    assert parse_store_url("chdb://rel/dir", cwd="/base").path == "/base/rel/dir"


def test_insert_with_batch_column_is_dictionary_encoded():
    from fleetscope.collector.writer import with_batch_column

    a = pa.table({"x": [1, 2]})
    b = pa.table({"x": [3]})
    t = with_batch_column([("k1", a), ("k2", b)])
    assert t.column("_batch").to_pylist() == ["k1", "k1", "k2"]
    assert pa.types.is_dictionary(t.schema.field("_batch").type)


# ---- communication is the union of a rank-step's op intervals (schema version 2) ----------
def _op(job, rank, step, start_ms, dur_ms, t0, op="all_reduce", axis="tp", seq=1, peer=-1):
    return dict(job=job, rank=rank, step=step, group_id=f"{axis}.{rank}", axis=axis, seq=seq, op=op, peer=peer,
                enqueued_ns=t0 + start_ms * MS, started_ns=t0 + start_ms * MS,
                completed_ns=t0 + (start_ms + dur_ms) * MS, duration_ns=dur_ms * MS)  # fmt: skip


def union_dataset(job, t0):
    """Three rank-steps of rank 0, written in two batches; returns (batches, {step: (sum, union)})."""
    b1 = [
        # step 1: a 1F1B paired exchange (isend + irecv in flight together) and a disjoint op
        _op(job, 0, 1, 0, 10, t0, "isend", "pp", 1, 1), _op(job, 0, 1, 2, 13, t0, "irecv", "pp", 2, 1),
        _op(job, 0, 1, 50, 5, t0),
        # step 2: the pair split by a flush (isend here, irecv in the next batch), ops on both sides
        _op(job, 0, 2, 0, 4, t0, seq=2), _op(job, 0, 2, 20, 6, t0), _op(job, 0, 2, 100, 10, t0, "isend", "pp", 3, 1),
        # step 3: serial ops only: the union is the plain sum
        _op(job, 0, 3, 0, 3, t0, seq=3), _op(job, 0, 3, 10, 7, t0, seq=4),
    ]
    b2 = [
        _op(job, 0, 2, 103, 12, t0, "irecv", "pp", 4, 1), _op(job, 0, 2, 200, 5, t0, seq=5),
        _op(job, 0, 3, 30, 2, t0, seq=6),
        _op(job, 0, 2, 300, 0, t0, seq=7),  # a zero-length op counts, adds no time
    ]
    # step 1: [0,15] + [50,55] = 20 (sum 28); step 2: [0,4] + [20,26] + [100,115] + [200,205] = 30
    # (sum 37); step 3: 3 + 7 + 2 = 12 either way
    return [b1, b2], {1: (28, 20), 2: (37, 30), 3: (12, 12)}


def rollup_comm(store, job):
    """{step: comm_ns} of rank 0 as the step breakdown and the heat-map's comm metric read it."""
    df = queries.step_breakdown(store, job, 0, 0, 10, [], 100)
    topo = Topology(dp=1, tp=1, pp=1)
    cells = view_queries.heatmap_cells(store, job, 0, topo, view_queries.METRICS["comm"], "max", 1, 10, 1, 1)
    breakdown = {int(r.step): int(r.comm_ns) // MS for r in df.itertuples()}
    heatmap = {int(c.col) + 1: round(float(c.value)) for c in cells.itertuples()}
    assert breakdown == heatmap, (breakdown, heatmap)
    return breakdown


def test_rollup_comm_is_the_union_of_overlapping_ops_across_batches(env):
    store, db = env
    batches, expected = union_dataset("union", now_ns())
    for i, b in enumerate(batches):
        run_writer(store, db, [(f"union-{i}", {"collectives": b})])
    assert rollup_comm(store, "union") == {s: u for s, (_, u) in expected.items()}
    # the plain sum is kept (rows written before version 2 read it), per-axis columns are sums
    df = store.query_df("SELECT step, sum(comm_ns) AS s, sum(comm_pp_ns) AS pp FROM step_rollup "
                        "WHERE job = 'union' GROUP BY step ORDER BY step")  # fmt: skip
    assert [int(v) // MS for v in df["s"]] == [s for s, _ in expected.values()]
    assert [int(v) // MS for v in df["pp"]] == [23, 22, 0]


def test_migration_from_version_1_keeps_old_rows_and_unions_new_ones(env, monkeypatch):
    """A store written by schema version 1 is upgraded in place: its rows read as before (the
    sum), ops that arrive after the upgrade are counted as the union, even for a rank-step
    that straddles the upgrade (then its whole rank-step reads the sum: never a mix)."""
    old = older_store(env[0], "v1_store")
    try:
        monkeypatch.setattr(mig, "MIGRATIONS", MIGRATIONS[:1])
        assert migrate(old.client, 30) == [1]
        monkeypatch.undo()
        batches, expected = union_dataset("upg", now_ns())
        insert_collectives(old, "upg-0", batches[0])  # written by the version-1 view
        cols = {r["name"] for r in old.query_rows("SELECT name FROM system.columns WHERE database = 'v1_store' "
                                                  "AND table = 'step_rollup'")}  # fmt: skip
        assert "comm_union_ops" not in cols
        assert migrate(old.client, 30) == [m.version for m in MIGRATIONS[1:]] and migrate(old.client, 30) == []
        insert_collectives(old, "upg-1", batches[1])  # written by the version-2 view
        insert_collectives(old, "upg-2", [_op("upg", 0, 5, 0, 10, now_ns(), "isend", "pp", 9, 1),
                                          _op("upg", 0, 5, 1, 10, now_ns(), "irecv", "pp", 9, 1)])
        got = rollup_comm(old, "upg")
        # step 1: all before the upgrade -> the sum, as version 1 read it; steps 2, 3 straddle
        # it -> the sum; step 5: after it -> the union of the pair (11 ms, not 20)
        assert got == {1: expected[1][0], 2: expected[2][0], 3: expected[3][0], 5: 11}
        versions = [r["version"] for r in old.query_rows("SELECT version FROM schema_migrations ORDER BY version")]
        assert versions == [m.version for m in MIGRATIONS]
    finally:
        old.close()


def older_store(store: Store, database: str) -> Store:
    """A store in its own database of the same chDB, to be migrated step by step."""
    store.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    return Store(StoreURL("chdb", path=store.url.path),
                 clickhouse_connect.get_client(dsn=f"chdb://{store.url.path}", database=database))


def test_migration_to_version_3_backfills_each_ranks_newest_inflight_row(env, monkeypatch):
    """A store written before ``inflight_latest`` existed: the upgrade fills it from the
    in-flight rows of the last hour, rows arriving later go through its view, and the
    loader's query over it answers what the query over every raw row answers."""
    from fleetscope.server.diagnosis import loader

    old = older_store(env[0], "v2_store")
    t = now_ns()

    def rows(ts, op, ranks, job="bf"):
        return codec.rows_to_table(RECORD_TYPES["inflight"], [
            {"job": job, "attempt": 0, "rank": r, "host": f"h{r}", "ts_ns": ts + r, "step": 3, "kind": "collective",
             "op": op, "group_id": "tp.g0", "axis": "tp", "seq": r, "peer": -1, "since_ns": ts - 10**9}
            for r in ranks])

    try:
        monkeypatch.setattr(mig, "MIGRATIONS", MIGRATIONS[:2])
        assert migrate(old.client, 30) == [1, 2]
        monkeypatch.undo()
        old.insert_arrow("inflight", rows(t - 7200 * 10**9, "too-old", range(5), job="bf-old"))  # before the backfill
        old.insert_arrow("inflight", rows(t - 20 * 10**9, "older", range(4)))
        old.insert_arrow("inflight", rows(t - 10 * 10**9, "newest", range(3)))
        assert migrate(old.client, 30) == [m.version for m in MIGRATIONS[2:]]
        old.insert_arrow("inflight", rows(t - 5 * 10**9, "after", [2, 4]))  # through the view
        p = {"job": "bf", "attempt": 0, "since_ns": t - 600 * 10**9}
        got = loader._df(old, loader.INFLIGHT_NEWEST, p).sort_values("rank").reset_index(drop=True)
        want = loader._df(old, loader.INFLIGHT_LATEST, p).sort_values("rank").reset_index(drop=True)
        assert list(got["op"]) == ["newest", "newest", "after", "older", "after"]
        pd.testing.assert_frame_equal(got, want[got.columns], check_dtype=False)
        assert loader._df(old, loader.INFLIGHT_NEWEST, {**p, "job": "bf-old", "since_ns": 0}).empty
        assert sorted(loader._df(old, loader.INFLIGHT_NEWEST, {**p, "since_ns": t - 15 * 10**9})["rank"]) == [0, 1, 2, 4]
    finally:
        old.close()


def test_migration_to_version_4_adds_acked_through_to_heartbeats(env, monkeypatch):
    """A store of version 3: its heartbeat rows read ``acked_through_ns = -1`` (not said)
    after the upgrade; rows of new agents carry it, rows of older agents (no such column
    on the wire) get -1; the hang pass's heartbeat query keeps, per rank, the largest value
    an agent said and -1 only where none did."""
    from fleetscope.server.diagnosis import loader

    old = older_store(env[0], "v3_store")
    t = now_ns()
    rt = RECORD_TYPES["heartbeats"]

    def beat(ts, rank, **extra):
        return {"ts_ns": ts, "job": "hb", "host": "h0", "rank": rank, "local_rank": rank, **extra}

    try:
        monkeypatch.setattr(mig, "MIGRATIONS", MIGRATIONS[:3])
        assert migrate(old.client, 30) == [1, 2, 3]
        monkeypatch.undo()
        v3 = codec.rows_to_table(rt, [beat(t - 9 * 10**9, 0), beat(t - 9 * 10**9, 1)])
        old.insert_arrow("heartbeats", v3.drop_columns(["acked_through_ns"]))  # a v3 table
        assert migrate(old.client, 30) == [m.version for m in MIGRATIONS[3:]]
        assert migrate(old.client, 30) == []  # idempotent
        old.insert_arrow("heartbeats", codec.rows_to_table(rt, [
            beat(t - 4 * 10**9, 0, acked_through_ns=t - 5 * 10**9),
            beat(t - 2 * 10**9, 0, acked_through_ns=t - 6 * 10**9),  # reordered: the max holds
            beat(t - 2 * 10**9, 2, acked_through_ns=0)]))  # nothing acknowledged yet
        older_agent = codec.conform(rt, v3.drop_columns(["acked_through_ns"]).slice(1, 1))
        assert older_agent.column("acked_through_ns").to_pylist() == [-1]
        old.insert_arrow("heartbeats", older_agent)
        got = loader._df(old, loader.HEARTBEATS_LATEST, {"job": "hb", "hosts": ["h0"], "since_ns": t - 60 * 10**9},
                         loader.HEARTBEAT_COLUMNS)
        acked = dict(zip(got["rank"], got["acked_through_ns"]))
        assert acked == {0: t - 5 * 10**9, 1: -1, 2: 0}
        assert set(loader.HEARTBEAT_COLUMNS) == set(got.columns)
    finally:
        old.close()


RAW_LATEST_HEARTBEATS = """
SELECT rank, argMax(h.host, h.ts_ns) AS hb_host, max(h.ts_ns) AS hb_ts_ns, argMax(h.alive, h.ts_ns) AS hb_alive,
       argMax(h.last_step, h.ts_ns) AS hb_last_step, argMax(h.inflight_op, h.ts_ns) AS hb_inflight_op
FROM heartbeats AS h WHERE h.job = {job:String} AND h.rank >= 0
GROUP BY rank
"""
"""The job page's heartbeat query before schema version 5 (every heartbeat of the job)."""


def test_migration_to_version_5_backfills_each_rank_processs_heartbeat_state(env, monkeypatch):
    """A store of version 4 with heartbeats: the upgrade fills ``heartbeats_latest`` from
    the last hour, later heartbeats go through its view, and the hang pass's query over it
    answers what the query over every raw heartbeat answers (alive, pid, dead since, step,
    acknowledged prefix, the job's hosts' own rows)."""
    from fleetscope.server.diagnosis import loader

    old = older_store(env[0], "v4_store")
    t = now_ns()
    rt = RECORD_TYPES["heartbeats"]

    def beats(ts, ranks, alive=1, job="hb5", host="h0", **extra):
        return codec.rows_to_table(rt, [{"ts_ns": ts + r, "job": job, "host": host, "rank": r, "local_rank": r,
                                         "pid": 100 + r, "alive": alive, "last_step": 4, **extra} for r in ranks])

    try:
        monkeypatch.setattr(mig, "MIGRATIONS", MIGRATIONS[:4])
        assert migrate(old.client, 30) == [1, 2, 3, 4]
        monkeypatch.undo()
        old.insert_arrow("heartbeats", beats(t - 7200 * 10**9, range(3), job="hb5-old"))  # before the backfill
        old.insert_arrow("heartbeats", beats(t - 30 * 10**9, range(4), acked_through_ns=t - 31 * 10**9))
        old.insert_arrow("heartbeats", beats(t - 20 * 10**9, [2], alive=0))  # rank 2 dies
        old.insert_arrow("heartbeats", beats(t - 20 * 10**9, [-1], job=""))  # the host's own row
        assert migrate(old.client, 30) == [m.version for m in MIGRATIONS[4:]]
        old.insert_arrow("heartbeats", beats(t - 10 * 10**9, [0, 2, 3], alive=1, last_step=6))  # through the view
        old.insert_arrow("heartbeats", beats(t - 5 * 10**9, [2], alive=0, last_step=6))
        p = {"job": "hb5", "hosts": ["h0"], "since_ns": t - 600 * 10**9}
        cols = loader.HEARTBEAT_COLUMNS
        got = loader._df(old, loader.HEARTBEATS_NEWEST, p, cols).sort_values(["rank", "host"]).reset_index(drop=True)
        want = loader._df(old, loader.HEARTBEATS_LATEST, p, cols).sort_values(["rank", "host"]).reset_index(drop=True)
        assert list(got["rank"]) == [-1, 0, 1, 2, 3]
        assert list(got["alive"]) == [1, 1, 1, 0, 1] and list(got["spool_last_step"]) == [4, 6, 4, 6, 6]
        assert list(got["acked_through_ns"]) == [-1] + [t - 31 * 10**9] * 4  # -1 rows: not said
        pd.testing.assert_frame_equal(got, want[got.columns], check_dtype=False)
        assert loader._df(old, loader.HEARTBEATS_NEWEST, {**p, "job": "hb5-old", "hosts": [], "since_ns": 0}).empty
        recent = loader._df(old, loader.HEARTBEATS_NEWEST, {**p, "since_ns": t - 15 * 10**9})
        assert sorted(recent["rank"]) == [0, 2, 3]
        host = old.query_rows(loader.HOSTS_LAST_NEWEST, p)
        assert host == old.query_rows(loader.HOSTS_LAST, p) and len(host) == 1
        old.insert_arrow("heartbeats", beats(t - 2 * 10**9, [3], last_step=6,
                                             inflight_op="collective:all_reduce dp.g0 seq=9"))
        page = view_queries.latest_heartbeats(old, "hb5").sort_values("rank").reset_index(drop=True)
        raw = old.query_df(RAW_LATEST_HEARTBEATS, {"job": "hb5"}).sort_values("rank").reset_index(drop=True)
        pd.testing.assert_frame_equal(page, raw[page.columns], check_dtype=False)  # the job page's query
        assert list(page["hb_alive"]) == [1, 1, 0, 1] and page["hb_inflight_op"].iloc[3].startswith("collective:")
    finally:
        old.close()


def test_migration_to_version_6_backfills_each_ranks_newest_work(env, monkeypatch):
    """A store of version 5 with collectives and sections: the upgrade fills
    ``progress_latest`` from the last hour, later rows go through its two views, and the
    hang pass's query over it answers what the raw-row query answers (highest completed
    sequence and newest completion per rank and group, newest section end per rank, only
    for ranks and groups with work at ``from_step`` or later)."""
    from fleetscope.server.diagnosis import loader

    old = older_store(env[0], "v5_store")
    t = now_ns()
    ms = 10**6

    def ops(step, ranks, seq, job="pg6", state="completed", group="tp.g0", t_ns=None):
        base = (t - 60 * 10**9 + step * 1000 * ms) if t_ns is None else t_ns
        return codec.rows_to_table(RECORD_TYPES["collectives"], [
            {"job": job, "attempt": 0, "host": "h0", "rank": r, "step": step, "microbatch": 0,
             "group_id": group, "axis": group.split(".")[0], "seq": seq, "op": "all_reduce", "bytes": 8,
             "dtype": "float32", "peer": -1, "state": state, "enqueued_ns": base + r * ms,
             "completed_ns": base + (r + 5) * ms if state == "completed" else -1} for r in ranks])

    def secs(step, ranks, job="pg6"):
        base = t - 60 * 10**9 + step * 1000 * ms
        return codec.rows_to_table(RECORD_TYPES["sections"], [
            {"job": job, "attempt": 0, "host": "h0", "rank": r, "step": step, "microbatch": 0,
             "name": "forward", "kind": "compute", "start_ns": base + r * ms, "end_ns": base + (r + 50) * ms,
             "duration_ns": 50 * ms} for r in ranks]).drop_columns(["cpu_ns"])  # a writer of version 5

    try:
        monkeypatch.setattr(mig, "MIGRATIONS", MIGRATIONS[:5])
        assert migrate(old.client, 30) == [1, 2, 3, 4, 5]
        monkeypatch.undo()
        old.insert_arrow("collectives", ops(0, range(3), 1, job="pg6-old", t_ns=t - 7200 * 10**9))  # too old
        for step in range(3):
            old.insert_arrow("collectives", ops(step, range(4), step + 1))
            old.insert_arrow("sections", secs(step, range(4)))
        old.insert_arrow("collectives", ops(1, [0, 1], 1, group="pp.g0"))  # a group rank 0, 1 left at step 1
        assert migrate(old.client, 30) == [6, 7]
        for step in (3, 4):  # through the views; rank 3 is stuck after step 2
            old.insert_arrow("collectives", ops(step, range(3), step + 1))
            old.insert_arrow("collectives", ops(step, [3], step + 1, state="enqueued"))
            old.insert_arrow("sections", secs(step, range(3)))
        for from_step in (0, 2, 3, 5):
            p = {"job": "pg6", "attempt": 0, "from_step": from_step}
            got, want = (old.query_df(q, p) for q in (loader.PROGRESS_NEWEST, loader.RECENT_WORK))
            key = ["src", "rank", "group_id"]
            assert len(got) == len(want)
            if len(want):
                pd.testing.assert_frame_equal(got.sort_values(key).reset_index(drop=True),
                                              want.sort_values(key).reset_index(drop=True)[got.columns],
                                              check_dtype=False)
            if from_step == 3:
                assert sorted(got.loc[got["src"] == 0, "rank"]) == [0, 1, 2]  # rank 3 did nothing since
                assert set(got.loc[got["src"] == 0, "last_seq"]) == {5}
        assert old.query_df(loader.PROGRESS_NEWEST, {"job": "pg6-old", "attempt": 0, "from_step": 0}).empty
    finally:
        old.close()


def insert_collectives(store, batch, rows):
    t = codec.rows_to_table(RECORD_TYPES["collectives"], rows)
    store.insert_arrow("collectives", t.append_column(BATCH_COLUMN, pa.array([batch] * t.num_rows, pa.string())))


def test_rollup_comm_over_three_batches_is_exact_and_a_late_block_an_upper_bound(env):
    """Each batch subtracts its overlap with the edges of the latest-starting batch before
    it: exact for batches in time order whose ops overlap only at consecutive batches'
    edges, however many; a batch that overlaps an older one elsewhere is counted as an
    upper bound (never above the plain sum, never below the union)."""
    store, db = env
    t0 = now_ns()
    b1 = [_op("three", 0, 1, 0, 4, t0, seq=1), _op("three", 0, 1, 100, 10, t0, "isend", "pp", 2, 1)]
    b2 = [_op("three", 0, 1, 103, 12, t0, "irecv", "pp", 3, 1), _op("three", 0, 1, 150, 10, t0, "isend", "pp", 4, 1)]
    b3 = [_op("three", 0, 1, 152, 18, t0, "irecv", "pp", 5, 1)]
    for i, b in enumerate((b1, b2, b3)):
        run_writer(store, db, [(f"three-{i}", {"collectives": b})])
    # each pair split between two batches: union [0,4] + [100,115] + [150,170] = 39 (sum 54)
    assert rollup_comm(store, "three")[1] == 39
    run_writer(store, db, [("three-3", {"collectives": [_op("three", 0, 1, 1, 2, t0, seq=6)]})])
    # a late op inside the first batch's edge: the union stays 39, the sum is 56
    got = rollup_comm(store, "three")[1]
    assert 39 <= got <= 56 and got == 41


def test_diagnosis_queries_carry_the_nice_setting_the_store_knows(env):
    """The passes' queries are niced by the setting name the store's ClickHouse knows (an
    unknown name would fail every query); nice 0 sends none; the handle applies them."""
    from fleetscope.server.store import diagnosis_query_settings
    from fleetscope.server.store.client import NICE_SETTINGS

    store, _ = env
    diag = None
    try:
        got = diagnosis_query_settings(10, store)
        assert list(got.values()) == [10] and next(iter(got)) in NICE_SETTINGS, got
        assert diagnosis_query_settings(0, store) == {}
        diag = store.sibling(got)
        name = next(iter(got))
        assert diag.query_rows("SELECT getSetting({n:String}) AS v", {"n": name})[0]["v"] == 10
        assert store.query_rows("SELECT getSetting({n:String}) AS v", {"n": name})[0]["v"] == 0
        assert len(diag.query_df("SELECT number FROM numbers(3)")) == 3
        assert diag.query_arrow("SELECT number FROM numbers(3)").num_rows == 3
    finally:
        if diag is not None:
            diag.client.close()
