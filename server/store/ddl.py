"""ClickHouse DDL derived from :mod:`fleetscope.schema` (never written by hand).

Every record type becomes one MergeTree table named after it:

* columns and types from the record type (``CLICKHOUSE_TYPES``), plus the hidden
  ``_batch`` column (the ingest batch id, see :mod:`fleetscope.collector.writer`);
* ``ORDER BY`` the record type's ``order_by`` (the hot query prefix);
* ``PARTITION BY`` the day of the record type's ``time_column``;
* ``TTL`` ``ttl_days`` after that time (``0`` disables it);
* ``non_replicated_deduplication_window`` so ``insert_deduplication_token`` works.

Derived objects: ``ingest_batches`` (which batch wrote which table, fed by one
materialized view per table) and ``step_rollup`` (per job, attempt, step, rank: section
time by kind, collective time by axis, step duration), fed by materialized views from
``sections``, ``collectives`` and ``steps`` so the heat map and the step breakdown
never scan raw events.

A rank's communication time in a step is the *union* of its ops' intervals, not their
sum: overlapping async ops (the paired ``isend`` + ``irecv`` of a 1F1B exchange) wait
once, not twice. A view sees one insert block at a time, and the ops of one rank-step
may arrive in several blocks (an agent ships every half second), so (schema version 2)
the collectives view adds, per rank-step of a block, plain columns only:

* ``comm_union_ns``: the union of the block's op intervals, minus its overlap with the
  *edges* already stored for that rank-step (looked up by key in ``step_rollup`` while
  the block is inserted: a few granules);
* ``comm_edges_hi`` (``max`` of a tuple): the block's edges ``(first start, first end,
  last start, last end)``, the earliest and the latest disjoint segment of its union, so
  the rollup keeps the edges of the latest-starting block;
* ``comm_union_ops``: the ops counted.

So communication reads back as ``sum(comm_union_ns)`` (:func:`comm_union_sql`), as
cheap as the plain sum. It is exact when a rank-step's blocks arrive in time order and
ops of different blocks overlap only at the edges of consecutive blocks (a flush that
splits a pair of async ops in flight together), whatever the number of blocks; in any
other case an upper bound: each block subtracts only what an earlier block covers, so
the value is never below the true union, and never above the plain sum (so it is for
a rank-step split between two blocks of *one* insert, which do not see each other's
rows; ClickHouse squashes an insert into blocks of about a million rows). A rank-step
whose ops the union does not all cover (rows written before version 2) reads the plain
sum ``comm_ns``, which stays what it was.
"""

from __future__ import annotations

from typing import Final

from fleetscope.schema import CLICKHOUSE_TYPES, RECORD_TYPES, RecordType

BATCH_COLUMN: Final = "_batch"
"""Hidden column holding the ingest batch id (Idempotency-Key) of every row."""
BATCHES_TABLE: Final = "ingest_batches"
ROLLUP_TABLE: Final = "step_rollup"
DEDUP_WINDOW: Final = 10_000
"""Blocks remembered per table for ``insert_deduplication_token``."""

ROLLUP_SUM_COLUMNS: Final = (
    "compute_ns",
    "dataloader_ns",
    "optimizer_ns",
    "other_ns",
    "comm_ns",
    "comm_dp_ns",
    "comm_tp_ns",
    "comm_pp_ns",
    "comm_world_ns",
    "num_collectives",
    "num_sections",
)
"""Additive per-rank-per-step counters of ``step_rollup``."""

_EDGES = "Tuple(Int64, Int64, Int64, Int64)"
_I64_MAX = "9223372036854775807"
COMM_UNION_COLUMNS: Final = (
    ("comm_union_ns", "SimpleAggregateFunction(sum, Int64)"),
    ("comm_edges_hi", f"SimpleAggregateFunction(max, {_EDGES})"),
    ("comm_union_ops", "SimpleAggregateFunction(sum, Int64)"),
)
"""(name, type) of the ``step_rollup`` columns (schema version 2) that give communication
as the union of a rank-step's op intervals (see the module docstring). Rows of the
sections and steps views leave the edges at ``(0, 0, 0, 0)``, which never wins the
``max`` and overlaps nothing (times are positive)."""


