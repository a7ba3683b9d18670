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

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'512M', '20G', '1.5GiB', '1000' -> bytes (binary multiples)."""
    from fleetscope.cli import CliError

    m = _SIZE.match(text)
    if not m:
        raise CliError(f"bad size {text!r}; use e.g. 500M, 20G or a number of bytes")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "agent", help="per-host daemon: ship spool files, GPU/host/NIC metrics, heartbeats, logs",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL",
                   help="fleetscope server base URL, e.g. http://ctl:8000")
    p.add_argument("--spool", required=True, metavar="DIR", help="spool directory the trainer writes")
    p.add_argument("--job", metavar="ID", help="ship only this job (default: every job in the spool)")
    p.add_argument("--log", action="append", default=[], metavar="FILE", dest="logs",
                   help="trainer log file to scan (repeatable); <spool>/<job>/rank-*/*.log "
                        "are scanned anyway")
    p.add_argument("--state-dir", metavar="DIR", help="offsets/outbox dir (default <spool>/.fleetscope-agent)")
    p.add_argument("--host", metavar="NAME", help="host name to report (default: this host's name)")
    p.add_argument("--token-file", metavar="FILE",
                   help="file holding the bearer token (an 'ingest' token from `fleetscope token "
                        "create --scope ingest`); default $FLEETSCOPE_TOKEN_FILE, else $FLEETSCOPE_TOKEN")
    p.add_argument("--token", metavar="TOKEN", default=None,
                   help="bearer token on the command line: DISCOURAGED, every user of the host "
                        "sees it in `ps`; use --token-file or $FLEETSCOPE_TOKEN")
    g = p.add_argument_group("batching and retries")
    g.add_argument("--batch-bytes", default="4M", metavar="SIZE",
                   help="ship when this much spool data is pending (default 4M)")
    g.add_argument("--batch-delay", type=float, default=0.5, metavar="S",
                   help="...or when the oldest pending frame waited this long (default 0.5)")
    g.add_argument("--in-flight", type=int, default=4, metavar="N",
                   help="batches on the wire at once (default 4; 1 = one request at a time)")
    g.add_argument("--poll", type=float, default=0.1, metavar="S", help="spool scan period (default 0.1)")
    g.add_argument("--compression", default="zstd", choices=["zstd", "lz4", "none"],
                   help="wire compression (default zstd)")
    g.add_argument("--max-backoff", type=float, default=5.0, metavar="S",
                   help="cap of the exponential retry backoff (default 5)")
    g = p.add_argument_group("retention")
    g.add_argument("--disk-budget", metavar="SIZE", help="spool disk budget, e.g. 20G (default none)")
    g.add_argument("--budget-policy", choices=["keep", "drop-oldest"], default="keep",
                   help="at the budget with only unacked data left (default keep)")
    g.add_argument("--rejected-max", default="64M", metavar="SIZE",
                   help="cap of <state>/rejected/ (frames the server refused; oldest deleted "
                        "beyond it; default 64M)")
    g.add_argument("--retain-acked", action="store_true",
                   help="keep acked sealed segments until the budget needs the space")
    g = p.add_argument_group("metrics, heartbeats, clock")
    g.add_argument("--metrics-interval", type=float, default=10.0, metavar="S",
                   help="GPU/host/NIC metric period (default 10)")
    g.add_argument("--heartbeat", type=float, default=2.0, metavar="S", help="heartbeat period (default 2)")
    g.add_argument("--no-gpu", action="store_true", help="do not use NVML")
    g.add_argument("--no-clock-sync", action="store_true",
                   help="do not estimate the clock offset (send 0)")
    g.add_argument("--otlp-endpoint", metavar="URL",
                   help="also export metrics via OTLP/HTTP, e.g. http://otel:4318/v1/metrics")
    g.add_argument("--proc-root", default="/proc", metavar="DIR", help="procfs root (default /proc)")
    g.add_argument("--sys-root", default="/sys", metavar="DIR", help="sysfs root (default /sys)")
    p.add_argument("--drain-timeout", type=float, default=5.0, metavar="S",
                   help="on SIGTERM/SIGINT, ship what is on disk for up to S seconds before "
                        "exiting; a second signal exits at once (default 5)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="agent log verbosity (default INFO)")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace):
    """An :class:`~fleetscope.agent.config.AgentConfig` from parsed arguments."""
    from fleetscope.agent.config import AgentConfig

    from fleetscope.cli import CliError

    if not re.match(r"^https?://", args.server):
        raise CliError(f"--server {args.server!r}: expected an http:// or https:// URL")
    for name in ("batch_delay", "poll", "metrics_interval", "heartbeat", "max_backoff"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be positive")
    from fleetscope.agent.config import read_token

    try:
        token = read_token(args.token_file, args.token)
    except ValueError as e:
        raise CliError(f"--token-file: {e}") from None
    kw = {}
    if args.host:
        kw["host"] = args.host
    try:
        return AgentConfig(
            server=args.server, spool=args.spool, job=args.job, state_dir=args.state_dir,
            token=token, batch_bytes=parse_size(args.batch_bytes),
            rejected_max_bytes=parse_size(args.rejected_max),
            batch_delay_s=args.batch_delay, poll_s=args.poll, compression=args.compression,
            in_flight=args.in_flight,
            max_backoff_s=args.max_backoff, clock_sync=not args.no_clock_sync,
            heartbeat_s=args.heartbeat, metrics_interval_s=args.metrics_interval,
            gpu=not args.no_gpu, proc_root=args.proc_root, sys_root=args.sys_root,
            otlp_endpoint=args.otlp_endpoint, logs=args.logs,
            disk_budget_bytes=parse_size(args.disk_budget) if args.disk_budget else None,
            budget_policy=args.budget_policy, retain_acked=args.retain_acked, **kw)
    except ValueError as e:
        raise CliError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    import logging
    import signal

    from fleetscope.agent.daemon import Agent

    cfg = build_config(args)
    logging.basicConfig(level=getattr(logging, args.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg.spool.mkdir(parents=True, exist_ok=True)
    agent = Agent(cfg)

    def _stop(signum, frame):
        agent.drain_and_stop(args.drain_timeout)  # a second signal stops at once

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run()
    return 0
