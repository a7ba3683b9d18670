"""The ClickHouse cluster variant of the store schema (store URL ``...?cluster=NAME``).

No ClickHouse server or cluster runs here (Debian's 18.16 is too old for
clickhouse-connect), so the cluster DDL is checked in three ways:

* golden files of the rendered DDL of every migration (``tests/golden/cluster_ddl/``);
  after a schema change regenerate them and review the diff::

      FLEETSCOPE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_cluster_ddl.py

* invariants that hold for *any* table or view of the single-node schema (every table
  has a Replicated local table and a Distributed one, every view reads and writes local
  tables, everything is ``ON CLUSTER`` and idempotent), and every rendered statement is
  parsed by ClickHouse's own parser (chDB 26.x, ``formatQuery``);
* the local parts run in chDB: the rendered DDL, with only what needs Keeper and a
  network taken out (``ON CLUSTER``, the Replicated engines' Keeper arguments), builds
  two "shards" (databases) whose rows are routed by the rendered sharding key; a
  ``Merge`` table stands in for each ``Distributed`` one (both read every shard and
  apply ``FINAL`` per shard). The product's own queries then give the same answers as
  on a single node.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import clickhouse_connect
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fleetscope.server.diagnosis import loader
from fleetscope.server.store import Store, StoreURL, queries, view_queries
from fleetscope.server.store.cluster import (
    LOCAL_SUFFIX,
    Cluster,
    ClusterDDLError,
    Renderer,
    migrations_table_ddl,
    parse_create_table,
    sharding_key,
)
from fleetscope.server.store.ddl import BATCH_COLUMN
from fleetscope.server.store.migrations import (
    MIGRATIONS,
    MIGRATIONS_TABLE,
    migrate,
    statements_of,
    ttl_statements,
)
from fleetscope.server.store.url import StoreURLError, parse_store_url

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.synthetic import SynthJob

GOLDEN = Path(__file__).parent / "golden" / "cluster_ddl"
UPDATE = os.environ.get("FLEETSCOPE_UPDATE_GOLDEN") == "1"
CLUSTER = Cluster("fleetscope", "fleetscope")
TTL_DAYS = 30
SHARDS = ("shard1", "shard2")


def rendered(version_filter=None) -> dict[str, str]:
    """Golden file name -> its text: one file per migration, plus the registry and a TTL change."""
    out = {}
    for m in MIGRATIONS:
        out[f"v{m.version:04d}.sql"] = ";\n\n".join(statements_of(m, TTL_DAYS, CLUSTER)) + ";\n"
    out["schema_migrations.sql"] = migrations_table_ddl(MIGRATIONS_TABLE, CLUSTER) + ";\n"
    current = {rt.name + LOCAL_SUFFIX: "TTL x + toIntervalDay(30)" for rt in RECORD_TYPES.values()}
    out["ttl_change_to_7_days.sql"] = ";\n\n".join(ttl_statements(current, 7, CLUSTER)) + ";\n"
    return out


def test_rendered_cluster_ddl_matches_the_golden_files():
    files = rendered()
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for old in GOLDEN.glob("*.sql"):
            if old.name not in files:
                old.unlink()
        for name, text in files.items():
            (GOLDEN / name).write_text(text)
    have = {p.name for p in GOLDEN.glob("*.sql")}
    assert have == set(files), (f"golden files {sorted(have)} != rendered {sorted(files)}; "
                                "regenerate: FLEETSCOPE_UPDATE_GOLDEN=1 pytest tests/test_cluster_ddl.py")  # fmt: skip
    for name, text in files.items():
        assert (GOLDEN / name).read_text() == text, (
            f"{name} differs from the rendered cluster DDL; review, then regenerate with "
            "FLEETSCOPE_UPDATE_GOLDEN=1 pytest tests/test_cluster_ddl.py")


def all_single_node() -> list[str]:
    return [s for m in MIGRATIONS for s in m.statements(TTL_DAYS)]


def test_every_table_and_view_of_every_migration_gets_its_cluster_variant():
    """Holds for tables added later (e.g. new rollups and their views) with no extra work."""
    single = all_single_node()
    tables = [t for t in map(parse_create_table, single) if t is not None]
    views = [s for s in single if re.match(r"\s*CREATE\s+MATERIALIZED\s+VIEW", s, re.I)]
    assert {"sections", "steps", "step_rollup", "ingest_batches"} <= {t.name for t in tables}
    out = [s for m in MIGRATIONS for s in statements_of(m, TTL_DAYS, CLUSTER)]
    text = "\n".join(out)
    for t in tables:
        local = [s for s in out if s.startswith(f"CREATE TABLE IF NOT EXISTS `{t.name}_local` ON CLUSTER `fleetscope`")]
        dist = [s for s in out if s.startswith(f"CREATE TABLE IF NOT EXISTS `{t.name}` ON CLUSTER `fleetscope`")]
        assert len(local) == 1 and len(dist) == 1, t.name
        assert f"ENGINE = Replicated{t.engine}('/clickhouse/tables/{{shard}}/{{database}}/{{table}}', '{{replica}}'" in local[0]
        assert f"Distributed(`fleetscope`, `fleetscope`, `{t.name}_local`, " in dist[0]
        assert out.index(local[0]) < out.index(dist[0])
    mvs = [s for s in out if s.startswith("CREATE MATERIALIZED VIEW")]
    assert len(mvs) == len(views)
    for mv in mvs:
        target = re.search(r" TO `([^`]+)`", mv).group(1)
        sources = re.findall(r"\bFROM `([^`]+)`", mv)
        assert target.endswith(LOCAL_SUFFIX) and sources and all(s.endswith(LOCAL_SUFFIX) for s in sources), mv[:120]
    # a backfill runs once, from one node, into the Distributed table of an aggregating
    # table: running it again (a re-run, a racing replica) merges to the same states
    engines = {t.name: t.engine for t in tables}
    backfills = [s for s in out if s.startswith("INSERT INTO ")]
    for s in backfills:
        target = re.match(r"INSERT INTO `([^`]+)` SELECT ", s).group(1)
        assert engines.get(target) == "AggregatingMergeTree" and " ON CLUSTER " not in s, s[:120]
    ddl_out = [s for s in out if s not in backfills]
    assert all(" ON CLUSTER `fleetscope`" in s for s in ddl_out)
    # idempotent: a re-run or a racing replica is safe (re-setting a view's query is a no-op)
    assert all("IF NOT EXISTS" in s or re.search(r"_mv` ON CLUSTER `fleetscope` MODIFY QUERY ", s) for s in ddl_out)
    assert "non_replicated_deduplication_window" not in text and "replicated_deduplication_window" in text


def test_rollup_rows_of_one_rank_share_a_shard_with_its_raw_rows():
    """FINAL over the Distributed rollup is exact only if each rollup key lives on one shard."""
    by_name = {t.name: t for t in map(parse_create_table, all_single_node()) if t is not None}
    rank_key = "cityHash64(toString(`job`), toInt64(`rank`))"
    for name in ("sections", "collectives", "steps", "inflight", "step_rollup"):
        assert sharding_key(by_name[name]) == rank_key, name
    assert sharding_key(by_name["heartbeats"]) == "cityHash64(toString(`host`))"  # host-keyed
    assert sharding_key(by_name["ingest_batches"]) == "cityHash64(toString(`batch`))"


def test_renderer_is_generic_over_new_tables_views_and_alters():
    """What a later migration may add: a rollup table and its view, column changes, drops."""
    new = [
        "CREATE TABLE IF NOT EXISTS group_progress (job LowCardinality(String), group_id String, "
        "seq Int64, last_ns SimpleAggregateFunction(max, Int64)) ENGINE = AggregatingMergeTree "
        "ORDER BY (job, group_id, seq) SETTINGS non_replicated_deduplication_window = 100",
        "CREATE MATERIALIZED VIEW IF NOT EXISTS group_progress_mv TO group_progress AS "
        "SELECT c.job, c.group_id, c.seq, max(c.completed_ns) AS last_ns FROM collectives AS c "
        "JOIN steps AS s ON s.job = c.job WHERE c.name != 'FROM steps' GROUP BY c.job, c.group_id, c.seq",
        "ALTER TABLE sections ADD COLUMN IF NOT EXISTS stream Int32 DEFAULT 0",
        "ALTER TABLE sections MODIFY SETTING ttl_only_drop_parts = 1",
        "ALTER TABLE group_progress_mv MODIFY QUERY SELECT job, group_id, seq, max(completed_ns) AS last_ns "
        "FROM collectives GROUP BY job, group_id, seq",
        "DROP VIEW IF EXISTS group_progress_mv",
        "DROP TABLE IF EXISTS group_progress",
        "INSERT INTO group_progress SELECT job, group_id, seq, max(completed_ns) FROM collectives GROUP BY 1, 2, 3",
    ]
    r = Renderer.for_statements(CLUSTER, all_single_node())
    out = [r.render(s) for s in new]
    assert out[0][0].startswith("CREATE TABLE IF NOT EXISTS `group_progress_local` ON CLUSTER `fleetscope`")
    assert "ReplicatedAggregatingMergeTree(" in out[0][0] and "replicated_deduplication_window = 100" in out[0][0]
    assert "cityHash64(toString(`job`))" in out[0][1]  # no rank column: sharded by job
    mv = out[1][0]
    assert "TO `group_progress_local`" in mv and "FROM `collectives_local` AS c" in mv and "JOIN `steps_local` AS s" in mv
    assert "'FROM steps'" in mv  # never rewritten inside a string
    assert out[2] == ["ALTER TABLE `sections_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS stream Int32 DEFAULT 0",
                      "ALTER TABLE `sections` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS stream Int32 DEFAULT 0"]
    assert out[3] == ["ALTER TABLE `sections_local` ON CLUSTER `fleetscope` MODIFY SETTING ttl_only_drop_parts = 1"]
    assert "FROM `collectives_local`" in out[4][0] and "ON CLUSTER" in out[4][0]
    assert out[5] == ["DROP VIEW IF EXISTS `group_progress_mv` ON CLUSTER `fleetscope`"]
    assert out[6] == ["DROP TABLE IF EXISTS `group_progress` ON CLUSTER `fleetscope`",
                      "DROP TABLE IF EXISTS `group_progress_local` ON CLUSTER `fleetscope`"]
    assert out[7] == [new[7]]  # through the Distributed tables, as written
    for bad, says in [("CREATE TABLE t (a Int32) ENGINE = Memory", "Memory"),
                      ("CREATE DICTIONARY d (k UInt64) PRIMARY KEY k SOURCE(NULL()) LAYOUT(FLAT()) LIFETIME(0)",
                       "no cluster rendering"),
                      ("CREATE MATERIALIZED VIEW v TO nowhere AS SELECT 1", "nowhere")]:  # fmt: skip
        with pytest.raises(ClusterDDLError, match=says):
            r.render(bad)


def test_store_url_names_the_cluster():
    u = parse_store_url("http://fs:pw@ch-1:8123/fleetscope?cluster=fleetscope")
    assert (u.cluster, u.database, u.cluster_spec()) == ("fleetscope", "fleetscope", CLUSTER)
    assert u.redacted() == "http://fs:***@ch-1:8123/fleetscope?cluster=fleetscope"
    assert parse_store_url("http://ch-1:8123/fleetscope").cluster_spec() is None
    for bad, says in [("http://h/db?cluster=", "bad cluster name"), ("http://h/db?cluster=a;DROP", "bad cluster name"),
                      ("http://u:pw@h/db?replicas=2", "unknown option"), ("chdb:///x?cluster=c", "no query string")]:
        with pytest.raises(StoreURLError, match=says) as e:
            parse_store_url(bad)
        assert "pw" not in str(e.value)


# ---- ClickHouse itself: the parser, and the local parts on two simulated shards ----------------
_PATHS: dict[int, str] = {}


def chdb_path(client) -> str:
    return _PATHS[id(client)]


@pytest.fixture(scope="module")
def chdb_client(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cluster-chdb"))
    client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
    _PATHS[id(client)] = path
    yield client
    client.close()


def test_every_rendered_statement_parses_in_clickhouse(chdb_client):
    out = [s for text in rendered().values() for s in text.split(";\n\n")]
    for stmt in out:
        stmt = stmt.strip().rstrip(";")
        formatted = chdb_client.query("SELECT formatQuery({q:String})", parameters={"q": stmt}).result_rows[0][0]
        assert "ON CLUSTER fleetscope" in formatted or stmt.startswith("INSERT"), formatted[:200]


def localize(stmt: str, shard: str) -> str | None:
    """A rendered statement for one shard database of a single chDB (None: the Distributed table).

    Only Keeper and the network are taken out: ``ON CLUSTER`` and the Replicated engines'
    Keeper path and replica name; the statements are otherwise the rendered ones.
    """
    distributed_alter = re.match(r"ALTER TABLE `\w+` ON CLUSTER", stmt) and not re.match(
        r"ALTER TABLE `\w+(?:_local|_mv)`", stmt)
    if stmt.startswith("INSERT "):
        return None  # a backfill reads and writes the Distributed tables (the shards start empty)
    if "ENGINE = Distributed(" in stmt or distributed_alter:
        return None  # the Distributed table (or a change of its columns): a Merge table stands in
    s = stmt.replace(" ON CLUSTER `fleetscope`", "")
    s = re.sub(r"Replicated(\w*MergeTree)\('[^']*', '[^']*'(?:, )?", r"\1(", s)
    s = s.replace("replicated_deduplication_window", "non_replicated_deduplication_window")
    s = re.sub(r"`(\w+(?:_local|_mv))`", rf"`{shard}`.`\1`", s)
    return s


def stand_in(stmt: str) -> str | None:
    """The Distributed table as a Merge table over every shard's local table (reads only)."""
    m = re.match(r"CREATE TABLE IF NOT EXISTS `(\w+)` ON CLUSTER `fleetscope` AS `(\w+)`\nENGINE = Distributed\(", stmt)
    if not m:
        return None
    name, local = m.groups()
    return (f"CREATE TABLE IF NOT EXISTS `dist`.`{name}` AS `{SHARDS[0]}`.`{local}` "
            f"ENGINE = Merge(REGEXP('^shard[12]$'), '^{local}$')")  # fmt: skip


