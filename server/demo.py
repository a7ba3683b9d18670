"""``fleetscope demo``: the whole system on one machine, one command.

By default it runs, on an embedded store under ``./.fleetscope/demo``:

1. the server (collector + REST API + diagnosis loop + dashboard at ``/ui``);
2. a webhook receiver on loopback that prints every alert it is sent;
3. the reference 3D-parallel trainer (dp=2 tp=2 pp=2, gloo) with its host agent, with
   an injected compute straggler (rank 5, from step 3) and later a hang (rank 3 stops
   before a tensor-parallel collective);

and prints the findings, the incident and the delivered alerts as they happen, then
keeps serving the dashboard until Ctrl-C. ``--synthetic`` instead posts a generated job
(no torch needed) and serves it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HELP = """\
Run the whole system on this machine: the fleetscope server on an embedded store
under ./.fleetscope/demo, a local webhook receiver that prints the alerts it gets,
and the reference trainer (8 ranks: dp=2 tp=2 pp=2, gloo on CPU) with its host agent
and two injected faults: a straggler on rank 5 and later a hang on rank 3. Prints the
dashboard URL at once, the findings and alerts as they arrive, and serves until
Ctrl-C. With --synthetic, posts a generated job instead of training (no torch).
"""

TRAIN_MODEL = ["--dp", "2", "--tp", "2", "--pp", "2", "--hidden", "128", "--seq-len", "64",
               "--global-batch", "8", "--microbatches", "4"]  # fmt: skip


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="server + dashboard + reference job with injected faults",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--dir", default="./.fleetscope/demo", help="demo data directory (default ./.fleetscope/demo)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--synthetic", action="store_true",
                   help="post a generated job instead of running the reference trainer")  # fmt: skip
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default 400; with --synthetic: steps to post, default 40)")  # fmt: skip
    p.add_argument("--straggler", default="rank=5:factor=1.5:from_step=3", metavar="SPEC",
                   help="straggler injection (see 'fleetscope train --help'); '' for none")  # fmt: skip
    p.add_argument("--hang", default="rank=3:step=40:where=collective", metavar="SPEC",
                   help="hang injection; '' for none (default rank=3:step=40:where=collective)")  # fmt: skip
    p.add_argument("--scenario-timeout-s", type=float, default=900.0, metavar="S",
                   help="stop the training job after S seconds at the latest (default 900)")  # fmt: skip
    p.add_argument(
        "--exit-after", type=float, metavar="S", default=None,
        help="exit S seconds after the scenario is over (default: serve until Ctrl-C)",
    )  # fmt: skip
    p.add_argument("--no-ui", action="store_true", help="do not mount the dashboard")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fleetscope.cli import CliError

    steps = args.steps if args.steps is not None else (40 if args.synthetic else 400)
    if steps < 2:
        raise CliError(f"--steps {steps}: need at least 2")
    if args.port < 0 or args.port > 65535:
        raise CliError(f"--port {args.port}: not a TCP port")
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
        webhook_allow="127.0.0.1",  # the demo's own webhook receiver on loopback
    )
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    failure: list[str] = []
    scenario = _synthetic if args.synthetic else _training
    threading.Thread(
        target=_scenario_or_stop, args=(server, args, steps, workdir, scenario, failure), daemon=True
    ).start()
    try:
        server.run()
    except SystemExit as e:  # uvicorn exits 1 when it cannot bind
        raise CliError(f"cannot serve on {args.host}:{args.port} (port in use? try --port 0)") from e
    if failure:
        raise CliError(failure[0])
    return 0


def _scenario_or_stop(server: Any, args: argparse.Namespace, steps: int, workdir: str,
                      scenario: Any, failure: list[str]) -> None:  # fmt: skip
    try:
        base = _wait_started(server, args.host)
        if base is None:
            return
        scenario(base, server, args, steps, workdir)
    except Exception as e:  # report through the exit status, not a thread traceback
        failure.append(f"demo scenario failed: {e}")
        server.should_exit = True
        return
    if args.exit_after is not None:
        time.sleep(args.exit_after)
        server.should_exit = True
    else:
        print("Serving; Ctrl-C to stop.", flush=True)


def _wait_started(server: Any, host: str) -> str | None:
    while not server.started:
        if server.should_exit:
            return None
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"


def _print_urls(base: str, job: str, server: Any) -> None:
    print(f"  API:       {base}/api/v1/jobs/{job}", flush=True)
    print(f"  OpenAPI:   {base}/docs", flush=True)
    if any(getattr(route, "path", "") == "/ui" for route in server.config.app.routes):
        print(f"  dashboard: {base}/ui/", flush=True)


# ---------------------------------------------------------------------------------------
# synthetic
# ---------------------------------------------------------------------------------------
def _synthetic(base: str, server: Any, args: argparse.Namespace, steps: int, workdir: str) -> None:
    import httpx
    from fleetscope.sim.offline import demo_tables

    from fleetscope import codec

    job = time.strftime("demo-%Y%m%d-%H%M%S")
    tables = demo_tables(job, steps, time.time_ns() - steps * 400_000_000)
    r = httpx.post(
        f"{base}/api/v1/ingest",
        content=codec.encode_batch(tables),
        headers={"Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": job},
        timeout=120,
    )
    r.raise_for_status()
    total = sum(r.json()["rows"].values())
    detail = httpx.get(f"{base}/api/v1/jobs/{job}", timeout=30).json()
    print(f"fleetscope demo: posted {total} rows of job {job} "
          f"(last step {detail.get('last_step')}, {detail.get('steps_per_s') or 0:.2f} steps/s)", flush=True)  # fmt: skip
    _print_urls(base, job, server)
    print(f"  breakdown: {base}/api/v1/jobs/{job}/steps?from_step=0&to_step=5", flush=True)


# ---------------------------------------------------------------------------------------
# the real job
# ---------------------------------------------------------------------------------------
class _Receiver:
    """A webhook receiver on loopback that prints each Alertmanager-style notification."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.end_headers()
                try:
                    payload = json.loads(body)
                except ValueError:
                    return
                outer.received.append(payload)
                for alert in payload.get("alerts", []):
                    labels, notes = alert.get("labels", {}), alert.get("annotations", {})
                    print(f"[webhook] {payload.get('status', '?').upper()} {labels.get('alertname')} "
                          f"job={labels.get('job')} culprit ranks={notes.get('culprit_ranks', '?')}: "
                          f"{notes.get('summary', '')}", flush=True)  # fmt: skip

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def _training(base: str, server: Any, args: argparse.Namespace, steps: int, workdir: str) -> None:
    import httpx

    http = httpx.Client(base_url=f"{base}/api/v1", timeout=30)
    rx = _Receiver()
    http.post("/alerts/webhooks", json={"name": f"demo-receiver-{int(time.time())}", "url": rx.url}).raise_for_status()
    job = time.strftime("demo-%Y%m%d-%H%M%S")
    cmd = [sys.executable, "-m", "fleetscope.cli", "train", *TRAIN_MODEL, "--steps", str(steps),
           "--job", job, "--server", base, "--spool", os.path.join(workdir, "spool"),
           "--timeout-s", str(int(args.scenario_timeout_s))]  # fmt: skip
    faults = []
    if args.straggler:
        cmd += ["--inject", f"straggler:{args.straggler}"]
        faults.append(f"straggler {args.straggler}")
    if args.hang:
        cmd += ["--inject", f"hang:{args.hang}"]
        faults.append(f"hang {args.hang}")
    log_path = os.path.join(workdir, f"{job}.log")
    print(f"fleetscope demo: training job {job} (8 ranks, dp=2 tp=2 pp=2) with injected "
          f"{' and '.join(faults) or 'no faults'}; trainer log {log_path}", flush=True)  # fmt: skip
    _print_urls(base, job, server)
    if not args.no_ui:
        print(f"  job page:  {base}/ui/jobs/{job}", flush=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        _watch(http, job, proc, rx, args, steps)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    _summary(http, job, rx)


def _step_bar(total: int) -> Any:
    """A rich progress bar of the job's steps on a terminal; None elsewhere (or without rich),
    where the demo prints every tenth step instead."""
    if not sys.stdout.isatty():
        return None
    try:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )
    except ImportError:
        return None
    bar = Progress(TextColumn("training steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar.add_task("steps", total=total)
    bar.start()
    return bar


def _watch(http: Any, job: str, proc: subprocess.Popen, rx: _Receiver, args: argparse.Namespace,
           steps: int) -> None:
    """Print progress and findings until the hang is alerted (or the job ends)."""
    bar = _step_bar(steps)
    try:
        _watch_loop(http, job, proc, rx, args, bar)
    finally:
        if bar is not None:
            bar.stop()


def _watch_loop(http: Any, job: str, proc: subprocess.Popen, rx: _Receiver, args: argparse.Namespace,
                bar: Any) -> None:
    deadline = time.monotonic() + args.scenario_timeout_s
    seen: set[str] = set()
    last_step, hang_seen_at = None, None
    while time.monotonic() < deadline:
        time.sleep(2)
        step = _get(http, f"/jobs/{job}").get("last_step")
        if bar is not None and step is not None:
            bar.update(bar.task_ids[0], completed=step + 1)
        elif step is not None and step != last_step and (last_step is None or step // 10 != last_step // 10):
            print(f"  ... step {step}", flush=True)
        last_step = step if step is not None else last_step
        for item in _get(http, f"/jobs/{job}/stragglers").get("items", []):
            key = f"{item.get('kind')}:{item.get('ranks')}"
            if key not in seen:
                seen.add(key)
                print(f"[finding] {item.get('kind')} ranks={item.get('ranks')} "
                      f"est. slowdown {100 * (item.get('est_slowdown') or 0):.1f}%", flush=True)  # fmt: skip
        hang = _get(http, f"/jobs/{job}/hang")
        if hang.get("stalled") and hang_seen_at is None:
            hang_seen_at = time.monotonic()
            print(f"[finding] HANG after step {hang.get('last_step')}: class={hang.get('hang_class')} "
                  f"culprit ranks={hang.get('culprits')} group={hang.get('group_id') or '-'} "
                  f"(stalled {hang.get('stalled_for_s')} s)", flush=True)  # fmt: skip
        hang_alerted = any(p.get("commonLabels", {}).get("alertname") == "FleetscopeHang" for p in rx.received)
        if hang_alerted or (hang_seen_at and time.monotonic() - hang_seen_at > 60):
            return
        if proc.poll() is not None:
            print(f"  training job exited with status {proc.returncode}", flush=True)
            time.sleep(5)
            return
    print("  scenario time limit reached; stopping the training job", flush=True)


def _get(http: Any, path: str) -> dict:
    try:
        r = http.get(path)
        return r.json() if r.status_code == 200 else {}
    except Exception:  # the demo keeps going while the server is busy
        return {}


def _summary(http: Any, job: str, rx: _Receiver) -> None:
    incidents = _get(http, "/incidents?job=" + job).get("items", [])
    print(f"fleetscope demo: {len(incidents)} incident(s) for {job}, {len(rx.received)} webhook "
          f"notification(s) delivered", flush=True)  # fmt: skip
    for inc in incidents:
        print(f"  incident #{inc.get('id')} {inc.get('kind')} [{inc.get('status')}] ranks={inc.get('ranks')}: "
              f"{inc.get('summary', '')}", flush=True)  # fmt: skip
