"""``fleetscope import fr|trace``: bring Flight Recorder dumps and profiler traces in."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from urllib.parse import quote

from fleetscope import env

FR_DESCRIPTION = """\
Import PyTorch Flight Recorder dumps (one file per rank, pickle or JSON; the rank is
the last number in the file name) as 'collectives' records and analyse the hang:
the culprit ranks, the process group and sequence number where they diverged, ranks
that left no dump (missing), and op/size/dtype mismatches. gloo dumps (empty
pg_config) are handled. Without --server/--store only the analysis is printed.

When the job's topology is known (--dp/--tp/--pp, else the job's row on --server or in
--store), FR's process groups (world, pg1, pg2, ...) are renamed to the hooks' group
names (tp.pp0.dp0, dp.pp0.tp1, ...) by their member ranks, so the imported collectives
join the live ones in the wait-for graph and the views; unmatched groups keep FR's name.
"""

TRACE_DESCRIPTION = """\
Import torch.profiler / Kineto Chrome-trace JSON files (one per rank, the files HTA
reads; .json or .json.gz) as 'sections', 'collectives' and 'steps' records, so the
straggler detector, the timeline and the Perfetto export work on them. The rank
comes from the trace's distributedInfo, else from the last number in the file name.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("import", help="import Flight Recorder dumps or profiler traces",
                              description="Import telemetry that PyTorch already produced.")
    sub = p.add_subparsers(dest="import_kind", metavar="KIND")
    sub.required = True
    fr = sub.add_parser("fr", help="Flight Recorder dumps -> collectives + hang analysis",
                        description=FR_DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  fleetscope import fr /tmp/fr-dumps --job llama-7b "
                               "--world-size 64 --server http://ctl:8000\n"
                               "  fleetscope import fr /tmp/fr-dumps --job llama-7b --dp 4 --tp 8 --pp 2 --json")
    fr.add_argument("dir", metavar="DIR", type=Path, help="directory with one dump per rank")
    fr.add_argument("--world-size", type=int, metavar="N",
                    help="ranks in the job (default: from the dumps; needed to name missing ranks on gloo)")
    fr.add_argument("--dp", type=int, metavar="N",
                    help="data-parallel size of the job: with --tp/--pp, FR's process groups get the "
                         "hooks' group names (default: the job's row on --server/--store, if any)")
    fr.add_argument("--tp", type=int, metavar="N", help="tensor-parallel size of the job (see --dp)")
    fr.add_argument("--pp", type=int, metavar="N", help="pipeline-parallel size of the job (see --dp)")
    fr.add_argument("--order", default=None, metavar="ORDER",
                    help="rank order of the axes, fastest first (default tp-dp-pp, as the hooks)")
    fr.add_argument("--json", action="store_true", help="print the analysis as JSON")
    _common(fr)
    fr.set_defaults(func=run_fr)
    tr = sub.add_parser("trace", help="torch.profiler Chrome traces -> sections + collectives",
                        description=TRACE_DESCRIPTION,
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="example:\n  fleetscope import trace traces/rank*.json --job llama-7b "
                               "--server http://ctl:8000")
    tr.add_argument("files", metavar="FILES", nargs="+", type=Path, help="one trace per rank")
    _common(tr)
    tr.set_defaults(func=run_trace)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", required=True, metavar="ID", help="job id to file the records under")
    dest = p.add_mutually_exclusive_group()
    dest.add_argument("--server", metavar="URL", help="post the records to this server's ingest API")
    dest.add_argument("--store", metavar="URL", help="write the records into this store (e.g. chdb:///dir)")
    p.add_argument("--token", default=env.TOKEN.get(), metavar="TOKEN",
                   help="bearer token for --server (default $FLEETSCOPE_TOKEN)")


def _job_row(job: str, world_size: int, name: str, status: str) -> dict:
    return {"ts_ns": time.time_ns(), "job": job, "attempt": 0, "name": name, "dp": world_size,
            "tp": 1, "pp": 1, "status": status}


MAX_WORLD = 1 << 20


def _flag_topology(args: argparse.Namespace):
    """The topology from --dp/--tp/--pp/--order, or None when none is given."""
    from fleetscope.cli import CliError
    from fleetscope.topology import DEFAULT_ORDER, Topology

    sizes = {a: getattr(args, a) for a in ("dp", "tp", "pp")}
    if all(v is None for v in sizes.values()) and args.order is None:
        return None
    for a, v in sizes.items():
        if v is not None and not 1 <= v <= MAX_WORLD:
            raise CliError(f"--{a} {v}: must be 1..{MAX_WORLD}")
    try:
        topo = Topology(**{a: v or 1 for a, v in sizes.items()}, order=args.order or DEFAULT_ORDER)
    except ValueError as e:
        raise CliError(f"--order {args.order!r}: {e}") from None
    if topo.world_size > MAX_WORLD:
        raise CliError(f"--dp x --tp x --pp = {topo.world_size}: more than {MAX_WORLD} ranks")
    return topo


