"""Data behind the dashboard's views: ``/jobs/{job}/heatmap``, ``/grid``, ``/trend``,
``/timeline``, ``/trace.json`` and ``/hardware``.

Everything a 12,288-rank job needs is aggregated here, server side: the heat-map is at
most ``max_rows`` x ``max_cols`` cells, the grid at most ``max_cells`` cells and the
timeline at most ``max_spans`` spans, whatever the job size.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from fleetscope.server.api.deps import SessionDep, SettingsDep, StoreDep
from fleetscope.server.api.routes.jobs import check_rank_spec
from fleetscope.server.db.models import Job
from fleetscope.server.settings import Settings
from fleetscope.server.store import queries, view_queries
from fleetscope.server.views import grid as grid_view
from fleetscope.server.views import heatmap as heatmap_view
from fleetscope.server.views import timeline as timeline_view

from fleetscope.topology import Topology

router = APIRouter(tags=["views"])

MAX_TRACE_SPANS = 1_000_000
STALL_S = 10.0
"""A rank blocked in one op/section longer than this is drawn as ``stuck``."""
HEARTBEAT_TIMEOUT_S = 30.0


def json_body(payload: dict[str, Any]) -> Response:
    """``payload`` (plain lists, numbers, strings, ``None``) serialised once with the C
    encoder. A dict returned from a route is walked element by element by FastAPI's
    ``jsonable_encoder`` first: for a 160 x 200 heat-map that walk costs several times
    the encoding itself. NaN is refused, as by Starlette's ``JSONResponse``."""
    body = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return Response(body.encode(), media_type="application/json")


@dataclass(frozen=True)
class JobView:
    job: str
    attempt: int
    topo: Topology
    num_microbatches: int
    model_flops_per_step: float
    device_peak_flops: float
    status: str = "running"


MAX_WORLD_SIZE = Settings.model_fields["max_world_size"].default


def _topology(job: str, dp: int, tp: int, pp: int, order: str, max_world: int) -> Topology:
    """The job's topology; 422 naming the field when what is stored is unusable (rows
    written before ingest bounded topologies), never a world-size allocation."""
    for name, v in (("dp", dp), ("tp", tp), ("pp", pp)):
        if not 1 <= v <= max_world:
            raise HTTPException(422, detail=f"job {job!r}: stored topology {name}={v} is outside 1..max_world_size={max_world}")
    if dp * tp * pp > max_world:
        raise HTTPException(
            422, detail=f"job {job!r}: stored world size {dp}*{tp}*{pp} is more than max_world_size={max_world}"
        )
    try:
        return Topology(dp=dp, tp=tp, pp=pp, order=order)
    except ValueError as e:
        raise HTTPException(422, detail=f"job {job!r}: stored {e}") from None


def resolve_job(session, store, job: str, max_world: int = MAX_WORLD_SIZE) -> JobView:
    """Topology and latest attempt of ``job``: control-plane row, else the ``jobs``
    records in the store, else inferred (pure DP) from the ranks that reported."""
    row = session.get(Job, job)
    if row is not None:
        return JobView(
            job, row.attempt, _topology(job, row.dp, row.tp, row.pp, row.order, max_world),
            row.num_microbatches, row.model_flops_per_step, row.device_peak_flops, row.status,
        )
    meta = view_queries.job_meta(store, job)
    attempt = queries.latest_attempt(store, job)
    if meta is not None:
        topo = _topology(job, int(meta["dp"]), int(meta["tp"]), int(meta["pp"]), str(meta["order"]), max_world)
        return JobView(
            job, attempt or 0, topo, int(meta["num_microbatches"]),
            float(meta["model_flops_per_step"]), float(meta["device_peak_flops"]), str(meta["status"]),
        )
    if attempt is None:
        raise HTTPException(404, detail=f"job {job!r} not found")
    world = view_queries.max_rank(store, job, attempt) + 1
    return JobView(job, attempt, _topology(job, max(world, 1), 1, 1, "tp-dp-pp", max_world), 1, 0.0, 0.0)


def step_window(store, jv: JobView, from_step: int | None, to_step: int | None, default_len: int) -> tuple[int, int] | None:
    """``(from, to)`` clamped to the steps the store has; the last ``default_len`` steps
    when not given. ``None`` when the job has no step data yet."""
    if from_step is not None and to_step is not None and to_step < from_step:
        raise HTTPException(422, detail=f"to_step={to_step} is before from_step={from_step}")
    have = view_queries.step_range(store, jv.job, jv.attempt)
    if have is None:
        return None
    first, last = have
    hi = min(to_step, last) if to_step is not None else last
    lo = from_step if from_step is not None else max(first, hi - default_len + 1)
    return max(lo, first), max(hi, max(lo, first))


