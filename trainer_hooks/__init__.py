"""fleetscope.trainer_hooks: time a trainer's sections and trace its collectives.

Two lines instrument a trainer::

    from fleetscope import trainer_hooks as hooks
    hooks.init(job="run-42", rank=rank, topology=Topology(dp=2, tp=2, pp=2))

then ``with hooks.section("forward", microbatch=i): ...`` around code sections and
``hooks.step(n)`` at the start of each step. ``torch.distributed`` collectives and p2p
ops are traced automatically after ``init`` (pass ``trace_collectives=False`` to opt out
and use :func:`traced_op` explicitly).

Without ``init`` every call here is a no-op costing a fraction of a microsecond. With
it, the training thread only appends to a bounded queue; a background thread does the
rest and writes to a pluggable sink (spool files by default). Nothing here raises into
the trainer or blocks it; what cannot be kept is dropped and counted.
"""

from __future__ import annotations

import atexit
import functools
import os
from threading import get_ident
from typing import Any, Literal

from fleetscope.trainer_hooks import collectives, state
from fleetscope.trainer_hooks.control import LEVELS, SECTIONS, STEPS, control_path, level_index
from fleetscope.trainer_hooks.recorder import (
    CPU_REUSE_NS,
    SECTION_KINDS,
    HookConfig,
    Recorder,
    perf_ns,
    resolve,
)
from fleetscope.trainer_hooks.sinks import MemorySink, Sink, SpoolSink

from fleetscope import env
from fleetscope.topology import Coords, Topology

__all__ = [
    "HookConfig", "MemorySink", "Recorder", "Sink", "SpoolSink", "emit", "enabled", "init",
    "register_group", "section", "set_level", "shutdown", "stats", "step", "step_info",
    "traced_op", "LEVELS",
]

_atexit_registered = False


def init(job: str, rank: int, coords: Coords | dict | None = None, sink: Sink | None = None,
         *, topology: Topology | None = None, spool: str | os.PathLike | None = None,
         host: str | None = None, attempt: int = 0, local_rank: int | None = None,
         device: Any = None, trace_collectives: bool = True,
         config: HookConfig | None = None, control: str | os.PathLike | None = None,
         level: str = "full") -> Recorder:
    """Start recording for this process (one rank).

    Args:
        job: Job id; names the spool directory and every record.
        rank: Global rank of this process.
        coords: The rank's (dp, pp, tp) coordinates; derived from ``topology`` if omitted.
        sink: Where records go. Default: a :class:`SpoolSink` under ``spool``.
        topology: The job's layout; lets the hooks name process groups (``tp.pp0.dp1``).
        spool: Spool directory for the default sink (default ``$FLEETSCOPE_SPOOL`` or
            ``./.fleetscope/spool``).
        host: Host name written with every record (default: ``socket.gethostname()``).
        attempt: Restart attempt of the job.
        local_rank: Rank on this host (default: ``rank``).
        device: ``torch.device`` the rank computes on; CUDA devices get CUDA-event timing.
        trace_collectives: Trace ``torch.distributed`` ops: the c10d functions, the
            ``ProcessGroup`` methods below them, and functional collectives (DTensor,
            FSDP2, coalesced ops and ``batch_isend_irecv`` included).
        config: Queue size and background intervals.
        control: Runtime-control file (:mod:`.control`); default
            ``<spool>/<job>/control.json`` with the default spool sink, none otherwise.
        level: Instrumentation level to start at (off | steps | sections | full).

    Returns:
        The active recorder (for :func:`stats` and tests).
    """
    global _atexit_registered
    if state.recorder is not None:
        shutdown()
    if isinstance(coords, dict):
        coords = Coords(dp=int(coords["dp"]), pp=int(coords["pp"]), tp=int(coords["tp"]))
    if sink is None:
        from fleetscope.config import DEFAULT_SPOOL_DIR

        sink = SpoolSink(spool or env.SPOOL.get() or DEFAULT_SPOOL_DIR)
    if control is None and isinstance(sink, SpoolSink):
        control = control_path(sink.root, str(job))
    rec = Recorder(job, rank, sink, topology=topology, coords=coords, host=host,
                   attempt=attempt, local_rank=local_rank, device=device, config=config,
                   control=control, level=level_index(level))
    rec.start()
    if trace_collectives:
        install_tracing()
    state.recorder = rec
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    return rec


