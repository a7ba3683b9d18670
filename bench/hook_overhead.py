"""Hook overhead inside one job: blocks of steps with the hooks off and fully on.

A small DP x TP job on gloo (an MLP whose layers are split tensor-parallel with an
all-reduce after each, gradients all-reduced over DP; forward/backward/optimizer as
sections: the hooks' full record mix) runs ``--pairs`` pairs of blocks of ``--block``
steps. Within each pair one block runs with the hooks at level ``off`` and one at
``full`` (order random per pair), switched through runtime control: rank 0 writes the
job's control file, every rank's hooks thread picks it up, and the ranks wait for each
other before timing resumes. Both halves of a pair are seconds apart, so they share
the machine's noise. The first ``--skip`` steps of each block are not timed.

Two figures per pair, each the mean over pairs with a 90% bootstrap interval:

* **wall**: median step time (full) / median step time (off), rank 0, geometric mean;
  printed, but on a shared machine (and with more ranks than cores) scheduling moves
  it by several percent either way, so it cannot decide 1%;
* **CPU share** (the pass/fail judgement): what the hooks cost each rank in CPU, as a
  share of the step's wall time - the training thread's median CPU per step (full -
  off) plus the hooks' background thread's CPU over the full block minus the off
  block, per step (read from its thread CPU clock; after each block the bench waits
  for two flushes, so a block's records are encoded and written inside its own
  window), over the median wall step (off); averaged over ranks. Every CPU
  nanosecond the hooks spend counts as time the step lost, so this is an upper bound
  on a CPU-bound rank; thread CPU clocks move much less with other load than wall
  time does (context switches and cache misses on a crowded machine still add to them).

Exit 1 when the CPU share's point estimate exceeds ``--target`` (default 1.005) or its
interval's upper end exceeds 1.01 (the interval does not decide). Note the load
average it prints: on a busy machine the figures widen.

    .venv/bin/python bench/hook_overhead.py                   # full figure (~3-5 min on 2 cores)
    .venv/bin/python bench/hook_overhead.py --pairs 6 --block 10   # quick check
    .venv/bin/python bench/hook_overhead.py --micro                # per-op cost, 1-rank gloo

``--interleave off,full`` (a diagnosis, not the figure) sets the level in-process at
every step instead, so adjacent steps compare; ``--stop-worker`` leaves out the
background thread, which isolates the training thread's own share.

``--micro`` measures one wrapped call instead: ``dist.all_reduce`` of a 4-element tensor
on a 1-rank gloo group with no tracing installed, traced at level ``off``, and traced
at ``full``, plus an empty ``hooks.section``; rounds interleaved, medians of ns per
call (wall and calling-thread CPU), printed side by side with their ratios. These are
warm-cache figures (a tight loop); inside a real job each call runs colder, which the
job figure above includes. Exit 1 if a traced call's record is missing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TARGET = 1.005
DECIDE = 1.01


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, a: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from fleetscope.trainer_hooks.control import control_path, level_index, write_control

    from fleetscope import trainer_hooks as hooks
    from fleetscope.topology import Topology

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    topo = Topology(dp=a.dp, tp=a.tp)
    tp_group = dp_group = None
    tp_groups = {}
    dp_groups = {}
    for r in range(world):
        tp_groups.setdefault(tuple(sorted(topo.group_ranks("tp", r))), None)
        dp_groups.setdefault(tuple(sorted(topo.group_ranks("dp", r))), None)
    for ranks in tp_groups:
        g = dist.new_group(list(ranks))
        if rank in ranks:
            tp_group = g
    for ranks in dp_groups:
        g = dist.new_group(list(ranks))
        if rank in ranks:
            dp_group = g
    spool = Path(out) / "spool"
    # level switches are seen within 0.1 s; the queue is drained at --poll-interval
    cfg = hooks.HookConfig(poll_interval_s=a.poll_interval, control_interval_s=0.1)
    rec = hooks.init(job="overhead", rank=rank, topology=topo, spool=spool, config=cfg)
    ctl = control_path(spool, "overhead")
    torch.manual_seed(rank // a.tp)
    hidden = a.hidden
    shard = hidden // a.tp
    w1 = [torch.randn(hidden, shard, requires_grad=True) for _ in range(a.layers)]
    w2 = [torch.randn(shard, hidden, requires_grad=True) for _ in range(a.layers)]
    params = w1 + w2
    opt = torch.optim.SGD(params, lr=1e-4)
    x_all = torch.randn(a.batch, hidden)

    class _TPAllReduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            t = t.clone()
            dist.all_reduce(t, group=tp_group)
            return t

        @staticmethod
        def backward(ctx, g):
            return g

    def one_step(n: int) -> None:
        with hooks.step(n):
            with hooks.section("forward"):
                h = x_all
                for i in range(a.layers):
                    h = h + _TPAllReduce.apply(torch.relu(h @ w1[i]) @ w2[i]) * 0.01
                loss = h.pow(2).mean()
            with hooks.section("backward"):
                loss.backward()
                for p in params:
                    dist.all_reduce(p.grad, group=dp_group)
            with hooks.section("optimizer"):
                opt.step()
                opt.zero_grad()

    def switch(level: str) -> None:
        if rank == 0:
            write_control(ctl, {"level": level})
        want = level_index(level)
        deadline = time.monotonic() + 10
        while rec.level != want and time.monotonic() < deadline:
            time.sleep(0.01)
        dist.barrier()

    if a.interleave:  # diagnosis: the level set in-process per step, every rank alike
        levels = a.interleave.split(",")
        if a.stop_worker:  # the training thread's share alone (records pile up, unwritten)
            rec._stopping = True
            rec._wake.set()
            time.sleep(0.3)
        for n in range(a.warmup):
            one_step(n)
        per_step: list[tuple[str, float, float]] = []
        k = len(levels)
        for i in range(a.pairs * a.block):
            block = i // (2 * k)  # each level twice in a row (the second is timed), the
            order = levels[block % k:] + levels[:block % k]  # order rotating
            level = order[(i // 2) % k]
            hooks.set_level(level)
            c0, t0 = time.thread_time(), time.perf_counter()
            one_step(a.warmup + i)
            t1, c1 = time.perf_counter(), time.thread_time()
            if i % 2:
                per_step.append((level, t1 - t0, c1 - c0))
        hooks.shutdown()
        dist.destroy_process_group()
        Path(out, f"rank{rank}.json").write_text(json.dumps({"interleaved": per_step}))
        return
    bg_cpu = _thread_cpu_clock(rec)

    def settle() -> None:
        # two flushes finished after this point: every record of the block just run
        # is encoded and written, so its background work is charged to its own block
        f = rec.flushes
        deadline = time.monotonic() + 10
        while rec.flushes < f + 2 and time.monotonic() < deadline:
            time.sleep(0.01)

    rng = random.Random(a.seed)
    orders = [rng.random() < 0.5 for _ in range(a.pairs)]
    step = 0
    for _ in range(a.warmup):
        one_step(step)
        step += 1
    times: list[tuple[int, str, float, float]] = []
    blocks: list[tuple[int, str, int]] = []  # (pair, level, background-thread CPU ns)
    for p, off_first in enumerate(orders):
        for level in (("off", "full") if off_first else ("full", "off")):
            switch(level)
            b0 = bg_cpu()
            for i in range(a.block):
                c0, t0 = time.thread_time(), time.perf_counter()
                one_step(step)
                t1, c1 = time.perf_counter(), time.thread_time()
                step += 1
                if i >= a.skip:
                    times.append((p, level, t1 - t0, c1 - c0))
            settle()
            blocks.append((p, level, bg_cpu() - b0))
    stats = hooks.stats()
    hooks.shutdown()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        {"times": times, "blocks": blocks, "stats": stats}))


def _thread_cpu_clock(rec: object) -> Callable[[], int]:
    """A reader of the hooks' background thread's CPU time in ns (Linux: its thread
    CPU clock; elsewhere the thread's own counter, updated at each of its wake-ups)."""
    thread = getattr(rec, "_thread", None)
    try:
        clock = time.pthread_getcpuclockid(thread.ident)  # type: ignore[union-attr]
        time.clock_gettime_ns(clock)
        return lambda: time.clock_gettime_ns(clock)
    except (AttributeError, OSError, TypeError):
        return lambda: int(getattr(rec, "worker_cpu_ns", 0))


def analyse(times: list[tuple[int, str, float]], num_pairs: int, seed: int,
            resamples: int = 10_000) -> dict[str, float]:
    """See :func:`_analyse`; ``times`` rows are (pair, level, seconds)."""
    return _analyse(times, num_pairs, seed, resamples)


def _analyse(times: list[tuple[int, str, float]], num_pairs: int, seed: int,
             resamples: int = 10_000) -> dict[str, float]:
    """Geometric mean of per-pair (full / off) median-step-time ratios, 90% bootstrap CI."""
    blocks: dict[tuple[int, str], list[float]] = {}
    for p, lv, t in times:
        blocks.setdefault((p, lv), []).append(t)
    logs = []
    for p in range(num_pairs):
        on, off = blocks.get((p, "full")), blocks.get((p, "off"))
        if on and off:  # medians: one scheduler hiccup does not move a block
            logs.append(math.log(statistics.median(on) / statistics.median(off)))
    rng = random.Random(seed)
    k = len(logs)
    boot = sorted(sum(rng.choice(logs) for _ in range(k)) / k for _ in range(resamples))
    return {"ratio": math.exp(sum(logs) / k), "lo": math.exp(boot[int(0.05 * resamples)]),
            "hi": math.exp(boot[int(0.95 * resamples) - 1]), "pairs": k,
            "median_step_off_ms": 1e3 * statistics.median(t for _, lv, t in times if lv == "off"),
            "median_step_full_ms": 1e3 * statistics.median(t for _, lv, t in times if lv == "full")}


def cpu_cost(docs: list[dict], num_pairs: int, block: int, seed: int,
             resamples: int = 10_000) -> dict[str, float]:
    """The hooks' CPU per step as a share of the step's wall time, per pair, averaged
    over ranks: (median training-thread CPU full - off, plus the background thread's
    CPU of the full block minus the off block's, per step) / median wall step (off).
    ``1 + mean`` over pairs, with a 90% bootstrap interval over pairs.

    Thread CPU clocks hardly move with other load, so this resolves a fraction of a
    percent where wall time cannot; it counts every CPU nanosecond the hooks spend in
    the process as time the step lost, an upper bound when the rank is CPU-bound."""
    per_pair: dict[int, list[float]] = {}
    train_d, bg_d, walls = [], [], []
    for doc in docs:
        steps: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for p, lv, wall, cpu in doc["times"]:
            steps.setdefault((p, lv), []).append((wall, cpu))
        bg = {(p, lv): ns for p, lv, ns in doc["blocks"]}
        for p in range(num_pairs):
            on, off = steps.get((p, "full")), steps.get((p, "off"))
            if not on or not off or (p, "full") not in bg or (p, "off") not in bg:
                continue
            d_train = statistics.median(c for _, c in on) - statistics.median(c for _, c in off)
            d_bg = (bg[(p, "full")] - bg[(p, "off")]) / 1e9 / block
            wall_off = statistics.median(w for w, _ in off)
            per_pair.setdefault(p, []).append((d_train + d_bg) / wall_off)
            train_d.append(d_train)
            bg_d.append(d_bg)
            walls.append(wall_off)
    costs = [statistics.fmean(v) for v in per_pair.values()]
    k = len(costs)
    if not k:
        raise SystemExit("no pair has both blocks timed: nothing to compare")
    rng = random.Random(seed)
    boot = sorted(sum(rng.choice(costs) for _ in range(k)) / k for _ in range(resamples))
    return {"ratio": 1 + statistics.fmean(costs), "lo": 1 + boot[int(0.05 * resamples)],
            "hi": 1 + boot[int(0.95 * resamples) - 1], "pairs": k,
            "train_us": 1e6 * statistics.median(train_d), "bg_us": 1e6 * statistics.median(bg_d),
            "wall_off_ms": 1e3 * statistics.median(walls)}


def micro(rounds: int, calls: int) -> int:
    """Per-call cost of the tracing wrappers, side by side (see the module docstring)."""
    import torch
    import torch.distributed as dist

    from fleetscope import trainer_hooks as hooks

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    x = torch.zeros(4)
    sink = hooks.MemorySink()
    rec = hooks.init(job="micro", rank=0, sink=sink, trace_collectives=False)
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    res: dict[str, list[tuple[float, float]]] = {}

    def timed(name: str, fn) -> None:
        w0, c0 = wall(), cpu()
        for _ in range(calls):
            fn()
        res.setdefault(name, []).append(((wall() - w0) / calls, (cpu() - c0) / calls))

    def section() -> None:
        with hooks.section("forward"):
            pass

    full_calls = 0
    for _ in range(rounds):
        hooks.uninstall_tracing()
        timed("all_reduce, not traced", lambda: dist.all_reduce(x))
        hooks.install_tracing()
        hooks.set_level("off")
        timed("all_reduce, traced, level off", lambda: dist.all_reduce(x))
        hooks.set_level("full")
        timed("all_reduce, traced, level full", lambda: dist.all_reduce(x))
        full_calls += calls
        timed("empty section, level full", section)
    st = rec.stats()
    hooks.shutdown()
    hooks.uninstall_tracing()
    dist.destroy_process_group()
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in res.items()}
    base_w, base_c = med["all_reduce, not traced"]
    print(f"1-rank gloo, all_reduce of 4 float32, {rounds} rounds x {calls} calls, medians; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'':34s} {'wall ns':>9s} {'ratio':>6s} {'cpu ns':>9s} {'ratio':>6s}")
    for k, (w, c) in med.items():
        print(f"{k:34s} {w:9.0f} {w / base_w:6.3f} {c:9.0f} {c / base_c:6.3f}")
    w_off, c_off = med["all_reduce, traced, level off"]
    w_full, c_full = med["all_reduce, traced, level full"]
    print(f"traced full - not traced: {w_full - base_w:.0f} ns wall, {c_full - base_c:.0f} ns cpu "
          f"per call; full - off: {w_full - w_off:.0f} ns wall, {c_full - c_off:.0f} ns cpu")
    print(f"hooks' own time per call (self-measured): {st['overhead_ns'] / max(1, st['calls']):.0f} ns")
    got = len(sink.rows("collectives"))
    lost = st["dropped_records"] + st["worker_errors"]
    if got != full_calls or lost:
        print(f"FAIL: {got} collectives records for {full_calls} traced calls, {lost} lost")
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--pairs", type=int, default=40, help="off/full block pairs (default 40)")
    ap.add_argument("--block", type=int, default=20, help="steps per block (default 20)")
    ap.add_argument("--skip", type=int, default=2, help="untimed steps after each switch (default 2)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps at the start (default 10)")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--poll-interval", type=float, default=0.5,
                    help="the hooks' drain interval, HookConfig.poll_interval_s (default 0.5, "
                         "the hooks' default; the control file is checked every 0.1 s)")
    ap.add_argument("--target", type=float, default=TARGET, help="point-estimate target (default 1.005)")
    ap.add_argument("--micro", action="store_true",
                    help="per-call cost of the wrappers on a 1-rank group instead (see below)")
    ap.add_argument("--micro-rounds", type=int, default=30, help="--micro: rounds (default 30)")
    ap.add_argument("--micro-calls", type=int, default=2000,
                    help="--micro: calls per round and variant (default 2000)")
    ap.add_argument("--interleave", metavar="LEVELS", default="",
                    help="diagnosis instead of the figure: switch the level in-process per "
                         "step through these levels (e.g. off,full) and print each rank's "
                         "median step time per level; --pairs x --block steps")
    ap.add_argument("--stop-worker", action="store_true",
                    help="--interleave: stop the hooks' background thread first")
    a = ap.parse_args()
    if a.micro:
        return micro(a.micro_rounds, a.micro_calls)
    if a.block <= a.skip:
        ap.error(f"--block {a.block} must exceed --skip {a.skip}")
    import torch.multiprocessing as mp

    world = a.dp * a.tp
    load0 = os.getloadavg()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fs-overhead-") as tmp:
        mp.spawn(worker, args=(world, _free_port(), a, tmp), nprocs=world)
        docs = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    if a.interleave:
        print(f"job: dp={a.dp} tp={a.tp}, levels {a.interleave} interleaved per step, "
              f"{a.pairs * a.block} steps, hooks' thread {'stopped' if a.stop_worker else 'on'}, "
              f"{time.monotonic() - t0:.0f} s; load average before {load0[0]:.2f}, "
              f"after {os.getloadavg()[0]:.2f}")
        for r, doc in enumerate(docs):
            for col, what in ((2, "training-thread CPU"), (1, "wall")):
                by: dict[str, list[float]] = {}
                for row in doc["interleaved"]:
                    by.setdefault(row[0], []).append(row[col])
                base = statistics.median(by[a.interleave.split(",")[0]])
                print(f"rank {r} {what}, median per step: " + ", ".join(
                    f"{lv} {statistics.median(v) * 1e3:.3f} ms ({(statistics.median(v) - base) * 1e6:+.0f} us)"
                    for lv, v in by.items()))
        return 0
    rows = docs[0]["times"]
    res = analyse([(p, lv, wall) for p, lv, wall, _ in rows], a.pairs, a.seed)
    cpu = analyse([(p, lv, c) for p, lv, _, c in rows], a.pairs, a.seed)
    st = docs[0]["stats"]
    print(f"job: dp={a.dp} tp={a.tp} ({world} gloo ranks), {a.pairs} pairs x {a.block} steps "
          f"(first {a.skip} untimed), drain every {a.poll_interval:g} s, "
          f"{time.monotonic() - t0:.0f} s")
    print(f"load average: before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    print(f"median step time: off {res['median_step_off_ms']:.2f} ms, "
          f"full {res['median_step_full_ms']:.2f} ms; hooks' own time per call "
          f"{st['overhead_ns'] / max(1, st['calls']) / 1e3:.2f} us over {st['calls']} calls (rank 0)")
    print(f"ratio full/off = {res['ratio']:.4f}  (90% interval {res['lo']:.4f} .. {res['hi']:.4f}, "
          f"{res['pairs']} pairs)")
    print(f"training-thread CPU time per step: ratio full/off = {cpu['ratio']:.4f}  "
          f"(90% interval {cpu['lo']:.4f} .. {cpu['hi']:.4f}; less sensitive to other load; "
          f"median off {cpu['median_step_off_ms']:.2f} ms, full {cpu['median_step_full_ms']:.2f} ms)")
    cost = cpu_cost(docs, a.pairs, a.block, a.seed)
    print(f"hooks' CPU per step / wall step (all {world} ranks): {cost['ratio']:.4f}  "
          f"(90% interval {cost['lo']:.4f} .. {cost['hi']:.4f}, {cost['pairs']} pairs; median "
          f"per step: training thread +{cost['train_us']:.0f} us, background thread "
          f"+{cost['bg_us']:.0f} us, wall step {cost['wall_off_ms']:.2f} ms)")
    cores = os.cpu_count() or 1
    if not cost["lo"] - 1e-9 <= res["hi"] or not res["lo"] <= cost["hi"] + 1e-9:
        print(f"note: the wall-time interval and the CPU figure do not overlap ({world} ranks "
              f"on {cores} cores: scheduling moves wall time more than the hooks do)")
    ok = cost["ratio"] <= a.target and cost["hi"] <= DECIDE
    print(("PASS" if ok else "FAIL") + f": hooks' CPU share of the step <= {a.target - 1:.1%} "
          f"(point), interval upper end <= {DECIDE - 1:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