@router.get("/jobs/{job}/heatmap")
def heatmap(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    metric: Annotated[str, Query(description=f"one of {', '.join(view_queries.METRICS)}")] = "step",
    agg: Annotated[str, Query(description="cell aggregate when ranks/steps are bucketed: max | mean | min")] = "max",
    from_step: Annotated[int | None, Query(ge=0)] = None,
    to_step: Annotated[int | None, Query(ge=0)] = None,
    max_rows: Annotated[int, Query(ge=1, le=20_000)] = 256,
    max_cols: Annotated[int, Query(ge=1, le=5_000)] = 200,
) -> Response:
    """Rank x step matrix of one metric, ranks in (pp, dp, tp) order, bucketed server side
    so the answer is at most ``max_rows`` x ``max_cols`` cells. Each cell also names the
    rank with the largest value in it (for click-through)."""
    if metric not in view_queries.METRICS:
        raise HTTPException(422, detail=f"metric {metric!r}: expected one of {list(view_queries.METRICS)}")
    if agg not in view_queries.AGGREGATES:
        raise HTTPException(422, detail=f"agg {agg!r}: expected one of {list(view_queries.AGGREGATES)}")
    jv = resolve_job(session, store, job, settings.max_world_size)
    m = view_queries.METRICS[metric]
    window = step_window(store, jv, from_step, to_step, max_cols)
    row_bucket = heatmap_view.row_bucket_size(jv.topo, max_rows)
    if window is None:
        return json_body(heatmap_view.heatmap_payload(job, jv.topo, m, agg, 0, -1, row_bucket, 1, None))
    lo, hi = window
    step_bucket = heatmap_view.step_bucket_size(hi - lo + 1, max_cols)
    cells = view_queries.heatmap_cells(store, job, jv.attempt, jv.topo, m, agg, lo, hi, row_bucket, step_bucket)
    return json_body(heatmap_view.heatmap_payload(job, jv.topo, m, agg, lo, hi, row_bucket, step_bucket, cells))


@router.get("/jobs/{job}/grid")
def grid(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    window_steps: Annotated[int, Query(ge=1, le=1000, description="recent steps the score is taken over")] = 20,
    max_cells: Annotated[int, Query(ge=1, le=100_000)] = 16_384,
) -> Response:
    """Per-rank state (ok, slow, stuck, dead, missing) and straggler score (own work ÷
    median of the rest of its pipeline stage over the recent window) for the 3D grid;
    DP replicas are bucketed (worst wins) beyond ``max_cells`` ranks."""
    jv = resolve_job(session, store, job, settings.max_world_size)
    now_ns = time.time_ns()
    world = jv.topo.world_size
    window = step_window(store, jv, None, None, window_steps)
    own = np.full(world, np.nan)
    last_steps = np.full(world, -1.0)
    if window is not None:
        df = view_queries.rank_scores(store, job, jv.attempt, world, *window)
        own = grid_view.frame_to_rank_array(df, "own_ns", world, np.nan)
        last_steps = grid_view.frame_to_rank_array(df, "last_done_step", world, -1.0)
    if (last_steps < 0).any():  # a rank with no completed step in the window: look further back
        last = view_queries.rank_last_steps(store, job, jv.attempt)
        last_steps = np.maximum(last_steps, grid_view.frame_to_rank_array(last, "last_step", world, -1.0))
    scores = grid_view.stage_relative_scores(jv.topo, own)
    states, details = grid_view.rank_states(
        jv.topo, scores, last_steps,
        view_queries.latest_heartbeats(store, job), view_queries.latest_inflight(store, job, jv.attempt),
        now_ns, STALL_S, HEARTBEAT_TIMEOUT_S, live=jv.status == "running",
    )
    return json_body(grid_view.grid_payload(job, jv.topo, scores, states, details, window, max_cells))


@router.get("/jobs/{job}/trend")
def trend(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    max_steps: Annotated[int, Query(ge=2, le=100_000)] = 500,
) -> dict:
    """Per step: median and slowest rank step time (ms) and MFU, for the job header."""
    jv = resolve_job(session, store, job, settings.max_world_size)
    window = step_window(store, jv, None, None, max_steps)
    out: dict = {"job": job, "steps": [], "median_ms": [], "max_ms": [], "mfu": []}
    if window is None:
        return out
    df = view_queries.trend(store, job, jv.attempt, *window)
    peak = jv.topo.world_size * jv.device_peak_flops
    for step, med, mx in zip(df["step"], df["median_ns"], df["max_ns"]):
        out["steps"].append(int(step))
        out["median_ms"].append(round(float(med) / 1e6, 3))
        out["max_ms"].append(round(float(mx) / 1e6, 3))
        ok = jv.model_flops_per_step > 0 and peak > 0 and mx > 0
        # The slowest rank sets the pace of a synchronous step.
        out["mfu"].append(round(jv.model_flops_per_step / (float(mx) / 1e9) / peak, 5) if ok else None)
    return out


