"""Preflight: the quick self-check on every rank of a job, before step 0.

MegaScale runs self-checks before (re)starting a job and evicts hosts that fail. Here
every rank calls :func:`run_quick` after ``init_process_group`` and before training:

1. the per-device probes (matmul, membw, numerics) on the rank's own device;
2. all-reduce and all-to-all bus bandwidth on the job's own group (across hosts: the
   fabric the job will use);
3. the numerics hashes of all ranks are compared (same device model and variant must
   give the same bits; the minority fails);
4. pass/fail of every rank is gathered, so every rank knows which hosts passed;
5. each rank records its own results as ``probes`` records with the job id — through the
   job's telemetry (``emit``) or straight to a server — so the job records which hosts
   passed: ``GET /api/v1/jobs/{job}/preflight``.

Shipping problems are reported on the progress sink and never raise: the job decides
what a failed preflight means (``PreflightReport.passed``).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetscope.kernels.numerics import BitFlip
from fleetscope.kernels.plan import Plan, plan_for
from fleetscope.kernels.result import ProbeResult, Progress, stderr_progress


@dataclass(frozen=True)
class PreflightReport:
    """What the preflight found, as seen by one rank."""

    rank: int
    host: str
    results: tuple[ProbeResult, ...]
    """This rank's results (rank 0 also holds the group's collective results)."""
    hosts_passed: Mapping[str, bool] = field(default_factory=dict)
    """Every host of the job -> whether all its ranks passed."""
    failures: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """Failing rank -> short reasons, for every rank of the job."""
    shipped: bool = False

    @property
    def passed(self) -> bool:
        """True when every rank of the job passed."""
        return not self.failures

    @property
    def failed_hosts(self) -> list[str]:
        return sorted(h for h, ok in self.hosts_passed.items() if not ok)


def _reasons(results: Sequence[ProbeResult]) -> tuple[str, ...]:
    return tuple(
        f"{r.probe} {r.device}: {r.detail.get('reason') or r.detail.get('error') or 'failed'}"
        for r in results
        if not r.passed
    )


def run_quick(
    *,
    job: str = "",
    host: str | None = None,
    server: str | None = None,
    token: str | None = None,
    emit: Callable[[dict[str, Any]], None] | None = None,
    device: str | None = None,
    group: Any = None,
    collectives: bool = True,
    plan: Plan | None = None,
    slowdown: float = 1.0,
    flip: BitFlip | None = None,
    progress: Progress = stderr_progress,
) -> PreflightReport:
    """Run the quick self-check on this rank; call it on every rank of the job.

    Without an initialised ``torch.distributed`` group it checks this process's device
    only (a single-process job).

    Args:
        job: job id recorded with the results.
        host: this rank's host name (default: the hostname).
        server: fleetscope server to ship the results to (None: do not ship).
        token: bearer token for the server.
        emit: called with each ``probes`` record of this rank (e.g. the trainer's
            ``lambda r: trainer_hooks.emit("probes", **r)``, so the records travel
            with the job's other telemetry through the spool and the agent).
        device: device of this rank (default: the current CUDA device, else cpu).
        group: process group of the job (default: the world).
        collectives: also measure all-reduce / all-to-all on ``group``.
        plan: sizes and budgets (default: the quick plan of the device kind).
        slowdown: test-only fault injection factor (>= 1) on this rank.
        flip: test-only numerics fault injection on this rank.
        progress: progress sink.

    Returns:
        The report; ``passed`` is the same on every rank.
    """
    import torch
    import torch.distributed as dist
    from fleetscope.kernels.devices import cpu_info, cuda_info
    from fleetscope.kernels.suite import SuiteOptions, device_probes, group_probes

    host = host or socket.gethostname()
    if device is None:
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    dev = cuda_info(int(device.split(":")[1])) if device.startswith("cuda") else cpu_info()
    opts = SuiteOptions(plan or plan_for("quick", dev.is_cuda),
                        ("matmul", "membw", "numerics", "allreduce", "alltoall"),
                        slowdown, flip)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    world = dist.get_world_size(group) if distributed else 1

    def say(msg: str) -> None:
        progress(f"preflight rank {rank}: {msg}")

    results = device_probes(dev, opts, say if rank == 0 else _only_failures(say))
    if distributed and world > 1:
        if collectives:
            group_out = group_probes(dev, replace(opts, probes=("allreduce", "alltoall")),
                                     say if rank == 0 else _only_failures(say),
                                     devices=[], group=group)
            results += [r for r in group_out if rank == 0 or not r.passed]
        results = _compare_numerics(results, group)
        status: list[Any] = [None] * world
        dist.all_gather_object(status, (rank, host, _reasons(results)), group=group)
    else:
        status = [(rank, host, _reasons(results))]
    hosts_passed: dict[str, bool] = {}
    failures: dict[int, tuple[str, ...]] = {}
    for k, h, reasons in status:
        hosts_passed[h] = hosts_passed.get(h, True) and not reasons
        if reasons:
            failures[k] = tuple(reasons)
    records = [r.to_record(host=host, job=job) for r in results]
    if emit is not None:
        for rec in records:
            emit(rec)
    shipped = False
    if server:
        from fleetscope.kernels.ship import ShipError, ship_records

        try:
            ship_records(server, records, host=host, token=token)
            shipped = True
        except (ShipError, ValueError) as e:
            say(f"results not shipped: {e}")
    if rank == 0:
        bad = sorted(h for h, ok in hosts_passed.items() if not ok)
        say(f"{len(hosts_passed) - len(bad)}/{len(hosts_passed)} host(s) passed"
            + (f"; FAILED: {', '.join(bad)}" if bad else ""))
    return PreflightReport(rank, host, tuple(results), hosts_passed, failures, shipped)


def _compare_numerics(results: list[ProbeResult], group: Any) -> list[ProbeResult]:
    """Fail this rank's numerics result if its hash is not the majority of its peers'
    (same device model and variant) across the group. Collective: call on every rank."""
    import torch.distributed as dist

    mine = next((r for r in results if r.probe == "numerics" and "hash" in r.detail), None)
    key = None if mine is None else (mine.device_model, mine.variant, mine.detail["hash"])
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, key, group=group)
    if mine is None:
        return results
    counts = Counter(g[2] for g in gathered if g is not None and g[:2] == key[:2])  # type: ignore[index]
    if len(counts) < 2:
        return results
    (top, top_n), (_, second_n) = counts.most_common(2)
    if top_n > second_n and mine.detail["hash"] == top:
        return results
    why = (f"hash {mine.detail['hash']} differs from the job's majority {top}" if top_n > second_n
           else f"no majority among the job's hashes {dict(counts)}")
    failed = replace(mine, value=mine.value + 1, passed=False,
                     detail={**mine.detail, "reason": why})
    return [failed if r is mine else r for r in results]


def _only_failures(say: Progress) -> Progress:
    def sink(msg: str) -> None:
        if "FAIL" in msg:
            say(msg)

    return sink


class PreflightFailed(RuntimeError):
    """Some rank of the job failed the preflight; the message names hosts and reasons."""


def check_before_training(**kwargs: Any) -> PreflightReport:
    """:func:`run_quick` (same arguments), raising :class:`PreflightFailed` on any failure.

    What ``fleetscope train --preflight`` calls on every rank before step 0; every rank
    raises together, so the job stops before training instead of hanging.
    """
    report = run_quick(**kwargs)
    if not report.passed:
        reasons = "; ".join(f"rank {k}: {', '.join(v)}" for k, v in sorted(report.failures.items()))
        raise PreflightFailed(
            f"preflight failed on host(s) {', '.join(report.failed_hosts)}: {reasons}"
        )
    return report
