"""Launch every rank of the reference job on this host, torchrun-style.

The launcher imports torch once and forks one process per rank (fast start on small
machines), points them at a free loopback port for rendezvous, writes each rank's
stdout/stderr to ``<spool>/<job>/rank-XXXXX/trainer.log``, optionally starts the host
agent, and supervises: the first failing rank makes the others stop after a short
grace period, ``timeout_s`` bounds the whole job, and the ranks die with the launcher
(SIGINT/SIGTERM are forwarded; ``PR_SET_PDEATHSIG`` covers a SIGKILL of the launcher).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetscope.trainer.config import TrainConfig

from fleetscope import spool as spool_mod

EXIT_TIMEOUT = 124
LOG_NAME = "trainer.log"


@dataclass
class LaunchResult:
    """How the job ended."""

    returncode: int
    """0 if every rank succeeded, 124 on timeout, else the first failing rank's code (>0)."""
    rank_exitcodes: dict[int, int | None] = field(default_factory=dict)
    """Exit code per rank (negative: killed by that signal; None: still running)."""
    failed_ranks: list[int] = field(default_factory=list)
    timed_out: bool = False
    duration_s: float = 0.0


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_path(cfg: TrainConfig, rank: int) -> Path:
    return spool_mod.rank_dir(cfg.spool, cfg.job, rank) / LOG_NAME


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _flush_on_sigterm() -> None:
    """On SIGTERM, flush the hooks and exit, even while the main thread is blocked in C.

    The C-level signal handler writes to the wakeup fd at once; a helper thread reads
    it, so a rank stuck in a collective still leaves its last records on disk.
    """
    import threading

    from fleetscope import trainer_hooks as hooks

    r, w = socket.socketpair()
    w.setblocking(False)
    signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.signal(signal.SIGINT, lambda signum, frame: None)

    def watch() -> None:
        while True:
            sig = r.recv(1)
            if sig and sig[0] in (signal.SIGTERM, signal.SIGINT):
                hooks.shutdown(timeout_s=2.0, complete_step=False)
                sys.stdout.flush()
                os._exit(128 + sig[0])

    threading.Thread(target=watch, name="fleetscope-sigterm", daemon=True).start()
    os.register_at_fork(after_in_child=_default_signals)  # e.g. DataLoader workers


def _default_signals() -> None:
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread of the child
        pass


def pin_to_cpu(rank: int) -> int:
    """Pin this process (and the threads it starts later) to the ``rank % n``-th of the
    ``n`` CPUs it may use; returns that CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


def _rank_main(cfg: TrainConfig, rank: int, world_size: int, port: int) -> None:
    _die_with_parent()
    _flush_on_sigterm()
    path = log_path(cfg, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if cfg.pin_cpus:
        print(f"rank {rank} pinned to CPU {pin_to_cpu(rank)}", flush=True)
    from fleetscope.trainer.train import run_rank

    run_rank(cfg, rank, world_size, local_rank=rank)
    sys.stdout.flush()
    sys.stderr.flush()


def _preload() -> None:
    """Import the heavy modules once here so forked ranks share them (seconds per rank)."""
    import fleetscope.trainer.train  # noqa: F401
    import pyarrow  # noqa: F401  (the spool sink's encoder)
    import torch._dynamo  # noqa: F401  (imported lazily by torch.optim.AdamW: ~3 s)
    import torch.optim  # noqa: F401

    import fleetscope.codec  # noqa: F401


def start_agent(server: str, spool: str, job: str) -> subprocess.Popen | None:
    """Start ``fleetscope agent`` for this host if the agent component is installed."""
    if importlib.util.find_spec("fleetscope.agent.cli") is None:
        return None
    cmd = [sys.executable, "-m", "fleetscope.cli", "agent", "--server", server,
           "--spool", str(spool), "--job", job]
    return subprocess.Popen(cmd, start_new_session=False)


def stop_agent(agent: subprocess.Popen | None, grace_s: float = 10.0) -> None:
    if agent is None or agent.poll() is not None:
        return
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(grace_s)
    except subprocess.TimeoutExpired:
        agent.kill()
        agent.wait()


def launch(cfg: TrainConfig, *, timeout_s: float | None = None, server: str | None = None,
           failure_grace_s: float = 3.0, echo: Any = None) -> LaunchResult:
    """Run all ranks of ``cfg`` and wait for them.

    Args:
        cfg: Job configuration (checked here).
        timeout_s: Kill the job after this many seconds (exit code 124).
        server: Server URL for the host agent (started if the agent is installed).
        failure_grace_s: After a rank fails, how long the others get before being stopped.
        echo: Callable taking a line of progress text (default: print to stderr).
    """
    cfg.check()
    _preload()
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    world = cfg.world_size
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(cfg, r, world, port), name=f"rank-{r}",
                         daemon=False) for r in range(world)]
    t0 = time.monotonic()
    stopping: list[int] = []
    old = {s: signal.signal(s, lambda signum, _f: stopping.append(signum))
           for s in (signal.SIGINT, signal.SIGTERM)}
    agent = None
    try:
        for p in procs:
            p.start()
        if server:
            agent = start_agent(server, cfg.spool, cfg.job)
            say("agent: started" if agent else "agent: fleetscope.agent not installed; "
                "spool files are the output")
        result = _supervise(procs, timeout_s, failure_grace_s, stopping, say)
    finally:
        _stop_all(procs)
        for s, h in old.items():
            signal.signal(s, h)
        stop_agent(agent)
    result.duration_s = time.monotonic() - t0
    return result


def _supervise(procs: list, timeout_s: float | None, grace_s: float, stopping: list[int],
               say: Any) -> LaunchResult:
    deadline = time.monotonic() + timeout_s if timeout_s else None
    failed_at: float | None = None
    result = LaunchResult(returncode=0)
    while True:
        alive = [p for p in procs if p.exitcode is None]
        for r, p in enumerate(procs):
            if p.exitcode not in (None, 0) and r not in result.failed_ranks:
                result.failed_ranks.append(r)
                say(f"rank {r} exited with code {p.exitcode}")
                failed_at = failed_at or time.monotonic()
        if not alive:
            break
        now = time.monotonic()
        if stopping:
            say(f"signal {stopping[0]}: stopping {len(alive)} rank(s)")
            result.returncode = 128 + stopping[0]
            break
        if deadline is not None and now >= deadline:
            say(f"timeout after {timeout_s:.0f}s: stopping {len(alive)} rank(s)")
            result.timed_out, result.returncode = True, EXIT_TIMEOUT
            break
        if failed_at is not None and now - failed_at >= grace_s:
            say(f"stopping {len(alive)} rank(s) after the failure of rank(s) {result.failed_ranks}")
            break
        multiprocessing.connection.wait([p.sentinel for p in alive], timeout=0.2)
    _stop_all(procs)
    result.rank_exitcodes = {r: p.exitcode for r, p in enumerate(procs)}
    if result.returncode == 0 and result.failed_ranks:
        code = procs[result.failed_ranks[0]].exitcode or 1
        result.returncode = code if code > 0 else 128 - code
    return result


def _stop_all(procs: list, grace_s: float = 3.0) -> None:
    """SIGTERM every live rank, then SIGKILL what is left after ``grace_s``."""
    live = [p for p in procs if p.pid is not None and p.exitcode is None]
    for p in live:
        p.terminate()
    end = time.monotonic() + grace_s
    for p in live:
        p.join(max(0.0, end - time.monotonic()))
    for p in live:
        if p.exitcode is None:
            p.kill()
            p.join(grace_s)
