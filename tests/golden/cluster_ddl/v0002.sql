ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ns` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ns` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_edges_hi` SimpleAggregateFunction(max, Tuple(Int64, Int64, Int64, Int64));

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_edges_hi` SimpleAggregateFunction(max, Tuple(Int64, Int64, Int64, Int64));

ALTER TABLE `step_rollup_local` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ops` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup` ON CLUSTER `fleetscope` ADD COLUMN IF NOT EXISTS `comm_union_ops` SimpleAggregateFunction(sum, Int64);

ALTER TABLE `step_rollup_collectives_mv` ON CLUSTER `fleetscope` MODIFY QUERY SELECT b.job AS job, b.attempt AS attempt, b.step AS step, b.rank AS rank, b.day_ns AS day_ns, b.compute_ns AS compute_ns, b.dataloader_ns AS dataloader_ns, b.optimizer_ns AS optimizer_ns, b.other_ns AS other_ns, b.comm_ns AS comm_ns, b.comm_dp_ns AS comm_dp_ns, b.comm_tp_ns AS comm_tp_ns, b.comm_pp_ns AS comm_pp_ns, b.comm_world_ns AS comm_world_ns, b.num_collectives AS num_collectives, b.num_sections AS num_sections, toInt64(9223372036854775807) AS step_start_ns, toInt64(0) AS step_end_ns, toInt64(0) AS step_ns, toInt64(b.union_ns - (greatest(least(p.prev_edges.2, b.edges.2) - greatest(p.prev_edges.1, b.edges.1), 0) + greatest(least(p.prev_edges.2, b.edges.4) - greatest(p.prev_edges.1, b.edges.3), 0) + greatest(least(p.prev_edges.4, b.edges.2) - greatest(p.prev_edges.3, b.edges.1), 0) + greatest(least(p.prev_edges.4, b.edges.4) - greatest(p.prev_edges.3, b.edges.3), 0))) AS comm_union_ns, b.edges AS comm_edges_hi, b.num_collectives AS comm_union_ops
FROM (SELECT job, attempt, step, rank, max(enqueued_ns) AS day_ns, toInt64(0) AS compute_ns, toInt64(0) AS dataloader_ns, toInt64(0) AS optimizer_ns, toInt64(0) AS other_ns, toInt64(sum(if(duration_ns > 0, duration_ns, 0))) AS comm_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'dp')) AS comm_dp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'tp')) AS comm_tp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis = 'pp')) AS comm_pp_ns, toInt64(sumIf(if(duration_ns > 0, duration_ns, 0), axis NOT IN ('dp', 'tp', 'pp'))) AS comm_world_ns, toInt64(count()) AS num_collectives, toInt64(0) AS num_sections, arraySort(groupArrayIf((enqueued_ns, enqueued_ns + duration_ns), duration_ns > 0)) AS iv, arrayFold((acc, x) -> if(acc.3 = 0 OR x.1 > acc.1, (x.2, acc.2 + (x.2 - x.1), acc.3 + 1, if(acc.3 = 1, acc.1, acc.4), x.1), (greatest(acc.1, x.2), acc.2 + greatest(x.2 - acc.1, 0), acc.3, acc.4, acc.5)), iv, (toInt64(0), toInt64(0), toInt64(0), toInt64(0), toInt64(0))) AS f, toInt64(f.2) AS union_ns, CAST(if(f.3 = 0, (0, 0, 0, 0), (iv[1].1, if(f.3 = 1, f.1, f.4), if(f.3 = 1, f.1, f.5), f.1)), 'Tuple(Int64, Int64, Int64, Int64)') AS edges
      FROM `collectives_local` WHERE rank >= 0 GROUP BY job, attempt, step, rank) AS b
LEFT JOIN (SELECT job, attempt, step, rank, max(comm_edges_hi) AS prev_edges FROM `step_rollup_local`
           WHERE (job, attempt, step, rank) IN (SELECT job, attempt, step, rank FROM `collectives_local` WHERE rank >= 0)
           GROUP BY job, attempt, step, rank) AS p ON b.job = p.job AND b.attempt = p.attempt AND b.step = p.step AND b.rank = p.rank
SETTINGS join_use_nulls = 0;
