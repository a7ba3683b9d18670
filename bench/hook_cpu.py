"""The hooks' own CPU per training step, measured in one process (no other ranks).

A rank of the reference job (dp=2 tp=2 pp=2) records, per step, about 7 sections, 19
collectives, 4 p2p ops and one step row; its background thread wakes every 0.5 s to
turn them into rows, write the in-flight liveness row, encode Arrow IPC frames and
append them to the spool. This script replays that per-rank mix with the real hooks
on a 1-rank gloo group and measures with ``time.thread_time_ns`` (CPU of one thread,
which other load on the machine hardly moves):

* training thread: CPU of the step's hooked calls (sections, step marker, traced
  ``all_reduce``/``all_gather``, p2p ops), the median step with hooks on minus the
  median with hooks off (steps alternate between the two);
* background thread: the same wake-up schedule as the real thread (a virtual clock:
  steps of ``--step-ms``, drain + in-flight + flush every 0.5 s, metrics every 5 s)
  driven on this thread, CPU per step split by task (drain/convert, in-flight,
  metrics, flush = encode + write), and per record.

    .venv/bin/python bench/hook_cpu.py                 # ~20 s
    .venv/bin/python bench/hook_cpu.py --profile       # plus a cProfile of the background work

Exit status 1 if any record was lost (every queued record must reach the spool).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
from typing import Any

CLOCK = time.thread_time_ns
AR_PER_MB_FWD, AR_PER_MB_BWD, MICROBATCHES = 5, 4, 2


def _workload(hooks: Any, dist: Any, collectives: Any, torch: Any, step: int,
              small: Any, parts: list) -> None:
    """One step of a middle rank: sections with the collectives issued inside them."""
    rec = hooks.state.recorder if hasattr(hooks, "state") else None
    with hooks.step(step, num_microbatches=MICROBATCHES, tokens=512):
        with hooks.section("dataloader"):
            pass
        for mb in range(MICROBATCHES):
            with hooks.section("forward", microbatch=mb):
                for _ in range(AR_PER_MB_FWD - 1):
                    dist.all_reduce(small)
                dist.all_gather(parts, small)
            _p2p(hooks, collectives, small, "send", 1)
            with hooks.section("backward", microbatch=mb):
                for _ in range(AR_PER_MB_BWD):
                    dist.all_reduce(small)
            _p2p(hooks, collectives, small, "recv", 1)
        with hooks.section("grad_sync", kind="other"):
            dist.all_reduce(small)
        with hooks.section("optimizer"):
            pass
        hooks.step_info(loss=1.0)
    del rec


_P2P: dict[str, Any] = {}


def _p2p(hooks: Any, collectives: Any, t: Any, name: str, peer: int) -> None:
    """A p2p op through the real tracing wrapper (hooks on) or none (off); a 1-rank
    group has no peer, so the transport under the wrapper does nothing."""
    if hooks.state.recorder is None:
        return
    fn = _P2P.get(name)
    if fn is None:
        fn = _P2P[name] = collectives.traced(name, lambda *args, **kwargs: None)
    fn(t, peer)


def measure(steps: int, step_ms: float, repeats: int, profile: bool, with_gc: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from fleetscope.trainer.launcher import free_port
    from fleetscope.trainer_hooks import collectives

    from fleetscope import trainer_hooks as hooks
    from fleetscope.topology import Topology

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    small = torch.ones(8)
    parts = [torch.empty(8)]
    out: dict[str, Any] = {}
    if not with_gc:  # a cyclic-GC pass (tens of ms with torch loaded) lands on whichever
        gc.collect()  # code allocates when it is due: measure our code without it
        gc.disable()
    try:
        for s in range(60):  # warm up
            _workload(hooks, dist, collectives, torch, s, small, parts)
        off_steps: list[int] = []
        on_steps: list[int] = []
        tasks = {"drain": 0, "inflight": 0, "metrics": 0, "flush": 0}
        counts: dict[str, int] = {}
        wakeups = 0
        lost = 0
        prof = cProfile.Profile() if profile else None
        cfg = hooks.HookConfig(poll_interval_s=3600, flush_interval_s=3600,
                               inflight_interval_s=3600, metrics_interval_s=3600,
                               reanchor_interval_s=3600)
        with tempfile.TemporaryDirectory() as d:  # warm-up: one-time imports and caches
            rec = hooks.init(job="cpu", rank=3, topology=Topology(dp=2, tp=2, pp=2),
                             spool=d, config=cfg)
            while not rec._sink_open and rec.stats()["worker_alive"]:
                time.sleep(0.001)
            rec._metrics_prev = (time.monotonic_ns(), 0)
            for s in range(3):
                _workload(hooks, dist, collectives, torch, s, small, parts)
            rec._drain()
            rec._inflight()
            rec._metrics()
            rec._flush()
            hooks.shutdown()
        for rep in range(repeats):
            d = tempfile.mkdtemp()
            rec = hooks.init(job="cpu", rank=3, topology=Topology(dp=2, tp=2, pp=2),
                             spool=d, config=cfg)
            while not rec._sink_open and rec.stats()["worker_alive"]:
                time.sleep(0.001)  # the background thread opens the sink, then sleeps
            rec._metrics_prev = (time.monotonic_ns(), 0)
            bg = dict.fromkeys(tasks, 0)
            vnow, next_wake, next_metrics = 0.0, 0.5, 1.0
            for s in range(steps):
                # a step with hooks off (nothing wrapped, no recorder), then one with them
                # on: interleaved, so drifting load or clock speed hits both alike
                hooks.state.recorder = None
                collectives.uninstall()
                t0 = CLOCK()
                _workload(hooks, dist, collectives, torch, s, small, parts)
                off_steps.append(CLOCK() - t0)
                collectives.install()
                hooks.state.recorder = rec
                t0 = CLOCK()
                _workload(hooks, dist, collectives, torch, s, small, parts)
                on_steps.append(CLOCK() - t0)
                vnow += step_ms / 1e3
                while next_wake <= vnow:  # the real thread's order: drain, inflight, metrics, flush
                    wakeups += rep == 0
                    if prof:
                        prof.enable()
                    for name, fn in (("drain", rec._drain), ("inflight", rec._inflight),
                                     ("metrics", rec._metrics if next_metrics <= next_wake else None),
                                     ("flush", rec._flush)):
                        if fn is None:
                            continue
                        t0 = CLOCK()
                        fn()
                        bg[name] += CLOCK() - t0
                    if prof:
                        prof.disable()
                    if next_metrics <= next_wake:
                        next_metrics += 5.0
                    next_wake += 0.5
            for k in tasks:
                tasks[k] = bg[k] if rep == 0 else min(tasks[k], bg[k])
            st = rec.stats()
            hooks.shutdown()
            lost += st["dropped_records"] + st["sink_errors"] + st["worker_errors"]
            if st["last_error"]:
                print("error:", st["last_error"], file=sys.stderr)
            if rep == 0:
                from fleetscope.trainer_hooks.reader import read_job

                rows = read_job(d, "cpu")
                counts = {k: len(v) for k, v in rows.items()}
        off, on = statistics.median(off_steps), statistics.median(on_steps)
        out.update(train_off_us=off / 1e3, train_on_us=on / 1e3, train_hooks_us=(on - off) / 1e3,
                   bg_us={k: v / steps / 1e3 for k, v in tasks.items()},
                   counts=counts, wakeups_per_step=wakeups / steps, lost=lost, profile=prof)
    finally:
        dist.destroy_process_group()
        gc.enable()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="steps per run (default 300)")
    ap.add_argument("--step-ms", type=float, default=775.0,
                    help="virtual step time for the wake-up schedule (default 775)")
    ap.add_argument("--repeats", type=int, default=5, help="runs; the minimum counts (default 5)")
    ap.add_argument("--profile", action="store_true", help="cProfile the background tasks")
    ap.add_argument("--gc", action="store_true",
                    help="leave the cyclic GC on (its passes then add noise to every figure)")
    args = ap.parse_args()
    r = measure(args.steps, args.step_ms, args.repeats, args.profile, args.gc)
    bg = r["bg_us"]
    bg_total = sum(bg.values())
    c = r["counts"]
    queued = c.get("sections", 0) + c.get("collectives", 0) + c.get("steps", 0)
    per_step_records = sum(c.values()) / args.steps
    print(f"records per step: {per_step_records:.1f} "
          + ", ".join(f"{k} {v / args.steps:.2f}" for k, v in sorted(c.items())))
    print(f"background wake-ups per step: {r['wakeups_per_step']:.2f}")
    print(f"training thread per step: hooks off {r['train_off_us']:.1f} us, on {r['train_on_us']:.1f} us"
          f" -> hooks {r['train_hooks_us']:.1f} us "
          f"({r['train_hooks_us'] / max(1, queued / args.steps):.2f} us per queued record)")
    print(f"background thread per step: {bg_total:.1f} us "
          f"({bg_total / per_step_records:.2f} us per record) = "
          + ", ".join(f"{k} {v:.1f}" for k, v in bg.items()))
    print(f"hooks' CPU per step (one rank): {r['train_hooks_us'] + bg_total:.1f} us; "
          f"records lost: {r['lost']}")
    if r["profile"] is not None:
        pstats.Stats(r["profile"]).sort_stats("tottime").print_stats(25)
    return 1 if r["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
