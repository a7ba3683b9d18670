"""Jobs: ``GET /jobs``, ``GET /jobs/{job}``, ``GET /jobs/{job}/steps``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from fleetscope.server.api.deps import SessionDep, SettingsDep, StoreDep
from fleetscope.server.api.models import JobDetail, JobPublic, StepBreakdown, Topology
from fleetscope.server.db.models import Job
from fleetscope.server.store import queries
from sqlalchemy import select

router = APIRouter(tags=["jobs"])

MAX_STEP_ROWS = 1_000_000


def job_public(job: Job) -> dict:
    return {
        "id": job.id,
        "name": job.name,
        "attempt": job.attempt,
        "status": job.status,
        "topology": Topology(dp=job.dp, tp=job.tp, pp=job.pp, order=job.order, world_size=job.world_size),
        "num_microbatches": job.num_microbatches,
        "model_flops_per_step": job.model_flops_per_step,
        "device_name": job.device_name,
        "device_peak_flops": job.device_peak_flops,
        "start_ns": job.start_ns,
        "end_ns": job.end_ns,
        "command": job.command,
        "versions": job.versions,
        "host": job.host,
    }


@router.get("/jobs", response_model=list[JobPublic])
def list_jobs(
    session: SessionDep,
    status: Annotated[str | None, Query(description="running | finished | failed")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> list[dict]:
    """Jobs known to the control plane, newest first."""
    q = select(Job)
    if status:
        q = q.where(Job.status == status)
    q = q.order_by(Job.start_ns.desc().nulls_last(), Job.id).limit(limit)
    return [job_public(j) for j in session.scalars(q)]


def _get_job(session, job: str) -> Job:
    row = session.get(Job, job)
    if row is None:
        raise HTTPException(404, detail=f"job {job!r} not found")
    return row


@router.get("/jobs/{job}", response_model=JobDetail)
def get_job(job: str, session: SessionDep, store: StoreDep) -> dict:
    """One job: topology, status, last step, step rate and MFU (when computable)."""
    row = _get_job(session, job)
    out = job_public(row)
    rate = queries.step_rate(store, job, row.attempt)
    out["last_step"] = rate["last_step"]
    out["num_ranks_reporting"] = rate["num_ranks"]
    out["steps_per_s"] = rate["steps_per_s"]
    out["mfu"] = mfu(row, rate["steps_per_s"])
    return out


def mfu(job: Job, steps_per_s: float | None) -> float | None:
    """Model FLOPs utilisation, or None when a factor is unknown."""
    if not steps_per_s or job.model_flops_per_step <= 0 or job.device_peak_flops <= 0:
        return None
    return job.model_flops_per_step * steps_per_s / (job.world_size * job.device_peak_flops)


def check_rank_spec(text: str | None, limit: int) -> None:
    """422 when ``ranks=`` would select more than ``limit`` ranks, counted from the
    text before anything is expanded (parts that are not ranges count one each)."""
    if not text:
        return
    total = 0
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if sep and lo.isdigit() and hi.isdigit() and len(lo) < 12 and len(hi) < 12:
            total += max(0, int(hi) - int(lo) + 1)
        else:
            total += 1
        if total > limit:
            raise HTTPException(
                422, detail=f"ranks: selects more than max_ranks_expanded={limit} ranks"
            )


def parse_ranks(text: str | None, limit: int = 2**20) -> list[int]:
    """``"0,3,8-11"`` -> ``[0, 3, 8, 9, 10, 11]``; raises 422 naming the bad part, or the
    limit when more than ``limit`` ranks would be selected (checked before expanding)."""
    if not text:
        return []
    check_rank_spec(text, limit)
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            if len(part) > 24:
                raise ValueError
            if sep:
                a, b = int(lo), int(hi)
                if b < a or a < 0:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
                if out[-1] < 0:
                    raise ValueError
        except ValueError:
            raise HTTPException(422, detail=f"ranks: bad value {part[:40]!r} (use e.g. 0,3,8-11)") from None
    return out


@router.get("/jobs/{job}/steps", response_model=StepBreakdown)
def job_steps(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    from_step: Annotated[int, Query(ge=0)] = 0,
    to_step: Annotated[int | None, Query(ge=0)] = None,
    ranks: Annotated[str | None, Query(description="comma list / ranges, e.g. 0,3,8-11; default all")] = None,
    attempt: Annotated[int | None, Query(ge=0, description="default: the latest attempt")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_STEP_ROWS)] = 100_000,
) -> JSONResponse:
    """Per rank per step: total, compute, communication, data-loading and idle time (ns),
    from the materialized per-rank-per-step rollup. Communication is the union of the
    rank's op intervals in the step (overlapping ops count once); the per-axis fields
    are sums per axis."""
    if to_step is not None and to_step < from_step:
        raise HTTPException(422, detail=f"to_step={to_step} is before from_step={from_step}")
    rank_list = parse_ranks(ranks, settings.max_ranks_expanded)
    if attempt is None:
        row = session.get(Job, job)
        attempt = row.attempt if row is not None else queries.latest_attempt(store, job)
        if attempt is None:
            raise HTTPException(404, detail=f"job {job!r} not found")
    df = queries.step_breakdown(
        store, job, attempt, from_step, to_step if to_step is not None else 2**62, rank_list, limit + 1
    )
    truncated = len(df) > limit
    rows: list[dict] = []
    if not df.empty:
        df = df.iloc[:limit]
        out = {
            "step": df["step"],
            "rank": df["rank"],
            "total_ns": df["total_ns"],
            "compute_ns": df["compute_ns"] + df["optimizer_ns"],
            "communication_ns": df["comm_ns"],
            "data_loading_ns": df["dataloader_ns"],
            "idle_ns": df["idle_ns"],
            "optimizer_ns": df["optimizer_ns"],
            "other_ns": df["other_ns"],
            "comm_dp_ns": df["comm_dp_ns"],
            "comm_tp_ns": df["comm_tp_ns"],
            "comm_pp_ns": df["comm_pp_ns"],
            "num_collectives": df["num_collectives"],
        }
        cols = {k: v.astype("int64").tolist() for k, v in out.items()}
        names = list(cols)
        rows = [dict(zip(names, values)) for values in zip(*cols.values())]
    # the rows are plain ints already: skip re-validating every one against StepRow
    return JSONResponse({"job": job, "attempt": attempt, "rows": rows, "truncated": truncated})