def _known_topology(args: argparse.Namespace):
    """The job's topology from its row on --server or in --store (None if unknown)."""
    from fleetscope.topology import Topology

    doc = None
    if args.server:
        import httpx

        from fleetscope.config import API_PREFIX

        headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
        try:
            r = httpx.get(f"{args.server.rstrip('/')}{API_PREFIX}/jobs/{quote(args.job, safe='')}",
                          headers=headers, timeout=30)
        except httpx.HTTPError:
            return None
        if r.status_code == 200:
            doc = (r.json() or {}).get("topology")
        else:
            print(f"topology of job {args.job!r} unknown (GET /jobs/{{job}} answered {r.status_code}): "
                  "FR's group names are kept; pass --dp/--tp/--pp to map them", file=sys.stderr)
    elif args.store:
        from fleetscope.server.store import Store

        st = Store.open(args.store)
        try:
            got = st.query_rows("SELECT dp, tp, pp, `order` FROM jobs WHERE job = {j:String} "
                                "ORDER BY ts_ns DESC LIMIT 1", {"j": args.job})
        finally:
            st.close()
        doc = got[0] if got else None
    if not doc:
        return None
    try:
        topo = Topology(dp=int(doc["dp"]), tp=int(doc["tp"]), pp=int(doc["pp"]),
                        order=str(doc.get("order") or "tp-dp-pp"))
    except (KeyError, TypeError, ValueError):
        return None
    return topo if topo.world_size <= MAX_WORLD else None


def run_fr(args: argparse.Namespace) -> int:
    from fleetscope.server.importers.deliver import deliver
    from fleetscope.server.importers.flight_recorder import DumpError, import_dir, inflight_rows

    from fleetscope.cli import CliError

    if not args.dir.is_dir():
        raise CliError(f"{args.dir}: not a directory")
    if args.world_size is not None and not 1 <= args.world_size <= MAX_WORLD:
        raise CliError(f"--world-size {args.world_size}: must be 1..{MAX_WORLD}")
    topology = _flag_topology(args)
    job_known = False
    if topology is None and (args.server or args.store):
        topology = _known_topology(args)
        job_known = topology is not None
    try:
        rows, analysis = import_dir(args.dir, args.job, args.world_size, topology=topology)
    except DumpError as e:
        raise CliError(str(e)) from None
    if topology is not None:
        source = "the job's row" if job_known else "flags"
        print(f"topology dp={topology.dp} tp={topology.tp} pp={topology.pp} "
              f"({source}): groups " + ", ".join(
                  sorted({r["group_id"] for r in rows})), file=sys.stderr)
    if args.json:
        print(json.dumps(analysis.as_dict(), indent=2))
    else:
        print(f"job {args.job}: {len(analysis.dumped)} dump(s) of {analysis.world_size} ranks, "
              f"{len(rows)} collective records")
        print(f"hang: {analysis.kind}: {analysis.summary}")
        print(f"culprit ranks: {analysis.culprits}")
        for s in analysis.stops:
            print(f"  {s.group_id}#{s.seq} {s.op}: waiting {s.waiting}, never arrived {s.culprits}, "
                  f"missing {s.missing}")
        for m in analysis.mismatches:
            print(f"  mismatch: {m['summary']}")
    if args.server or args.store:
        at = max((p.stat().st_mtime_ns for p in args.dir.iterdir() if p.is_file()), default=time.time_ns())
        tables: dict[str, list[dict]] = {}
        if not job_known:  # a job the server knows keeps its own row (name, status, topology)
            row = _job_row(args.job, analysis.world_size, "fr import",
                           "failed" if analysis.kind != "no_hang" else "finished")
            if topology is not None:
                row.update(dp=topology.dp, tp=topology.tp, pp=topology.pp, order=topology.order)
            tables["jobs"] = [row]
        tables.update(collectives=rows, inflight=inflight_rows(args.job, rows, at))
        written = deliver(tables, server=args.server, store=args.store, token=args.token,
                          label="import fr")
        print(f"written: {written}", file=sys.stderr)
    return 0


def run_trace(args: argparse.Namespace) -> int:
    from fleetscope.server.importers.deliver import Progress, deliver
    from fleetscope.server.importers.profiler_trace import TraceError, load_trace, to_records

    from fleetscope.cli import CliError

    tables: dict[str, list[dict]] = {"sections": [], "collectives": [], "steps": []}
    ranks = set()
    progress = Progress(len(args.files), "read traces")
    for path in args.files:
        try:
            trace = load_trace(path)
            recs = to_records(args.job, path, trace)
        except TraceError as e:
            raise CliError(str(e)) from None
        rank = recs["rank"]
        if rank in ranks:
            raise CliError(f"{path}: a second trace for rank {rank}")
        ranks.add(rank)
        for name in tables:
            tables[name] += recs[name]
        progress.advance()
    world = max(ranks) + 1
    print(f"job {args.job}: {len(ranks)} rank(s); " + ", ".join(
        f"{len(v)} {k}" for k, v in tables.items()))
    if args.server or args.store:
        tables = {"jobs": [_job_row(args.job, world, "trace import", "finished")], **tables}
        written = deliver(tables, server=args.server, store=args.store, token=args.token,
                          label="import trace")
        print(f"written: {written}", file=sys.stderr)
    return 0
