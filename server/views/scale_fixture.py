"""Fixture generator: a 12,288-rank job (DP 192 x PP 8 x TP 8) x 200 steps of per-rank
step summaries, written straight into the store's ``step_rollup`` table (plus the job's
``jobs`` record), as the materialized views would have produced them from raw events.

The full fleet simulator is a later piece of work; this is just enough data for the
dashboard's heat-map, grid and header to be exercised at scale::

    python -m fleetscope.server.views.scale_fixture --store chdb:///tmp/fs-scale/store
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from fleetscope.topology import Topology

MS = 1_000_000


@dataclass(frozen=True)
class ScaleJob:
    job: str = "scale-12288"
    topo: Topology = Topology(dp=192, tp=8, pp=8)
    num_steps: int = 200
    step_ms: float = 1_200.0
    stragglers: tuple[tuple[int, float], ...] = ((7777, 1.35), (100, 1.2))
    """(rank, compute slowdown factor) from step 50 on."""
    seed: int = 0
    t0_ns: int = 0

    def jobs_record(self) -> dict:
        return {
            "ts_ns": self.t0_ns, "job": self.job, "name": "12,288-rank scale fixture", "dp": self.topo.dp,
            "tp": self.topo.tp, "pp": self.topo.pp, "order": self.topo.order, "num_microbatches": 16,
            "model_flops_per_step": 2.4e18, "device_name": "NVIDIA H200", "device_peak_flops": 9.89e14,
            "status": "running", "host": "node-00000",
        }  # fmt: skip

    def insert_sql(self) -> tuple[str, dict]:
        """``INSERT ... SELECT FROM numbers()``: ClickHouse generates the rows itself
        (seconds instead of shipping 2.5 M rows through a client). Noise is a hash of
        the row number, so the data is the same on every run."""
        strides, stride = {}, 1
        for axis in self.topo.axes_fastest_first:
            strides[axis] = stride
            stride *= self.topo.size(axis)
        sql = """
INSERT INTO step_rollup (job, attempt, step, rank, day_ns, compute_ns, dataloader_ns, optimizer_ns, other_ns,
    comm_ns, comm_dp_ns, comm_tp_ns, comm_pp_ns, comm_world_ns, num_collectives, num_sections,
    step_start_ns, step_end_ns, step_ns)
SELECT {job:String}, 0, step, rank, start, toInt64(compute), toInt64(dl), toInt64(opt), 0,
       toInt64(comm), toInt64(comm * 0.5), toInt64(comm * 0.3), toInt64(comm * 0.2), 0, 40, 36,
       start, start + toInt64(step_ns), toInt64(step_ns)
FROM (
  SELECT step, rank, start, compute, dl, opt, busy,
         max(busy) OVER (PARTITION BY step) * 1.02 AS step_ns, step_ns - busy AS comm
  FROM (
    SELECT step, rank, start, compute, dl, opt, compute + dl + opt AS busy
    FROM (
      SELECT toInt64(intDiv(number, {n:UInt64})) AS step, toInt32(number % {n:UInt64}) AS rank,
             {t0:Int64} + step * {period:Int64} AS start,
             intDiv(rank, {s_pp:UInt64}) % {n_pp:UInt64} AS stage,
             {compute_ns:Float64} * (1 + 0.04 * ((cityHash64(number) % 10000) / 10000.0 - 0.5))
               * if(stage = 0 OR stage = {n_pp:UInt64} - 1, 1.08, 1.0)
               * if(step >= {slow_from:Int64}, transform(rank, {slow_ranks:Array(Int32)},
                                                         {slow_factors:Array(Float64)}, 1.0), 1.0) AS compute,
             {dl_ns:Float64} * (1 + 0.2 * ((cityHash64(number, 1) % 10000) / 10000.0 - 0.5)) AS dl,
             {opt_ns:Float64} AS opt
      FROM numbers({total:UInt64})
    )
  )
)
"""
        params = {
            "job": self.job,
            "n": self.topo.world_size,
            "total": self.topo.world_size * self.num_steps,
            "t0": self.t0_ns,
            "period": int(self.step_ms * 1.05 * MS),
            "s_pp": strides["pp"],
            "n_pp": self.topo.pp,
            "compute_ns": self.step_ms * 0.55 * MS,
            "dl_ns": self.step_ms * 0.02 * MS,
            "opt_ns": self.step_ms * 0.05 * MS,
            "slow_from": 50,
            "slow_ranks": [r for r, _ in self.stragglers],
            "slow_factors": [f for _, f in self.stragglers],
        }
        return sql, params


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