def install_tracing() -> list[str]:
    """Install every collective-tracing layer this torch has (idempotent)."""
    done: list[str] = []
    try:
        done += collectives.install()
        from fleetscope.trainer_hooks import pg_tracing

        done += pg_tracing.install()
    except ImportError:
        return done  # no torch.distributed: sections only
    try:
        from fleetscope.trainer_hooks import functional

        done += functional.install()
    except (ImportError, AttributeError, RuntimeError):
        pass  # a torch without functional collectives
    return done


def uninstall_tracing() -> None:
    """Undo :func:`install_tracing`."""
    import sys

    for name in ("collectives", "pg_tracing", "functional"):
        module = sys.modules.get(f"fleetscope.trainer_hooks.{name}")
        if module is not None:
            module.uninstall()


def set_level(level: str) -> None:
    """Set the instrumentation level in-process (off | steps | sections | full).

    The runtime-control file sets it from outside (see :mod:`.control`); this is the
    same switch for code that wants it directly.
    """
    rec = state.recorder
    index = level_index(level)
    if rec is not None and rec.level != index:
        rec.level = index
        rec._level_changed = True


def shutdown(timeout_s: float = 5.0, complete_step: bool = True) -> None:
    """Flush everything to the sink and stop recording.

    Args:
        timeout_s: How long to wait for the background thread to finish writing.
        complete_step: Record the open step as ended now (normal exit); ``False`` when
            the process is being stopped mid-step (the step never completed).
    """
    rec, state.recorder = state.recorder, None
    if rec is not None:
        if not complete_step:
            rec.step_open = None
        rec.close(timeout_s)


def enabled() -> bool:
    """Whether :func:`init` is active in this process."""
    return state.recorder is not None


class _Section:
    """A timed section; context manager and decorator. See :func:`section`."""

    __slots__ = ("name", "mb", "kind", "rec", "item", "prev_mb")

    def __init__(self, name: str, microbatch: int = -1, kind: str | None = None,
                 rec: Recorder | None = None) -> None:
        self.name, self.mb, self.rec = name, microbatch, rec
        self.kind = kind or SECTION_KINDS.get(name, "other")

    def __enter__(self) -> _Section:
        rec = self.rec
        if rec is None:
            return self
        if rec.level < SECTIONS:  # runtime control: this section is not recorded
            self.rec = None
            return self
        t_in = perf_ns()
        self.prev_mb = mb = rec.microbatch
        if self.mb >= 0:
            rec.microbatch = mb = self.mb
        else:
            self.mb = mb
        cuda = rec.cuda
        ev0 = None if cuda is None else cuda.event()
        clock = rec.thread_cpu_ns
        if clock is None:
            c0 = -1
        else:  # right after a section's end on this thread: its reading (one syscall less)
            t_end, tid, c0 = rec.cpu_exit
            if t_in - t_end > CPU_REUSE_NS or tid != get_ident():
                c0 = clock()
        t0 = perf_ns()
        # one list: the in-flight marker on the stack, then (completed) the queued record
        item = self.item = ["S", self.name, self.kind, rec.step, mb, t0, -1, ev0, None, c0, -1]
        rec.stack.append(item)
        rec.overhead_ns += t0 - t_in
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        rec = self.rec
        if rec is None:
            return False
        t1 = perf_ns()
        item = self.item
        item[6] = t1
        if rec.cuda is not None:
            item[8] = rec.cuda.event()
        elif item[9] >= 0:
            item[10] = c1 = rec.thread_cpu_ns()
            rec.cpu_exit = (t1, get_ident(), c1)
        stack = rec.stack
        if stack:
            stack.pop()
        rec.microbatch = self.prev_mb
        q = rec.queue
        if len(q) < rec.capacity:
            q.append(item)
        else:
            rec.dropped += 1
        if rec.unresolved:  # the ops issued inside: their tensors, read in one go
            resolve(rec.unresolved)
        rec.calls += 1
        rec.overhead_ns += perf_ns() - t1
        return False

    def __call__(self, fn: Any) -> Any:
        name, mb, kind = self.name, self.mb, self.kind

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with section(name, mb, kind):
                return fn(*args, **kwargs)

        return wrapper


