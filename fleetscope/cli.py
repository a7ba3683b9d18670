"""The ``fleetscope`` command: one entry point, one subcommand per component.

Each component owns a small ``cli`` module with ``register(subparsers)``. Those modules
import nothing heavy at import time (no torch, no Dash, no FastAPI), so ``--help`` is
fast and a host with only the agent's dependencies can still run ``fleetscope agent``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fleetscope import __version__

# (module, purpose) in the order they appear in --help.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "fleetscope.server.cli",
    "fleetscope.agent.cli",
    "fleetscope.trainer.cli",
    "fleetscope.dashboard.cli",
    "fleetscope.kernels.cli",
    "fleetscope.server.demo",
    "fleetscope.sim.cli",
    "fleetscope.server.tokens_cli",
    "fleetscope.server.control_cli",
    "fleetscope.server.importers.cli",
    "fleetscope.rca.cli",
)

DESCRIPTION = """\
fleetscope: observability and diagnosis for 3D-parallel LLM training fleets.

Every rank times its compute sections and collectives; per-host agents ship the
timings to a server backed by ClickHouse, which finds stragglers and hung
collectives, names the culprit rank, and alerts operators.
"""

EPILOG = """\
examples:
  fleetscope demo                                  # everything on one machine
  fleetscope server --store chdb:///var/lib/fleetscope/store
  fleetscope agent --server http://ctl:8000 --spool /var/spool/fleetscope
  fleetscope train --dp 2 --tp 2 --pp 2 --steps 50 --server http://127.0.0.1:8000

Run 'fleetscope COMMAND --help' for the options of one command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetscope",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fleetscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # component not part of this install
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        return 130
    except CliError as e:
        print(f"fleetscope {args.command}: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


class CliError(Exception):
    """A user error: printed as one line naming the bad value, exit status 2."""


if __name__ == "__main__":  # pragma: no cover
    # `python -m fleetscope.cli`: run the imported module, not this __main__ copy, so
    # components raising fleetscope.cli.CliError are caught by the same class.
    from fleetscope.cli import main as _main

    sys.exit(_main())
