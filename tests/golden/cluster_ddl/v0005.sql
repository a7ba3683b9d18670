CREATE TABLE IF NOT EXISTS `heartbeats_latest_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `rank` Int32,
  `host` LowCardinality(String),
  `pid` Int32,
  `ts_ns` SimpleAggregateFunction(max, Int64),
  `alive` AggregateFunction(argMax, UInt8, Int64),
  `dead_since_ns` SimpleAggregateFunction(min, Int64),
  `last_step` SimpleAggregateFunction(max, Int64),
  `acked_through_ns` SimpleAggregateFunction(max, Int64),
  `inflight_op` AggregateFunction(argMax, String, Int64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`job`, `rank`, `host`, `pid`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `heartbeats_latest` ON CLUSTER `fleetscope` AS `heartbeats_latest_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `heartbeats_latest_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE MATERIALIZED VIEW IF NOT EXISTS `heartbeats_latest_mv` ON CLUSTER `fleetscope` TO `heartbeats_latest_local` AS
SELECT job, rank, host, pid, max(t) AS ts_ns, argMaxState(a, t) AS alive,
       min(if(a = 0, t, toInt64(9223372036854775807))) AS dead_since_ns, max(s) AS last_step,
       max(if(k = -1, toInt64(-9223372036854775808), k)) AS acked_through_ns, argMaxState(o, t) AS inflight_op
FROM (SELECT job, rank, host, pid, ts_ns AS t, alive AS a, last_step AS s, acked_through_ns AS k, CAST(inflight_op, 'String') AS o FROM `heartbeats_local`)
GROUP BY job, rank, host, pid;

INSERT INTO `heartbeats_latest` SELECT job, rank, host, pid, max(t) AS ts_ns, argMaxState(a, t) AS alive,
       min(if(a = 0, t, toInt64(9223372036854775807))) AS dead_since_ns, max(s) AS last_step,
       max(if(k = -1, toInt64(-9223372036854775808), k)) AS acked_through_ns, argMaxState(o, t) AS inflight_op
FROM (SELECT job, rank, host, pid, ts_ns AS t, alive AS a, last_step AS s, acked_through_ns AS k, CAST(inflight_op, 'String') AS o FROM `heartbeats` WHERE ts_ns >= (toInt64(toUnixTimestamp(now())) - 3600) * 1000000000)
GROUP BY job, rank, host, pid;
