"""Argument types the benchmark scripts share (imported as a sibling: ``python
bench/x.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

import argparse


def int_list(text: str) -> list[int]:
    """An argparse ``type``: ``"512,2048,12288"`` -> ``[512, 2048, 12288]`` (empty
    items skipped); a bad item is a usage error naming it."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r} in {text!r} is not an integer (expected e.g. 512,2048)") from None
    return out


def fleet_world(text: str) -> int:
    """An argparse ``type`` for the simulated job's world size (``bench/full_pass.py``'s
    builder lays it out as DP x PP 8 x TP 8): a positive multiple of 64."""
    try:
        world = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (expected e.g. 12288)") from None
    if world < 64 or world % 64:
        raise argparse.ArgumentTypeError(f"{world}: expected a positive multiple of 64 (DP x PP 8 x TP 8)")
    return world


def add_sim_store_args(ap: argparse.ArgumentParser, steps: int, marks_help: str) -> None:
    """The options of a bench that stores the fleet simulator's job (``bench/full_pass.py``'s
    builder) and times queries on its newest steps: ``--world``, ``--steps``,
    ``--microbatches``, ``--tp-ops``, ``--marks``, ``--repeat``."""
    ap.add_argument("--world", type=fleet_world, default=12288, help="ranks, a multiple of 64 (default 12288)")
    ap.add_argument("--steps", type=int, default=steps, help=f"steps stored (default {steps})")
    ap.add_argument("--microbatches", type=int, default=4, help="micro-batches per step (default 4)")
    ap.add_argument("--tp-ops", type=int, default=4, help="TP collectives per micro-batch (default 4)")
    ap.add_argument("--marks", type=int, default=3, help=f"{marks_help} (default 3)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each form per step (default 5)")


def check_sim_store_args(ap: argparse.ArgumentParser, args: argparse.Namespace, spare_steps: int) -> None:
    """Usage errors for :func:`add_sim_store_args`'s options: all positive, and ``--steps``
    at least ``--marks`` + ``spare_steps``."""
    if min(args.marks, args.repeat, args.microbatches, args.tp_ops) < 1:
        ap.error("--marks, --repeat, --microbatches and --tp-ops must be positive")
    if args.steps < args.marks + spare_steps:
        ap.error(f"--steps {args.steps}: need at least --marks + {spare_steps} ({args.marks + spare_steps})")