def _seconds(col: str) -> str:
    return f"toDateTime(intDiv({col}, 1000000000))"


def _settings() -> str:
    return f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"


def ttl_clause(rt: RecordType, ttl_days: int) -> str:
    """The TTL expression of a record table ("" when ``ttl_days`` is 0)."""
    if ttl_days <= 0:
        return ""
    return f"TTL {_seconds(rt.time_column)} + toIntervalDay({int(ttl_days)})"


def column_defs(rt: RecordType, version: int = 1) -> list[tuple[str, str]]:
    """(name, ClickHouse type) of every column a table of store schema ``version`` was
    created with, the hidden one last (later columns come by ``ALTER``:
    :func:`added_columns`)."""
    cols = [(c.name, CLICKHOUSE_TYPES[c.type]) for c in rt.columns if c.since <= version]
    return cols + [(BATCH_COLUMN, "LowCardinality(String)")]


def added_columns(version: int) -> list[str]:
    """``ALTER TABLE ... ADD COLUMN`` of every record column that store schema ``version``
    adds, with its default (what the rows written before it read), in its place in the
    schema (before the hidden batch column, as a table created today has it)."""
    return [f"ALTER TABLE `{rt.name}` ADD COLUMN IF NOT EXISTS `{c.name}` {CLICKHOUSE_TYPES[c.type]} "
            f"DEFAULT {c.default!r} AFTER `{rt.columns[i - 1].name}`"
            for rt in RECORD_TYPES.values() for i, c in enumerate(rt.columns) if c.since == version]


def create_record_table(rt: RecordType, ttl_days: int) -> str:
    cols = ",\n  ".join(f"`{n}` {t}" for n, t in column_defs(rt))
    order = ", ".join(f"`{c}`" for c in rt.order_by)
    return (
        f"CREATE TABLE IF NOT EXISTS `{rt.name}` (\n  {cols}\n) ENGINE = MergeTree\n"
        f"PARTITION BY toDate({_seconds(rt.time_column)})\n"
        f"ORDER BY ({order})\n{ttl_clause(rt, ttl_days)}\n{_settings()}"
    )


def create_batches_table() -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS `{BATCHES_TABLE}` (\n"
        "  `batch` String,\n  `table` LowCardinality(String),\n  `rows` UInt64,\n"
        "  `written_at` DateTime DEFAULT now()\n"
        ") ENGINE = ReplacingMergeTree\nORDER BY (`batch`, `table`)\n"
        "TTL written_at + toIntervalDay(30)\n" + _settings()
    )