def synth_tables() -> dict[str, pa.Table]:
    frames = SynthJob(num_steps=8, job="cl", t0_ns=time.time_ns() - 60 * 10**9).build()  # inside the TTL
    out = {}
    for name, df in frames.items():
        if name not in RECORD_TYPES or df.empty:
            continue
        rows = df.to_dict("records")
        for r in rows:
            r.pop("loss", None)
        t = codec.rows_to_table(RECORD_TYPES[name], rows)
        out[name] = t.append_column(BATCH_COLUMN, pa.array([f"b-{name}"] * t.num_rows, pa.string()))
    # in-flight samples, three per rank, the newest one different per rank
    t0 = time.time_ns() - 30 * 10**9
    inflight = [{"job": "cl", "attempt": 0, "rank": r, "host": f"h{r // 4}", "ts_ns": t0 + k * 10**9 + r,
                 "step": 7, "kind": "collective" if k < 2 else "section", "op": "all_reduce" if k < 2 else f"s{r}",
                 "group_id": f"tp.g{r // 2}", "axis": "tp", "seq": 10 + k, "peer": -1, "since_ns": t0 - r}
                for r in range(8) for k in (2, 0, 1)]
    t = codec.rows_to_table(RECORD_TYPES["inflight"], inflight)
    out["inflight"] = t.append_column(BATCH_COLUMN, pa.array(["b-inflight"] * t.num_rows, pa.string()))
    # heartbeats (sharded by host, their state by job and rank): rank 5 dies at the last one
    beats = [{"ts_ns": t0 + k * 2 * 10**9, "job": "cl", "host": f"h{r // 4}", "rank": r, "local_rank": r % 4,
              "pid": 100 + r, "alive": int(not (r == 5 and k == 2)), "last_step": 5 + k,
              "acked_through_ns": t0 + k * 2 * 10**9 - 10**9 if r % 2 else -1}
             for r in range(-1, 8) for k in range(3)]
    t = codec.rows_to_table(RECORD_TYPES["heartbeats"], beats)
    out["heartbeats"] = t.append_column(BATCH_COLUMN, pa.array(["b-heartbeats"] * t.num_rows, pa.string()))
    return out


