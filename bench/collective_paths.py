"""Cost per op of each collective-tracing approach, on one gloo rank (CPU).

For each way of calling a collective (c10d function, a name bound before ``init`` -
traced on the ProcessGroup layer -, a functional collective + ``wait_tensor``) it times
N small all-reduces with the hooks off and on, interleaved in rounds, and prints the
median difference per op (the cost on the training thread) and the hooks' own measured
time per op. Then the Flight Recorder alternative: the same loop in a child process
with ``TORCH_FR_BUFFER_SIZE`` set vs unset (FR's recording cost per op, paid in C++ on
the training thread), and the cost of reading FR's buffer live (``_dump_fr_trace`` +
unpickling, per entry, as a background thread would pay it).

    .venv/bin/python bench/collective_paths.py            # full figures (~1 min)
    .venv/bin/python bench/collective_paths.py --ops 2000 --rounds 3   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _loop(call, n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        call()
    return (time.perf_counter_ns() - t0) / n / 1e3


def measure_paths(ops: int, rounds: int) -> dict[str, dict[str, float]]:
    import torch
    import torch.distributed as dist

    from fleetscope import trainer_hooks as hooks
    from fleetscope.topology import Topology

    bound = dist.all_reduce  # bound before init: reaches the ProcessGroup layer
    import torch.distributed._functional_collectives as funcol

    x = torch.ones(16)
    paths = {
        "c10d function (dist.all_reduce)": lambda: dist.all_reduce(x),
        "ProcessGroup layer (name bound before init)": lambda: bound(x),
        "functional + wait_tensor": lambda: funcol.all_reduce(x, "sum", dist.group.WORLD).wait(),
        "async + Work.wait": lambda: dist.all_reduce(x, async_op=True).wait(),
    }
    out: dict[str, dict[str, float]] = {}
    samples = {k: ([], []) for k in paths}
    own = {k: [] for k in paths}
    for _ in range(rounds):
        for name, call in paths.items():
            _loop(call, ops // 10)
            samples[name][0].append(_loop(call, ops))
            rec = hooks.init(job="bench", rank=0, topology=Topology(), sink=hooks.MemorySink())
            _loop(call, ops // 10)
            o0, c0 = rec.overhead_ns, rec.calls
            samples[name][1].append(_loop(call, ops))
            own[name].append((rec.overhead_ns - o0) / max(1, rec.calls - c0) / 1e3)
            hooks.shutdown()
    for name in paths:
        off, on = samples[name]
        out[name] = {"off_us": statistics.median(off), "on_us": statistics.median(on),
                     "added_us": statistics.median([b - a for a, b in zip(off, on)]),
                     "self_measured_us": statistics.median(own[name])}
    return out


def child_fr(ops: int, rounds: int) -> dict[str, float]:
    """In a child: per-op time of a plain all-reduce loop (FR on or off by env)."""
    import torch
    import torch.distributed as dist

    x = torch.ones(16)
    res = {"op_us": statistics.median(_loop(lambda: dist.all_reduce(x), ops) for _ in range(rounds))}
    if os.environ.get("TORCH_FR_BUFFER_SIZE"):
        import pickle

        from torch._C._distributed_c10d import _dump_fr_trace

        t0 = time.perf_counter_ns()
        raw = _dump_fr_trace(includeStackTraces=False)
        t1 = time.perf_counter_ns()
        entries = pickle.loads(raw)["entries"]
        t2 = time.perf_counter_ns()
        res.update(entries=len(entries), dump_us_per_entry=(t1 - t0) / len(entries) / 1e3,
                   unpickle_us_per_entry=(t2 - t1) / len(entries) / 1e3)
    return res


def _init_world1() -> None:
    import torch.distributed as dist

    from tests.helpers.server import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=20000, help="all-reduces per timed loop")
    p.add_argument("--rounds", type=int, default=7, help="interleaved off/on rounds")
    p.add_argument("--child", choices=["fr"], help=argparse.SUPPRESS)
    a = p.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _init_world1()
    if a.child:
        print(json.dumps(child_fr(a.ops, a.rounds)))
        return
    rows = measure_paths(a.ops, a.rounds)
    fr = {}
    for label, env in (("fr_off", {}), ("fr_on", {"TORCH_FR_BUFFER_SIZE": str(a.ops)})):
        e = {k: v for k, v in os.environ.items() if k != "TORCH_FR_BUFFER_SIZE"}
        proc = subprocess.run([sys.executable, __file__, "--child", "fr", "--ops", str(a.ops),
                               "--rounds", str(a.rounds)], env={**e, **env}, capture_output=True,
                              text=True, check=True)
        fr[label] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"load average: {os.getloadavg()}")
    print(f"{'path':46s} {'off us/op':>10s} {'on us/op':>10s} {'added':>8s} {'hooks own':>10s}")
    for name, r in rows.items():
        print(f"{name:46s} {r['off_us']:10.2f} {r['on_us']:10.2f} {r['added_us']:8.2f} "
              f"{r['self_measured_us']:10.2f}")
    on, off = fr["fr_on"], fr["fr_off"]
    print(f"{'Flight Recorder recording (C++, per op)':46s} {off['op_us']:10.2f} {on['op_us']:10.2f} "
          f"{on['op_us'] - off['op_us']:8.2f}")
    print(f"Flight Recorder live read: dump {on['dump_us_per_entry']:.3f} us + unpickle "
          f"{on['unpickle_us_per_entry']:.3f} us per entry ({on['entries']} entries)")


if __name__ == "__main__":
    main()
