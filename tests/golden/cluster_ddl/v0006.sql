CREATE TABLE IF NOT EXISTS `progress_latest_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `rank` Int32,
  `src` UInt8,
  `group_id` LowCardinality(String),
  `ts_ns` SimpleAggregateFunction(max, Int64),
  `last_seq` SimpleAggregateFunction(max, Int64),
  `last_step` SimpleAggregateFunction(max, Int64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`job`, `attempt`, `rank`, `src`, `group_id`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `progress_latest` ON CLUSTER `fleetscope` AS `progress_latest_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `progress_latest_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE MATERIALIZED VIEW IF NOT EXISTS `progress_latest_collectives_mv` ON CLUSTER `fleetscope` TO `progress_latest_local` AS
SELECT job, attempt, rank, toUInt8(0) AS src, group_id, max(completed_ns) AS ts_ns,
       max(seq) AS last_seq, max(step) AS last_step
FROM `collectives_local` WHERE state = 'completed'
GROUP BY job, attempt, rank, group_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS `progress_latest_sections_mv` ON CLUSTER `fleetscope` TO `progress_latest_local` AS
SELECT job, attempt, rank, toUInt8(1) AS src, '' AS group_id, max(end_ns) AS ts_ns,
       toInt64(-1) AS last_seq, max(step) AS last_step
FROM `sections_local`
GROUP BY job, attempt, rank;

INSERT INTO `progress_latest` SELECT job, attempt, rank, toUInt8(0) AS src, group_id, max(completed_ns) AS ts_ns,
       max(seq) AS last_seq, max(step) AS last_step
FROM `collectives` WHERE state = 'completed' AND enqueued_ns >= (toInt64(toUnixTimestamp(now())) - 3600) * 1000000000
GROUP BY job, attempt, rank, group_id;

INSERT INTO `progress_latest` SELECT job, attempt, rank, toUInt8(1) AS src, '' AS group_id, max(end_ns) AS ts_ns,
       toInt64(-1) AS last_seq, max(step) AS last_step
FROM `sections` WHERE start_ns >= (toInt64(toUnixTimestamp(now())) - 3600) * 1000000000
GROUP BY job, attempt, rank;
