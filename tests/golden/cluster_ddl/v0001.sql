CREATE TABLE IF NOT EXISTS `sections_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `rank` Int32,
  `host` LowCardinality(String),
  `step` Int64,
  `microbatch` Int32,
  `name` LowCardinality(String),
  `kind` LowCardinality(String),
  `start_ns` Int64,
  `end_ns` Int64,
  `duration_ns` Int64,
  `device_ns` Int64,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(start_ns, 1000000000)))
ORDER BY (`job`, `step`, `rank`, `start_ns`)
TTL toDateTime(intDiv(start_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `sections` ON CLUSTER `fleetscope` AS `sections_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `sections_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE TABLE IF NOT EXISTS `collectives_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `rank` Int32,
  `host` LowCardinality(String),
  `step` Int64,
  `microbatch` Int32,
  `group_id` LowCardinality(String),
  `axis` LowCardinality(String),
  `group_rank` Int32,
  `group_size` Int32,
  `seq` Int64,
  `op` LowCardinality(String),
  `bytes` Int64,
  `dtype` LowCardinality(String),
  `peer` Int32,
  `state` LowCardinality(String),
  `enqueued_ns` Int64,
  `started_ns` Int64,
  `completed_ns` Int64,
  `duration_ns` Int64,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(enqueued_ns, 1000000000)))