def create_batches_view(rt: RecordType) -> str:
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{BATCHES_TABLE}_{rt.name}_mv` "
        f"TO `{BATCHES_TABLE}` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS\n"
        f"SELECT `{BATCH_COLUMN}` AS batch, '{rt.name}' AS `table`, count() AS rows "
        f"FROM `{rt.name}` GROUP BY `{BATCH_COLUMN}`"
    )


def create_rollup_table(ttl_days: int) -> str:
    sums = ",\n  ".join(f"`{c}` SimpleAggregateFunction(sum, Int64)" for c in ROLLUP_SUM_COLUMNS)
    ttl = f"TTL {_seconds('day_ns')} + toIntervalDay({int(ttl_days)})\n" if ttl_days > 0 else ""
    return (
        f"CREATE TABLE IF NOT EXISTS `{ROLLUP_TABLE}` (\n"
        "  `job` LowCardinality(String),\n  `attempt` Int32,\n  `step` Int64,\n  `rank` Int32,\n"
        "  `day_ns` SimpleAggregateFunction(max, Int64),\n"
        f"  {sums},\n"
        "  `step_start_ns` SimpleAggregateFunction(min, Int64),\n"
        "  `step_end_ns` SimpleAggregateFunction(max, Int64),\n"
        "  `step_ns` SimpleAggregateFunction(max, Int64)\n"
        ") ENGINE = AggregatingMergeTree\n"
        "PARTITION BY toDate(toDateTime(intDiv(day_ns, 1000000000)))\n"
        "ORDER BY (`job`, `attempt`, `step`, `rank`)\n" + ttl + _settings()
    )


_ROLLUP_COLUMNS = (
    "job LowCardinality(String), attempt Int32, step Int64, rank Int32, day_ns Int64, "
    + ", ".join(f"{c} Int64" for c in ROLLUP_SUM_COLUMNS)
    + ", step_start_ns Int64, step_end_ns Int64, step_ns Int64"
)


def _rollup_view(name: str, source: str, values: dict[str, str], time_col: str) -> str:
    cols = []
    for c in ROLLUP_SUM_COLUMNS:
        cols.append(f"toInt64({values.get(c, '0')}) AS {c}")
    # No step marker yet: neutral values for min/max so a later marker wins.
    cols.append(f"toInt64({values.get('step_start_ns', '9223372036854775807')}) AS step_start_ns")
    cols.append(f"toInt64({values.get('step_end_ns', '0')}) AS step_end_ns")
    cols.append(f"toInt64({values.get('step_ns', '0')}) AS step_ns")
    select = ", ".join(cols)
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{ROLLUP_TABLE}_{name}_mv` TO `{ROLLUP_TABLE}` "
        f"({_ROLLUP_COLUMNS}) AS\n"
        f"SELECT job, attempt, step, rank, max({time_col}) AS day_ns, {select}\n"
        f"FROM `{source}` WHERE rank >= 0 GROUP BY job, attempt, step, rank"
    )


def rollup_views() -> list[str]:
    """Materialized views feeding ``step_rollup`` from sections, collectives and steps."""
    dur = "if(duration_ns > 0, duration_ns, 0)"
    sections = {
        "compute_ns": f"sumIf({dur}, kind = 'compute')",
        "dataloader_ns": f"sumIf({dur}, kind = 'dataloader')",
        "optimizer_ns": f"sumIf({dur}, kind = 'optimizer')",
        "other_ns": f"sumIf({dur}, kind NOT IN ('compute', 'dataloader', 'optimizer'))",
        "num_sections": "count()",
    }
    collectives = {
        "comm_ns": f"sum({dur})",
        "comm_dp_ns": f"sumIf({dur}, axis = 'dp')",
        "comm_tp_ns": f"sumIf({dur}, axis = 'tp')",
        "comm_pp_ns": f"sumIf({dur}, axis = 'pp')",
        "comm_world_ns": f"sumIf({dur}, axis NOT IN ('dp', 'tp', 'pp'))",
        "num_collectives": "count()",
    }
    steps = {
        "step_start_ns": "min(start_ns)",
        "step_end_ns": "max(end_ns)",
        "step_ns": f"max({dur})",
    }
    return [
        _rollup_view("sections", "sections", sections, "start_ns"),
        _rollup_view("collectives", "collectives", collectives, "enqueued_ns"),
        _rollup_view("steps", "steps", steps, "start_ns"),
    ]


_EDGE_FOLD = (
    # One pass over the block's intervals sorted by start ("max of running end"):
    # (covered end, union length, number of disjoint segments, end of the first
    # segment, start of the last one).
    "arrayFold((acc, x) -> if(acc.3 = 0 OR x.1 > acc.1, "
    "(x.2, acc.2 + (x.2 - x.1), acc.3 + 1, if(acc.3 = 1, acc.1, acc.4), x.1), "
    "(greatest(acc.1, x.2), acc.2 + greatest(x.2 - acc.1, 0), acc.3, acc.4, acc.5)), "
    "iv, (toInt64(0), toInt64(0), toInt64(0), toInt64(0), toInt64(0)))"
)


def _edges_overlap(a: str, b: str) -> str:
    """Overlap (ns) of two blocks' edges: the sum over their segment pairs (the segments
    of one block are disjoint, so the pairs' intersections are too)."""
    segs = ((1, 2), (3, 4))
    return " + ".join(
        f"greatest(least({a}.{e1}, {b}.{e2}) - greatest({a}.{s1}, {b}.{s2}), 0)"
        for s1, e1 in segs for s2, e2 in segs
    )


