"""Run the group probes in a local process group: one child process per rank.

Ranks are fresh interpreters (``python -m fleetscope.kernels.launch``), not
``multiprocessing`` children: CUDA cannot be forked, and ``spawn`` would re-import the
caller's ``__main__`` (a trainer, a test runner, a user script). Options go to the
children and results come back as JSON files in a fresh temporary directory, which also
holds the rendezvous file, so concurrent suites never collide on a port. The parent
waits at most ``plan.group_timeout_s``; ranks that have not reported by then are
killed and every probe they owed is reported as failed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from fleetscope.kernels.progress import captures_children
from fleetscope.kernels.result import COLLECTIVE_PROBES, ProbeResult, Progress, failed_result


def _options_to_json(opts: Any) -> dict[str, Any]:
    return {
        "plan": dataclasses.asdict(opts.plan),
        "probes": list(opts.probes),
        "slowdown": opts.slowdown,
        "flip": dataclasses.asdict(opts.flip) if opts.flip else None,
    }


def _options_from_json(doc: dict[str, Any]) -> Any:
    from fleetscope.kernels.numerics import BitFlip
    from fleetscope.kernels.plan import Plan
    from fleetscope.kernels.suite import SuiteOptions

    plan = Plan(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc["plan"].items()})
    flip = BitFlip(**doc["flip"]) if doc["flip"] else None
    return SuiteOptions(plan, tuple(doc["probes"]), doc["slowdown"], flip)


def result_to_json(r: ProbeResult) -> dict[str, Any]:
    """A result as a JSON-able dict (inverse: :func:`result_from_json`)."""
    d = dataclasses.asdict(r)
    d["detail"] = dict(r.detail)
    return d


def result_from_json(d: dict[str, Any]) -> ProbeResult:
    """Rebuild a :class:`ProbeResult` from :func:`result_to_json` output."""
    return ProbeResult(**{k: (float("nan") if k == "peak" and v is None else v) for k, v in d.items()})


def _worker(rank: int, world: int, workdir: str) -> None:
    """Entry point of one rank (a child process): run, then write ``result-<rank>.json``."""
    import torch
    import torch.distributed as dist
    from fleetscope.kernels.devices import cpu_info, cuda_info
    from fleetscope.kernels.result import stderr_progress
    from fleetscope.kernels.suite import device_probes, group_probes

    with open(os.path.join(workdir, "options.json")) as f:
        doc = json.load(f)
    opts = _options_from_json(doc["options"])
    devices, labels = doc["devices"], doc["labels"]
    with_device_probes = doc["with_device_probes"]

    def progress(msg: str) -> None:
        if rank == 0 or "FAIL" in msg or with_device_probes:
            stderr_progress(f"rank {rank}: {msg}")

    out: list[ProbeResult] = []
    error = ""
    try:
        cuda = devices[rank].startswith("cuda")
        if cuda:
            index = int(devices[rank].split(":")[1])
            torch.cuda.set_device(index)
            dev = cuda_info(index)
        else:
            torch.set_num_threads(1)  # the ranks share the host's cores
            dev = cpu_info(num_threads=1)
        if with_device_probes:
            out += device_probes(dev, opts, progress)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"file://{os.path.join(workdir, 'rendezvous')}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=opts.plan.group_timeout_s),
        )
        try:
            group_out = group_probes(dev, opts, progress, devices=labels)
        finally:
            dist.destroy_process_group()
        # All-reduce / all-to-all figures are the same on every rank: rank 0 reports them.
        out += [r for r in group_out if r.probe == "p2p" or rank == 0]
    except BaseException as e:  # report, never leave the parent guessing
        error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    tmp = os.path.join(workdir, f"result-{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"results": [result_to_json(r) for r in out], "error": error}, f)
    os.replace(tmp, os.path.join(workdir, f"result-{rank}.json"))


def run_local_group(
    nprocs: int,
    opts: Any,
    devices: Sequence[str],
    *,
    with_device_probes: bool,
    progress: Progress,
) -> list[ProbeResult]:
    """Start ``nprocs`` ranks that run the group probes (and per-device probes).

    Args:
        nprocs: number of ranks.
        opts: :class:`fleetscope.kernels.suite.SuiteOptions`.
        devices: device of each rank (``cuda:N`` or ``cpu``).
        with_device_probes: each rank first runs matmul/membw/numerics on its device.
        progress: progress sink of the parent.

    Returns:
        All ranks' results, rank by rank; failed results for ranks that crashed or hung.
    """
    labels = [d if d.startswith("cuda") else f"cpu#{i}" for i, d in enumerate(devices)]
    backend = "nccl" if devices[0].startswith("cuda") else "gloo"
    progress(f"starting a {nprocs}-rank {backend} group for the collective probes")
    got: dict[int, list[ProbeResult]] = {}
    errors: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="fleetscope-selfcheck-") as workdir:
        with open(os.path.join(workdir, "options.json"), "w") as f:
            json.dump({"options": _options_to_json(opts), "devices": list(devices),
                       "labels": labels, "with_device_probes": with_device_probes}, f)
        # behind a progress bar the ranks' lines go to files, forwarded through the sink
        capture = captures_children(progress)
        logs = [open(os.path.join(workdir, f"rank-{r}.log"), "wb") if capture else None
                for r in range(nprocs)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "fleetscope.kernels.launch", str(r), str(nprocs), workdir],
                stdin=subprocess.DEVNULL, stderr=logs[r],
            )
            for r in range(nprocs)
        ]
        for log_file in logs:
            if log_file is not None:
                log_file.close()
        offsets = [0] * nprocs

        def forward() -> None:
            for r in range(nprocs) if capture else ():
                with open(os.path.join(workdir, f"rank-{r}.log"), "rb") as f:
                    f.seek(offsets[r])
                    chunk = f.read()
                done = chunk.rfind(b"\n") + 1
                offsets[r] += done
                for line in chunk[:done].decode(errors="replace").splitlines():
                    if line.strip():
                        progress(line.removeprefix("[selfcheck] "))

        deadline = time.monotonic() + opts.plan.group_timeout_s + 60
        try:
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.1)
                forward()
            forward()
        finally:
            for p in procs:  # only our own children, by handle
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
        for r, p in enumerate(procs):
            path = os.path.join(workdir, f"result-{r}.json")
            if not os.path.exists(path):
                errors[r] = f"exited with status {p.returncode} without a result"
                continue
            with open(path) as f:
                doc = json.load(f)
            results = [result_from_json(d) for d in doc["results"]]
            if doc["error"]:
                errors[r] = doc["error"].strip().splitlines()[0]
            got[r] = results
    merged = [r for rank in sorted(got) for r in got[rank]]
    if errors:
        why = "; ".join(f"rank {r}: {e}" for r, e in sorted(errors.items()))
        progress(f"local group FAILED: {why}")
        err = RuntimeError(why)
        reported = {r.probe for r in merged}
        for probe in COLLECTIVE_PROBES:
            if probe in opts.probes and probe not in reported:
                merged.append(failed_result(probe, f"{backend}:{nprocs}", "", backend, "GB/s", err))
    return merged


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
