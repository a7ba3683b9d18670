"""``fleetscope jobs | job | stragglers | hang | incidents | ack``: RCA from a terminal.

A REST client of the server (``--server`` or ``$FLEETSCOPE_SERVER``; the bearer token
from ``$FLEETSCOPE_TOKEN`` or ``--token-file``). Tables for people, ``--output json``
for scripts. Exit status: 0 success; 1 the condition asked about holds (``hang``: the
job is hung now); 2 a usage error, an unknown job/incident, a refused token or a server
that cannot be reached.

Nothing heavy is imported here: httpx and rich load when a command runs.
"""

from __future__ import annotations

import argparse
import os

from fleetscope import env
from fleetscope.config import DEFAULT_HOST, DEFAULT_PORT

DEFAULT_SERVER = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
STATUSES = ("active", "open", "acknowledged", "resolved", "all")

COMMON_EPILOG = """\
environment:
  FLEETSCOPE_SERVER      server URL (default %(default_server)s)
  FLEETSCOPE_TOKEN       bearer token (a read-only one is enough except for ack)
  FLEETSCOPE_TOKEN_FILE  file holding the token (same as --token-file)

exit status: 0 ok, 1 the condition holds (hang: hung now), 2 error (bad argument,
unknown job or incident, token refused, server unreachable)
"""

COMMANDS = {
    "jobs": ("list jobs: status, topology, step, steps/s, MFU",
             "List the jobs the server knows, newest first, with their step rate and MFU.",
             "  fleetscope jobs\n  fleetscope jobs --status running --output json | jq '.[].id'"),
    "job": ("one job: topology, last step, steps/s, MFU, open incidents",
            "One job: topology, status, last step, step rate, MFU, and its active incidents.",
            "  fleetscope job llama-70b-run3"),
    "stragglers": ("ranked straggler suspects of a job",
                   "Straggling ranks and slow links of the job's latest window, biggest estimated "
                   "slowdown first, with the evidence that names them.",
                   "  fleetscope stragglers llama-70b-run3\n  fleetscope stragglers JOB --kind slow_compute --limit 5"),
    "hang": ("is the job hung; culprit ranks and why (exit 1 while hung)",
             "The current hang analysis of a job: stalled since when, the culprit ranks, the hang class "
             "and the wait-for chain. Exits 1 while the job is hung, 0 when it is not.",
             "  fleetscope hang llama-70b-run3 || page-oncall\n  fleetscope hang JOB --output json | jq .culprits"),
    "incidents": ("incidents (active by default), optionally of one job",
                  "Incidents, newest first: active (open + acknowledged) by default.",
                  "  fleetscope incidents --job llama-70b-run3\n  fleetscope incidents --status all --kind hang"),
    "ack": ("acknowledge an incident",
            "Mark an open incident as seen (it stays active; no new alerts are sent for it).",
            "  fleetscope ack 42 --by alice"),
}


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--server", default=env.SERVER.get() or DEFAULT_SERVER, metavar="URL",
                   help=f"fleetscope server (default $FLEETSCOPE_SERVER or {DEFAULT_SERVER})")
    g.add_argument("--token-file", default=env.TOKEN_FILE.get(), metavar="PATH",
                   help="read the bearer token from PATH (default: $FLEETSCOPE_TOKEN)")
    g.add_argument("--timeout-s", type=float, default=30.0, metavar="S", help="per-request timeout (default 30)")
    p.add_argument("--output", "-o", choices=("table", "json"), default="table",
                   help="table (for people, default) or json (for scripts)")


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, (short, desc, examples) in COMMANDS.items():
        p = subparsers.add_parser(
            name, help=short, description=desc,
            epilog="examples:\n" + examples + "\n\n" + COMMON_EPILOG % {"default_server": DEFAULT_SERVER},
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        if name in ("job", "stragglers", "hang"):
            p.add_argument("job", metavar="JOB", help="job id")
        if name == "jobs":
            p.add_argument("--status", choices=("running", "finished", "failed", "lost"), default=None,
                           help="only jobs with this status")
            p.add_argument("--limit", type=_positive, default=100, help="most jobs to show (default 100)")
        if name == "stragglers":
            p.add_argument("--kind", default=None, help="only this finding kind, e.g. slow_compute")
            p.add_argument("--limit", type=_positive, default=20, help="most suspects to show (default 20)")
        if name == "incidents":
            p.add_argument("--job", default=None, help="only this job's incidents")
            p.add_argument("--status", choices=STATUSES, default="active",
                           help="active (open + acknowledged, default), open, acknowledged, resolved or all")
            p.add_argument("--kind", default=None, help="only this kind, e.g. hang or slow_compute")
            p.add_argument("--limit", type=_positive, default=50, help="most incidents to show (default 50)")
        if name == "ack":
            p.add_argument("id", metavar="ID", type=_positive, help="incident id (see 'fleetscope incidents')")
            p.add_argument("--by", default=os.environ.get("USER", ""), help="who acknowledges (default $USER)")
        _common(p)
        p.set_defaults(func=_run, rca_command=name)


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def _run(args: argparse.Namespace) -> int:
    from .commands import run

    return run(args)
