"""Diagnosis pass time per world size, before (pandas over raw events) and after (ClickHouse
reductions, server/diagnosis/rollups.py), on the synthetic 1F1B job of
tests/helpers/synthetic.py (the simulator's step model; 24-step window, 4 micro-batches, one 1.3x compute
straggler on rank 5) written to a real embedded chdb store.

Per world size it prints, in seconds (best of --repeat):

* ``pure_before``  - ``engine.diagnose`` on the raw frames in memory (no store I/O): the
  figure issue #12 measured (0.08 s at 8 ranks ... 4.86 s at 2,048);
* ``store_before`` - the old loader (raw sections/collectives of the window into pandas)
  plus that pass;
* ``store_after_cold`` - the new loader on an empty step cache (every step of the window
  reduced by ClickHouse) plus the pass;
* ``store_after_new_step`` - the steady-state pass: cache warm, one new step arrived since
  the last pass (it and the steps still incomplete are reduced);
* ``store_after`` - a pass with the cache warm and nothing new;
* ``pure_after``  - the detectors alone on the reduced frames;
* ``hang_after``  - the hang-only pass (O(ranks) rows);
* rows moved from the store per pass (before / after), and whether the findings agree.

    .venv/bin/python bench/diagnosis_scale.py                    # 8 64 512 2048 12288 ranks
    .venv/bin/python bench/diagnosis_scale.py --sizes 8,64,512 --repeat 1   # quick
    .venv/bin/python bench/diagnosis_scale.py --remote --sizes 512  # + the worker's HTTP hop

``--remote`` also times the after-passes from a separate process' view: through a real
server's internal query route (how a worker reaches an embedded store).
Exit status 1 when the reduced path names other culprits than the pandas path.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import int_list  # noqa: E402 - a sibling (this script's folder is on sys.path)

TOPOLOGIES = {8: (2, 2, 2), 64: (4, 4, 4), 512: (8, 8, 8), 2048: (32, 8, 8), 4096: (64, 8, 8), 12288: (192, 8, 8)}
REPLICATED = {4096: 2, 12288: 6}
"""Sizes built from the 2,048-rank job (32x8x8) replicated along DP (the synthetic
generator is a Python loop: 10 M rows at 12,288 ranks would take many minutes): each
replica gets its own DP indices, ranks, hosts and TP/PP group ids; the DP groups span all
replicas (192 members at 12,288), whose members arrive at the same times as in the base."""


def replicate_dp(frames, base_dp: int, tp: int, pp: int, copies: int):
    """``frames`` of a (base_dp x tp x pp, order tp-dp-pp) job as ``copies`` DP replicas."""
    import numpy as np
    import pandas as pd

    new_dp = base_dp * copies

    def remap(r: np.ndarray, k: int) -> np.ndarray:
        t, d, p_ = r % tp, (r // tp) % base_dp, r // (tp * base_dp)
        return np.where(r >= 0, t + tp * (d + base_dp * k + new_dp * p_), r)

    out = {}
    for name, df in frames.items():
        parts = []
        for k in range(copies):
            c = df.copy()
            c["rank"] = remap(c["rank"].to_numpy(), k)
            c["host"] = "h" + (c["rank"] // 8).astype(str)
            if "peer" in c:
                c["peer"] = remap(c["peer"].to_numpy(), k)
            if "group_id" in c and k:
                gid = c["group_id"].astype(str)
                m = c["axis"].isin(["tp", "pp"])
                ex = gid[m].str.extract(r"^(.*dp)(\d+)(.*)$")
                gid[m] = ex[0] + (ex[1].astype(int) + base_dp * k).astype(str) + ex[2].fillna("")
                c["group_id"] = gid
            parts.append(c)
        out[name] = pd.concat(parts, ignore_index=True)
    return out


def best(fn, repeat: int):
    out, ts = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return out, min(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int_list, default="8,64,512,2048,12288", help=f"world sizes (of {sorted(TOPOLOGIES)})")
    ap.add_argument("--steps", type=int, default=26, help="steps generated (the window is 24)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many passes")
    ap.add_argument("--skip-before", action="store_true", help="only the new path (the old one needs the "
                    "raw window in memory: ~3 GB at 12,288 ranks)")
    ap.add_argument("--remote", action="store_true", help="also through a real server's internal query route")
    ap.add_argument("--json", metavar="FILE", help="write the table as JSON")
    args = ap.parse_args(argv)

    sizes = args.sizes
    bad = [n for n in sizes if n not in TOPOLOGIES]
    if bad:
        ap.error(f"--sizes {bad}: expected some of {sorted(TOPOLOGIES)}")
    print(f"load average at start: {os.getloadavg()}", flush=True)
    rows, ok = [], True
    for n in sizes:
        row, same = measure(n, args)
        ok &= same
        rows.append(row)
    cols = ["ranks", "raw_rows_window", "pure_before", "store_before", "store_after_cold", "store_after_new_step",
            "store_after",
            "pure_after", "hang_after", "remote_after", "remote_hang", "rows_moved_before", "rows_moved_after",
            "same_findings", "load_avg_1m"]
    cols = [c for c in cols if any(c in r for r in rows)]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(_fmt(r.get(c, "")) for c in cols) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if ok else 1



def measure(n: int, args: argparse.Namespace) -> tuple[dict, bool]:
    """One world size: its row of the table, and whether the old and new paths agree."""
    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.diagnosis.engine import JobInfo, diagnose, diagnose_hang
    from fleetscope.server.diagnosis.loader import load_job_frames, load_reduced_frames
    from fleetscope.server.store import Store

    from fleetscope.topology import Topology
    from tests.helpers.synthetic import SynthJob

    same = True
    dp, tp, pp = TOPOLOGIES[n]
    topo = Topology(dp=dp, tp=tp, pp=pp)
    tmp = Path(tempfile.mkdtemp(prefix=f"fs-scale-{n}-"))
    try:
        t0 = time.perf_counter()
        copies = REPLICATED.get(n, 1)
        base = Topology(dp=dp // copies, tp=tp, pp=pp)
        job = SynthJob(topo=base, num_steps=args.steps, num_mb=4, job=f"scale{n}",
                       compute_factor=lambda r, s: 1.3 if r == 5 and s >= 8 else 1.0)
        f = job.build()
        if copies > 1:
            f = replicate_dp(f, dp // copies, tp, pp, copies)
        gen_s = time.perf_counter() - t0
        raw_rows = int(sum(len(f[k]) for k in ("sections", "collectives")))
        store = Store.open(f"chdb://{tmp / 'store'}", ttl_days=0)

        def insert(lo: int, hi: int, f: dict = f) -> None:
            for t in ("sections", "collectives", "steps"):
                df = f[t][(f[t]["step"] >= lo) & (f[t]["step"] <= hi)]
                for i in range(0, len(df), 1_000_000):
                    store.insert_arrow(t, pa.Table.from_pandas(df.iloc[i:i + 1_000_000], preserve_index=False))

        info = JobInfo(job=job.job, topology=topo, num_microbatches=4)
        now = int(f["steps"]["end_ns"].max()) + 10**9
        row: dict = {"ranks": n, "raw_rows_window": raw_rows, "generate_s": round(gen_s, 1)}
        print(f"[{n} ranks] generated {raw_rows:,} raw rows in {gen_s:.1f}s; load {os.getloadavg()[0]:.1f}",
              flush=True)
        # steady state: the cache holds the window, then each pass sees one new step arrive
        held = args.repeat
        insert(0, args.steps - 1 - held)
        live = rollups.StepCache()
        load_reduced_frames(store, job.job, now, live, n, 4)
        times = []
        for k in range(held):
            s_new = args.steps - held + k
            insert(s_new, s_new)
            t0 = time.perf_counter()
            fr = load_reduced_frames(store, job.job, now, live, n, 4)
            diagnose(info, fr, now)
            times.append(time.perf_counter() - t0)
        row["store_after_new_step"] = min(times)
        before = None
        if not args.skip_before:
            from fleetscope.server.diagnosis.loader import JobFrames

            frames = JobFrames(0, args.steps - 1, f["steps"], f["sections"], f["collectives"],
                               f["steps"].groupby("step", as_index=False).agg(duration_ns=("duration_ns", "max"),
                                                                             end_ns=("end_ns", "max")),
                               *[__import__("pandas").DataFrame()] * 3, {}, *[__import__("pandas").DataFrame()] * 2)
            before, row["pure_before"] = best(lambda: diagnose(info, frames, now), args.repeat)
            del frames
            (fr, d), row["store_before"] = best(
                lambda: (lambda fr: (fr, diagnose(info, fr, now)))(load_job_frames(store, job.job, now)),
                args.repeat)
            row["rows_moved_before"] = int(len(fr.sections) + len(fr.collectives) + len(fr.steps))
            del fr
        del f

        def cold():
            fr = load_reduced_frames(store, job.job, now, rollups.StepCache(), n, 4)
            return fr, diagnose(info, fr, now)

        # a cold pass reduces the whole window (minutes at 12,288 ranks on 2 CPUs): once is enough
        (fr, after), row["store_after_cold"] = best(cold, 1 if n >= 4096 else args.repeat)
        cache = live  # warm: holds every step of the window

        def warm():
            fr = load_reduced_frames(store, job.job, now, cache, n, 4)
            return fr, diagnose(info, fr, now)

        (fr, after), row["store_after"] = best(warm, args.repeat)
        _, row["pure_after"] = best(lambda: diagnose(info, fr, now), args.repeat)

        def hang():
            h = load_reduced_frames(store, job.job, now, cache, n, 4, hardware=False, hang_only=True)
            return diagnose_hang(info, h, now)

        _, row["hang_after"] = best(hang, args.repeat)
        red = fr.reduced
        row["rows_moved_after"] = int(len(red.breakdown) + len(red.groups) + len(fr.steps) + len(fr.inflight)
                                      + len(fr.heartbeats) + len(fr.progress))
        row["cache_mb"] = round(cache.nbytes() / 2**20, 1)
        sig_after = sorted((x.kind.value, x.ranks, x.group_id) for x in after.findings)
        row["findings_after"] = [f"{k}:{list(r)}{':' + g if g else ''}" for k, r, g in sig_after]
        if before is not None:
            sig_before = sorted((x.kind.value, x.ranks, x.group_id) for x in before.findings)
            row["same_findings"] = sig_before == sig_after
            same = sig_before == sig_after
        store.close()
        if args.remote:
            row.update(remote_passes(tmp, job.job, info, now, n, args.repeat))
        row["load_avg_1m"] = round(os.getloadavg()[0], 1)
        print(json.dumps(row), flush=True)
        return row, same
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def remote_passes(tmp: Path, job: str, info, now: int, n: int, repeat: int) -> dict:
    """The same passes from another process' view: a real server owns the store and the
    queries go through its internal route (the diagnosis worker's path)."""
    from fleetscope.server.diagnosis import rollups
    from fleetscope.server.diagnosis.engine import diagnose, diagnose_hang
    from fleetscope.server.diagnosis.loader import load_reduced_frames
    from fleetscope.server.diagnosis.worker import RemoteStore

    from tests.helpers.server import running_server

    with running_server(tmp / "srv", store_url=f"chdb://{tmp / 'store'}", diagnosis_worker="off") as url:
        rs = RemoteStore(str(url))
        cache = rollups.StepCache()
        load_reduced_frames(rs, job, now, cache, n, 4)
        _, warm = best(lambda: diagnose(info, load_reduced_frames(rs, job, now, cache, n, 4), now), repeat)
        _, hang = best(lambda: diagnose_hang(info, load_reduced_frames(rs, job, now, cache, n, 4, hardware=False,
                                                                     hang_only=True), now), repeat)
        b0 = rs.bytes_received
        load_reduced_frames(rs, job, now, cache, n, 4)
        return {"remote_after": warm, "remote_hang": hang, "remote_kb_per_pass": round((rs.bytes_received - b0) / 1024)}


if __name__ == "__main__":
    sys.exit(main())
