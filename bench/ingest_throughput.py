"""Ingest throughput through the real path: coalescing agents vs one request per batch.

Per world size (DP x PP 8 x TP 8, 8 ranks per host), the same simulated clean job
(``fleetscope simulate``, same seed) is played twice, each time against a fresh
``fleetscope server`` on loopback with the embedded chDB store:

* ``baseline``  ``--no-coalesce``: every host POSTs each batch it cuts as its own
                request (one request per host per ``--batch-delay``), as before;
* ``coalesced`` the default: a host's sender, when it becomes free, takes every batch
                queued for that host (bounded rows/bytes, ``agent/coalesce.py``) as
                one request.

Printed per run: records/s generated and stored (acknowledged: the server answers
after the store has the rows), steady-state ingest lag (age of the oldest
unacknowledged batch, p50/p95), requests and batches acknowledged, POST latency p50,
and the server process's CPU seconds per 1,000 stored records (more meaningful on a
shared machine than wall-clock rates). Then the ratios coalesced / baseline. The
diagnosis worker is off unless ``--with-diagnosis`` (it queries the embedded store
through the server process, so its work would count as ingest CPU).

Checks (exit 1 if one fails): every run has rows acknowledged, stores exactly what it acknowledged when it
drained (the server's ``fleetscope_ingest_records_total`` equals the simulator's
acknowledged rows: nothing acknowledged lost, nothing stored twice), and the coalesced
run stores at least 0.9x the baseline's records/s.

    .venv/bin/python bench/ingest_throughput.py                  # 2,048 and 12,288 ranks, 20 steps
    .venv/bin/python bench/ingest_throughput.py --quick          # 1,024 ranks, 8 steps (~1 min)
    .venv/bin/python bench/ingest_throughput.py --sizes 2048 --steps 12
    .venv/bin/python bench/ingest_throughput.py --request-cost   # CPU per request, per insert
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleet_scale import Server, Sim, _stop_children  # bench/ is the script's directory: sys.path[0]

VARIANTS = (("baseline", ["--no-coalesce"]), ("coalesced", []))
MIN_RATE_RATIO = 0.9
METRICS_CACHE_S = 5.0
"""The server's default ``metrics_cache_s``."""


def stored_records(srv: Server) -> int:
    """Rows the server wrote (``fleetscope_ingest_records_total``, all tables)."""
    text = srv.http.get(f"{srv.url}/metrics", timeout=30).text
    return int(sum(float(m) for m in re.findall(r'^fleetscope_ingest_records_total\{type="[^"]+"\} ([0-9.e+]+)$',
                                                  text, re.M)))


def server_cpu_s(srv: Server) -> float:
    """CPU seconds of the server's API/ingest process (not the diagnosis worker)."""
    import psutil

    t = psutil.Process(srv.proc.pid).cpu_times()
    return t.user + t.system


def one_run(args: argparse.Namespace, world: int, variant: str, extra: list[str], work: Path) -> dict[str, Any]:
    # the diagnosis worker queries the embedded store through the server process: off by
    # default, so the server's CPU is the ingest path's alone
    settings = {"diagnosis_enabled": str(args.with_diagnosis).lower()}
    if args.linger_ms is not None:
        settings["coalesce_linger_ms"] = str(args.linger_ms)
    srv = Server(work, **settings)
    try:
        cpu0 = server_cpu_s(srv)
        sim = Sim(srv, f"ingest{world}-{variant}", world, args.steps, args.step_ms, work, tp_ops=args.tp_ops,
                  batch_delay_s=args.batch_delay, drain_s=args.drain, extra=["--seed", "1", *extra]).start()
        s = sim.finish(timeout_s=args.steps * args.step_ms / 1e3 + args.drain + 300)
        cpu = server_cpu_s(srv) - cpu0
        time.sleep(METRICS_CACHE_S + 1.0)  # /metrics is a snapshot at most this old
        stored = stored_records(srv)
    finally:
        srv.stop()
    wall = s.get("wall_s") or float("nan")
    acked = int(s.get("records_acked", 0))
    return {"variant": variant, "world": world, "hosts": s.get("num_hosts", 0),
            "generated": int(s.get("records_generated", 0)), "acked": acked, "stored": stored,
            "gen_rps": s.get("records_generated", 0) / wall, "stored_rps": acked / wall,
            "lag_p50": s.get("ingest_lag_s_p50", float("nan")), "lag_p95": s.get("ingest_lag_s_p95", float("nan")),
            "requests": int(s.get("requests_acked", s.get("batches_acked", 0))),
            "batches": int(s.get("batches_acked", 0)), "post_p50": s.get("post_s_p50", float("nan")),
            "drained": bool(s.get("drained")), "rejected": int(s.get("rejected_batches", 0)),
            "cpu_s": cpu, "cpu_ms_per_krec": 1e6 * cpu / max(stored, 1), "wall_s": wall}


