"""``fleetscope demo``: the server on an embedded store with synthetic data, one command.

Starts ``fleetscope server`` in this process on ``./.fleetscope/demo`` (embedded
ClickHouse + SQLite), posts a synthetic 3D-parallel job (dp=2 tp=2 pp=2, one slow rank)
through the real ingest API, prints the URLs to open, and serves until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

HELP = """\
Run a self-contained demo: the fleetscope server on an embedded store under
./.fleetscope/demo, fed with a synthetic 8-rank 3D-parallel job (rank 5 is a
straggler). Prints the API (and dashboard) URLs and serves until Ctrl-C.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="server + synthetic job on one machine", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--dir", default="./.fleetscope/demo", help="demo data directory (default ./.fleetscope/demo)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--steps", type=int, default=40, help="synthetic training steps to post (default 40)")
    p.add_argument(
        "--exit-after", type=float, metavar="S", default=None,
        help="stop S seconds after the synthetic data is posted (for tests and scripts)",
    )  # fmt: skip
    p.add_argument("--no-ui", action="store_true", help="do not mount the dashboard")
    p.set_defaults(func=run)


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


def run(args: argparse.Namespace) -> int:
    from fleetscope.cli import CliError

    if args.steps < 2:
        raise CliError(f"--steps {args.steps}: need at least 2")
    workdir = os.path.abspath(args.dir)
    os.makedirs(workdir, exist_ok=True)

    import uvicorn

    from fleetscope.server.app import create_app
    from fleetscope.server.settings import Settings

    settings = Settings(
        store_url=f"chdb://{os.path.join(workdir, 'store')}",
        db_url=f"sqlite:///{os.path.join(workdir, 'control.db')}",
        host=args.host,
        port=args.port,
        ui=not args.no_ui,
        log_level="warning",
    )
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    failure: list[str] = []
    threading.Thread(target=_feed_or_stop, args=(server, args, failure), daemon=True).start()
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits 1 when it cannot bind
        raise CliError(f"cannot serve on {args.host}:{args.port} (port in use?)") from e
    if failure:
        raise CliError(f"posting the synthetic job failed: {failure[0]}")
    return 0


def _feed_or_stop(server: Any, args: argparse.Namespace, failure: list[str]) -> None:
    try:
        _feed(server, args)
    except Exception as e:  # report through the exit status, not a thread traceback
        failure.append(str(e))
        server.should_exit = True
        return
    if args.exit_after is not None:
        time.sleep(args.exit_after)
        server.should_exit = True


def _feed(server: Any, args: argparse.Namespace) -> None:
    import httpx

    from fleetscope import codec

    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    base = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{port}"
    job = time.strftime("demo-%Y%m%d-%H%M%S")
    rows = synthetic_job(job, args.steps, time.time_ns() - args.steps * 400_000_000)
    r = httpx.post(
        f"{base}/api/v1/ingest",
        content=codec.encode_batch(rows),
        headers={"Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": job},
        timeout=120,
    )
    r.raise_for_status()
    total = sum(r.json()["rows"].values())
    detail = httpx.get(f"{base}/api/v1/jobs/{job}", timeout=30).json()
    print(f"fleetscope demo: posted {total} rows of job {job} "
          f"(last step {detail.get('last_step')}, {detail.get('steps_per_s') or 0:.2f} steps/s)", flush=True)  # fmt: skip
    print(f"  API:       {base}/api/v1/jobs/{job}", flush=True)
    print(f"  breakdown: {base}/api/v1/jobs/{job}/steps?from_step=0&to_step=5", flush=True)
    print(f"  OpenAPI:   {base}/docs", flush=True)
    if any(getattr(route, "path", "") == "/ui" for route in server.config.app.routes):
        print(f"  dashboard: {base}/ui/", flush=True)
    if args.exit_after is None:
        print("Ctrl-C to stop.", flush=True)
