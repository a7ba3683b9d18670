"""``fleetscope instrument``: set a running job's instrumentation level (runtime control)."""

from __future__ import annotations

import argparse

from fleetscope import env

DESCRIPTION = """\
Set the instrumentation level of a job's hooks while it runs.

  off       nothing recorded (collectives still numbered, so tracing can resume)
  steps     step markers only
  sections  steps and timed sections
  full      steps, sections, every collective and p2p op (the default)

The server keeps the level; each host's agent writes it into the spool, where the
hooks' background thread applies it within about 2.5 s (the trainer makes no
network call). The level is recorded in the telemetry (hooks.instrumentation_level),
so a gap in the data while a job is 'off' is not taken for a hang.
"""

EPILOG = """\
examples:
  fleetscope instrument llama-7b --level steps                 # every rank
  fleetscope instrument llama-7b --level full --ranks 0-7,64   # some ranks
  fleetscope instrument llama-7b                               # show the current level
"""


def parse_ranks(text: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7] (at most 65536 ranks)."""
    from fleetscope.cli import CliError

    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
            else:
                lo = hi = int(part)
        except ValueError:
            raise CliError(f"bad --ranks {text!r}: use e.g. 0-7,12") from None
        if lo < 0 or hi < lo or hi - lo + len(out) >= 1 << 16:
            raise CliError(f"bad --ranks range {part!r} (0 <= lo <= hi, at most 65536 ranks)")
        out.extend(range(lo, hi + 1))
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    from fleetscope.config import DEFAULT_PORT

    p = subparsers.add_parser("instrument", help="set a job's instrumentation level at runtime",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB", help="job id")
    p.add_argument("--level", choices=["off", "steps", "sections", "full"],
                   help="the new level (omit to show the current one)")
    p.add_argument("--ranks", metavar="LIST", help="only these global ranks, e.g. 0-7,12")
    p.add_argument("--server", default=f"http://127.0.0.1:{DEFAULT_PORT}", metavar="URL",
                   help="fleetscope server (default %(default)s)")
    p.add_argument("--token", default=env.TOKEN.get(), metavar="TOKEN",
                   help="admin bearer token (default $FLEETSCOPE_TOKEN)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import httpx

    from fleetscope.cli import CliError
    from fleetscope.config import API_PREFIX

    if args.ranks and not args.level:
        raise CliError("--ranks needs --level")
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    url = f"{args.server.rstrip('/')}{API_PREFIX}/jobs/{args.job}/instrumentation"
    try:
        if args.level:
            body: dict = {"level": args.level}
            if args.ranks:
                body["ranks"] = parse_ranks(args.ranks)
            r = httpx.put(url, json=body, headers=headers, timeout=30)
        else:
            r = httpx.get(url, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise CliError(f"cannot reach {args.server}: {e}") from None
    if r.status_code != 200:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text[:200]
        raise CliError(f"server answered {r.status_code}: {detail}")
    doc = r.json()
    ranks = ", ".join(f"{k}={v}" for k, v in doc["ranks"].items())
    print(f"job {doc['job']}: level {doc['level']}" + (f" (ranks {ranks})" if ranks else "")
          + f", version {doc['version']}")
    return 0
