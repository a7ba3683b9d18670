"""Internal routes for diagnosis workers that run in their own process.

With the embedded store (chdb) one process - the server - owns the store directory, so
a worker process (``fleetscope worker``) reaches the store through these routes: it
names one of the diagnosis queries (:func:`fleetscope.server.diagnosis.loader.named_queries`;
never SQL text) with its parameters and gets the result as an Arrow IPC stream. The
queries return reductions (O(ranks) rows), so the transfer stays small. It also reads
when each host's agent last delivered a batch (the collector's memory) and wakes the
alert dispatcher after queueing notifications. Behind the same bearer token as the API.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
from fastapi import APIRouter, HTTPException, Request, Response
from fleetscope.server.api.deps import DiagnosisStoreDep
from fleetscope.server.api.diagnosis import Verdict, publish
from fleetscope.server.diagnosis.findings import finding_from_dict, hang_from_dict
from fleetscope.server.diagnosis.loader import named_queries
from pydantic import BaseModel, Field

router = APIRouter(tags=["internal"], prefix="/internal/diagnosis")
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_QUERIES = named_queries()
MAX_FINDINGS = 10_000
"""The most findings one published verdict carries."""


class QueryIn(BaseModel):
    name: str = Field(description="a diagnosis query name", max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)


@router.post("/query", response_class=Response, responses={200: {"content": {ARROW_STREAM: {}}}})
async def query(body: QueryIn, store: DiagnosisStoreDep) -> Response:
    """Run one named diagnosis query; the rows as an Arrow IPC stream."""
    sql = _QUERIES.get(body.name)
    if sql is None:
        raise HTTPException(422, detail=f"name {body.name!r}: not a diagnosis query")
    try:
        table = await asyncio.to_thread(_arrow, store, sql, body.params)
    except Exception as e:  # a bad parameter: ClickHouse names it
        raise HTTPException(422, detail=f"query {body.name}: {str(e).splitlines()[0][:300]}") from None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return Response(sink.getvalue().to_pybytes(), media_type=ARROW_STREAM)


def _arrow(store: Any, sql: str, params: dict[str, Any]) -> pa.Table:
    """The query as an Arrow table (through the store's DataFrame path, the one every other
    caller of the embedded engine takes)."""
    df = store.query_df(sql, params)
    for c in df.columns:  # nullable extension ints -> plain numpy (no NULLs in these queries)
        if str(df[c].dtype) in ("UInt8", "UInt16", "UInt32", "UInt64", "Int8", "Int16", "Int32", "Int64"):
            df[c] = df[c].astype("int64")
    return pa.Table.from_pandas(df, preserve_index=False)


class VerdictIn(BaseModel):
    job: str = Field(max_length=256)
    computed_ns: int = Field(ge=0)
    took_s: float = Field(ge=0, le=86400)
    findings: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_FINDINGS)
    hang: dict[str, Any]


@router.post("/verdict")
def verdict(body: VerdictIn, request: Request) -> dict[str, int]:
    """A worker's latest verdict of a job (findings and hang analysis): the API's
    ``/stragglers`` and ``/hang`` answer it while it is fresh."""
    try:
        findings = [finding_from_dict(f) for f in body.findings]
        hang = hang_from_dict({**body.hang, "job": body.job})
    except (KeyError, TypeError, ValueError) as e:
        raise HTTPException(422, detail=f"verdict of job {body.job[:64]!r}: {str(e)[:200]}") from None
    publish(request.app, Verdict(body.job, body.computed_ns, findings, hang, body.took_s))
    return {"findings": len(findings)}


@router.get("/host-seen")
def host_seen(request: Request) -> dict[str, int]:
    """Host -> server time (ns) of the latest batch its agent delivered to this server."""
    collector = request.app.state.collector
    return dict(collector.host_seen_ns) if collector is not None else {}


@router.get("/job-seen")
def job_seen(request: Request) -> dict[str, int]:
    """Job -> server time (ns) of the latest batch holding its rows."""
    collector = request.app.state.collector
    return dict(collector.job_seen_ns) if collector is not None else {}


class PassesIn(BaseModel):
    worker: str = Field(description="the reporting worker's id", max_length=200)
    passes: dict[str, list[float]] = Field(
        description="pass name -> [count, total seconds, latest seconds] since the worker started",
        max_length=16)


MAX_WORKERS_REPORTED = 64
"""Workers whose pass times one server keeps (the oldest report goes first)."""


@router.post("/passes")
def report_passes(body: PassesIn, request: Request) -> dict[str, int]:
    """A worker's diagnosis pass times, exported by this server's GET /metrics."""
    for name, v in body.passes.items():
        if len(v) != 3 or any(not (x >= 0) for x in v) or len(name) > 64:
            raise HTTPException(422, detail=f"passes[{name[:64]!r}]: expected [count, total_s, latest_s] >= 0")
    reports = request.app.state.worker_passes
    reports.pop(body.worker, None)
    reports[body.worker] = {k: (int(v[0]), float(v[1]), float(v[2])) for k, v in body.passes.items()}
    while len(reports) > MAX_WORKERS_REPORTED:
        reports.pop(next(iter(reports)))
    return {"workers": len(reports)}


@router.post("/wake-alerts")
def wake_alerts(request: Request) -> dict[str, bool]:
    """Deliver newly queued alert notifications now rather than at the next poll."""
    d = request.app.state.alert_dispatcher
    if d is not None and hasattr(d, "wake"):
        d.wake()
        return {"woken": True}
    return {"woken": False}