ORDER BY (`job`, `step`, `rank`, `group_id`, `seq`)
TTL toDateTime(intDiv(enqueued_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `collectives` ON CLUSTER `fleetscope` AS `collectives_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `collectives_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE TABLE IF NOT EXISTS `steps_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `rank` Int32,
  `host` LowCardinality(String),
  `step` Int64,
  `start_ns` Int64,
  `end_ns` Int64,
  `duration_ns` Int64,
  `num_microbatches` Int32,
  `tokens` Int64,
  `loss` Float64,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(start_ns, 1000000000)))
ORDER BY (`job`, `step`, `rank`)
TTL toDateTime(intDiv(start_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `steps` ON CLUSTER `fleetscope` AS `steps_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `steps_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE TABLE IF NOT EXISTS `inflight_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `rank` Int32,
  `host` LowCardinality(String),
  `ts_ns` Int64,
  `step` Int64,
  `kind` LowCardinality(String),
  `op` LowCardinality(String),
  `group_id` LowCardinality(String),
  `axis` LowCardinality(String),
  `seq` Int64,
  `peer` Int32,
  `since_ns` Int64,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`job`, `rank`, `ts_ns`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `inflight` ON CLUSTER `fleetscope` AS `inflight_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `inflight_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE TABLE IF NOT EXISTS `heartbeats_local` ON CLUSTER `fleetscope` (
  `ts_ns` Int64,
  `job` LowCardinality(String),
  `host` LowCardinality(String),
  `rank` Int32,
  `local_rank` Int32,
  `ip` LowCardinality(String),
  `node` LowCardinality(String),
  `agent_version` LowCardinality(String),
  `num_gpus` Int32,
  `pid` Int32,
  `alive` UInt8,
  `last_record_ns` Int64,
  `last_step` Int64,
  `inflight_op` String,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`host`, `ts_ns`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `heartbeats` ON CLUSTER `fleetscope` AS `heartbeats_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `heartbeats_local`, cityHash64(toString(`host`)));

CREATE TABLE IF NOT EXISTS `metrics_local` ON CLUSTER `fleetscope` (
  `ts_ns` Int64,
  `job` LowCardinality(String),
  `host` LowCardinality(String),
  `rank` Int32,
  `source` LowCardinality(String),
  `device` LowCardinality(String),
  `name` LowCardinality(String),
  `value` Float64,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`host`, `source`, `name`, `ts_ns`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `metrics` ON CLUSTER `fleetscope` AS `metrics_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `metrics_local`, cityHash64(toString(`host`)));

CREATE TABLE IF NOT EXISTS `log_events_local` ON CLUSTER `fleetscope` (
  `ts_ns` Int64,
  `job` LowCardinality(String),
  `host` LowCardinality(String),
  `rank` Int32,
  `source` String,
  `kind` LowCardinality(String),
  `severity` LowCardinality(String),
  `message` String,
  `context` String,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`job`, `host`, `ts_ns`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `log_events` ON CLUSTER `fleetscope` AS `log_events_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `log_events_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE TABLE IF NOT EXISTS `jobs_local` ON CLUSTER `fleetscope` (
  `ts_ns` Int64,
  `job` LowCardinality(String),
  `attempt` Int32,
  `name` String,
  `dp` Int32,
  `tp` Int32,
  `pp` Int32,
  `order` LowCardinality(String),
  `num_microbatches` Int32,
  `model_flops_per_step` Float64,
  `device_name` LowCardinality(String),
  `device_peak_flops` Float64,
  `status` LowCardinality(String),
  `command` String,
  `versions` String,
  `host` LowCardinality(String),
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`job`, `ts_ns`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `jobs` ON CLUSTER `fleetscope` AS `jobs_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `jobs_local`, cityHash64(toString(`host`)));

CREATE TABLE IF NOT EXISTS `probes_local` ON CLUSTER `fleetscope` (
  `ts_ns` Int64,
  `job` LowCardinality(String),
  `host` LowCardinality(String),
  `device` LowCardinality(String),
  `device_model` LowCardinality(String),
  `probe` LowCardinality(String),
  `value` Float64,
  `unit` LowCardinality(String),
  `peak_fraction` Float64,
  `passed` UInt8,
  `detail` String,
  `_batch` LowCardinality(String)
) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(ts_ns, 1000000000)))
ORDER BY (`host`, `probe`, `ts_ns`)
TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `probes` ON CLUSTER `fleetscope` AS `probes_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `probes_local`, cityHash64(toString(`host`)));

CREATE TABLE IF NOT EXISTS `ingest_batches_local` ON CLUSTER `fleetscope` (
  `batch` String,
  `table` LowCardinality(String),
  `rows` UInt64,
  `written_at` DateTime DEFAULT now()
) ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
ORDER BY (`batch`, `table`)
TTL written_at + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `ingest_batches` ON CLUSTER `fleetscope` AS `ingest_batches_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `ingest_batches_local`, cityHash64(toString(`batch`)));

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_sections_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'sections' AS `table`, count() AS rows FROM `sections_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_collectives_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'collectives' AS `table`, count() AS rows FROM `collectives_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_steps_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'steps' AS `table`, count() AS rows FROM `steps_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_inflight_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'inflight' AS `table`, count() AS rows FROM `inflight_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_heartbeats_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'heartbeats' AS `table`, count() AS rows FROM `heartbeats_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_metrics_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'metrics' AS `table`, count() AS rows FROM `metrics_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_log_events_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'log_events' AS `table`, count() AS rows FROM `log_events_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_jobs_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'jobs' AS `table`, count() AS rows FROM `jobs_local` GROUP BY `_batch`;

CREATE MATERIALIZED VIEW IF NOT EXISTS `ingest_batches_probes_mv` ON CLUSTER `fleetscope` TO `ingest_batches_local` (`batch` String, `table` LowCardinality(String), `rows` UInt64) AS
SELECT `_batch` AS batch, 'probes' AS `table`, count() AS rows FROM `probes_local` GROUP BY `_batch`;

CREATE TABLE IF NOT EXISTS `step_rollup_local` ON CLUSTER `fleetscope` (
  `job` LowCardinality(String),
  `attempt` Int32,
  `step` Int64,
  `rank` Int32,
  `day_ns` SimpleAggregateFunction(max, Int64),
  `compute_ns` SimpleAggregateFunction(sum, Int64),
  `dataloader_ns` SimpleAggregateFunction(sum, Int64),
  `optimizer_ns` SimpleAggregateFunction(sum, Int64),
  `other_ns` SimpleAggregateFunction(sum, Int64),
  `comm_ns` SimpleAggregateFunction(sum, Int64),
  `comm_dp_ns` SimpleAggregateFunction(sum, Int64),
  `comm_tp_ns` SimpleAggregateFunction(sum, Int64),
  `comm_pp_ns` SimpleAggregateFunction(sum, Int64),
  `comm_world_ns` SimpleAggregateFunction(sum, Int64),
  `num_collectives` SimpleAggregateFunction(sum, Int64),
  `num_sections` SimpleAggregateFunction(sum, Int64),
  `step_start_ns` SimpleAggregateFunction(min, Int64),
  `step_end_ns` SimpleAggregateFunction(max, Int64),
  `step_ns` SimpleAggregateFunction(max, Int64)
) ENGINE = ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')
PARTITION BY toDate(toDateTime(intDiv(day_ns, 1000000000)))
ORDER BY (`job`, `attempt`, `step`, `rank`)
TTL toDateTime(intDiv(day_ns, 1000000000)) + toIntervalDay(30)
SETTINGS replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS `step_rollup` ON CLUSTER `fleetscope` AS `step_rollup_local`
ENGINE = Distributed(`fleetscope`, `fleetscope`, `step_rollup_local`, cityHash64(toString(`job`), toInt64(`rank`)));

CREATE MATERIALIZED VIEW IF NOT EXISTS `step_rollup_sections_mv` ON CLUSTER `fleetscope` TO `step_rollup_local` (job LowCardinality(String), attempt Int32, step Int64, rank Int32, day_ns Int64, compute_ns Int64, dataloader_ns Int64, optimizer_ns Int64, other_ns Int64, comm_ns Int64, comm_dp_ns Int64, comm_tp_ns Int64, comm_pp_ns Int64, comm_world_ns Int64, num_collectives Int64, num_sections Int64, step_start_ns Int64, step_end_ns Int64, step_ns Int64) AS
SELECT job, attempt, step, rank, max(start_ns) AS day_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), kind = 'compute')) AS compute_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), kind = 'dataloader')) AS dataloader_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), kind = 'optimizer')) AS optimizer_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), kind NOT IN ('compute', 'dataloader', 'optimizer'))) AS other_ns, toInt64(0) AS comm_ns, toInt64(0) AS comm_dp_ns, toInt64(0) AS comm_tp_ns, toInt64(0) AS comm_pp_ns, toInt64(0) AS comm_world_ns, toInt64(0) AS num_collectives, toInt64(count()) AS num_sections, toInt64(9223372036854775807) AS step_start_ns, toInt64(0) AS step_end_ns, toInt64(0) AS step_ns
FROM `sections_local` WHERE rank >= 0 GROUP BY job, attempt, step, rank;

