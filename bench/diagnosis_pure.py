"""Pure diagnosis pass time per world size: ``engine.diagnose`` and ``engine.diagnose_hang``
alone (no store I/O) on the reduced frames of the synthetic job of
``bench/diagnosis_scale.py`` (24-step window, 4 micro-batches, one 1.3x compute
straggler on rank 5; 12,288 ranks = the 2,048-rank job replicated along DP).

The frames are reduced once by a real embedded chdb store (minutes at 12,288 ranks on
2 CPUs) and cached as pickles in ``--frames-dir``; the timed passes then read them.

    .venv/bin/python bench/diagnosis_pure.py                       # 512 2048 12288 ranks
    .venv/bin/python bench/diagnosis_pure.py --sizes 512 --repeat 3  # quick

Prints per size: full pass and hang pass, min and median of ``--repeat`` runs (seconds),
the findings, and the load average.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import int_list  # noqa: E402 - a sibling, found through sys.path above


def build_frames(n: int, steps: int):
    import pyarrow as pa
    from diagnosis_scale import REPLICATED, TOPOLOGIES, replicate_dp
    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.diagnosis.engine import JobInfo
    from fleetscope.server.diagnosis.loader import load_reduced_frames
    from fleetscope.server.store import Store

    from fleetscope.topology import Topology
    from tests.helpers.synthetic import SynthJob

    dp, tp, pp = TOPOLOGIES[n]
    copies = REPLICATED.get(n, 1)
    job = SynthJob(topo=Topology(dp=dp // copies, tp=tp, pp=pp), num_steps=steps, num_mb=4, job=f"scale{n}",
                   compute_factor=lambda r, s: 1.3 if r == 5 and s >= 8 else 1.0)
    f = job.build()
    if copies > 1:
        f = replicate_dp(f, dp // copies, tp, pp, copies)
    tmp = Path(tempfile.mkdtemp(prefix=f"fs-pure-{n}-"))
    try:
        store = Store.open(f"chdb://{tmp / 'store'}", ttl_days=0)
        for t in ("sections", "collectives", "steps"):
            for i in range(0, len(f[t]), 1_000_000):
                store.insert_arrow(t, pa.Table.from_pandas(f[t].iloc[i:i + 1_000_000], preserve_index=False))
        now = int(f["steps"]["end_ns"].max()) + 10**9
        cache = rollups.StepCache()
        full = load_reduced_frames(store, job.job, now, cache, n, 4)
        hang = load_reduced_frames(store, job.job, now, cache, n, 4, hardware=False, hang_only=True)
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return JobInfo(job=job.job, topology=Topology(dp=dp, tp=tp, pp=pp), num_microbatches=4), full, hang, now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int_list, default="512,2048,12288", help="world sizes (those of bench/diagnosis_scale.py)")
    ap.add_argument("--steps", type=int, default=26, help="steps generated (the window is 24)")
    ap.add_argument("--repeat", type=int, default=5, help="passes timed per size")
    ap.add_argument("--frames-dir", default=os.path.join(tempfile.gettempdir(), "fleetscope-pure-frames"),
                    help="where the reduced frames are cached between runs")
    args = ap.parse_args(argv)
    from diagnosis_scale import TOPOLOGIES
    from fleetscope.server.diagnosis.engine import diagnose, diagnose_hang

    sizes = args.sizes
    bad = [n for n in sizes if n not in TOPOLOGIES]
    if bad:
        ap.error(f"--sizes {bad}: expected some of {sorted(TOPOLOGIES)}")
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: must be at least 1")
    cache_dir = Path(args.frames_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    print("| ranks | full pass min | full pass median | hang pass min | findings | load |\n|---|---|---|---|---|---|")
    for n in sizes:
        path = cache_dir / f"frames{n}-{args.steps}.pkl"
        if not path.exists():
            t0 = time.perf_counter()
            print(f"[{n} ranks] generating and reducing the window (cached in {path}) ...", file=sys.stderr,
                  flush=True)
            with open(path, "wb") as fh:
                pickle.dump(build_frames(n, args.steps), fh)
            print(f"[{n} ranks] frames ready in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        with open(path, "rb") as fh:
            info, full, hang, now = pickle.load(fh)
        ts, hs, d = [], [], None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            d = diagnose(info, full, now)
            ts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            diagnose_hang(info, hang, now)
            hs.append(time.perf_counter() - t0)
        found = sorted({f"{f.kind.value}:{list(f.ranks)}" for f in d.findings})
        print(f"| {n:,} | {min(ts):.3f} | {statistics.median(ts):.3f} | {min(hs):.3f} | {' '.join(found)} "
              f"| {os.getloadavg()[0]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