def _timeline_input(store, session, job, ranks, focus, from_step, to_step, default_len, settings):
    check_rank_spec(ranks, settings.max_ranks_expanded)
    jv = resolve_job(session, store, job, settings.max_world_size)
    try:
        rank_list = timeline_view.parse_ranks(ranks or "", jv.topo) or timeline_view.default_ranks(jv.topo, focus)
    except ValueError as e:
        raise HTTPException(422, detail=str(e)) from None
    window = step_window(store, jv, from_step, to_step, default_len)
    return jv, rank_list, window


@router.get("/jobs/{job}/timeline")
def timeline(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    ranks: Annotated[str | None, Query(description="e.g. 0,2,4-7 or a group id like pp.dp0.tp0; default: the pipeline chain of `rank`")] = None,
    rank: Annotated[int | None, Query(ge=0, description="focus rank for the default rank set")] = None,
    from_step: Annotated[int | None, Query(ge=0)] = None,
    to_step: Annotated[int | None, Query(ge=0)] = None,
    max_spans: Annotated[int, Query(ge=1, le=50_000)] = 4000,
    max_ranks: Annotated[int, Query(ge=1, le=512)] = 64,
) -> dict:
    """Sections and collectives/p2p of a rank set in a step window (default: the last two
    steps), at most ``max_spans`` of them, with send -> recv dependency links."""
    jv, rank_list, window = _timeline_input(
        store, session, job, ranks, rank, from_step, to_step, 2, settings
    )
    if len(rank_list) > max_ranks:
        raise HTTPException(422, detail=f"ranks: {len(rank_list)} ranks selected, at most max_ranks={max_ranks}")
    if window is None:
        return timeline_view.timeline_payload(job, jv.topo, rank_list, 0, -1, view_queries.empty_spans(), 0, max_spans)
    df, total = view_queries.spans(store, job, jv.attempt, rank_list, *window, max_spans, time.time_ns())
    return timeline_view.timeline_payload(job, jv.topo, rank_list, *window, df, total, max_spans)


@router.get("/jobs/{job}/trace.json")
def trace(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    ranks: Annotated[str | None, Query(description="as for /timeline")] = None,
    rank: Annotated[int | None, Query(ge=0)] = None,
    from_step: Annotated[int | None, Query(ge=0)] = None,
    to_step: Annotated[int | None, Query(ge=0)] = None,
    max_spans: Annotated[int, Query(ge=1, le=MAX_TRACE_SPANS)] = 200_000,
) -> JSONResponse:
    """The same window as ``/timeline`` as a Chrome trace-event file (open it in
    https://ui.perfetto.dev or chrome://tracing)."""
    jv, rank_list, window = _timeline_input(
        store, session, job, ranks, rank, from_step, to_step, 2, settings
    )
    df = view_queries.empty_spans()
    total = 0
    if window is not None:
        df, total = view_queries.spans(store, job, jv.attempt, rank_list, *window, max_spans, time.time_ns())
    body = timeline_view.chrome_trace(job, jv.topo, df, total > len(df))
    lo, hi = window or (0, 0)
    name = f"fleetscope-{job}-steps{lo}-{hi}.trace.json".replace("/", "_")
    return JSONResponse(body, headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.get("/jobs/{job}/hardware")
def hardware(
    job: str,
    store: StoreDep,
    session: SessionDep,
    settings: SettingsDep,
    rank: Annotated[int, Query(ge=0)],
    from_step: Annotated[int | None, Query(ge=0)] = None,
    to_step: Annotated[int | None, Query(ge=0)] = None,
) -> dict:
    """GPU metrics of ``rank``, NIC/RDMA counters and log events (XID, ECC, NCCL...) of
    its host over the time span of the step window (default: the last 20 steps; the
    last 5 minutes when the rank has no completed step in it)."""
    jv = resolve_job(session, store, job, settings.max_world_size)
    if rank >= jv.topo.world_size:
        raise HTTPException(422, detail=f"rank={rank} outside 0..{jv.topo.world_size - 1}")
    host = view_queries.rank_host(store, job, rank)
    window = step_window(store, jv, from_step, to_step, 20)
    span = view_queries.rank_window(store, job, jv.attempt, rank, *window) if window else None
    if span is None:
        now = time.time_ns()
        span = (now - 300 * 10**9, now)
    out: dict = {"job": job, "rank": rank, "host": host, "t0_ns": span[0], "t1_ns": span[1], "series": [], "events": []}
    if not host:
        return out
    df = view_queries.host_metrics(store, host, rank, *span)
    for (name, device), g in df.groupby(["name", "device"], sort=True) if not df.empty else []:
        out["series"].append(
            {"name": str(name), "device": str(device), "ts_ns": g["ts_ns"].astype("int64").tolist(),
             "value": [round(float(v), 4) for v in g["value"]]}
        )
    ev = view_queries.host_events(store, host, job, rank, *span)
    out["events"] = [] if ev.empty else [
        {"ts_ns": int(e["ts_ns"]), "kind": str(e["kind"]), "severity": str(e["severity"]),
         "message": str(e["message"]), "rank": int(e["rank"])}
        for e in ev.to_dict("records")
    ]
    return out