def show(r: dict[str, Any]) -> None:
    print(f"  {r['variant']:<9} generated {r['gen_rps']:>9,.0f} rec/s  stored {r['stored_rps']:>9,.0f} rec/s  "
          f"lag p50 {r['lag_p50']:5.1f} s p95 {r['lag_p95']:5.1f} s  {r['requests']:>6,} requests for "
          f"{r['batches']:>6,} batches  POST p50 {r['post_p50']:5.2f} s  server CPU {r['cpu_s']:6.1f} s = "
          f"{r['cpu_ms_per_krec']:.1f} ms/1k rec  wall {r['wall_s']:.0f} s  drained {r['drained']}", flush=True)


def check(r: dict[str, Any]) -> list[str]:
    bad = []
    if r["generated"] and not r["acked"]:  # a run that shipped nothing proves nothing
        bad.append(f"{r['variant']} {r['world']}: generated {r['generated']} rows, none acknowledged")
    if r["rejected"]:
        bad.append(f"{r['variant']} {r['world']}: {r['rejected']} batches rejected")
    if r["stored"] < r["acked"]:
        bad.append(f"{r['variant']} {r['world']}: acknowledged {r['acked']} rows but the server wrote {r['stored']}")
    if r["drained"] and r["stored"] != r["acked"]:
        bad.append(f"{r['variant']} {r['world']}: drained, but wrote {r['stored']} rows for {r['acked']} acknowledged")
    if r["stored"] > r["generated"]:
        bad.append(f"{r['variant']} {r['world']}: wrote {r['stored']} rows of {r['generated']} generated (twice?)")
    return bad


