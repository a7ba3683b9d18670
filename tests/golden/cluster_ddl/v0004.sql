ALTER TABLE `heartbeats_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `acked_through_ns` Int64 DEFAULT -1;

ALTER TABLE `heartbeats` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `acked_through_ns` Int64 DEFAULT -1;
