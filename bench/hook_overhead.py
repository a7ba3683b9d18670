"""Hook overhead: the same 8-rank reference job with trainer_hooks off and on.

Runs ``fleetscope train`` (dp=2, tp=2, pp=2 on gloo) alternately without and with hooks
(interleaved repeats, so drifting machine load hits both alike), takes each run's
median step time (warm-up steps dropped) and prints the ratio on/off (target <= 1.01).
It also reports the CPU time of all ranks per step (on/off), which includes the hooks'
background threads and is less sensitive to other load on a shared machine. Then it
measures, in this process, the CPU time one hooked section and one traced collective
cost the training thread, in microseconds (target <= 5 us per section on CPU), and
from those and the background threads' measured CPU time, the hooks' own CPU per step
as a share of the job's (a figure other load on the machine hardly moves).

    .venv/bin/python bench/hook_overhead.py            # ~2-3 minutes on 2 cores
    .venv/bin/python bench/hook_overhead.py --repeats 5 --steps 20

Exit status 1 when a target is missed (the wall-time ratio is judged on its point
estimate; the bootstrap interval printed beside it says how much the noise allows).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 1.01
TARGET_SECTION_US = 5.0
MODEL = ["--layers", "4", "--hidden", "128", "--heads", "4", "--seq-len", "64",
         "--global-batch", "16", "--microbatches", "2", "--vocab", "512"]


def run_job(tmp: Path, hooks_on: bool, steps: int,
            index: int) -> tuple[list[float], list[float], float, dict[str, float]]:
    """One job: the step wall times (s) and CPU times of all ranks per step (s) after warm-up, the
    largest per-rank fraction of step time the hooks measured in their own code, and per
    step, all ranks together: the CPU time of the hooks' background threads (s, measured steps only)
    and the numbers of sections and traced ops recorded."""
    results = tmp / f"results-{index}"
    cmd = [sys.executable, "-m", "fleetscope.cli", "train", "--dp", "2", "--tp", "2", "--pp", "2",
           "--steps", str(steps), "--job", f"bench-{index}", "--spool", str(tmp / "spool"),
           "--results", str(results), "--timeout-s", "600", *MODEL]
    if not hooks_on:
        cmd.append("--no-hooks")
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    times, cpu, self_frac, worker_cpu = [], [], 0.0, 0.0
    warm = max(2, steps // 5)
    for path in sorted(results.glob("rank-*.json")):
        doc = json.loads(path.read_text())
        times.append(doc["step_times_s"])
        cpu.append(doc["step_cpu_s"])
        if doc["hook_stats"]:
            spent = doc["hook_stats"]["overhead_ns"] / 1e9
            self_frac = max(self_frac, spent / sum(doc["step_times_s"]))
        cum = doc.get("hook_worker_cpu_s") or []
        if hooks_on:  # steady state: the measured steps only, no start-up
            if len(cum) != steps:
                raise SystemExit(f"{path.name}: {len(cum)} background-CPU readings for {steps} steps")
            worker_cpu += cum[-1] - cum[warm - 1]
    # the job is synchronous: per step, the slowest rank's time is the job's step time
    per_step = [max(t[i] for t in times) for i in range(warm, steps)]
    cpu_step = [sum(c[i] for c in cpu) for i in range(warm, steps)]
    counts = {"worker_cpu": worker_cpu / (steps - warm), "sections": 0.0, "ops": 0.0}
    if hooks_on:
        from fleetscope.trainer_hooks.reader import read_job

        rows = read_job(tmp / "spool", f"bench-{index}")
        counts["sections"] = len(rows.get("sections", ())) / steps
        counts["ops"] = len(rows.get("collectives", ())) / steps
    return per_step, cpu_step, self_frac, counts


def job_ratio(repeats: int, steps: int) -> dict[str, float]:
    """Interleaved off/on runs: medians of the pooled steps of each arm, a bootstrap
    interval for the wall-time ratio (resampling whole runs, the unit of noise here)."""
    off: list[float] = []
    on: list[float] = []
    cpu_off: list[float] = []
    cpu_on: list[float] = []
    self_frac: list[float] = []
    worker: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(repeats):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for hooks_on in order:
                t, c, f, w = run_job(tmp, hooks_on, steps, len(off) + len(on))
                (on if hooks_on else off).append(t)
                (cpu_on if hooks_on else cpu_off).append(c)
                t, c = statistics.median(t), statistics.median(c)
                if hooks_on:
                    self_frac.append(f)
                    worker.append(w)
                print(f"  run {len(off) + len(on):2d}: hooks {'on ' if hooks_on else 'off'} "
                      f"median step {t * 1e3:7.1f} ms, CPU of all ranks per step "
                      f"{c * 1e3:7.1f} ms", flush=True)
    def pooled(runs: list[list[float]]) -> float:
        return statistics.median(x for run in runs for x in run)

    rng = random.Random(0)
    boot = sorted(pooled(rng.choices(on, k=len(on))) / pooled(rng.choices(off, k=len(off)))
                  for _ in range(2000))
    return {"off": pooled(off), "on": pooled(on), "cpu_off": pooled(cpu_off), "cpu_on": pooled(cpu_on),
            "ci": (boot[100], boot[1899]),
            "spread_off": (max(map(statistics.median, off)) - min(map(statistics.median, off)))
            / pooled(off),
            "self_fraction": max(self_frac),
            **{k: statistics.median(w[k] for w in worker) for k in worker[0]}}


def section_cost(n: int = 100_000) -> dict[str, float]:
    """Training-thread cost of one hooked section / traced all_reduce, in us."""
    from fleetscope import trainer_hooks as hooks

    clock = time.thread_time_ns  # CPU time of this (training) thread: immune to other load

    def loop_sections() -> float:
        t0 = clock()
        for _ in range(n):
            with hooks.section("forward", microbatch=0):
                pass
        return (clock() - t0) / n / 1e3

    def loop_empty() -> float:
        t0 = clock()
        for _ in range(n):
            pass
        return (clock() - t0) / n / 1e3

    base = min(loop_empty() for _ in range(3))
    disabled = min(loop_sections() for _ in range(3)) - base
    with tempfile.TemporaryDirectory() as d:
        rec = hooks.init(job="bench", rank=0, sink=hooks.SpoolSink(d), trace_collectives=False)
        enabled = min(loop_sections() for _ in range(3)) - base
        self_measured = rec.overhead_ns / max(1, rec.calls) / 1e3
        hooks.shutdown()
        dropped = rec.stats()["dropped_records"]
    out = {"section_disabled_us": disabled, "section_enabled_us": enabled,
           "section_self_measured_us": self_measured, "section_dropped": float(dropped)}
    out.update(collective_cost(n // 10))
    return out


def collective_cost(n: int) -> dict[str, float]:
    """Extra cost of tracing a tiny all_reduce on a 1-rank gloo group."""
    import torch
    import torch.distributed as dist
    from fleetscope.trainer.launcher import free_port

    from fleetscope import trainer_hooks as hooks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    t = torch.ones(1)

    def loop() -> float:
        t0 = time.thread_time_ns()
        for _ in range(n):
            dist.all_reduce(t)
        return (time.thread_time_ns() - t0) / n / 1e3

    try:
        off = min(loop() for _ in range(3))
        with tempfile.TemporaryDirectory() as d:
            hooks.init(job="bench", rank=0, sink=hooks.SpoolSink(d))
            on = min(loop() for _ in range(3))
            hooks.shutdown()
    finally:
        dist.destroy_process_group()
    return {"all_reduce_untraced_us": off, "all_reduce_traced_us": on,
            "all_reduce_tracing_us": on - off}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=4, help="off/on pairs (default 4)")
    ap.add_argument("--steps", type=int, default=14, help="steps per job (default 14)")
    ap.add_argument("--skip-job", action="store_true", help="only the in-process micro-costs")
    args = ap.parse_args()
    ok = True
    if not args.skip_job:
        print(f"8-rank job (dp=2 tp=2 pp=2, gloo), {args.repeats} interleaved off/on pairs, "
              f"{args.steps} steps each", flush=True)
        r = job_ratio(args.repeats, args.steps)
        off, on = r["off"], r["on"]
        ratio = on / off
        lo, hi = r["ci"]
        ok &= ratio <= TARGET_RATIO
        verdict = "OK" if ratio <= TARGET_RATIO else "MISSED"
        if lo <= TARGET_RATIO < hi:
            verdict += (f" (the 90% interval [{lo:.3f}, {hi:.3f}] still spans the target: the "
                        f"baseline runs differ by {r['spread_off']:.0%} among themselves)")
        print(f"median step time over all measured steps: hooks off {off * 1e3:.1f} ms, "
              f"hooks on {on * 1e3:.1f} ms")
        print(f"ratio on/off: {ratio:.4f}, 90% bootstrap interval over runs [{lo:.4f}, {hi:.4f}] "
              f"(target <= {TARGET_RATIO}) {verdict}")
        print(f"hooks' self-measured share of step time on the training thread (worst rank): "
              f"{r['self_fraction']:.4%}")
        print(f"CPU of all ranks per step: off {r['cpu_off'] * 1e3:.1f} ms, on "
              f"{r['cpu_on'] * 1e3:.1f} ms, ratio {r['cpu_on'] / r['cpu_off']:.4f} "
              "(includes the hooks' background threads; less sensitive to other load)")
        if off < 0.2:
            print(f"note: step time {off * 1e3:.0f} ms is below the 200 ms the comparison asks for")
    c = section_cost()
    if not args.skip_job:
        # the hooks' own CPU, all ranks, per step: measured on the background threads,
        # estimated on the training threads (records x per-call cost measured below)
        train = (r["sections"] * c["section_enabled_us"]
                 + r["ops"] * max(0.0, c["all_reduce_tracing_us"])) / 1e6
        own = r["worker_cpu"] + train
        print(f"hooks' own CPU, all ranks: {own * 1e3:.2f} ms per step = {own / r['cpu_off']:.3%} "
              f"of the hooks-off CPU per step (background threads {r['worker_cpu'] * 1e3:.2f} ms "
              f"measured; training threads {train * 1e3:.2f} ms = {r['sections']:.0f} sections + "
              f"{r['ops']:.0f} traced ops per step x the per-call costs below)")
    ok &= c["section_enabled_us"] <= TARGET_SECTION_US
    print(f"one section on the training thread: {c['section_enabled_us']:.2f} us enabled "
          f"(self-measured in hook code {c['section_self_measured_us']:.2f} us), "
          f"{c['section_disabled_us']:.2f} us disabled; target <= {TARGET_SECTION_US} us "
          f"{'OK' if c['section_enabled_us'] <= TARGET_SECTION_US else 'MISSED'}")
    print(f"one traced all_reduce (1-rank gloo): +{c['all_reduce_tracing_us']:.2f} us "
          f"({c['all_reduce_untraced_us']:.1f} -> {c['all_reduce_traced_us']:.1f} us)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
