ALTER TABLE `heartbeats_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `acked_through_ns` Int64 DEFAULT -1 AFTER `inflight_op`;

ALTER TABLE `heartbeats` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `acked_through_ns` Int64 DEFAULT -1 AFTER `inflight_op`;
