CREATE TABLE IF NOT EXISTS `inflight_latest_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `rank` Int32,
  `ts_ns` SimpleAggregateFunction(max, Int64),
  `latest` AggregateFunction(argMax, Tuple(Int64, String, String, String, String, Int64, Int32, Int64), Int64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`job`, `attempt`, `rank`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `inflight_latest` ON CLUSTER `fleetscope` AS `inflight_latest_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `inflight_latest_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE MATERIALIZED VIEW IF NOT EXISTS `inflight_latest_mv` ON CLUSTER `fleetscope` TO `inflight_latest_local` AS
SELECT job, attempt, rank, max(t) AS ts_ns, argMaxState(CAST(tuple(CAST(`step`, 'Int64'), CAST(`kind`, 'String'), CAST(`op`, 'String'), CAST(`group_id`, 'String'), CAST(`axis`, 'String'), CAST(`seq`, 'Int64'), CAST(`peer`, 'Int32'), CAST(`since_ns`, 'Int64')), 'Tuple(Int64, String, String, String, String, Int64, Int32, Int64)'), t) AS latest
FROM (SELECT job, attempt, rank, ts_ns AS t, `step`, `kind`, `op`, `group_id`, `axis`, `seq`, `peer`, `since_ns` FROM `inflight_local`)
GROUP BY job, attempt, rank;

INSERT INTO `inflight_latest` SELECT job, attempt, rank, max(t) AS ts_ns, argMaxState(CAST(tuple(CAST(`step`, 'Int64'), CAST(`kind`, 'String'), CAST(`op`, 'String'), CAST(`group_id`, 'String'), CAST(`axis`, 'String'), CAST(`seq`, 'Int64'), CAST(`peer`, 'Int32'), CAST(`since_ns`, 'Int64')), 'Tuple(Int64, String, String, String, String, Int64, Int32, Int64)'), t) AS latest
FROM (SELECT job, attempt, rank, ts_ns AS t, `step`, `kind`, `op`, `group_id`, `axis`, `seq`, `peer`, `since_ns` FROM `inflight` WHERE ts_ns >= (toInt64(toUnixTimestamp(now())) - 3600) * 1000000000)
GROUP BY job, attempt, rank;
