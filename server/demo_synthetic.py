"""A synthetic 8-rank 3D-parallel job (dp=2 tp=2 pp=2) for ``fleetscope demo --synthetic``.

Rows shaped exactly like the reference trainer's telemetry, with rank 5 running 1.3x
slower from step 10; posted through the real ingest API.
"""

from __future__ import annotations

from typing import Any


def synthetic_job(job: str, steps: int, t0_ns: int, slow_rank: int = 5) -> dict[str, list[dict[str, Any]]]:
    """Rows of a small dp=2 tp=2 pp=2 job: sections, collectives, step markers, job record."""
    from fleetscope.topology import Topology

    topo = Topology(dp=2, tp=2, pp=2)
    ms = 1_000_000
    out: dict[str, list[dict[str, Any]]] = {"sections": [], "collectives": [], "steps": [], "jobs": []}
    out["jobs"].append(
        dict(ts_ns=t0_ns, job=job, name="demo 3D job", dp=2, tp=2, pp=2, num_microbatches=2,
             model_flops_per_step=3.2e12, device_name="cpu", device_peak_flops=1e12,
             command="fleetscope demo", host="demo-host-0")
    )  # fmt: skip
    seqs: dict[str, int] = {}
    for step in range(steps):
        s0 = t0_ns + step * 400 * ms
        for rank in topo.ranks():
            factor = 1.3 if rank == slow_rank and step >= 10 else 1.0
            host = f"demo-host-{rank // 4}"
            base = dict(job=job, rank=rank, host=host, step=step)
            t = s0
            parts = [("dataloader", "dataloader", 20, -1)]
            for mb in range(2):
                parts += [("forward", "compute", 60, mb), ("backward", "compute", 90, mb)]
            parts.append(("optimizer", "optimizer", 15, -1))
            for name, kind, dur, mb in parts:
                d = int(dur * factor * ms)
                out["sections"].append(dict(base, microbatch=mb, name=name, kind=kind, start_ns=t, end_ns=t + d, duration_ns=d))
                t += d
                if kind == "compute":
                    gid = topo.group_id("tp", rank)
                    seqs[gid + str(rank)] = seqs.get(gid + str(rank), 0) + 1
                    c = 5 * ms
                    out["collectives"].append(
                        dict(base, microbatch=mb, group_id=gid, axis="tp", group_rank=topo.coords(rank).tp,
                             group_size=2, seq=seqs[gid + str(rank)], op="all_reduce", bytes=4 << 20,
                             dtype="float32", enqueued_ns=t, started_ns=t, completed_ns=t + c, duration_ns=c)
                    )  # fmt: skip
                    t += c
            gid = topo.group_id("dp", rank)
            seqs[gid + str(rank)] = seqs.get(gid + str(rank), 0) + 1
            c = 25 * ms
            out["collectives"].append(
                dict(base, group_id=gid, axis="dp", group_rank=topo.coords(rank).dp, group_size=2,
                     seq=seqs[gid + str(rank)], op="all_reduce", bytes=64 << 20, dtype="float32",
                     enqueued_ns=t, started_ns=t, completed_ns=t + c, duration_ns=c)
            )  # fmt: skip
            end = max(t + c, s0 + 390 * ms)
            out["steps"].append(dict(base, start_ns=s0, end_ns=end, duration_ns=end - s0, num_microbatches=2))
    return out
