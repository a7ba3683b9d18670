"""``fleetscope simulate``: play a 3D-parallel job of any size through the real ingest path."""

from __future__ import annotations

import argparse
from typing import Any

from fleetscope import env

HELP = "simulate a DP x PP x TP job of any size (one agent per host) against a server"

DESCRIPTION = """\
Play a 3D-parallel training job of any size (12,288 ranks on 1,536 hosts is the
yardstick) against a real fleetscope server, in real time. The telemetry is what the
real hooks and agents produce - jobs, steps, sections per micro-batch, TP/DP
collectives and PP p2p ops with per-group sequence numbers, in-flight liveness rows,
host and rank heartbeats, GPU and host metrics - with the reference trainer's
schedule (1F1B, TP lock-step, DP sync: a late rank makes its peers wait). It is
generated vectorised with numpy/Arrow and shipped by one simulated agent per host
through the agent's own transport (Arrow IPC batches, Idempotency-Key, host and clock
headers, bounded in-flight requests, 429 honoured).
"""

EPILOG = """\
fault injection (--inject, repeatable; the same specs as 'fleetscope train' plus
host_down; the ground truth goes to --results DIR/ground_truth.json, never into the
telemetry):
  straggler:rank=R:factor=F[:from_step=S][:section=compute|dataloader]
  hang:rank=R:step=S[:where=compute|collective|p2p|in_collective|in_p2p]
  crash:rank=R:step=S
  slowlink:group=tp|dp|pp:rank=R:delay_ms=D
  gc:rank=R:every=N:pause_ms=P
  host_down:host=H:step=S          (hosts are numbered 0.., ranks H*G .. H*G+G-1)

examples:
  fleetscope simulate --server http://127.0.0.1:8000 --dp 2 --tp 2 --pp 2 --steps 50
  fleetscope simulate --server http://127.0.0.1:8000 --dp 192 --pp 8 --tp 8 --steps 30 \\
      --inject hang:rank=4242:step=12:where=collective --results ./sim-results

A summary (records generated/acknowledged, generation time per step, lag, 429s) is
printed at the end and written to DIR/summary.json. Exit status 0 when every batch
was acknowledged, 1 when some were rejected or not acknowledged before the drain
timeout.
"""


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand."""
    p = subparsers.add_parser("simulate", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, metavar="URL", help="fleetscope server base URL")
    g = p.add_argument_group("job")
    g.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    g.add_argument("--microbatches", type=int, default=4, metavar="M",
                   help="micro-batches per step and replica (default 4)")
    g.add_argument("--gpus-per-host", type=int, default=8, metavar="G",
                   help="ranks per host; one simulated agent per host (default 8)")
    g.add_argument("--step-ms", type=float, default=2000.0, metavar="T",
                   help="target step time in ms (default 2000)")
    g.add_argument("--steps", type=int, default=30, metavar="S", help="training steps (default 30)")
    g.add_argument("--job", default=None, metavar="ID", help="job id (default sim-<time>)")
    g.add_argument("--tp-ops-per-microbatch", type=int, default=4, metavar="K",
                   help="TP collectives in each forward and each backward of a micro-batch "
                        "(default 4: the reference model's 2 blocks per stage); real "
                        "Megatron-style jobs issue several per layer")
    g.add_argument("--seed", type=int, default=0, metavar="K", help="seed of all noise (default 0)")
    g.add_argument("--inject", action="append", default=[], metavar="SPEC",
                   help="inject a fault (repeatable; see below)")
    g.add_argument("--results", default=None, metavar="DIR",
                   help="write ground_truth.json (faults, onsets, culprits) and summary.json here")
    s = p.add_argument_group("shipping")
    s.add_argument("--token", default=env.TOKEN.get(), metavar="TOKEN",
                   help="bearer token for the server (default $FLEETSCOPE_TOKEN)")
    s.add_argument("--batch-delay", type=float, default=None, metavar="S",
                   help="how often each agent cuts a batch (default: the agent's, 0.5)")
    s.add_argument("--in-flight", type=int, default=None, metavar="N",
                   help="requests per agent on the wire at once (default: the agent's, 4)")
    s.add_argument("--senders", type=int, default=0, metavar="N",
                   help="sender threads shared by all simulated agents (default 0: one per "
                        "two hosts, 16..256)")
    s.add_argument("--compression", default="none", choices=["none", "lz4", "zstd"],
                   help="Arrow IPC compression (default none: 1,536 agents' zstd would "
                        "measure this machine's CPU, not the server)")
    s.add_argument("--no-coalesce", dest="coalesce", action="store_false",
                   help="one request per batch: do not merge a host's batches queued behind its "
                        "busy requests into one (the behaviour before coalescing, for comparison)")
    s.add_argument("--fast", action="store_true",
                   help="do not wait for real time: the job is played as fast as it ships, with "
                        "time-stamps that end when the simulator started")
    s.add_argument("--drain-timeout", type=float, default=60.0, metavar="S",
                   help="at the end, wait this long for unacknowledged batches (default 60)")
    s.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    """SimConfig from parsed arguments; CliError names the bad value."""
    import dataclasses
    import time

    from fleetscope.agent.config import AgentConfig
    from fleetscope.sim.runner import SimConfig

    from fleetscope.cli import CliError

    agent_defaults = {f.name: f.default for f in dataclasses.fields(AgentConfig)}
    try:
        cfg = SimConfig(
            server=args.server, dp=args.dp, tp=args.tp, pp=args.pp,
            num_microbatches=args.microbatches, gpus_per_host=args.gpus_per_host,
            step_ms=args.step_ms, steps=args.steps,
            job=args.job or time.strftime("sim-%Y%m%d-%H%M%S"), injections=tuple(args.inject),
            seed=args.seed, results_dir=args.results or "",
            tp_ops_per_microbatch=args.tp_ops_per_microbatch, token=args.token,
            batch_delay_s=agent_defaults["batch_delay_s"] if args.batch_delay is None else args.batch_delay,
            in_flight=agent_defaults["in_flight"] if args.in_flight is None else args.in_flight,
            senders=args.senders, compression=None if args.compression == "none" else args.compression,
            coalesce=args.coalesce, fast=args.fast, drain_timeout_s=args.drain_timeout, progress=not args.quiet,
        )
        from fleetscope.topology import Topology

        Topology(dp=args.dp, tp=args.tp, pp=args.pp)
        cfg.check()
    except ValueError as e:
        raise CliError(str(e)) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    import threading

    from fleetscope.sim.runner import install_signal_stop
    from fleetscope.sim.runner import run as run_sim

    cfg = build_config(args)
    topo = cfg.topology
    print(f"fleetscope simulate: job {cfg.job}: {topo.world_size} ranks (dp={topo.dp} pp={topo.pp} "
          f"tp={topo.tp}) on {cfg.num_hosts} hosts, {cfg.steps} steps of {cfg.step_ms:.0f} ms -> "
          f"{cfg.server}", file=sys.stderr, flush=True)
    stop = threading.Event()
    install_signal_stop(stop)
    summary = run_sim(cfg, stop)
    print(json.dumps(summary, indent=1), flush=True)
    ok = summary["drained"] and summary["rejected_batches"] == 0
    return 0 if ok else 1