def request_cost() -> None:
    """The server's CPU per request (decode + validate + content digest, no HTTP) and its
    Arrow compute calls, for 1, 4 and 16 s of one host's data (12,288-rank job shape:
    TP 8 x PP 8, K=4, 4 micro-batches), and chDB's CPU per insert group."""
    import cProfile
    import pstats
    import resource

    import pyarrow.compute as pc
    from fleetscope.collector.validate import decode_request
    from fleetscope.collector.writer import content_digest, with_batch_column
    from fleetscope.sim.agents import encode_body
    from fleetscope.sim.offline import job_tables

    from fleetscope.codec import ARROW_CONTENT_TYPE
    from fleetscope.topology import Topology

    t0 = time.time_ns() - 600 * 10**9
    tabs = job_tables(Topology(dp=2, tp=8, pp=8), 8, t0, job="cost", step_ms=2000, tp_ops=4, gpus_per_host=8,
                      num_mb=4)
    host0 = {k: (t.filter(pc.equal(t["host"], "h0")) if "host" in t.column_names else t)
             for k, t in tabs.items() if k != "jobs"}
    print(f"server cost per request (load average {os.getloadavg()}):")
    for secs in (1, 4, 16):
        part = {k: t.slice(0, max(1, t.num_rows * secs // 16)) for k, t in host0.items()}
        body = encode_body(part, None)
        rows = sum(t.num_rows for t in part.values())

        def work(reps: int, body: bytes = body) -> None:
            for _ in range(reps):
                content_digest(decode_request(body, ARROW_CONTENT_TYPE, "h0", 12345))

        work(5)
        best = []
        for _ in range(5):
            c0 = time.process_time()
            work(20)
            best.append((time.process_time() - c0) / 20)
        prof = cProfile.Profile()
        prof.enable()
        work(5)
        prof.disable()
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        calls = sum(v[1] for k, v in stats.items() if k[0].endswith("pyarrow/compute.py") and "wrapper" in k[2]) / 5
        print(f"  {secs:2d} s of one host: {rows:5d} rows, CPU {min(best) * 1e3:5.2f} ms/request = "
              f"{min(best) / rows * 1e6:5.2f} us/row, {calls:.0f} Arrow compute calls/request")
    from fleetscope.server.store import Store

    work_dir = Path(tempfile.mkdtemp(prefix="ingest-cost-"))
    store = Store.open(f"chdb://{work_dir / 'store'}")
    client = store.new_client()
    big = job_tables(Topology(dp=4, tp=8, pp=8), 4, t0, job="ins", step_ms=2000, tp_ops=4, gpus_per_host=8, num_mb=4)
    n = 0
    for frac in (0.01, 0.1, 1.0):
        part = {k: t.slice(0, max(1, int(t.num_rows * frac))) for k, t in big.items() if k != "jobs"}
        rows = sum(t.num_rows for t in part.values())
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(3):
            for name, t in part.items():
                n += 1
                client.insert_arrow(name, with_batch_column([(f"k{n}", t)]),
                                    settings={"insert_deduplication_token": f"t{n}"})
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / 3
        print(f"  chDB insert group of {len(part)} tables, {rows:6d} rows: CPU {cpu * 1e3:5.0f} ms")
    store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=None, help="world sizes, multiples of 64 (default 2048,12288)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 20)")
    ap.add_argument("--step-ms", type=float, default=2000.0, help="step time (default 2000)")
    ap.add_argument("--tp-ops", type=int, default=4, help="--tp-ops-per-microbatch (default 4)")
    ap.add_argument("--batch-delay", type=float, default=1.0,
                    help="each simulated agent cuts a batch this often (default 1.0, as bench/fleet_scale.py)")
    ap.add_argument("--drain", type=float, default=120.0,
                    help="seconds each run may take after its last step to ship its backlog (default 120)")
    ap.add_argument("--variants", default="baseline,coalesced", help="which runs (default both)")
    ap.add_argument("--with-diagnosis", action="store_true",
                    help="run the diagnosis worker too (its store queries then count in the server's CPU)")
    ap.add_argument("--linger-ms", type=float, default=None,
                    help="the servers' coalesce_linger_ms (default: the server's default)")
    ap.add_argument("--request-cost", action="store_true",
                    help="only the server's CPU per request (decode, validation, digest) and per insert group")
    ap.add_argument("--quick", action="store_true", help="1,024 ranks, 8 steps")
    ap.add_argument("--workdir", default=None, help="keep servers' dirs and logs here (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.request_cost:
        request_cost()
        return 0
    if args.sizes is None:
        args.sizes = "1024" if args.quick else "2048,12288"
    if args.steps is None:
        args.steps = 8 if args.quick else 20
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if any(s % 64 or s < 64 for s in sizes):
        ap.error(f"--sizes: {sizes} must be multiples of 64 (DP x PP 8 x TP 8)")
    wanted = {v for v in args.variants.split(",") if v}
    variants = [(n, e) for n, e in VARIANTS if n in wanted]
    if not variants:
        ap.error(f"--variants: none of {sorted(wanted)} is one of {[n for n, _ in VARIANTS]}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ingest-tp-"))
    print(f"ingest_throughput: sizes {sizes}, {args.steps} steps of {args.step_ms:.0f} ms, K={args.tp_ops}, "
          f"batch delay {args.batch_delay} s; work dir {work}; load average {os.getloadavg()}", flush=True)
    failures: list[str] = []
    for w in sizes:
        print(f"[{w:,} ranks, {w // 8:,} hosts]", flush=True)
        runs = {}
        for name, extra in variants:
            r = one_run(args, w, name, extra, work / f"{name}-{w}")
            runs[name] = r
            show(r)
            failures += check(r)
        if len(runs) == 2:
            b, c = runs["baseline"], runs["coalesced"]
            rate = c["stored_rps"] / max(b["stored_rps"], 1e-9)
            cpu = c["cpu_ms_per_krec"] / max(b["cpu_ms_per_krec"], 1e-9)
            print(f"  coalesced / baseline: stored rec/s x{rate:.2f}, requests x{c['requests'] / max(b['requests'], 1):.2f}, "
                  f"server CPU per record x{cpu:.2f}, lag p95 {b['lag_p95']:.1f} s -> {c['lag_p95']:.1f} s", flush=True)
            if rate < MIN_RATE_RATIO:
                failures.append(f"{w}: coalesced stored x{rate:.2f} the baseline's rec/s (< {MIN_RATE_RATIO})")
        print(f"  load average {os.getloadavg()}", flush=True)
    for f in failures:
        print(f"FAIL {f}")
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    try:
        sys.exit(main())
    finally:
        _stop_children()