def t0_of(tables: dict[str, pa.Table]) -> int:
    """The first heartbeat time of :func:`synth_tables`."""
    return int(pc.min(tables["heartbeats"].column("ts_ns")).as_py())


def test_the_cluster_schema_on_two_shards_answers_like_one_node(chdb_client):
    c = chdb_client
    for db in (*SHARDS, "dist", "stage"):
        c.command(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    stmts = [s for m in MIGRATIONS for s in statements_of(m, TTL_DAYS, CLUSTER)]
    keys = {}
    for shard in SHARDS:
        for s in stmts:
            local = localize(s, shard)
            if local is not None:
                c.command(local)
    for s in stmts:
        d = stand_in(s)
        if d is not None:
            c.command(d)
            keys[re.search(r"`dist`\.`(\w+)`", d).group(1)] = re.search(r", (cityHash64\(.*\)|rand\(\))\)$", s).group(1)
    tables = synth_tables()
    for name, t in tables.items():  # route each row as the Distributed table would: key % 2 shards
        c.command(f"CREATE TABLE `stage`.`{name}` AS `{SHARDS[0]}`.`{name}_local` ENGINE = MergeTree ORDER BY tuple()")
        c.insert_arrow(f"stage.{name}", t)
        for i, shard in enumerate(SHARDS):
            c.command(f"INSERT INTO `{shard}`.`{name}_local` SELECT * FROM `stage`.`{name}` WHERE {keys[name]} % 2 = {i}")
    per_shard = [c.command(f"SELECT count() FROM `{s}`.`step_rollup_local`") for s in SHARDS]
    assert all(n > 0 for n in per_shard)  # the views fired on both shards, into the local rollups

    # one chDB engine per process: the single-node schema goes into a database of the same one
    c.command("CREATE DATABASE IF NOT EXISTS `single`")
    path = chdb_path(c)
    single = Store(StoreURL("chdb", path=path), clickhouse_connect.get_client(dsn=f"chdb://{path}", database="single"))
    cluster = Store(StoreURL("chdb", path=path), clickhouse_connect.get_client(dsn=f"chdb://{path}", database="dist"))
    try:
        assert migrate(single.client, TTL_DAYS) == [m.version for m in MIGRATIONS]  # the product's migrations
        for name, t in tables.items():
            single.insert_arrow(name, t)
        world = 8
        for store in (single, cluster):
            assert queries.latest_attempt(store, "cl") == 0
        a = queries.step_breakdown(single, "cl", 0, 0, 7, [], 10_000)
        b = queries.step_breakdown(cluster, "cl", 0, 0, 7, [], 10_000)
        assert len(a) == 8 * world and a["compute_ns"].sum() > 0
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)
        sa = view_queries.rank_scores(single, "cl", 0, world, 0, 7).sort_values("rank").reset_index(drop=True)
        sb = view_queries.rank_scores(cluster, "cl", 0, world, 0, 7).sort_values("rank").reset_index(drop=True)
        assert len(sa) == world
        pd.testing.assert_frame_equal(sa, sb, check_dtype=False)  # FINAL per shard == FINAL on one node
        ia, ib = (view_queries.latest_inflight(s, "cl", 0).sort_values("rank").reset_index(drop=True)
                  for s in (single, cluster))  # each rank's newest in-flight row, kept at insert time
        assert len(ia) == world and list(ia["if_op"]) == [f"s{r}" for r in range(world)]
        assert list(ia["if_seq"]) == [12] * world
        pd.testing.assert_frame_equal(ia, ib, check_dtype=False)
        p = {"job": "cl", "hosts": ["h0", "h1"], "since_ns": 0}
        ha, hb = (loader._df(s, loader.HEARTBEATS_NEWEST, p).sort_values(["rank", "host"]).reset_index(drop=True)
                  for s in (single, cluster))  # each rank process's heartbeat state, kept at insert time
        assert len(ha) == world + 1 and list(ha.loc[ha["rank"] == 5, "alive"]) == [0]
        assert list(ha.loc[ha["rank"] == 3, "acked_through_ns"]) == [t0_of(tables) + 3 * 10**9]
        pd.testing.assert_frame_equal(ha, hb, check_dtype=False)
        p = {"job": "cl", "attempt": 0, "from_step": 0}
        key = ["src", "rank", "group_id"]
        pa_, pb_, raw = (s.query_df(q, p).sort_values(key).reset_index(drop=True) for s, q in (
            (single, loader.PROGRESS_NEWEST), (cluster, loader.PROGRESS_NEWEST), (single, loader.RECENT_WORK)))
        assert set(pa_["src"]) == {0, 1} and set(pa_.loc[pa_["src"] == 1, "rank"]) == set(range(world))
        pd.testing.assert_frame_equal(pa_, pb_, check_dtype=False)  # each rank's newest work, kept at insert time
        pd.testing.assert_frame_equal(pa_, raw[pa_.columns], check_dtype=False)
        got = queries.written_batches(cluster.client, [f"b-{n}" for n in tables])
        assert got == queries.written_batches(single.client, [f"b-{n}" for n in tables]) == {
            (f"b-{n}", n) for n in tables}
    finally:
        single.close()
        cluster.close()