def collectives_rollup_query() -> str:
    """The ``SELECT`` of the collectives view since schema version 2: the v1 columns plus
    :data:`COMM_UNION_COLUMNS`, per (job, attempt, step, rank) of one insert block.

    ``collectives`` in it is the inserted block (subqueries included); ``step_rollup``
    is the stored table, read for the block's keys only (its primary key).
    """
    dur = "if(duration_ns > 0, duration_ns, 0)"
    sums = {
        "comm_ns": f"sum({dur})",
        "comm_dp_ns": f"sumIf({dur}, axis = 'dp')",
        "comm_tp_ns": f"sumIf({dur}, axis = 'tp')",
        "comm_pp_ns": f"sumIf({dur}, axis = 'pp')",
        "comm_world_ns": f"sumIf({dur}, axis NOT IN ('dp', 'tp', 'pp'))",
        "num_collectives": "count()",
    }
    inner = ", ".join(f"toInt64({sums.get(c, '0')}) AS {c}" for c in ROLLUP_SUM_COLUMNS)
    outer = ", ".join(f"b.{c} AS {c}" for c in ROLLUP_SUM_COLUMNS)
    # a one-segment block: its last edge is empty ([end, end]), so it is not counted twice
    edges = "if(f.3 = 0, (0, 0, 0, 0), (iv[1].1, if(f.3 = 1, f.1, f.4), if(f.3 = 1, f.1, f.5), f.1))"
    key = "job, attempt, step, rank"
    on = " AND ".join(f"b.{k} = p.{k}" for k in key.split(", "))
    return (
        f"SELECT b.job AS job, b.attempt AS attempt, b.step AS step, b.rank AS rank, b.day_ns AS day_ns, {outer}, "
        f"toInt64({_I64_MAX}) AS step_start_ns, toInt64(0) AS step_end_ns, toInt64(0) AS step_ns, "
        f"toInt64(b.union_ns - ({_edges_overlap('p.prev_edges', 'b.edges')})) AS comm_union_ns, "
        "b.edges AS comm_edges_hi, b.num_collectives AS comm_union_ops\n"
        f"FROM (SELECT {key}, max(enqueued_ns) AS day_ns, {inner}, "
        "arraySort(groupArrayIf((enqueued_ns, enqueued_ns + duration_ns), duration_ns > 0)) AS iv, "
        f"{_EDGE_FOLD} AS f, toInt64(f.2) AS union_ns, CAST({edges}, '{_EDGES}') AS edges\n"
        f"      FROM `collectives` WHERE rank >= 0 GROUP BY {key}) AS b\n"
        f"LEFT JOIN (SELECT {key}, max(comm_edges_hi) AS prev_edges FROM `{ROLLUP_TABLE}`\n"
        f"           WHERE ({key}) IN (SELECT {key} FROM `collectives` WHERE rank >= 0)\n"
        f"           GROUP BY {key}) AS p ON {on}\n"
        "SETTINGS join_use_nulls = 0"
    )


def comm_union_sql(grouped: bool) -> str:
    """A rank-step's communication time (ns, Int64) as the union of its op intervals.

    Args:
        grouped: ``True`` for a query that groups rollup rows by their key again
            (aggregates of the columns of ``FROM step_rollup``, unaliased); ``False``
            for merged rows (``FINAL``).
    """
    if grouped:  # qualified: a query may alias its sums with these very names
        t = f"`{ROLLUP_TABLE}`"
        return (f"if(sum({t}.comm_union_ops) = sum({t}.num_collectives), sum({t}.comm_union_ns), "
                f"sum({t}.comm_ns))")  # fmt: skip
    return "if(comm_union_ops = num_collectives, comm_union_ns, comm_ns)"


