"""Inserts while a diagnosis pass runs: the passes' queries niced (the query threads' nice
value, ``FLEETSCOPE_DIAGNOSIS_QUERY_NICE``) against not, side by side in one run.

One process, one embedded store, as in the server: the simulator's job (``bench/full_pass.py``'s
builder) is stored for ``--steps`` steps; then a thread runs full diagnosis passes back to
back on the server's second handle (``Store.sibling``), each with a cold step cache (the
heaviest pass: the first of a job, or any after a restart), while the main thread inserts
the job's next steps one by one, as the ingest writer does, and times each insert. Blocks of
``--block`` inserts (each begun with a pass in its setting) alternate between the passes' queries at nice ``--nice`` and at nice 0
(the order random per pair), so both halves share the machine's noise. Per setting it prints
the insert time p50 / p95 and the passes' time, and the ratios niced / not niced with a 90%
bootstrap interval of the per-pair ratio of insert medians.

Exit status 1 when the niced inserts are not faster (the upper end of the interval of the
insert-median ratio at or above 1).

    .venv/bin/python bench/ingest_vs_diagnosis.py                 # 1,024 ranks
    .venv/bin/python bench/ingest_vs_diagnosis.py --world 4096 --pairs 4
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import fleet_world  # noqa: E402  (a sibling: bench/ is on sys.path)
from full_pass import JOB, Builder, topology  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=fleet_world, default=1024, help="ranks, a multiple of 64 (default 1024)")
    ap.add_argument("--steps", type=int, default=24, help="steps stored before timing (default 24)")
    ap.add_argument("--pairs", type=int, default=6, help="niced / not-niced block pairs (default 6)")
    ap.add_argument("--block", type=int, default=12, help="timed inserts per block (default 12)")
    ap.add_argument("--nice", type=int, default=10, help="nice value of the niced half's queries (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if min(args.steps, args.pairs, args.block) < 1 or not 1 <= args.nice <= 19:
        ap.error("--steps, --pairs and --block must be positive, --nice within 1..19")

    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.diagnosis.engine import JobInfo, diagnose
    from fleetscope.server.diagnosis.loader import load_reduced_frames
    from fleetscope.server.diagnosis.loop import config_from_settings
    from fleetscope.server.settings import Settings
    from fleetscope.server.store import Store, diagnosis_query_settings

    tmp = Path(tempfile.mkdtemp(prefix="fs-ingest-vs-diag-"))
    store = Store.open(f"chdb://{tmp}", ttl_days=0)
    diag = store.sibling()
    writer = store.sibling()  # the ingest writer's own handle, as in the server
    need = args.steps + 2 * args.pairs * args.block + 2
    t0 = time.time_ns() - int(need * 2.2e9)
    b = Builder(writer, args.world, 4, 4, t0)
    print(f"load average {os.getloadavg()[0]:.2f}; storing {args.steps} steps of {args.world:,} ranks ...",
          flush=True)
    for s in range(args.steps):
        b.add()
        print(f"\r  step {s + 1}/{args.steps}: {b.rows:,} rows", end="", flush=True)
    print(flush=True)
    topo = topology(args.world)
    info = JobInfo(job=JOB, topology=topo, num_microbatches=4, model_flops_per_step=1e15,
                   device_peak_flops=989e12, start_ns=t0)
    config = config_from_settings(Settings())
    stop = threading.Event()
    passes: dict[str, list[float]] = {"niced": [], "plain": []}
    mode = ["plain"]

    started = threading.Condition()
    current = [""]

    def passes_loop() -> None:
        while not stop.is_set():
            m = mode[0]
            diag.query_settings = diagnosis_query_settings(args.nice if m == "niced" else 0, store)
            with started:
                current[0] = m
                started.notify_all()
            t = time.perf_counter()
            frames = load_reduced_frames(diag, JOB, b.now_ns(), rollups.StepCache(), topo.world_size, 4,
                                         window_steps=config.stragglers.window_steps)
            diagnose(info, frames, b.now_ns(), config)
            if mode[0] == m:
                passes[m].append(time.perf_counter() - t)

    th = threading.Thread(target=passes_loop, daemon=True)
    th.start()
    rng = random.Random(args.seed)
    inserts: dict[str, list[list[float]]] = {"niced": [], "plain": []}
    try:
        time.sleep(1.0)  # a pass under way
        for i in range(args.pairs):
            order = ["niced", "plain"] if rng.random() < 0.5 else ["plain", "niced"]
            for m in order:
                mode[0] = m
                with started:  # the pass in flight runs in the other mode's setting: the next
                    started.wait_for(lambda m=m: current[0] == m or stop.is_set(), timeout=600)
                got = [b.add() for _ in range(args.block)]
                inserts[m].append(got)
            print(f"  pair {i + 1}/{args.pairs}: insert median niced {np.median(inserts['niced'][-1]):.3f} s, "
                  f"not niced {np.median(inserts['plain'][-1]):.3f} s", flush=True)
    finally:
        stop.set()
        th.join(timeout=300)
        store.close()
    ratios = np.array([np.median(n) / np.median(p) for n, p in zip(inserts["niced"], inserts["plain"])])
    boot = np.random.default_rng(args.seed).choice(ratios, size=(2000, len(ratios))).mean(axis=1)
    lo, hi = np.percentile(boot, [5, 95])
    print(f"\n{args.world:,} ranks, {b.rows:,} rows stored; load average at the end {os.getloadavg()[0]:.2f}")
    for m, label in (("niced", f"passes at nice {args.nice}"), ("plain", "passes at nice 0")):
        flat = np.concatenate([np.array(x) for x in inserts[m]])
        ps = passes[m]
        print(f"  {label:<18} insert p50 {np.median(flat):.3f} s, p95 {np.percentile(flat, 95):.3f} s "
              f"({len(flat)} inserts); cold full pass p50 "
              f"{np.median(ps) if ps else float('nan'):.2f} s ({len(ps)} passes)")
    pn, pp = (np.median(passes[m]) if passes[m] else float("nan") for m in ("niced", "plain"))
    print(f"  insert time, niced / not niced: {ratios.mean():.3f} (90% interval {lo:.3f} .. {hi:.3f}, "
          f"{len(ratios)} pairs); pass time niced / not niced: {pn / pp:.2f}")
    ok = hi < 1.0
    print(("PASS" if ok else "FAIL") + ": inserts are faster while the passes' queries are niced")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