_NULLS: dict[tuple, _Section] = {}


def section(name: str, microbatch: int = -1, kind: str | None = None) -> _Section:
    """Time a code section: ``with section("forward", microbatch=i):`` or ``@section("x")``.

    Args:
        name: Section name (forward, backward, optimizer, dataloader, ...).
        microbatch: Micro-batch index, -1 if not per micro-batch. Collectives issued
            inside inherit it.
        kind: compute | dataloader | optimizer | other; derived from ``name`` if omitted.
    """
    rec = state.recorder
    if rec is None or rec.level < SECTIONS:  # disabled: a shared, stateless no-op
        key = (name, microbatch, kind)
        null = _NULLS.get(key)
        if null is None:
            null = _Section(name, microbatch, kind)
            if len(_NULLS) < 4096:
                _NULLS[key] = null
        return null
    return _Section(name, microbatch, kind, rec)


class _StepScope:
    __slots__ = ()

    def __enter__(self) -> _StepScope:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> Literal[False]:
        rec = state.recorder
        if rec is not None:
            if exc_type is None:
                rec.end_step(perf_ns())
            else:  # the step did not complete: no ``steps`` record claims it did
                rec.step_open = None
        return False


_STEP_SCOPE = _StepScope()


def step(n: int, **info: Any) -> _StepScope:
    """Mark the start of training step ``n`` (ends the previous one).

    Usable as ``with hooks.step(n):`` to end the step at the block's end. Keyword
    arguments (``num_microbatches``, ``tokens``, ``loss``) go into the ``steps`` record.
    """
    rec = state.recorder
    if rec is not None:
        if rec.level < STEPS:  # runtime control: keep the step number, record nothing
            rec.step_open = None
            rec.step = int(n)
            return _STEP_SCOPE
        rec.begin_step(n, perf_ns())
        if info:
            rec.step_info.update(info)
    return _STEP_SCOPE


def step_info(**info: Any) -> None:
    """Attach ``loss``, ``tokens`` or ``num_microbatches`` to the current step's record."""
    rec = state.recorder
    if rec is not None:
        rec.step_info.update(info)


def emit(record_type: str, **row: Any) -> None:
    """Queue one row of any record type (job/rank/host/ts_ns are filled in if missing)."""
    rec = state.recorder
    if rec is not None:
        rec.emit(record_type, row)


def register_group(group: Any, axis: str, group_id: str | None = None) -> None:
    """Name a process group's parallel axis (dp | tp | pp | world) for its records.

    Unregistered groups are named by matching their members against the topology.
    """
    rec = state.recorder
    if rec is not None:
        collectives.register_group(rec, group, axis, group_id)


def traced_op(name: str) -> Any:
    """An explicitly traced version of ``torch.distributed.<name>`` (e.g. ``"all_reduce"``)."""
    import torch.distributed as dist

    original = collectives._ORIGINALS.get(name) or getattr(dist, name)
    if name == "batch_isend_irecv":
        return collectives.traced_batch_isend_irecv(original)
    return collectives.traced(name, original)


def stats() -> dict[str, Any]:
    """Counters of the active recorder (empty when disabled)."""
    rec = state.recorder
    return rec.stats() if rec is not None else {}