def schema_v2_statements(ttl_days: int) -> list[str]:
    """Store schema version 2: ``step_rollup`` communication as the union of op intervals.

    Adds :data:`COMM_UNION_COLUMNS` to an existing rollup and swaps the collectives view's
    query in place (``MODIFY QUERY``: no insert falls between an old and a new view).
    Rows written before stay as they were and read as the plain sum.
    """
    del ttl_days  # no TTL of its own: the rollup's applies
    stmts = [f"ALTER TABLE `{ROLLUP_TABLE}` ADD COLUMN IF NOT EXISTS `{name}` {type_}"
             for name, type_ in COMM_UNION_COLUMNS]  # fmt: skip
    stmts.append(f"ALTER TABLE `{ROLLUP_TABLE}_collectives_mv` MODIFY QUERY {collectives_rollup_query()}")
    return stmts


INFLIGHT_LATEST_TABLE: Final = "inflight_latest"
INFLIGHT_LATEST_FIELDS: Final = ("step", "kind", "op", "group_id", "axis", "seq", "peer", "since_ns")
"""The ``inflight`` columns of each rank's newest row kept in ``inflight_latest`` (one
``argMax`` state of a tuple, so every field comes from the same row)."""
_INFLIGHT_COLUMNS = {c.name: c for c in RECORD_TYPES["inflight"].columns}
_FIELD_TYPES = tuple(CLICKHOUSE_TYPES[_INFLIGHT_COLUMNS[n].type].replace("LowCardinality(String)", "String")
                     for n in INFLIGHT_LATEST_FIELDS)
_LATEST_TUPLE = "Tuple(" + ", ".join(_FIELD_TYPES) + ")"
INFLIGHT_NEWEST_ROWS: Final = (
    f"SELECT rank, max(ts_ns) AS last_ts, argMaxMerge(latest) AS r FROM `{INFLIGHT_LATEST_TABLE}`\n"
    "WHERE job = {job:String} AND attempt = {attempt:Int32} GROUP BY rank"
)
"""Each rank's newest in-flight time (``last_ts``) and row (the tuple ``r``, fields read
with :func:`inflight_field`) of one job attempt, from ``inflight_latest``."""


def inflight_field(name: str) -> str:
    """The expression of field ``name`` of :data:`INFLIGHT_NEWEST_ROWS`' tuple ``r``."""
    return f"r.{INFLIGHT_LATEST_FIELDS.index(name) + 1}"


BACKFILL_S: Final = 3600
"""Schema version 3 fills ``inflight_latest`` from the in-flight rows of this many
seconds before the migration (the diagnosis lookback is 10 minutes)."""


def create_inflight_latest_table(ttl_days: int) -> str:
    """Each rank's newest in-flight row per job attempt (schema version 3), kept at insert
    time: what the hang pass and the job page read instead of every in-flight row of the
    job (two rows a second per rank, so the raw table grows with the job's age)."""
    ttl = f"TTL {_seconds('ts_ns')} + toIntervalDay({int(ttl_days)})\n" if ttl_days > 0 else ""
    return (
        f"CREATE TABLE IF NOT EXISTS `{INFLIGHT_LATEST_TABLE}` (\n"
        "  `job` LowCardinality(String),\n  `attempt` Int32,\n  `rank` Int32,\n"
        "  `ts_ns` SimpleAggregateFunction(max, Int64),\n"
        f"  `latest` AggregateFunction(argMax, {_LATEST_TUPLE}, Int64)\n"
        ") ENGINE = AggregatingMergeTree\n"
        "PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))\n"
        "ORDER BY (`job`, `attempt`, `rank`)\n" + ttl + _settings()
    )


def inflight_latest_query(since_s: int | None = None) -> str:
    """The ``SELECT`` that reduces in-flight rows to one state per (job, attempt, rank):
    the view's (of one insert block) or, with ``since_s``, the backfill's (of the rows of
    the last ``since_s`` seconds)."""
    fields = ", ".join(f"CAST(`{n}`, '{t}')" for n, t in zip(INFLIGHT_LATEST_FIELDS, _FIELD_TYPES))
    since = (f" WHERE ts_ns >= (toInt64(toUnixTimestamp(now())) - {int(since_s)}) * 1000000000"
             if since_s is not None else "")
    return (
        f"SELECT job, attempt, rank, max(t) AS ts_ns, argMaxState(CAST(tuple({fields}), '{_LATEST_TUPLE}'), t) AS latest\n"
        "FROM (SELECT job, attempt, rank, ts_ns AS t, "
        + ", ".join(f"`{n}`" for n in INFLIGHT_LATEST_FIELDS) + f" FROM `inflight`{since})\n"
        "GROUP BY job, attempt, rank"
    )


