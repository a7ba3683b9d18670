"""The RCA commands: one REST call (or two) each, then a rich table or the JSON."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any
from urllib.parse import quote

from rich.console import Console
from rich.table import Table

from .client import RcaClient, read_token

SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def run(args: argparse.Namespace) -> int:
    client = RcaClient(args.server, read_token(args.token_file), args.timeout_s)
    try:
        return COMMANDS[args.rca_command](client, args)
    finally:
        client.close()


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def _job_path(job: str) -> str:
    return "/jobs/" + quote(job, safe="")


def _ago(ns: int | None) -> str:
    if not ns:
        return "-"
    s = max(0.0, time.time() - ns / 1e9)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def _topo(t: dict[str, Any]) -> str:
    return f"dp{t.get('dp')} tp{t.get('tp')} pp{t.get('pp')} ({t.get('world_size')} ranks)"


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _ranks(v: list[int], n: int = 8) -> str:
    return ", ".join(str(r) for r in v[:n]) + (f" (+{len(v) - n})" if len(v) > n else "")


def cmd_jobs(client: RcaClient, args: argparse.Namespace) -> int:
    jobs = client.get("/jobs", status=args.status, limit=args.limit)
    if args.output == "json":
        _emit_json(jobs)
        return 0
    t = Table(title=f"jobs on {args.server}", title_justify="left")
    for col in ("job", "status", "topology", "device", "started"):
        t.add_column(col)
    for j in jobs:
        t.add_row(j["id"], j["status"], _topo(j["topology"]), j.get("device_name") or "-", _ago(j.get("start_ns")))
    _console().print(t if jobs else "no jobs")
    return 0


def cmd_job(client: RcaClient, args: argparse.Namespace) -> int:
    job = client.get(_job_path(args.job))
    incidents = client.get("/incidents", job=args.job, status="active", limit=100)
    if args.output == "json":
        _emit_json({**job, "active_incidents": incidents["items"]})
        return 0
    t = Table(show_header=False, title=f"job {job['id']}", title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    rows = [
        ("status", job["status"]), ("name", job.get("name") or "-"), ("topology", _topo(job["topology"])),
        ("device", job.get("device_name") or "-"), ("last step", _num(job.get("last_step"), "{}")),
        ("ranks reporting", str(job.get("num_ranks_reporting", "-"))),
        ("steps/s", _num(job.get("steps_per_s"), "{:.3f}")),
        ("MFU", "-" if job.get("mfu") is None else f"{100 * job['mfu']:.1f}%"),
        ("started", _ago(job.get("start_ns"))), ("host", job.get("host") or "-"),
    ]  # fmt: skip
    for k, v in rows:
        t.add_row(k, v)
    con = _console()
    con.print(t)
    con.print(_incident_table(incidents["items"], f"active incidents ({incidents['total']})")
              if incidents["items"] else "no active incidents")
    return 0


def cmd_stragglers(client: RcaClient, args: argparse.Namespace) -> int:
    d = client.get(_job_path(args.job) + "/stragglers", kind=args.kind, limit=args.limit)
    if args.output == "json":
        _emit_json(d)
        return 0
    if not d["items"]:
        _console().print(f"no straggler suspects in job {args.job}'s latest window")
        return 0
    t = Table(title=f"straggler suspects of {args.job} ({d['total']})", title_justify="left")
    for col, just in (("#", "right"), ("kind", "left"), ("ranks", "left"), ("hosts", "left"),
                      ("est. slowdown", "right"), ("score", "right"), ("steps", "left"), ("summary", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for n, f in enumerate(d["items"], start=1):
        t.add_row(str(n), f["kind"], _ranks(f["ranks"]), _ranks(f["hosts"], 3), f"{100 * f['est_slowdown']:.1f}%",
                  f"{f['score']:.2f}", f"{f['first_step']}-{f['last_step']}", f["summary"])
    _console().print(t)
    return 0


def cmd_hang(client: RcaClient, args: argparse.Namespace) -> int:
    h = client.get(_job_path(args.job) + "/hang")
    rc = 1 if h.get("stalled") else 0
    if args.output == "json":
        _emit_json(h)
        return rc
    con = _console()
    if not h.get("stalled"):
        con.print(f"job {args.job} is not hung (last step {h.get('last_step')}, "
                  f"stall threshold {h.get('threshold_s', 0):.0f} s)")
        return rc
    con.print(f"[bold red]job {args.job} is HUNG[/] for {h['stalled_for_s']:.0f} s after step {h['last_step']}: "
              f"culprit rank(s) [bold]{_ranks(h['culprits'], 16)}[/], class {h.get('hang_class') or '-'}"
              + (f", group {h['group_id']}" if h.get("group_id") else ""))
    if h.get("chain"):
        t = Table(title="wait-for chain", title_justify="left")
        for col in ("waiting rank", "waits for", "why"):
            t.add_column(col)
        for edge in h["chain"][:50]:
            t.add_row(*(str(x) for x in edge[:3]))
        con.print(t)
    return rc


def _incident_table(items: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("id", "severity", "status", "job", "kind", "ranks", "opened", "summary"):
        t.add_column(col, justify="right" if col == "id" else "left")
    for i in items:
        sev = i.get("severity", "")
        t.add_row(str(i["id"]), f"[{SEVERITY_STYLE.get(sev, '')}]{sev}[/]" if sev in SEVERITY_STYLE else sev,
                  i["status"], i["job"], i["kind"], _ranks(i.get("ranks") or []), _ago(i.get("opened_ns")),
                  i.get("summary", ""))
    return t


def cmd_incidents(client: RcaClient, args: argparse.Namespace) -> int:
    status = None if args.status == "all" else args.status
    d = client.get("/incidents", job=args.job, status=status, kind=args.kind, limit=args.limit)
    if args.output == "json":
        _emit_json(d)
        return 0
    what = f"{args.status} incidents" + (f" of {args.job}" if args.job else "")
    _console().print(_incident_table(d["items"], f"{what} ({d['total']})") if d["items"] else f"no {what}")
    return 0


def cmd_ack(client: RcaClient, args: argparse.Namespace) -> int:
    inc = client.post(f"/incidents/{args.id}/acknowledge", {"by": args.by})
    if args.output == "json":
        _emit_json(inc)
    else:
        _console().print(f"incident {inc['id']} ({inc['kind']}, job {inc['job']}) acknowledged"
                         + (f" by {inc['acknowledged_by']}" if inc.get("acknowledged_by") else ""))
    return 0


COMMANDS = {
    "jobs": cmd_jobs, "job": cmd_job, "stragglers": cmd_stragglers, "hang": cmd_hang,
    "incidents": cmd_incidents, "ack": cmd_ack,
}  # fmt: skip
