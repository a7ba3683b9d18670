"""Collective bus bandwidth (all-reduce, all-to-all) and p2p bandwidth per rank pair.

Bandwidths follow nccl-tests (``doc/PERFORMANCE.md``): for a per-rank buffer of ``S``
bytes and time ``t``, the algorithm bandwidth is ``algbw = S / t`` and the *bus*
bandwidth, comparable with the hardware link speed whatever the number of ranks ``n``,
is ``busbw = algbw x 2(n-1)/n`` for all-reduce and ``algbw x (n-1)/n`` for all-to-all,
all-gather and reduce-scatter. ``t`` is the slowest rank's time (a collective is as
fast as its slowest member).

These functions must be called on every rank of an initialised ``torch.distributed``
group (NCCL on GPU, gloo on CPU); every rank returns the same figures. Iteration counts
are agreed through the group, so no rank ever waits for a call another rank skips.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from fleetscope.kernels.result import ProbeResult, Progress, human_bytes, quiet
from fleetscope.kernels.timing import check_slowdown, synchronize

BUS_FACTORS: Final = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def bus_bandwidth_gbps(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth in GB/s of one ``op`` call on ``nbytes`` per rank.

    Args:
        op: ``allreduce``, ``alltoall``, ``allgather``, ``reducescatter`` or ``broadcast``.
        nbytes: bytes of the per-rank buffer.
        seconds: time of one call (slowest rank).
        world_size: ranks in the group.
    """
    if op not in BUS_FACTORS:
        raise ValueError(f"collective {op!r}; expected one of {sorted(BUS_FACTORS)}")
    if seconds <= 0:
        raise ValueError(f"collective time must be positive, got {seconds!r}")
    return nbytes / seconds / 1e9 * BUS_FACTORS[op](world_size)


def _agree_max(value: float, device: str, group: Any) -> float:
    """The maximum of ``value`` over the group (every rank gets it)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _timed_loop(fn: Any, calls: int, device: str, group: Any, slowdown: float) -> float:
    """Seconds per call of ``calls`` calls, the slowest rank's figure."""
    import torch.distributed as dist

    dist.barrier(group=group)
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    elapsed = time.perf_counter() - t0
    if slowdown > 1.0:
        time.sleep(elapsed * (slowdown - 1.0))
        elapsed *= slowdown
    return _agree_max(elapsed, device, group) / calls