CREATE MATERIALIZED VIEW IF NOT EXISTS `step_rollup_collectives_mv` ON CLUSTER `fleetscope` TO `step_rollup_local` (job LowCardinality(String), attempt Int32, step Int64, rank Int32, day_ns Int64, compute_ns Int64, dataloader_ns Int64, optimizer_ns Int64, other_ns Int64, comm_ns Int64, comm_dp_ns Int64, comm_tp_ns Int64, comm_pp_ns Int64, comm_world_ns Int64, num_collectives Int64, num_sections Int64, step_start_ns Int64, step_end_ns Int64, step_ns Int64) AS
SELECT job, attempt, step, rank, max(enqueued_ns) AS day_ns, toInt64(0) AS compute_ns, toInt64(0) AS dataloader_ns, toInt64(0) AS optimizer_ns, toInt64(0) AS other_ns, toInt64(sum(if(duration_ns > 0, duration_ns, 0))) AS comm_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'dp')) AS comm_dp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'tp')) AS comm_tp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'pp')) AS comm_pp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis NOT IN ('dp', 'tp', 'pp'))) AS comm_world_ns, toInt64(count()) AS num_collectives, toInt64(0) AS num_sections, toInt64(9223372036854775807) AS step_start_ns, toInt64(0) AS step_end_ns, toInt64(0) AS step_ns
FROM `collectives_local` WHERE rank >= 0 GROUP BY job, attempt, step, rank;

CREATE MATERIALIZED VIEW IF NOT EXISTS `step_rollup_steps_mv` ON CLUSTER `fleetscope` TO `step_rollup_local` (job LowCardinality(String), attempt Int32, step Int64, rank Int32, day_ns Int64, compute_ns Int64, dataloader_ns Int64, optimizer_ns Int64, other_ns Int64, comm_ns Int64, comm_dp_ns Int64, comm_tp_ns Int64, comm_pp_ns Int64, comm_world_ns Int64, num_collectives Int64, num_sections Int64, step_start_ns Int64, step_end_ns Int64, step_ns Int64) AS
SELECT job, attempt, step, rank, max(start_ns) AS day_ns, toInt64(0) AS compute_ns, toInt64(0) AS dataloader_ns, toInt64(0) AS optimizer_ns, toInt64(0) AS other_ns, toInt64(0) AS comm_ns, toInt64(0) AS comm_dp_ns, toInt64(0) AS comm_tp_ns, toInt64(0) AS comm_pp_ns, toInt64(0) AS comm_world_ns, toInt64(0) AS num_collectives, toInt64(0) AS num_sections, toInt64(min(start_ns)) AS step_start_ns, toInt64(max(end_ns)) AS step_end_ns, toInt64(max(if(duration_ns > 0, duration_ns, 0))) AS step_ns
FROM `steps_local` WHERE rank >= 0 GROUP BY job, attempt, step, rank;
