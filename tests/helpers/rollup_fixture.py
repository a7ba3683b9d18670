"""Rollup fixture: a 12,288-rank job (DP 192 x PP 8 x TP 8) x 200 steps of per-rank step
summaries, written straight into the store's ``step_rollup`` table (plus the job's
``jobs`` record), as the materialized views would have produced them from raw events.

Enough data for the dashboard's heat-map, grid and header (and the Prometheus series)
to be exercised at scale in seconds. The numbers are the fleet simulator's, not a second
model: part durations and noise come from :meth:`fleetscope.sim.schedule.Timing.parts_ns`,
stragglers are ``--inject`` specs turned into per-rank factors by
:class:`fleetscope.sim.faults.FaultPlan`. Only the reduction is done by ClickHouse, not by
playing the schedule (2.5 M rank-steps would take minutes): a rank's busy time is its
micro-batches' forward + backward, dataloader, grad sync and optimizer, each with the
simulator's jitter; a step lasts as long as its slowest rank's busy time plus the
bubble and communication the calibrated step time leaves (``step_ms`` minus the nominal
busy time); every other rank's remainder is communication, split between the axes in
the ratio of their link times. Communication is also stored as the collectives view
stores the union of op intervals (schema version 2: ``comm_union_ns``, the edges, the
ops counted). Run from the repository root::

    python -m tests.helpers.rollup_fixture --store chdb:///tmp/fs-scale/store
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import numpy as np
from fleetscope.sim.faults import FaultPlan, parse_sim_fault
from fleetscope.sim.schedule import Timing

from fleetscope.topology import Topology

NEVER = np.iinfo(np.int64).max


@dataclass(frozen=True)
class ScaleJob:
    job: str = "scale-12288"
    topo: Topology = Topology(dp=192, tp=8, pp=8)
    num_steps: int = 200
    num_mb: int = 16
    tp_ops: int = 4
    """TP collectives per forward/backward (the simulator's ``--tp-ops-per-microbatch``)."""
    step_ms: float = 1_200.0
    faults: tuple[str, ...] = ("straggler:rank=7777:factor=1.35:from_step=50",
                               "straggler:rank=100:factor=1.2:from_step=50")
    """``--inject`` specs; only compute stragglers shape a step rollup."""
    gpus_per_host: int = 8
    t0_ns: int = 0

    def jobs_record(self) -> dict:
        return {
            "ts_ns": self.t0_ns, "job": self.job, "name": "12,288-rank scale fixture", "dp": self.topo.dp,
            "tp": self.topo.tp, "pp": self.topo.pp, "order": self.topo.order, "num_microbatches": self.num_mb,
            "model_flops_per_step": 2.4e18, "device_name": "NVIDIA H200", "device_peak_flops": 9.89e14,
            "status": "running", "host": "node-00000",
        }  # fmt: skip

    def timing(self) -> Timing:
        return Timing(step_ms=self.step_ms)

    def params(self) -> dict:
        """The query parameters: every duration from the simulator's :class:`Timing`."""
        timing = self.timing()
        parts = timing.parts_ns(self.num_mb, self.topo.pp, self.tp_ops)
        n = self.topo.world_size
        plan = FaultPlan([parse_sim_fault(s, n, -(-n // self.gpus_per_host)) for s in self.faults], n,
                         self.gpus_per_host)
        slow = np.nonzero(plan.compute_from != NEVER)[0]
        compute_ns = self.num_mb * (parts["forward"] + parts["backward"])
        nominal_busy = compute_ns + parts["dataloader"] + parts["grad_sync"] + parts["optimizer"]
        links = {"tp": 2 * self.num_mb * self.tp_ops * parts["tp_link"],
                 "pp": 2 * self.num_mb * parts["pp_link"] if self.topo.pp > 1 else 0.0,
                 "dp": parts["dp_link"] if self.topo.dp > 1 else 0.0}
        total_link = sum(links.values()) or 1.0
        strides, stride = {}, 1
        for axis in self.topo.axes_fastest_first:
            strides[axis] = stride
            stride *= self.topo.size(axis)
        return {
            "job": self.job, "n": n, "total": n * self.num_steps, "t0": self.t0_ns,
            # a uniform variate of width sqrt(12) * noise has the simulator's relative sd
            "spread": math.sqrt(12) * timing.noise,
            "compute_ns": compute_ns, "dl_ns": parts["dataloader"], "opt_ns": parts["optimizer"],
            "other_ns": parts["grad_sync"], "wait_ns": max(timing.step_ms * 1e6 - nominal_busy, 0.0),
            "gap_ns": parts["gap"],
            "dp_share": links["dp"] / total_link, "tp_share": links["tp"] / total_link,
            "pp_share": links["pp"] / total_link,
            "num_collectives": 2 * self.num_mb * (self.tp_ops + (1 if self.topo.pp > 1 else 0)) + 1,
            "num_sections": 2 * self.num_mb + 3,
            "slow_ranks": [int(r) for r in slow] or [-1],
            "slow_factors": [float(plan.compute_factor[r]) for r in slow] or [1.0],
            "slow_from": [int(plan.compute_from[r]) for r in slow] or [int(NEVER)],
        }

    def insert_sql(self) -> tuple[str, dict]:
        """``INSERT ... SELECT FROM numbers()``: ClickHouse generates the rows itself
        (seconds instead of shipping 2.5 M rows through a client). Noise is a hash of
        the row number, so the data is the same on every run."""
        sql = """
INSERT INTO step_rollup (job, attempt, step, rank, day_ns, compute_ns, dataloader_ns, optimizer_ns, other_ns,
    comm_ns, comm_dp_ns, comm_tp_ns, comm_pp_ns, comm_world_ns, num_collectives, num_sections,
    step_start_ns, step_end_ns, step_ns, comm_union_ns, comm_edges_hi, comm_union_ops)
WITH rank_steps AS (
  SELECT toInt64(intDiv(number, {n:UInt64})) AS step, toInt32(number % {n:UInt64}) AS rank,
         {compute_ns:Float64} * (1 + {spread:Float64} * ((cityHash64(number) % 10000) / 10000.0 - 0.5))
           * if(step >= transform(rank, {slow_ranks:Array(Int32)}, {slow_from:Array(Int64)},
                                  toInt64(9223372036854775807)),
                transform(rank, {slow_ranks:Array(Int32)}, {slow_factors:Array(Float64)}, 1.0), 1.0) AS compute,
         {dl_ns:Float64} * (1 + {spread:Float64} * ((cityHash64(number, 1) % 10000) / 10000.0 - 0.5)) AS dl,
         {opt_ns:Float64} * (1 + {spread:Float64} * ((cityHash64(number, 2) % 10000) / 10000.0 - 0.5)) AS opt,
         compute + dl + opt + {other_ns:Float64} AS busy
  FROM numbers({total:UInt64})
),
steps AS (
  SELECT step, step_ns,
         {t0:Int64} + toInt64(sum(step_ns + {gap_ns:Float64})
             OVER (ORDER BY step ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS start
  FROM (SELECT step, max(busy) + {wait_ns:Float64} AS step_ns FROM rank_steps GROUP BY step)
)
SELECT {job:String}, 0, r.step, r.rank, s.start, toInt64(r.compute), toInt64(r.dl), toInt64(r.opt),
       toInt64({other_ns:Float64}), toInt64(s.step_ns - r.busy) AS comm,
       toInt64(comm * {dp_share:Float64}), toInt64(comm * {tp_share:Float64}), toInt64(comm * {pp_share:Float64}),
       0, {num_collectives:UInt32}, {num_sections:UInt32}, s.start, s.start + toInt64(s.step_ns), toInt64(s.step_ns),
       comm, (s.start, s.start + (intDiv(comm, {num_collectives:UInt32}) AS edge),
              s.start + toInt64(s.step_ns) - edge, s.start + toInt64(s.step_ns)),
       {num_collectives:UInt32}
FROM rank_steps AS r INNER JOIN steps AS s ON r.step = s.step
"""
        return sql, self.params()


def write_scale_job(store_url: str, job: ScaleJob | None = None) -> ScaleJob:
    """Create/migrate the store at ``store_url`` and insert the fixture (the store must
    not be open in another process: chdb directories have one owner)."""
    from fleetscope.server.store import Store

    from fleetscope import codec
    from fleetscope.schema import JOBS

    job = job or ScaleJob(t0_ns=time.time_ns() - 300 * 10**9)
    store = Store.open(store_url, ttl_days=0)
    try:
        sql, params = job.insert_sql()
        store.command(sql, params)
        store.insert_arrow("jobs", codec.rows_to_table(JOBS, [job.jobs_record()]))
    finally:
        store.close()
    return job


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, help="store URL, e.g. chdb:///tmp/fs-scale/store")
    args = p.parse_args()
    t = time.perf_counter()
    job = write_scale_job(args.store)
    print(f"wrote {job.topo.world_size} ranks x {job.num_steps} steps of {job.job!r} in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