def _verify(op: str, device: str, group: Any) -> bool:
    """One small call with known inputs: all-reduce sums ranks+1, all-to-all routes chunks."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    if op == "allreduce":
        t = torch.full((1024,), float(me + 1), device=device)
        dist.all_reduce(t, group=group)
        return bool((t == world * (world + 1) / 2).all())
    src = torch.full((world * 256,), float(me), device=device)
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src, group=group)
    expected = torch.arange(world, device=device).repeat_interleave(256).float()
    return bool((dst == expected).all())


def collective_probe(
    op: str,
    *,
    sizes: Sequence[int],
    device: str,
    device_model: str,
    budget_s: float,
    group: Any = None,
    slowdown: float = 1.0,
    progress: Progress = quiet,
) -> ProbeResult:
    """Measure the bus bandwidth of ``op`` over a sweep of sizes; call on every rank.

    Args:
        op: ``allreduce`` or ``alltoall``.
        sizes: per-rank buffer sizes in bytes (float32 elements; each divisible by the
            group size for all-to-all).
        device: this rank's device (``cpu`` or ``cuda:N``).
        device_model: model of this rank's device (for the record).
        budget_s: seconds for the whole sweep.
        group: process group (default: the world).
        slowdown: test-only fault injection factor (>= 1) on this rank.
        progress: progress sink.

    Returns:
        The best bus bandwidth of the sweep in GB/s; per-size figures in the detail.
    """
    import torch
    import torch.distributed as dist

    if op not in ("allreduce", "alltoall"):
        raise ValueError(f"collective probe {op!r}; expected allreduce or alltoall")
    slowdown = check_slowdown(slowdown)
    world = dist.get_world_size(group)
    backend = str(dist.get_backend(group))
    t_start = time.perf_counter()
    per_size = budget_s / max(1, len(sizes))
    sweep = []
    for nbytes in sizes:
        numel = max(world, nbytes // 4 // world * world)
        src = torch.zeros(numel, device=device)  # zeros stay zeros however often summed
        dst = torch.empty_like(src)
        if op == "allreduce":

            def fn(src: Any = src, dst: Any = dst) -> None:
                dist.all_reduce(src, group=group)

        else:

            def fn(src: Any = src, dst: Any = dst) -> None:
                dist.all_to_all_single(dst, src, group=group)

        fn()  # warm-up: connection setup, buffer registration
        one = _timed_loop(fn, 1, device, group, 1.0)
        calls = max(1, min(200, int(per_size / 3 / max(one, 1e-6))))
        best = min(_timed_loop(fn, calls, device, group, slowdown) for _ in range(3))
        busbw = bus_bandwidth_gbps(op, numel * 4, best, world)
        sweep.append({"bytes": numel * 4, "time_s": best, "busbw_gbps": busbw,
                      "algbw_gbps": numel * 4 / best / 1e9})
        progress(f"{op} {backend} x{world} {human_bytes(numel * 4)}: busbw {busbw:.2f} GB/s")
    ok = _verify(op, device, group)
    top = max(sweep, key=lambda s: s["busbw_gbps"])
    return ProbeResult(
        probe=op,
        device=f"{backend}:{world}",
        device_model=device_model,
        variant=f"{backend} ranks={world} max={human_bytes(sweep[-1]['bytes'])}",
        value=top["busbw_gbps"],
        unit="GB/s",
        passed=ok,
        detail={"world_size": world, "backend": backend, "sweep": sweep,
                "best_bytes": top["bytes"], **({} if ok else {"reason": "wrong result"})},
        duration_s=time.perf_counter() - t_start,
    )


def p2p_pairs(world: int, pattern: str) -> list[tuple[int, int]]:
    """Ordered (sender, receiver) pairs of group ranks for a p2p ``pattern``."""
    if pattern == "all":
        return [(i, j) for i in range(world) for j in range(world) if i != j]
    if pattern == "ring":
        return sorted({(i, (i + 1) % world) for i in range(world) if world > 1})
    raise ValueError(f"p2p pattern {pattern!r}; expected all or ring")


def p2p_probe(
    *,
    nbytes: int,
    device: str,
    device_model: str,
    devices: Sequence[str],
    budget_s: float,
    pattern: str = "all",
    group: Any = None,
    slowdown: float = 1.0,
    progress: Progress = quiet,
) -> list[ProbeResult]:
    """Unidirectional send/recv bandwidth for every ordered pair of ranks; call on every rank.

    Pairs run one at a time (the others wait at a barrier), so each figure is one link's.

    Args:
        nbytes: bytes per message.
        device: this rank's device.
        device_model: this rank's device model.
        devices: every rank's device name, indexed by group rank (for the records).
        budget_s: seconds for all pairs.
        pattern: ``all`` (every ordered pair i->j) or ``ring`` (i->i+1 mod n: every
            device sends and receives once, n pairs instead of n(n-1)).
        group: process group (default: the world).
        slowdown: test-only fault injection factor (>= 1) on this rank.
        progress: progress sink.

    Returns:
        On the receiving rank of each pair, that pair's result (GB/s); others get none.
    """
    import torch
    import torch.distributed as dist

    slowdown = check_slowdown(slowdown)
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    pairs = p2p_pairs(world, pattern)
    buf = torch.ones(max(1, nbytes // 4), device=device)
    nbytes = buf.numel() * 4

    def exchange(i: int, j: int, calls: int) -> float:
        dist.barrier(group=group)
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            if me == i:
                dist.send(buf, ranks[j], group=group)
            elif me == j:
                dist.recv(buf, ranks[i], group=group)
        synchronize(device)
        elapsed = time.perf_counter() - t0
        if slowdown > 1.0 and me in (i, j):
            time.sleep(elapsed * (slowdown - 1.0))
            elapsed *= slowdown
        return _agree_max(elapsed if me in (i, j) else 0.0, device, group)

    t_start = time.perf_counter()
    exchange(*pairs[0], 1)  # warm-up
    one = exchange(*pairs[0], 1)
    calls = max(1, min(100, int(budget_s / len(pairs) / max(one, 1e-6))))
    out = []
    for i, j in pairs:
        exchange(i, j, 1)  # warm-up of this pair's connection
        seconds = exchange(i, j, calls) / calls
        gbps = nbytes / seconds / 1e9
        if me == j:
            out.append(ProbeResult(
                probe="p2p",
                device=f"{devices[i]}->{devices[j]}",
                device_model=device_model,
                variant=f"{dist.get_backend(group)} {human_bytes(nbytes)}",
                value=gbps,
                unit="GB/s",
                passed=bool(buf[0] == 1),
                detail={"src_rank": i, "dst_rank": j, "nbytes": nbytes, "calls": calls,
                        "time_s": seconds},
                duration_s=time.perf_counter() - t_start,
            ))
        if me == 0:
            progress(f"p2p {devices[i]}->{devices[j]} {human_bytes(nbytes)}: {gbps:.2f} GB/s")
    return out