def schema_v3_statements(ttl_days: int) -> list[str]:
    """Store schema version 3: ``inflight_latest``, its view from ``inflight``, and a
    backfill of the last :data:`BACKFILL_S` seconds (the view and the backfill may both
    see a row inserted during the migration: ``max``/``argMax`` states merge to the same
    answer)."""
    return [
        create_inflight_latest_table(ttl_days),
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{INFLIGHT_LATEST_TABLE}_mv` TO `{INFLIGHT_LATEST_TABLE}` AS\n"
        + inflight_latest_query(),
        f"INSERT INTO `{INFLIGHT_LATEST_TABLE}` {inflight_latest_query(BACKFILL_S)}",
    ]


def schema_v4_statements(ttl_days: int) -> list[str]:
    """Store schema version 4: heartbeats say up to when each rank's records are
    acknowledged (``acked_through_ns``), so the hang pass certifies silence from what the
    store holds even when an agent's batches arrive out of order."""
    del ttl_days
    return added_columns(4)


HEARTBEATS_LATEST_TABLE: Final = "heartbeats_latest"
_NEVER: Final = "toInt64(9223372036854775807)"
_UNSAID: Final = "toInt64(-9223372036854775808)"


def create_heartbeats_latest_table(ttl_days: int) -> str:
    """Each rank process's heartbeat state (schema version 5), kept at insert time, keyed
    ``(job, rank, host, pid)``: its newest time, ``alive`` and in-flight op then, its
    first dead heartbeat (a process's death is one event: a restarted rank is a new pid),
    its newest step and the largest ``acked_through_ns`` its agent said. The hang pass and the health checks
    read these few rows per rank instead of every heartbeat of the lookback (one per rank
    every 2 s: 4.1 M rows in 10 minutes at 12,288 ranks), and the job page instead of
    every heartbeat of the job."""
    ttl = f"TTL {_seconds('ts_ns')} + toIntervalDay({int(ttl_days)})\n" if ttl_days > 0 else ""
    return (
        f"CREATE TABLE IF NOT EXISTS `{HEARTBEATS_LATEST_TABLE}` (\n"
        "  `job` LowCardinality(String),\n  `rank` Int32,\n  `host` LowCardinality(String),\n  `pid` Int32,\n"
        "  `ts_ns` SimpleAggregateFunction(max, Int64),\n"
        "  `alive` AggregateFunction(argMax, UInt8, Int64),\n"
        "  `dead_since_ns` SimpleAggregateFunction(min, Int64),\n"
        "  `last_step` SimpleAggregateFunction(max, Int64),\n"
        "  `acked_through_ns` SimpleAggregateFunction(max, Int64),\n"
        "  `inflight_op` AggregateFunction(argMax, String, Int64)\n"
        ") ENGINE = AggregatingMergeTree\n"
        "PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))\n"
        "ORDER BY (`job`, `rank`, `host`, `pid`)\n" + ttl + _settings()
    )


def heartbeats_latest_query(since_s: int | None = None) -> str:
    """The ``SELECT`` that reduces heartbeat rows to one state per (job, rank, host, pid):
    the view's (of one insert block) or, with ``since_s``, the backfill's."""
    since = (f" WHERE ts_ns >= (toInt64(toUnixTimestamp(now())) - {int(since_s)}) * 1000000000"
             if since_s is not None else "")
    return (
        "SELECT job, rank, host, pid, max(t) AS ts_ns, argMaxState(a, t) AS alive,\n"
        f"       min(if(a = 0, t, {_NEVER})) AS dead_since_ns, max(s) AS last_step,\n"
        f"       max(if(k = -1, {_UNSAID}, k)) AS acked_through_ns, argMaxState(o, t) AS inflight_op\n"
        "FROM (SELECT job, rank, host, pid, ts_ns AS t, alive AS a, last_step AS s, acked_through_ns AS k, "
        f"CAST(inflight_op, 'String') AS o FROM `heartbeats`{since})\nGROUP BY job, rank, host, pid"
    )


HEARTBEATS_NEWEST: Final = (
    "SELECT rank, host, max(t) AS last_ts, argMax(a, t) AS cur_alive, argMax(pid, t) AS cur_pid,\n"
    f"       argMax(if(d = {_NEVER}, 0, d), t) AS dead_since_ns, max(s) AS spool_last_step,\n"
    f"       if(max(k) = {_UNSAID}, -1, max(k)) AS acked_through_ns\n"
    "FROM (SELECT rank, host, pid, max(ts_ns) AS t, argMaxMerge(alive) AS a, min(dead_since_ns) AS d,\n"
    "             max(last_step) AS s, max(acked_through_ns) AS k\n"
    f"      FROM `{HEARTBEATS_LATEST_TABLE}`\n"
    "      WHERE job = {job:String} OR (rank = -1 AND has({hosts:Array(String)}, host))\n"
    "      GROUP BY rank, host, pid HAVING t >= {since_ns:Int64})\n"
    "GROUP BY rank, host"
)
"""Per (rank, host) of a job, and the job's hosts' own rows: the newest heartbeat time
(``last_ts``), ``alive`` and ``pid`` then, when that process's heartbeats first said it
was dead (0: never), its newest step and ``acked_through_ns`` (-1: not said), from
``heartbeats_latest`` (the columns of the raw-row ``HEARTBEATS_LATEST`` of the loader)."""


def schema_v5_statements(ttl_days: int) -> list[str]:
    """Store schema version 5: ``heartbeats_latest``, its view from ``heartbeats``, and a
    backfill of the last :data:`BACKFILL_S` seconds (states merge to the same answer when
    the view and the backfill both see a row)."""
    return [
        create_heartbeats_latest_table(ttl_days),
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{HEARTBEATS_LATEST_TABLE}_mv` TO `{HEARTBEATS_LATEST_TABLE}` AS\n"
        + heartbeats_latest_query(),
        f"INSERT INTO `{HEARTBEATS_LATEST_TABLE}` {heartbeats_latest_query(BACKFILL_S)}",
    ]


