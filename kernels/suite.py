"""The self-check suite: every probe on every local device, then the local group.

On a GPU host with several devices, one process per GPU runs the per-device probes
(matmul, membw, numerics) at the same time — as during training, with every GPU busy —
then joins an NCCL group for all-reduce, all-to-all and p2p. On a CPU host (or a single
GPU) the per-device probes run in this process, and the collective probes in a
``nprocs``-rank gloo group of local processes (loopback: it checks the collective path
and the host's memory system; across hosts use the preflight, which runs on the job's
own world group).

A probe that raises becomes a failed result; the suite always returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetscope.kernels.devices import DeviceInfo, local_devices
from fleetscope.kernels.numerics import BitFlip, mark_minority, numerics_probe
from fleetscope.kernels.plan import Plan, plan_for
from fleetscope.kernels.progress import begin, stage_done
from fleetscope.kernels.result import (
    COLLECTIVE_PROBES,
    PROBES,
    ProbeResult,
    Progress,
    failed_result,
    human_bytes,
    stderr_progress,
)
from fleetscope.kernels.timing import check_slowdown


@dataclass(frozen=True)
class SuiteOptions:
    """Everything a suite run (or one rank of it) needs; picklable for worker processes."""

    plan: Plan
    probes: tuple[str, ...] = PROBES
    slowdown: float = 1.0
    """Test-only fault injection: every timed probe runs this many times slower."""
    flip: BitFlip | None = None
    """Test-only fault injection: flip a bit of the numerics result."""


def device_probes(dev: DeviceInfo, opts: SuiteOptions, progress: Progress) -> list[ProbeResult]:
    """Run matmul, membw and numerics (those selected) on one device."""
    from fleetscope.kernels.matmul import matmul_probe
    from fleetscope.kernels.membw import membw_probe

    p = opts.plan
    out: list[ProbeResult] = []
    if "matmul" in opts.probes:
        for dtype in p.matmul_dtypes:
            out.append(_guard(
                lambda dtype=dtype: matmul_probe(
                    dev, n=p.matmul_n, dtype=dtype, budget_s=p.matmul_budget_s,
                    slowdown=opts.slowdown, progress=progress),
                "matmul", dev, f"{dtype} n={p.matmul_n}", "TFLOP/s", progress))
    if "membw" in opts.probes:
        for kernel in p.membw_kernels:
            out.append(_guard(
                lambda kernel=kernel: membw_probe(
                    dev, kernel=kernel, nbytes=p.membw_bytes, budget_s=p.membw_budget_s,
                    slowdown=opts.slowdown, progress=progress),
                "membw", dev, f"{kernel} {human_bytes(p.membw_bytes)}", "GB/s", progress))
    if "numerics" in opts.probes:
        out.append(_guard(
            lambda: numerics_probe(
                dev, n=p.numerics_n, depth=p.numerics_depth, repeats=p.numerics_repeats,
                flip=opts.flip, progress=progress),
            "numerics", dev, f"n={p.numerics_n}", "mismatches", progress))
    if dev.is_cuda:
        import torch

        torch.cuda.empty_cache()
    return out


def group_probes(
    dev: DeviceInfo,
    opts: SuiteOptions,
    progress: Progress,
    *,
    devices: Sequence[str],
    group: Any = None,
) -> list[ProbeResult]:
    """Run all-reduce, all-to-all and p2p (those selected) on every rank of ``group``.

    Args:
        dev: this rank's device.
        opts: the suite options (identical on every rank).
        progress: progress sink.
        devices: every rank's device name, by group rank.
        group: an initialised process group (default: the world).

    Returns:
        All-reduce and all-to-all results on every rank; each p2p pair on its receiver.
    """
    from fleetscope.kernels.collectives import collective_probe, p2p_probe

    p = opts.plan
    backend = "nccl" if dev.is_cuda else "gloo"
    out: list[ProbeResult] = []
    for op in ("allreduce", "alltoall"):
        if op in opts.probes:
            out.append(_guard(
                lambda op=op: collective_probe(
                    op, sizes=p.collective_sizes, device=dev.device, device_model=dev.model,
                    budget_s=p.collective_budget_s, group=group, slowdown=opts.slowdown,
                    progress=progress),
                op, dev, backend, "GB/s", progress))
    if "p2p" in opts.probes:
        try:
            out.extend(p2p_probe(
                nbytes=p.p2p_bytes, device=dev.device, device_model=dev.model,
                devices=devices, budget_s=p.p2p_budget_s,
                pattern=p.p2p_pattern, group=group,
                slowdown=opts.slowdown, progress=progress))
        except Exception as e:  # a broken link must not hide the other results
            progress(f"p2p {dev.device}: FAIL {type(e).__name__}: {e}")
            out.append(failed_result("p2p", dev.device, dev.model, backend, "GB/s", e))
    return out


def _guard(fn: Any, probe: str, dev: DeviceInfo, variant: str, unit: str,
           progress: Progress) -> ProbeResult:
    try:
        return fn()  # type: ignore[no-any-return]
    except Exception as e:  # the suite reports a failing probe instead of dying with it
        progress(f"{probe} {dev.device}: FAIL {type(e).__name__}: {e}")
        return failed_result(probe, dev.device, dev.model, variant, unit, e)
    finally:
        stage_done(progress)


def device_stages(opts: SuiteOptions) -> int:
    """Stages :func:`device_probes` runs on one device (one per probe variant)."""
    p = opts.plan
    return (len(p.matmul_dtypes) * ("matmul" in opts.probes)
            + len(p.membw_kernels) * ("membw" in opts.probes) + ("numerics" in opts.probes))


def run_suite(
    *,
    mode: str = "quick",
    device: str | None = None,
    plan: Plan | None = None,
    nprocs: int | None = None,
    probes: Sequence[str] = PROBES,
    slowdown: float = 1.0,
    flip: BitFlip | None = None,
    progress: Progress = stderr_progress,
) -> list[ProbeResult]:
    """Run the self-check suite on this host.

    Args:
        mode: ``quick`` or ``full`` (ignored when ``plan`` is given).
        device: ``cpu``, ``cuda``, ``cuda:N``; default every GPU, else the CPU.
        plan: explicit sizes and budgets (tests use tiny ones).
        nprocs: ranks of the local collective group; default one per GPU, or 2 on a
            CPU host; below 2 skips all-reduce, all-to-all and p2p.
        probes: which probes to run (names from :data:`fleetscope.kernels.result.PROBES`).
        slowdown: test-only fault injection factor (>= 1).
        flip: test-only numerics fault injection.
        progress: progress sink.

    Returns:
        One result per probe, device, variant (and p2p pair), in run order.

    Raises:
        ValueError: an unknown probe, device, mode or a bad slowdown (message names it).
    """
    unknown = sorted(set(probes) - set(PROBES))
    if unknown:
        raise ValueError(f"unknown probe(s) {unknown}; expected some of {list(PROBES)}")
    slowdown = check_slowdown(slowdown)
    devs = local_devices(device)
    cuda = devs[0].is_cuda
    opts = SuiteOptions(plan or plan_for(mode, cuda), tuple(probes), slowdown, flip)
    if nprocs is None:
        nprocs = len(devs) if cuda else 2
    if nprocs < 0:
        raise ValueError(f"nprocs {nprocs} must be >= 0")
    if cuda and nprocs > len(devs):
        raise ValueError(f"nprocs {nprocs} exceeds the {len(devs)} selected GPU(s)")
    wants_group = nprocs >= 2 and any(p in COLLECTIVE_PROBES for p in probes)

    from fleetscope.kernels.launch import run_local_group

    here = devs[nprocs:] if cuda and wants_group else devs  # devices probed in this process
    begin(progress, device_stages(opts) * len(here) + wants_group)
    if cuda and wants_group:  # one process per GPU runs everything, in parallel
        results = run_local_group(nprocs, opts, [d.device for d in devs[:nprocs]],
                                  with_device_probes=True, progress=progress)
        stage_done(progress)
        for d in here:
            results += device_probes(d, opts, progress)
    else:
        results = []
        for d in here:
            results += device_probes(d, opts, progress)
        if wants_group:
            results += run_local_group(nprocs, opts, ["cpu"] * nprocs,
                                       with_device_probes=False, progress=progress)
            stage_done(progress)
        elif any(p in COLLECTIVE_PROBES for p in probes):
            progress(f"collectives skipped: a group needs 2 or more ranks (nprocs={nprocs})")
    return mark_minority(results)
