"""``fleetscope agent``: the per-host daemon that ships spool files and host metrics."""

from __future__ import annotations

import argparse
import re

DESCRIPTION = """\
Run the fleetscope agent on one training host.

It tails every rank's spool files (<spool>/<job>/rank-*/seg-*.fsp, written by
fleetscope.trainer_hooks), ships them in batches to the server and commits its read
offset only after the server acknowledged them, so nothing acknowledged is lost and,
after a crash or restart, nothing is stored twice. It adds GPU metrics (NVML), host,
NIC and RDMA counters, heartbeats every 2 s, matches error lines in trainer logs
(NCCL, CUDA, Xid, ECC, OOM, segfaults, tracebacks) and estimates this host's clock
offset to the server.
"""

EPILOG = """\
state: offsets, the agent's own outbox and rejected frames live in
  <spool>/.fleetscope-agent unless --state-dir says otherwise. Keep it: deleting it
  re-ships everything still in the spool (the server deduplicates).
disk budget (--disk-budget): acked sealed segments go first, oldest first; near the
  budget the agent warns loudly; at the budget with only unacked data left, policy
  'keep' deletes nothing (error logged) and 'drop-oldest' deletes the oldest sealed
  unacked segments (counted, logged, reported as log events).
examples:
  fleetscope agent --server http://ctl:8000 --spool /var/spool/fleetscope
  fleetscope agent --server http://ctl:8000 --spool ./spool --job llama-7b \\
      --log /var/log/train/rank0.log --disk-budget 20G --budget-policy drop-oldest
"""

def parse_size(text: str) -> int:
    """'512M', '20G', '1.5GiB', '1000' -> bytes (binary multiples); CliError if bad."""
    from fleetscope.agent.config import parse_size as parse

    from fleetscope.cli import CliError

    try:
        return parse(text)
    except ValueError as e:
        raise CliError(str(e)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "agent", help="per-host daemon: ship spool files, GPU/host/NIC metrics, heartbeats, logs",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL",
                   help="fleetscope server base URL, e.g. http://ctl:8000")
    p.add_argument("--spool", required=True, metavar="DIR", help="spool directory the trainer writes")
    p.add_argument("--log", action="append", default=[], metavar="FILE", dest="logs",
                   help="trainer log file to scan (repeatable); <spool>/<job>/rank-*/*.log "
                        "are scanned anyway")
    p.add_argument("--token-file", metavar="FILE",
                   help="file holding the bearer token (an 'ingest' token from `fleetscope token "
                        "create --scope ingest`); default $FLEETSCOPE_TOKEN_FILE, else $FLEETSCOPE_TOKEN")
    p.add_argument("--token", metavar="TOKEN", default=None,
                   help="bearer token on the command line: DISCOURAGED, every user of the host "
                        "sees it in `ps`; use --token-file or $FLEETSCOPE_TOKEN")
    # every other flag is generated from AgentConfig's fields (default and help defined once)
    from fleetscope.agent.config import AgentConfig

    from fleetscope.dataclass_cli import add_arguments

    add_arguments(p, AgentConfig)
    p.add_argument("--drain-timeout", type=float, default=5.0, metavar="S",
                   help="on SIGTERM/SIGINT, ship what is on disk for up to S seconds before "
                        "exiting; a second signal exits at once (default 5)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="agent log verbosity (default INFO)")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):
    """An :class:`~fleetscope.agent.config.AgentConfig` from parsed arguments."""
    from fleetscope.agent.config import AgentConfig, ConfigError, read_token

    from fleetscope.cli import CliError
    from fleetscope.dataclass_cli import config_kwargs, flag_name

    if not re.match(r"^https?://", args.server):
        raise CliError(f"--server {args.server!r}: expected an http:// or https:// URL")
    try:
        token = read_token(args.token_file, args.token)
    except ValueError as e:
        raise CliError(f"--token-file: {e}") from None
    try:
        kw = config_kwargs(args, AgentConfig)
    except ValueError as e:  # a bad size
        raise CliError(str(e)) from None
    try:
        return AgentConfig(server=args.server, spool=args.spool, token=token, logs=args.logs, **kw)
    except ConfigError as e:
        raise CliError(f"{flag_name(AgentConfig, e.field)} {e.value}: {e.reason}") from None
    except ValueError as e:
        raise CliError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    import logging
    import signal

    from fleetscope.agent.daemon import Agent
    from fleetscope.agent.priority import raise_priority

    cfg = build_config(args)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    raise_priority(cfg.nice)  # before the agent's threads start: they inherit it
    cfg.spool.mkdir(parents=True, exist_ok=True)
    agent = Agent(cfg)

    def _stop(signum, frame):
        agent.drain_and_stop(args.drain_timeout)  # a second signal stops at once

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run()
    return 0