PROGRESS_LATEST_TABLE: Final = "progress_latest"


def create_progress_latest_table(ttl_days: int) -> str:
    """Each rank's newest work per job attempt (schema version 6), kept at insert time:
    per ``(rank, group_id)`` its highest completed sequence number, newest completion and
    newest step (``src`` 0, from ``collectives``), and per rank its newest section end
    and step (``src`` 1, ``group_id`` empty, from ``sections``). The hang pass reads
    these few rows per rank and group instead of every collective and section of the
    job's last three steps (about 100 k rows a step at 12,288 ranks)."""
    ttl = f"TTL {_seconds('ts_ns')} + toIntervalDay({int(ttl_days)})\n" if ttl_days > 0 else ""
    return (
        f"CREATE TABLE IF NOT EXISTS `{PROGRESS_LATEST_TABLE}` (\n"
        "  `job` LowCardinality(String),\n  `attempt` Int32,\n  `rank` Int32,\n  `src` UInt8,\n"
        "  `group_id` LowCardinality(String),\n"
        "  `ts_ns` SimpleAggregateFunction(max, Int64),\n"
        "  `last_seq` SimpleAggregateFunction(max, Int64),\n"
        "  `last_step` SimpleAggregateFunction(max, Int64)\n"
        ") ENGINE = AggregatingMergeTree\n"
        "PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))\n"
        "ORDER BY (`job`, `attempt`, `rank`, `src`, `group_id`)\n" + ttl + _settings()
    )


