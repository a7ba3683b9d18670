"""Run a function on N real gloo processes (loopback) and collect what each returns.

Usage::

    from tests.helpers.ranks import run_ranks

    results = run_ranks("tests.helpers.collective_scenarios:every_call_path", world=2,
                        tmp_path=tmp_path, timeout_s=120)
    results[0]  # what rank 0's function returned (JSON)

The function gets ``(rank, world, workdir)`` after ``init_process_group("gloo")`` and
returns something JSON-serialisable; each rank is its own ``python`` process.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(target: str, world: int, tmp_path: Path, timeout_s: float = 120,
              env: dict[str, str] | None = None, args: list[str] | None = None) -> list[Any]:
    """Start ``world`` processes running ``module:function``; their results by rank
    (``None`` for a rank that exited 0 without returning, e.g. by ``os._exit``)."""
    port = free_port()
    procs = []
    full_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                    PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    **(env or {}))
    for rank in range(world):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.ranks", target, str(rank), str(world),
             str(tmp_path), *(args or [])],
            env=full_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout_s)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{logs[rank][-4000:]}"
    paths = [tmp_path / f"result-{r}.json" for r in range(world)]
    return [json.loads(p.read_text()) if p.exists() else None for p in paths]


def _main() -> None:
    import importlib

    import torch.distributed as dist

    target, rank, world, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    module, name = target.split(":")
    fn = getattr(importlib.import_module(module), name)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, workdir, *sys.argv[5:])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    (workdir / f"result-{rank}.json").write_text(json.dumps(result))
    # Skip interpreter finalization: gloo worker threads can still hold work objects whose
    # tensors reference Python objects, and destroying them while the interpreter tears
    # down aborts the process ("terminate called without an active exception", seen in
    # two CI runs; pytorch/pytorch#179291). Exit handlers still run; only teardown is skipped.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main()
