ALTER TABLE `sections_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(start_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `collectives_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(enqueued_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `steps_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(start_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `inflight_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `heartbeats_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `metrics_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `log_events_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `jobs_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(7);

ALTER TABLE `probes_local` ON CLUSTER `fleetscope` MODIFY TTL toDateTime(intDiv(ts_ns, 1000000000)) + toIntervalDay(7);
