"""GPU checks of the instrumentation, run on a CUDA machine (prints SKIP and exits 0 without).

Each check is a function returning a :class:`CheckResult`; ``CHECKS`` is the list that
runs. Other components add theirs (agent/NVML, kernels) by appending to ``CHECKS``.

Checks of trainer_hooks:
* ``event_timing``: CUDA-event section durations vs a synchronised wall-clock
  measurement of the same kernels (error %, target <= 5 % for >= 5 ms of work);
* ``no_sync``: hooked steps show no more ``cudaStreamSynchronize``/
  ``cudaDeviceSynchronize``/``cudaEventSynchronize`` calls (torch.profiler) than the
  same steps without hooks, and ``torch.cuda.set_sync_debug_mode("error")`` stays silent;
* ``overhead``: GPU step time hooks off vs on, in interleaved pairs of blocks: mean of the
  pairs' ratios with a 90% bootstrap interval (target <= 1.01, upper end <= 1.02);
* ``inflight_on_device``: one NCCL rank queues ~2.5 s of device work (one spinning
  kernel) and an all-reduce behind it; while the training thread is idle the in-flight rows name that all-reduce,
  and after the drain its record completes (the device half of the hang analysis);
* ``reference_trainer``: the reference trainer runs one rank on NCCL with device timing.

    .venv/bin/python bench/gpu_check.py [--only name,name]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CheckResult:
    name: str
    passed: bool
    figures: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def _torch() -> Any:
    import torch

    return torch


def _work(a: Any, iters: int) -> Any:
    for _ in range(iters):
        a = (a @ a).mul_(1.0 / a.shape[0]).relu_()
    return a


def check_event_timing() -> CheckResult:
    """Section device time vs synchronised wall clock of the same kernels."""
    torch = _torch()
    from fleetscope import trainer_hooks as hooks

    dev = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=dev)
    _work(a, 3)
    torch.cuda.synchronize()
    errors = []
    sink = hooks.MemorySink()
    hooks.init(job="gpucheck", rank=0, sink=sink, device=dev, trace_collectives=False)
    walls = []
    for iters in (5, 10, 20, 40):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        with hooks.section("forward", microbatch=iters):
            _work(a, iters)
        torch.cuda.synchronize()  # the benchmark's sync, outside the section's events
        walls.append((iters, time.perf_counter_ns() - t0))
    hooks.shutdown()
    rows = {r["microbatch"]: r for r in sink.rows("sections")}
    figures = {}
    for iters, wall in walls:
        dev_ns = rows[iters]["device_ns"]
        err = abs(dev_ns - wall) / wall * 100
        errors.append(err)
        figures[f"iters={iters}"] = f"device {dev_ns / 1e6:.2f} ms, wall {wall / 1e6:.2f} ms, err {err:.2f}%"
    big = [e for (_, w), e in zip(walls, errors) if w >= 5e6]
    ok = bool(big) and max(big) <= 5.0 and all(rows[i]["device_ns"] > 0 for i, _ in walls)
    figures["max_error_pct(>=5ms)"] = round(max(big), 3) if big else None
    return CheckResult("event_timing", ok, figures)


def _hooked_step(a: Any, step: int, num_mb: int = 4, iters: int = 4) -> None:
    from fleetscope import trainer_hooks as hooks

    with hooks.step(step):
        for mb in range(num_mb):
            with hooks.section("forward", microbatch=mb):
                _work(a, iters)
            with hooks.section("backward", microbatch=mb):
                _work(a, 2 * iters)
        with hooks.section("optimizer"):
            a.mul_(0.999)


def check_no_sync() -> CheckResult:
    """No synchronising CUDA call on the training thread while hooked steps run: the same
    steps are profiled without hooks (the control: the harness's own synchronize, and
    whatever the profiler itself issues) and with them, and the hooked run may not show
    more syncs; ``torch.cuda.set_sync_debug_mode("error")`` stays silent throughout."""
    torch = _torch()
    from torch.profiler import ProfilerActivity, profile

    from fleetscope import trainer_hooks as hooks

    dev = torch.device("cuda", 0)
    a = torch.randn(2048, 2048, device=dev)
    steps = 10

    def profiled() -> tuple[list[str], str]:
        _hooked_step(a, 0)
        torch.cuda.synchronize()
        debug_error = ""
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda.set_sync_debug_mode("error")
            try:
                for s in range(1, steps + 1):
                    _hooked_step(a, s)
            except RuntimeError as e:
                debug_error = str(e)[:200]
            finally:
                torch.cuda.set_sync_debug_mode("default")
            torch.cuda.synchronize()  # harness sync after the measured steps
        return sorted(f"{e.name} (profiler thread {e.thread})" for e in prof.events()
                      if "Synchronize" in e.name and e.name.startswith("cuda")), debug_error

    control, control_error = profiled()  # no recorder: hooks.step/section do nothing
    rec = hooks.init(job="gpucheck", rank=0, sink=hooks.MemorySink(), device=dev,
                     trace_collectives=False,
                     config=hooks.HookConfig(reanchor_interval_s=3600.0))
    deadline = time.monotonic() + 10
    while rec.cuda is not None and not rec.cuda.anchored and time.monotonic() < deadline:
        time.sleep(0.01)  # the background thread's one anchoring sync happens before profiling
    hooked, debug_error = profiled()
    hooks.shutdown()
    extra = max(0, len(hooked) - len(control))
    ok = extra == 0 and not debug_error and not control_error
    return CheckResult("no_sync", ok, {
        "syncs_per_step_added_by_hooks": extra / steps,
        "syncs_without_hooks": control,
        "syncs_with_hooks": hooked,
        "sync_debug_mode_error": debug_error or control_error or "none"})


def check_overhead(reps: int = 12, steps: int = 10) -> CheckResult:
    """GPU step time, hooks off vs on: ``reps`` pairs of blocks of ``steps`` hooked-shape
    steps (order alternating per pair), the ratio of each pair's medians, and a 90%
    bootstrap interval of their mean (both halves of a pair share the machine's state)."""
    import random

    torch = _torch()
    from fleetscope import trainer_hooks as hooks

    dev = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=dev)
    _hooked_step(a, 0)
    torch.cuda.synchronize()
    off, on, ratios = [], [], []
    for rep in range(reps):
        pair = {}
        for enabled in ((False, True) if rep % 2 == 0 else (True, False)):
            if enabled:
                hooks.init(job="gpucheck", rank=0, sink=hooks.SpoolSink(tempfile.mkdtemp()),
                           device=dev, trace_collectives=False)
            times = []
            for s in range(steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                _hooked_step(a, s)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            pair[enabled] = statistics.median(times)
            (on if enabled else off).append(pair[enabled])
            hooks.shutdown()
        ratios.append(pair[True] / pair[False])
    rng = random.Random(0)
    boot = sorted(statistics.fmean(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    lo, hi = boot[int(0.05 * len(boot))], boot[int(0.95 * len(boot)) - 1]
    ratio = statistics.fmean(ratios)
    return CheckResult("overhead", ratio <= 1.01 and hi <= 1.02, {
        "median_step_ms_off": round(statistics.median(off) * 1e3, 3),
        "median_step_ms_on": round(statistics.median(on) * 1e3, 3),
        "ratio": round(ratio, 4),
        "ratio_90pct_interval": (round(lo, 4), round(hi, 4)),
        "pairs": reps}, note="target: mean ratio <= 1.01, interval upper end <= 1.02")


def check_inflight_on_device() -> CheckResult:
    """A collective queued behind long device work is what the rank's in-flight rows
    name while the training thread is idle (the real CUDA-event path of the hang
    analysis), and its record completes with device time once the work drains."""
    torch = _torch()
    import torch.distributed as dist
    from fleetscope.trainer.launcher import free_port

    from fleetscope import trainer_hooks as hooks

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    try:
        x = torch.ones(1 << 20, device=dev)
        dist.all_reduce(x)  # NCCL warm-up, untraced
        # one spinning kernel, not thousands of small ones: the host's launch queue holds
        # ~1000 kernels and blocks when full, so a long queue of short kernels would have
        # mostly run by the time the all-reduce is enqueued
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.cuda._sleep(100_000_000)
        torch.cuda.synchronize()
        cycles_per_s = 100_000_000 / (time.perf_counter() - t0)
        sink = hooks.MemorySink()
        hooks.init(job="gpucheck-inflight", rank=0, sink=sink, device=dev)
        with hooks.step(0):
            with hooks.section("forward"):
                t_launch = time.perf_counter()
                torch.cuda._sleep(int(2.5 * cycles_per_s))  # ~2.5 s of queued device work
                launch_s = time.perf_counter() - t_launch
            t_enq = time.time_ns()
            dist.all_reduce(x)  # returns at once: queued behind the work on the stream
            host_s = (time.time_ns() - t_enq) / 1e9
            time.sleep(1.6)  # the training thread is idle; the device is not
            torch.cuda.synchronize()
        t_done = time.time_ns()
        queued_s = (t_done - t_enq) / 1e9
        time.sleep(1.2)
        hooks.shutdown()
    finally:
        dist.destroy_process_group()
    rows = sink.rows("inflight")
    during = [r for r in rows if t_enq + 0.6e9 <= r["ts_ns"] <= t_enq + 1.5e9]
    named = [r for r in during if r["kind"] == "collective" and r["op"] == "all_reduce"]
    after = [r for r in rows if r["ts_ns"] >= t_done + 0.6e9]
    colls = [r for r in sink.rows("collectives") if r["op"] == "all_reduce"]
    ok = (bool(during) and len(named) == len(during) and bool(after)
          and all(r["kind"] != "collective" for r in after)
          and len(colls) == 1 and colls[0]["state"] == "completed" and colls[0]["duration_ns"] >= 0)
    return CheckResult("inflight_on_device", ok, {
        "device_busy_after_enqueue_s": round(queued_s, 2),
        "spin_kernel_launch_s": round(launch_s, 4),
        "all_reduce_host_call_s": round(host_s, 4),
        "inflight_rows_while_queued": len(during),
        "naming_the_all_reduce": len(named),
        "rows_while_queued": [(round((r["ts_ns"] - t_enq) / 1e9, 2), r["kind"], r["op"]) for r in during],
        "kinds_after_drain": sorted({r["kind"] for r in after}),
        "collective_record": {k: colls[0].get(k) for k in ("state", "group_id", "seq", "duration_ns")}
        if colls else None})


def check_reference_trainer() -> CheckResult:
    """One rank of the reference trainer on NCCL: sections carry CUDA-event device time."""
    from fleetscope.trainer.config import TrainConfig
    from fleetscope.trainer.launcher import free_port
    from fleetscope.trainer.train import run_rank

    from fleetscope import trainer_hooks as hooks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    sink = hooks.MemorySink()
    result = run_rank(TrainConfig(steps=5, job="gpucheck-train", device="cuda"), 0, 1, sink=sink)
    secs = [r for r in sink.rows("sections") if r["name"] in ("forward", "backward")]
    with_device = sum(r["device_ns"] > 0 for r in secs)
    ok = bool(secs) and with_device == len(secs) and result.losses[-1] < result.losses[0]
    return CheckResult("reference_trainer", ok, {
        "sections": len(secs), "with_device_time": with_device,
        "loss_first_last": (round(result.losses[0], 4), round(result.losses[-1], 4)),
        "dropped": result.hook_stats.get("dropped_records")})


def check_agent_nvml() -> CheckResult:
    """The agent's real NVML path: readings of every GPU, GPU->rank mapping, XID watcher."""
    import threading

    from fleetscope.agent.nvml import GpuSampler, XidWatcher, open_nvml
    from fleetscope.agent.ranks import RankRegistry

    from fleetscope import spool

    torch = _torch()
    x = torch.ones(1024, device="cuda:0")  # this process becomes a compute process of GPU 0
    nv = open_nvml()
    if nv is None:
        return CheckResult("agent_nvml", False, note="NVML could not be opened")
    ranks = RankRegistry()
    with tempfile.TemporaryDirectory() as d:
        rank_dir = spool.rank_dir(d, "gpucheck", 3)
        spool.write_rank_info(rank_dir, {"pid": os.getpid(), "local_rank": 0})
        ranks.get("gpucheck", 3, rank_dir)
        sampler = GpuSampler(nv, ranks)
        mapping = {i: r.rank for i, r in sampler.gpu_ranks().items()}
        readings = {(n, i): v for n, i, v in sampler.sample()}
        stop = threading.Event()
        watcher = XidWatcher(sampler, lambda gpu, xid: None, stop, timeout_ms=200)
        watcher.start()
        time.sleep(1.0)
        stop.set()
        watcher.join(5)
    del x
    gpu0 = {n: v for (n, i), v in readings.items() if i == 0}
    ok = (mapping.get(0) == 3 and gpu0.get("gpu.memory_total_bytes", 0) > 0
          and 0 < gpu0.get("gpu.temperature_c", -1) < 120 and gpu0.get("gpu.power_w", 0) > 0
          and not watcher.is_alive())
    return CheckResult("agent_nvml", ok, {"num_gpus": sampler.num_gpus, "names": sampler.names,
                                          "gpu_to_rank": mapping, "gpu0": gpu0})


CHECKS: list[Callable[[], CheckResult]] = [
    check_event_timing,
    check_no_sync,
    check_overhead,
    check_inflight_on_device,
    check_reference_trainer,
    check_agent_nvml,
]


def main() -> int:
    ap = argparse.ArgumentParser(description="GPU checks (SKIP without CUDA)")
    ap.add_argument("--only", default="", help="comma-separated check names")
    args = ap.parse_args()
    try:
        torch = _torch()
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        print("SKIP: no CUDA device (bench/gpu_check.py needs one)")
        return 0
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    only = {s for s in args.only.split(",") if s}
    failed = 0
    for check in CHECKS:
        name = check.__name__.removeprefix("check_")
        if only and name not in only:
            continue
        try:
            r = check()
        except Exception as e:  # one broken check must not hide the others
            r = CheckResult(name, False, note=f"error: {e!r}")
        failed += not r.passed
        print(f"[{'PASS' if r.passed else 'FAIL'}] {r.name} {r.note}")
        for k, v in r.figures.items():
            print(f"    {k}: {v}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
