"""``fleetscope selfcheck``: run the probes on this host, print a table, ship the results.

Imports nothing heavy at module level (torch loads only when the command runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
from typing import Any

from fleetscope import env

DESCRIPTION = """\
Run fleetscope's self-check probes on this host, as MegaScale does before (re)starting
a job: dense matmul throughput (bf16 on GPU, fp32 on CPU) against the device's peak,
memory bandwidth (STREAM copy and triad), a numerics check (a deterministic
computation whose result bits must agree across repeats, devices and the fleet),
all-reduce and all-to-all bus bandwidth (nccl-tests' definition; NCCL across the
local GPUs, gloo on CPU) and p2p bandwidth between every pair of local devices.

With --server the results are stored as `probes` records; the server scores each
host against the fleet's hosts with the same device model and against its own
history (GET /api/v1/selfcheck/hosts, GET /api/v1/hosts/HOST/selfcheck).

Progress: a progress bar on stderr when stderr is a terminal (and rich, from the `rca`
extra, is installed); otherwise one plain `[selfcheck] ...` line per probe step.
"""

EPILOG = """\
exit status: 0 every probe passed; 1 a probe failed; 2 bad arguments;
3 the results could not be shipped to --server.

environment: FLEETSCOPE_PEAK_TFLOPS and FLEETSCOPE_PEAK_MEM_GBPS override the nominal
peaks (default: a datasheet table for known GPUs; for CPUs cores x clock x FMA width,
memory bandwidth unknown).

examples:
  fleetscope selfcheck                                   # quick suite, print the table
  fleetscope selfcheck --full --server http://ctl:8000 --job maint-2024-06-01
  fleetscope selfcheck --probes matmul,membw --device cuda:3
"""


def register(subparsers: Any) -> None:
    """Add the ``selfcheck`` subcommand."""
    p = subparsers.add_parser(
        "selfcheck",
        help="run compute, memory, numerics and collective probes on this host",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--server", metavar="URL",
                   help="ship the results to this fleetscope server (e.g. http://ctl:8000)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="quick suite, about 30 s per GPU host (the default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="full suite: longer budgets, more sizes and dtypes (minutes)")
    p.set_defaults(mode="quick")
    p.add_argument("--job", default="", metavar="ID",
                   help="job or maintenance-window id the results belong to")
    p.add_argument("--host", default=None, metavar="NAME",
                   help="host name to record (default: this machine's hostname)")
    p.add_argument("--device", default=None, metavar="DEV",
                   help="cpu, cuda (all GPUs) or cuda:N (default: all GPUs, else the CPU)")
    p.add_argument("--nprocs", type=int, default=None, metavar="N",
                   help="ranks of the local collective group (default: one per GPU, 2 on "
                        "CPU; 1 skips the collective and p2p probes)")
    p.add_argument("--probes", default=None, metavar="LIST",
                   help="comma-separated subset of matmul,membw,numerics,allreduce,alltoall,p2p")
    p.add_argument("--token", default=env.TOKEN.get(),
                   metavar="TOKEN",
                   help="bearer token for --server (default: $FLEETSCOPE_TOKEN)")
    p.add_argument("--format", dest="wire_format", choices=("arrow", "json"), default="arrow",
                   help="wire format for --server (default: arrow)")
    p.add_argument("--output", choices=("table", "json"), default="table",
                   help="print a table (default) or one JSON record per line")
    p.add_argument("--slowdown", type=float, default=1.0, metavar="FACTOR",
                   help="TEST-ONLY fault injection: make every timed probe FACTOR times "
                        "slower (sleeps inside the measurement), to exercise the scoring")
    p.add_argument("--inject-bitflip", default=None, metavar="ELEMENT:BIT[:REPEAT]",
                   help="TEST-ONLY fault injection: flip one bit of the numerics result")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the suite as asked by the parsed arguments; returns the exit status."""
    from fleetscope.kernels.numerics import BitFlip
    from fleetscope.kernels.progress import terminal_progress
    from fleetscope.kernels.result import PROBES, format_table, stderr_progress
    from fleetscope.kernels.ship import ShipError, ingest_url, ship_records
    from fleetscope.kernels.suite import run_suite
    from fleetscope.kernels.timing import check_slowdown

    from fleetscope.cli import CliError

    probes = tuple(PROBES)
    if args.probes:
        probes = tuple(x.strip() for x in args.probes.split(",") if x.strip())
        bad = sorted(set(probes) - set(PROBES))
        if bad or not probes:
            raise CliError(f"--probes {args.probes!r}: unknown probe(s) {bad}; "
                           f"choose from {','.join(PROBES)}")
    try:
        slowdown = check_slowdown(args.slowdown)
        flip = BitFlip.parse(args.inject_bitflip) if args.inject_bitflip else None
        if args.server:
            ingest_url(args.server)
    except ValueError as e:
        raise CliError(str(e)) from None
    if args.nprocs is not None and args.nprocs < 0:
        raise CliError(f"--nprocs {args.nprocs} must be >= 0")
    host = args.host or socket.gethostname()
    if not host.strip():
        raise CliError(f"--host {args.host!r} must not be empty")

    bar = terminal_progress()  # a progress bar only when stderr is a terminal
    try:
        with bar if bar is not None else contextlib.nullcontext():
            results = run_suite(mode=args.mode, device=args.device, nprocs=args.nprocs,
                                probes=probes, slowdown=slowdown, flip=flip,
                                progress=bar if bar is not None else stderr_progress)
    except ValueError as e:
        raise CliError(str(e)) from None
    records = [r.to_record(host=host, job=args.job) for r in results]
    if args.output == "json":
        for rec in records:
            print(json.dumps(rec))
    else:
        print(format_table(results))
    failed = [r for r in results if not r.passed]
    print(f"{len(results) - len(failed)}/{len(results)} probe results passed on {host}",
          file=sys.stderr)
    if args.server:
        try:
            ack = ship_records(args.server, records, host=host, fmt=args.wire_format,
                               token=args.token)
        except ShipError as e:
            print(f"fleetscope selfcheck: {e}", file=sys.stderr)
            return 3
        print(f"shipped {len(records)} probes records to {args.server}: {ack}", file=sys.stderr)
    return 1 if failed else 0
