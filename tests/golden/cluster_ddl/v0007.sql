ALTER TABLE `sections_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `cpu_ns` Int64 DEFAULT -1 AFTER `device_ns`;

ALTER TABLE `sections` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `cpu_ns` Int64 DEFAULT -1 AFTER `device_ns`;