def progress_latest_queries(since_s: int | None = None) -> tuple[str, str]:
    """The two ``SELECT`` that reduce ``collectives`` and ``sections`` rows to one state per
    (job, attempt, rank, group): the views' (of one insert block) or, with ``since_s``,
    the backfill's (of the rows of the last ``since_s`` seconds)."""
    def since(col: str, joint: str) -> str:
        return ("" if since_s is None else
                f" {joint} {col} >= (toInt64(toUnixTimestamp(now())) - {int(since_s)}) * 1000000000")

    coll = (
        "SELECT job, attempt, rank, toUInt8(0) AS src, group_id, max(completed_ns) AS ts_ns,\n"
        "       max(seq) AS last_seq, max(step) AS last_step\n"
        f"FROM `collectives` WHERE state = 'completed'{since('enqueued_ns', 'AND')}\n"
        "GROUP BY job, attempt, rank, group_id"
    )
    secs = (
        "SELECT job, attempt, rank, toUInt8(1) AS src, '' AS group_id, max(end_ns) AS ts_ns,\n"
        "       toInt64(-1) AS last_seq, max(step) AS last_step\n"
        f"FROM `sections`{since('start_ns', 'WHERE')}\n"
        "GROUP BY job, attempt, rank"
    )
    return coll, secs


PROGRESS_NEWEST: Final = (
    "SELECT src, rank, toString(group_id) AS group_id, toInt64(last_seq) AS last_seq, toInt64(t) AS t\n"
    "FROM (SELECT src, rank, group_id, max(last_seq) AS last_seq, max(ts_ns) AS t, max(last_step) AS s\n"
    f"      FROM `{PROGRESS_LATEST_TABLE}` WHERE job = {{job:String}} AND attempt = {{attempt:Int32}}\n"
    "      GROUP BY src, rank, group_id HAVING s >= {from_step:Int64})"
)
"""Per rank and group of a job attempt that did work at ``from_step`` or later: the
highest completed sequence number and the newest completion (``src`` 0), and per rank
the newest section end (``src`` 1, ``last_seq`` -1), from ``progress_latest`` (the rows
of the loader's raw-row ``RECENT_WORK``: within an attempt sequence numbers, steps and
times grow together, so the maximum over the job is the maximum over its last steps)."""


def schema_v6_statements(ttl_days: int) -> list[str]:
    """Store schema version 6: ``progress_latest``, its views from ``collectives`` and
    ``sections``, and a backfill of the last :data:`BACKFILL_S` seconds (states merge to
    the same answer when a view and the backfill both see a row)."""
    coll, secs = progress_latest_queries()
    back_coll, back_secs = progress_latest_queries(BACKFILL_S)
    return [
        create_progress_latest_table(ttl_days),
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{PROGRESS_LATEST_TABLE}_collectives_mv` "
        f"TO `{PROGRESS_LATEST_TABLE}` AS\n" + coll,
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS `{PROGRESS_LATEST_TABLE}_sections_mv` "
        f"TO `{PROGRESS_LATEST_TABLE}` AS\n" + secs,
        f"INSERT INTO `{PROGRESS_LATEST_TABLE}` {back_coll}",
        f"INSERT INTO `{PROGRESS_LATEST_TABLE}` {back_secs}",
    ]


def schema_v7_statements(ttl_days: int) -> list[str]:
    """Store schema version 7: ``sections.cpu_ns``, the CPU time of the thread that ran a
    section (the hooks measure it where the device is the CPU: the CPU's counterpart of a
    CUDA event's device time, untouched by the time the rank waited for a core)."""
    del ttl_days
    return added_columns(7)


def schema_v1_statements(ttl_days: int) -> list[str]:
    """Every statement of store schema version 1, in dependency order (idempotent)."""
    stmts = [create_record_table(rt, ttl_days) for rt in RECORD_TYPES.values()]
    stmts.append(create_batches_table())
    stmts += [create_batches_view(rt) for rt in RECORD_TYPES.values()]
    stmts.append(create_rollup_table(ttl_days))
    stmts += rollup_views()
    return stmts
