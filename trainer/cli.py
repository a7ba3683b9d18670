"""``fleetscope train``: launch the reference 3D-parallel job (all ranks) on this host."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from typing import Any

HELP = "run the reference 3D-parallel GPT job (DP x TP x PP) with telemetry"

DESCRIPTION = """\
Launch the reference trainer: a small GPT with real Megatron-style tensor parallelism,
pipeline parallelism (1F1B over p2p send/recv) and data parallelism, one process per
rank on this host (gloo on CPU, NCCL on GPU). Every rank records its sections and
collectives with fleetscope.trainer_hooks into spool files under
SPOOL/JOB/rank-XXXXX/ (with the rank's log in trainer.log). With --server, the host
agent ships the spool to the server.
"""

EPILOG = """\
fault injection (--inject, repeatable; ground truth is never written to telemetry):
  straggler:rank=R:factor=F[:from_step=S][:section=compute|dataloader]
  hang:rank=R:step=S[:where=compute|collective|p2p]
  crash:rank=R:step=S
  slowlink:group=tp|dp|pp:rank=R:delay_ms=D
  gc:rank=R:every=N:pause_ms=P

examples:
  fleetscope train --dp 2 --tp 2 --pp 2 --steps 50
  fleetscope train --dp 2 --tp 2 --pp 2 --steps 200 --server http://127.0.0.1:8000 \\
      --inject straggler:rank=5:factor=1.3:from_step=10
  fleetscope train --dp 2 --tp 2 --pp 2 --inject hang:rank=3:step=20:where=collective --timeout-s 120

exit status: 0 when every rank finished; 124 on --timeout-s; otherwise the failing
rank's exit code (128+N when killed by signal N).
"""


def register(subparsers: Any) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser("train", help=HELP, description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("layout")
    g.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    g.add_argument("--order", default="tp-dp-pp", help="rank order of the axes, fastest first")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    t.add_argument("--global-batch", type=int, default=8, help="samples per step (default 8)")
    t.add_argument("--microbatches", type=int, default=2,
                   help="micro-batches per step and replica (default 2)")
    t.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    t.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    t.add_argument("--data", choices=("synthetic", "loader"), default="synthetic",
                   help="synthetic batches in the loop, or through a torch DataLoader")
    t.add_argument("--load-cost-ms", type=float, default=0.0,
                   help="extra time per batch in the data loader (default 0)")
    t.add_argument("--loader-workers", type=int, default=0, help="DataLoader worker processes")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA (NCCL) if available, else CPU (gloo)")
    t.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: CPUs/ranks)")
    t.add_argument("--pin-cpus", action="store_true",
                   help="pin rank r to the (r %% n)-th of the n usable CPUs (with as many cores as "
                        "ranks, no rank runs on another's core)")
    m = p.add_argument_group("model")
    m.add_argument("--layers", type=int, default=4, help="transformer blocks (divisible by pp)")
    m.add_argument("--hidden", type=int, default=64, help="hidden size")
    m.add_argument("--heads", type=int, default=4, help="attention heads (divisible by tp)")
    m.add_argument("--seq-len", type=int, default=32, help="tokens per sample")
    m.add_argument("--vocab", type=int, default=256, help="vocabulary size (divisible by tp)")
    o = p.add_argument_group("telemetry and supervision")
    o.add_argument("--job", default=None, help="job id (default train-<time>)")
    o.add_argument("--spool", default=None, help="spool directory (default ./.fleetscope/spool)")
    o.add_argument("--server", default=None,
                   help="server URL; starts the host agent to ship the spool there")
    o.add_argument("--no-hooks", action="store_true", help="train without telemetry (baseline)")
    o.add_argument("--inject", action="append", default=[], metavar="SPEC",
                   help="inject a fault (repeatable; see below)")
    o.add_argument("--preflight", action="store_true",
                   help="run the quick self-check (matmul, memory bandwidth, numerics, "
                        "all-reduce/all-to-all) on every rank before step 0; the results "
                        "are recorded with the job and any failure stops the job")
    o.add_argument("--timeout-s", type=float, default=None,
                   help="stop the whole job after this many seconds (exit 124)")
    o.add_argument("--results", default=None, metavar="DIR",
                   help="write per-rank JSON (losses, step times, hook counters) to DIR")
    o.add_argument("--failure-grace-s", type=float, default=3.0,
                   help="after a rank fails, seconds before the others are stopped (default 3)")
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    """TrainConfig from parsed arguments; CliError names the bad value."""
    from fleetscope.trainer.config import ModelConfig, TrainConfig
    from fleetscope.trainer.faults import parse_fault

    from fleetscope import components
    from fleetscope.cli import CliError
    from fleetscope.config import DEFAULT_SPOOL_DIR
    from fleetscope.topology import Topology

    try:
        topo = Topology(dp=args.dp, tp=args.tp, pp=args.pp, order=args.order)
        for spec in args.inject:
            parse_fault(spec, topo.world_size)
        if args.timeout_s is not None and args.timeout_s <= 0:
            raise ValueError(f"--timeout-s must be > 0, got {args.timeout_s}")
        cfg = TrainConfig(
            dp=args.dp, tp=args.tp, pp=args.pp, order=args.order, steps=args.steps,
            global_batch=args.global_batch, num_microbatches=args.microbatches, lr=args.lr,
            seed=args.seed, data=args.data, load_cost_ms=args.load_cost_ms,
            loader_workers=args.loader_workers, device=args.device, threads=args.threads,
            pin_cpus=args.pin_cpus,
            model=ModelConfig(vocab_size=args.vocab, seq_len=args.seq_len, hidden=args.hidden,
                              num_layers=args.layers, num_heads=args.heads),
            job=args.job or time.strftime("train-%Y%m%d-%H%M%S"),
            spool=args.spool or DEFAULT_SPOOL_DIR, hooks=not args.no_hooks,
            injections=tuple(args.inject), command=shlex.join(sys.argv),
            results_dir=args.results or "",
            preflight=args.preflight,
        )
        cfg.check()
        if cfg.preflight:  # say so now, not from every rank after the job started
            components.resolve(components.PREFLIGHT)
    except components.ComponentMissing as e:
        raise CliError(f"--preflight: {e}; install fleetscope with its self-check kernels") from None
    except ValueError as e:
        raise CliError(str(e)) from None
    return cfg


def run(args: argparse.Namespace) -> int:
    from fleetscope.trainer.launcher import launch

    cfg = build_config(args)
    print(f"fleetscope train: job {cfg.job}: {cfg.world_size} rank(s) dp={cfg.dp} tp={cfg.tp} "
          f"pp={cfg.pp}, spool {cfg.spool}", file=sys.stderr, flush=True)
    result = launch(cfg, timeout_s=args.timeout_s, server=args.server,
                    failure_grace_s=args.failure_grace_s)
    state = "finished" if result.returncode == 0 else f"failed (exit {result.returncode})"
    print(f"fleetscope train: job {cfg.job} {state} in {result.duration_s:.1f}s",
          file=sys.stderr, flush=True)
    return result.returncode
