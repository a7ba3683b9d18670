ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ns` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ns` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_blocks` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_blocks` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_edges_lo` SimpleAggregateFunction(min, Tuple(Int64, Int64, Int64, Int64)) DEFAULT (9223372036854775807, 9223372036854775807, 9223372036854775807, 9223372036854775807);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_edges_lo` SimpleAggregateFunction(min, Tuple(Int64, Int64, Int64, Int64)) DEFAULT (9223372036854775807, 9223372036854775807, 9223372036854775807, 9223372036854775807);

ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_edges_hi` SimpleAggregateFunction(max, Tuple(Int64, Int64, Int64, Int64)) DEFAULT (-9223372036854775808, -9223372036854775808, -9223372036854775808, -9223372036854775808);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_edges_hi` SimpleAggregateFunction(max, Tuple(Int64, Int64, Int64, Int64)) DEFAULT (-9223372036854775808, -9223372036854775808, -9223372036854775808, -9223372036854775808);

ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ops` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ops` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup_collectives_mv` ON CLUSTER `fleetscope` MODIFY QUERY SELECT job, attempt, step, rank, day_ns, compute_ns, dataloader_ns, optimizer_ns, other_ns, comm_ns, comm_dp_ns, comm_tp_ns, comm_pp_ns, comm_world_ns, num_collectives, num_sections, toInt64(9223372036854775807) AS step_start_ns, toInt64(0) AS step_end_ns, toInt64(0) AS step_ns, toInt64(f.2) AS comm_union_ns, toInt64(f.3 > 0) AS comm_blocks, if(f.3 > 0, (iv[1].1, if(f.3 = 1, f.1, f.4), if(f.3 = 1, f.1, f.5), f.1), (9223372036854775807, 9223372036854775807, 9223372036854775807, 9223372036854775807)) AS comm_edges_lo, if(f.3 > 0, (iv[1].1, if(f.3 = 1, f.1, f.4), if(f.3 = 1, f.1, f.5), f.1), (-9223372036854775808, -9223372036854775808, -9223372036854775808, -9223372036854775808)) AS comm_edges_hi, num_collectives AS comm_union_ops
FROM (SELECT job, attempt, step, rank, max(enqueued_ns) AS day_ns, toInt64(0) AS compute_ns, toInt64(0) AS dataloader_ns, toInt64(0) AS optimizer_ns, toInt64(0) AS other_ns, toInt64(sum(if(duration_ns > 0, duration_ns, 0))) AS comm_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'dp')) AS comm_dp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'tp')) AS comm_tp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'pp')) AS comm_pp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis NOT IN ('dp', 'tp', 'pp'))) AS comm_world_ns, toInt64(count()) AS num_collectives, toInt64(0) AS num_sections, arraySort(groupArrayIf((enqueued_ns, enqueued_ns + duration_ns), duration_ns > 0)) AS iv, arrayFold((acc, x) -> if(acc.3 = 0 OR x.1 > acc.1, (x.2, acc.2 + (x.2 - x.1), acc.3 + 1, if(acc.3 = 1, acc.1, acc.4), x.1), (greatest(acc.1, x.2), acc.2 + greatest(x.2 - acc.1, 0), acc.3, acc.4, acc.5)), iv, (toInt64(0), toInt64(0), toInt64(0), toInt64(0), toInt64(0))) AS f
FROM `collectives_local` WHERE rank >= 0 GROUP BY job, attempt, step, rank);
