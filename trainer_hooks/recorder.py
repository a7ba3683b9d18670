"""Per-process hook state, the bounded queue, and the background thread.

The training thread only appends small tuples to a bounded deque (dropping, and
counting the drop, when it is full) and pushes/pops its current activity on a stack.
Everything else (CUDA event resolution, time conversion, row building, in-flight
liveness records, self-metrics, sink I/O) happens on one daemon thread, inside
``try``/``except`` so nothing it does can reach the trainer.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter, sub
from typing import Any

from fleetscope.trainer_hooks.batch import Columns, ColumnSpec, rows_of
from fleetscope.trainer_hooks.clock import CpuClock, CudaTimer
from fleetscope.trainer_hooks.control import FULL, LEVELS, SECTIONS, ControlFile

from fleetscope.schema import RECORD_TYPES
from fleetscope.topology import Coords, Topology

perf_ns = time.perf_counter_ns

# Columns the background thread fills per record type (job, attempt, rank and host are
# constant per rank), and those it computes itself (ints: no type check when encoding).
_NAMES = {
    "sections": ("step", "microbatch", "name", "kind", "start_ns", "end_ns", "duration_ns",
                 "device_ns", "cpu_ns"),
    "collectives": ("step", "microbatch", "group_id", "axis", "group_rank", "group_size", "seq",
                    "op", "bytes", "dtype", "peer", "state", "enqueued_ns", "started_ns",
                    "completed_ns", "duration_ns"),
    "steps": ("step", "start_ns", "end_ns", "duration_ns", "num_microbatches", "tokens", "loss"),
    "inflight": ("ts_ns", "step", "kind", "op", "group_id", "axis", "seq", "peer", "since_ns"),
}
_TRUSTED = {
    "sections": frozenset({"step", "start_ns", "end_ns", "duration_ns", "device_ns", "cpu_ns"}),
    "collectives": frozenset({"step", "group_rank", "group_size", "seq", "bytes", "peer",
                              "enqueued_ns", "started_ns", "completed_ns", "duration_ns"}),
    "steps": frozenset({"step", "start_ns", "end_ns", "duration_ns"}),
    "inflight": frozenset({"ts_ns", "step", "seq", "peer", "since_ns"}),
}
_NAN = float("nan")
_STEP_INFO = {"num_microbatches": 0, "tokens": 0, "loss": _NAN}
"""The ``steps`` columns ``step(n, **info)`` fills, with their defaults."""
# An Op as the flat tuple a synchronous CPU op is queued as (after its "c"/"C" tag).
_OP_FIELDS = attrgetter("name", "group", "seq", "step", "mb", "nbytes", "dtype", "peer", "t_enq",
                        "t_done", "state")
_GROUP_ROW = attrgetter("row")
_TAG = itemgetter(0)

_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """A dtype as records name it (``torch.float32`` -> ``"float32"``); names pass through.

    The hot path queues a tensor's dtype object as it is; naming it is left to the
    background thread."""
    if dtype.__class__ is str:
        return dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


CPU_REUSE_NS = 20_000
"""A section entered within this long after the last section ended on the same thread
reuses that end's CPU-clock reading (see :attr:`HookConfig.section_cpu_time`)."""

UNRESOLVED_MAX = 32
"""Synchronous CPU ops whose tensor is read (bytes, dtype) later, at most; see
``Recorder.unresolved``."""


def payload_of(tensor: Any) -> tuple[int, Any]:
    """(bytes, dtype) of a tensor (never raises: odd objects give ``(0, "")``)."""
    try:
        return tensor.nbytes, tensor.dtype
    except Exception:
        return 0, ""


def resolve(items: list) -> None:
    """Fill in bytes and dtype of queued ``"c"`` records that still hold their tensor
    (in the bytes slot), then forget them. The dtype goes in first: a record the
    background thread takes meanwhile still holds the tensor and is read there."""
    for item in items:
        t = item[6]
        if t.__class__ is not int:
            nbytes, item[7] = payload_of(t)
            item[6] = nbytes
    items.clear()


SECTION_KINDS = {"forward": "compute", "backward": "compute", "dataloader": "dataloader",
                 "optimizer": "optimizer"}


@dataclass
class HookConfig:
    """Tuning of the hooks' background machinery."""

    queue_capacity: int = 65536
    """Items the training thread may queue before it starts dropping (and counting)."""
    poll_interval_s: float = 0.5
    """How often the background thread drains the queue, resolves CUDA events and polls
    async ops nobody waited on. It sleeps in between (no wake-ups while idle)."""
    control_interval_s: float | None = None
    """How often the runtime-control file is checked (one ``os.stat``); ``None``: every
    ``poll_interval_s``. A short one makes level changes quick without draining the
    queue that often (each drain is a burst of work holding the GIL)."""
    flush_interval_s: float = 0.5
    """How often finished rows are handed to the sink (one write per flush)."""
    inflight_interval_s: float = 0.5
    """Period of the liveness ``inflight`` records."""
    metrics_interval_s: float = 5.0
    """Period of the ``metrics`` rows with source='hooks'."""
    reanchor_interval_s: float = 10.0
    """Period of clock re-anchoring (CPU offset, CUDA anchor event)."""
    max_pending: int = 16384
    """Records waiting for CUDA events or async completion before new ones are dropped."""
    resolve_timeout_s: float = 2.0
    """At shutdown, how long to wait for outstanding CUDA events."""
    max_cuda_errors: int = 1
    """CUDA errors from event creation/recording after which the hooks stop using CUDA
    events and time on the CPU (each error is counted; none reaches the trainer)."""
    section_cpu_time: bool = True
    """Where the device is not CUDA (the CPU is the device), also record each section's
    ``cpu_ns``: the CPU time of the thread that ran it (two ``clock_gettime`` calls,
    ~0.6 µs each). It is the CPU's counterpart of a CUDA event's device time: the rank's
    own work, without the time it waited for a core or blocked in communication.
    A section entered on the same thread within ``CPU_REUSE_NS`` (20 µs) of the last
    section's end reuses that end's reading instead of a second call (adjacent sections
    such as forward, backward, optimizer): the CPU of that gap, at most 20 µs, counts
    towards the new section."""


class Recorder:
    """All hook state of one rank. Created by :func:`fleetscope.trainer_hooks.init`."""

    def __init__(self, job: str, rank: int, sink: Any, *, topology: Topology | None = None,
                 coords: Coords | None = None, host: str | None = None, attempt: int = 0,
                 local_rank: int | None = None, device: Any = None,
                 config: HookConfig | None = None, control: Any = None,
                 level: int = FULL) -> None:
        self.config = config or HookConfig()
        self.job, self.rank, self.attempt = str(job), int(rank), int(attempt)
        self.host = host or socket.gethostname()
        self.local_rank = rank if local_rank is None else int(local_rank)
        self.topology = topology
        if coords is None and topology is not None:
            coords = topology.coords(self.rank)
        self.coords = coords
        self.sink = sink
        self.ident = {"job": self.job, "attempt": self.attempt, "rank": self.rank,
                      "host": self.host}
        # training-thread state
        self.step = 0
        self.microbatch = -1
        self.stack: list[Sequence[Any]] = []
        self.queue: deque = deque()
        """Sections, steps, emitted rows (tagged tuples, see ``_convert``)."""
        self.ops: deque = deque()
        """Collectives and p2p ops: ``("c", ...)`` flat tuples (synchronous, CPU) or
        ``("C", Op)``. Bounded like ``queue``; a queue of its own, so the background
        thread converts a step's ops in bulk without sorting them out of the rest."""
        self.capacity = self.config.queue_capacity
        self.dropped = 0
        self.overhead_ns = 0
        self.calls = 0
        self.suppress = 0
        self.unresolved: list[list] = []
        """Queued synchronous CPU ops whose tensor's bytes and dtype are not read yet
        (training thread only). Reading a tensor's attributes calls into libtorch, which
        right after a blocking collective runs from cold caches (several µs); the reads
        are done in one batch when the enclosing section ends, at the next step, or every
        ``UNRESOLVED_MAX`` ops, whichever comes first, so each tensor is kept at most that
        long. Records the background thread takes first are read there."""
        self.step_open: tuple[int, int] | None = None
        self.step_info: dict[str, Any] = {}
        self.pending_async: dict[int, Any] = {}
        self.functional_pending: dict[int, tuple] = {}
        """Output data pointer -> (weakref, Op) of functional collectives not waited on yet."""
        self.groups: dict[Any, Any] = {}
        self.level = int(level)
        """Instrumentation level (:mod:`.control`): the training thread reads it."""
        self.control = ControlFile(control)
        self._level_changed = True
        # device timing
        self.cuda: CudaTimer | None = None
        if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
            import torch

            self.cuda = CudaTimer(torch, device, max_errors=self.config.max_cuda_errors)
        self.thread_cpu_ns = time.thread_time_ns if self.cuda is None and self.config.section_cpu_time else None
        """The sections' CPU-time clock (:attr:`HookConfig.section_cpu_time`), or None."""
        self.cpu_exit: tuple[int, int, int] = (0, 0, 0)
        """``(perf ns, thread id, CPU ns)`` of the last section end's CPU-clock reading
        (one tuple, replaced whole: threads read it without a lock)."""
        self.cpu = CpuClock()
        # background-thread state
        self.started_ns = time.time_ns()
        self.rows: dict[str, Any] = {}
        """Record type -> rows since the last flush: :class:`Columns`, or row dicts."""
        self._specs = {rt: ColumnSpec(rt, {k: v for k, v in self.ident.items()
                                           if k in RECORD_TYPES[rt].column_names},
                                      names, _TRUSTED[rt]) for rt, names in _NAMES.items()}
        self.waiting: list[tuple] = []
        self.records_written = 0
        self.sink_dropped = 0
        self.sink_errors = 0
        self.worker_errors = 0
        self.last_error = ""
        self._sink_open = False
        self.wakeups = 0
        self.flushes = 0
        """Flushes the background thread has finished (a benchmark waits on it)."""
        self.worker_cpu_ns = 0
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ training thread
    def enqueue(self, item: tuple) -> None:
        if len(self.queue) >= self.capacity:
            self.dropped += 1
        else:
            self.queue.append(item)

    def enqueue_op(self, item: tuple) -> None:
        if len(self.ops) >= self.capacity:
            self.dropped += 1
        else:
            self.ops.append(item)

    def begin_step(self, n: int, t: int) -> None:
        if self.unresolved:
            resolve(self.unresolved)
        self.end_step(t)
        self.step, self.step_open, self.step_info = int(n), (int(n), t), {}

    def end_step(self, t: int) -> None:
        if self.step_open is not None:
            n, t0 = self.step_open
            self.step_open = None
            self.enqueue(("T", n, t0, t, self.step_info))

    def emit(self, record_type: str, row: dict[str, Any]) -> None:
        self.enqueue(("R", record_type, row))

    def stats(self) -> dict[str, Any]:
        """Counters of this recorder (safe to call from any thread)."""
        return {
            "calls": self.calls, "overhead_ns": self.overhead_ns,
            "dropped_records": self.dropped + self.sink_dropped,
            "queue_dropped": self.dropped, "sink_dropped": self.sink_dropped,
            "sink_errors": self.sink_errors, "worker_errors": self.worker_errors,
            "records_written": self.records_written, "queue_len": len(self.queue) + len(self.ops),
            "pending": len(self.waiting) + len(self.pending_async) + len(self.functional_pending),
            "level": LEVELS[self.level],
            "cuda_errors": self.cuda.errors if self.cuda is not None else 0,
            "cuda_disabled": bool(self.cuda is not None and self.cuda.disabled),
            "worker_cpu_ns": self.worker_cpu_ns, "worker_wakeups": self.wakeups,
            "worker_flushes": self.flushes,
            "worker_alive": bool(self._thread and self._thread.is_alive()),
            "last_error": self.last_error,
        }

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetscope-hooks", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Close the open step, flush everything, stop the thread (idempotent)."""
        self.end_step(perf_ns())
        if self.unresolved:
            resolve(self.unresolved)
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    # ------------------------------------------------------------------ background thread
    def _run(self) -> None:
        cfg = self.config
        cpu0 = time.thread_time_ns()
        self._metrics_prev = (time.monotonic_ns(), 0)
        self._guard(self._open_sink)
        if self.cuda is not None:
            self._guard(self.cuda.bind_thread)
            self._guard(self.cuda.reanchor)
        self._guard(self._poll_control)  # a rank started while its job is "off" starts off
        # (period, task, drain first) on one timeline; equal periods share a wake-up. The
        # in-flight row and the flush come after the rows of everything the trainer
        # finished before them (the server's progress certificate relies on that).
        control = cfg.control_interval_s or cfg.poll_interval_s
        tasks = [(cfg.poll_interval_s, None, True),  # drain (and poll async ops)
                 (control, self._poll_control, False),
                 (cfg.inflight_interval_s, self._inflight, True),
                 (cfg.metrics_interval_s, self._metrics, False),
                 (cfg.flush_interval_s, self._flush, True),
                 (cfg.reanchor_interval_s, self._reanchor, False)]
        start = time.monotonic()
        due = [start + period for period, _, _ in tasks]
        due[3] = start + min(1.0, cfg.metrics_interval_s)  # first metrics row early
        while True:
            self.worker_cpu_ns = time.thread_time_ns() - cpu0
            self._wake.wait(max(0.0, min(due) - time.monotonic()))
            if self._stopping:
                break
            now = time.monotonic()
            self.wakeups += 1
            drained = False
            for i, (period, fn, drain_first) in enumerate(tasks):
                if now < due[i]:
                    continue
                due[i] += period
                if due[i] <= now:  # fell behind (suspended, overloaded): skip, don't burst
                    due[i] = now + period
                if drain_first and not drained:
                    drained = True
                    self._guard(self._drain)
                if fn is not None:
                    self._guard(fn)
        self._guard(self._final)
        self.worker_cpu_ns = time.thread_time_ns() - cpu0

    def _reanchor(self) -> None:
        self._guard(self.cpu.reanchor)
        if self.cuda is not None:
            self._guard(self.cuda.reanchor)

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except Exception as e:  # the trainer must never see our failures
            self.worker_errors += 1
            self.last_error = f"{fn.__name__}: {e!r}"[:500]

    def _open_sink(self) -> None:
        if self._sink_open:
            return
        info = dict(self.ident, pid=_pid(), local_rank=self.local_rank,
                    started_ns=self.started_ns)
        if self.coords is not None:
            info.update(dp=self.coords.dp, pp=self.coords.pp, tp=self.coords.tp)
        try:
            self.sink.open(info)
            self._sink_open = True
        except Exception as e:
            self.sink_errors += 1
            self.last_error = f"sink.open: {e!r}"[:500]

    def _drain(self) -> None:
        q, o = self.queue, self.ops
        items = [q.popleft() for _ in range(len(q))]
        ops = [o.popleft() for _ in range(len(o))]
        waiting = self.waiting
        self.waiting = []
        late = self._convert_all(items, ops) if items or ops else []
        if waiting:  # older items waiting for their CUDA events: still waiting go first
            self.waiting = self._convert_all(waiting, [])
        room = self.config.max_pending - len(self.waiting)
        if len(late) > room:
            self.dropped += len(late) - max(0, room)
            late = late[:max(0, room)]
        self.waiting += late
        if self.pending_async:
            self._poll_async()
        if self.functional_pending:
            from fleetscope.trainer_hooks.functional import sweep

            sweep(self)

    def _poll_control(self) -> None:
        """Apply a changed control file (runtime control, :mod:`.control`)."""
        level = self.control.poll(self.rank)
        if level is not None and level != self.level:
            self.level = level
            self._level_changed = True
        if self._level_changed:
            self._level_changed = False
            self._add("metrics", self._metric_row(time.time_ns(), "hooks.instrumentation_level",
                                                  self.level))

    def _metric_row(self, ts: int, name: str, value: float) -> dict[str, Any]:
        return {"ts_ns": ts, "job": self.job, "host": self.host, "rank": self.rank,
                "source": "hooks", "device": "", "name": name, "value": float(value)}

    def _convert_all(self, items: list[tuple], ops: list[tuple]) -> list[tuple]:
        """Turn queue items into rows, column by column in bulk where no CUDA event is
        involved; returns the items whose events are not done yet (in order)."""
        secs: list[tuple] = []
        colls: list[tuple] = []
        one_by_one: list[tuple] = []
        if ops and set(map(_TAG, ops)) == {"c"}:  # synchronous CPU ops only: as they are
            colls = ops
        else:
            items = ops + items
        steps: list[tuple] = []
        epoch = self.cpu.offset_ns.__add__  # perf_counter ns -> epoch ns
        for item in items:
            kind = item[0]
            if kind == "c":  # a synchronous op on CPU, already flat
                colls.append(item)
            elif kind == "S" and item[8] is None:
                secs.append(item)
            elif kind == "T" and item[4].keys() <= _STEP_INFO.keys():
                _, n, t0, t1, info = item
                steps.append((n, epoch(t0), epoch(t1), t1 - t0,
                              info.get("num_microbatches", 0), info.get("tokens", 0),
                              info.get("loss", _NAN)))
            elif kind == "C" and item[1].ev1 is None:
                colls.append(("C", *_OP_FIELDS(item[1])))
            else:
                one_by_one.append(item)
        if steps:
            self._extend("steps", tuple(zip(*steps)))
        if secs:
            _, names, kinds, sec_steps, mbs, t0s, t1s, _, _, c0s, c1s = zip(*secs)
            self._extend("sections", (
                sec_steps, mbs, names, kinds, list(map(epoch, t0s)), list(map(epoch, t1s)),
                list(map(sub, t1s, t0s)), [-1] * len(secs), _cpu_times(c0s, c1s)))
        if colls:
            states: Sequence[Any]  # a tuple from zip, or a list if some did not complete
            (_, names, groups, seqs, coll_steps, mbs, nbytes, dtypes, peers, t_enq, t_done,
             states) = zip(*colls)
            gids, axes, granks, gsizes = zip(*map(_GROUP_ROW, groups))
            if set(map(type, nbytes)) != {int}:  # tensors not read on the training thread
                nbytes, dtypes = zip(*(payload_of(n) if n.__class__ is not int else (n, d)
                                       for n, d in zip(nbytes, dtypes)))
            enq = list(map(epoch, t_enq))
            if min(t_done) >= 0:  # all returned (the usual case)
                done, took = list(map(epoch, t_done)), list(map(sub, t_done, t_enq))
            else:  # not seen completing (async ops nobody waited on): "started", no end
                done = [epoch(t) if t >= 0 else -1 for t in t_done]
                took = [t1 - t0 if t1 >= 0 else -1 for t0, t1 in zip(t_enq, t_done)]
                states = [s if t >= 0 or s != "completed" else "started"
                          for s, t in zip(states, t_done)]
            dnames = list(map(_DTYPE_NAMES.get, dtypes))  # dtypes seen before (usual)
            if None in dnames:
                dnames = list(map(dtype_name, dtypes))
            self._extend("collectives", (
                coll_steps, mbs, gids, axes, granks, gsizes, seqs, names, nbytes,
                dnames, peers, states, enq, enq, done, took))
        late = []
        for item in one_by_one:
            try:
                if not self._convert(item):
                    late.append(item)
            except Exception as e:  # one bad item (e.g. odd step info) costs only itself
                self.dropped += 1
                self.worker_errors += 1
                self.last_error = f"_convert: {e!r}"[:500]
        return late

    def _poll_async(self) -> None:
        for key, op in list(self.pending_async.items()):
            try:
                finished = op.work.is_completed()
            except Exception:
                finished = True
            if finished and self.pending_async.pop(key, None) is not None:
                op.t_done = perf_ns()
                self.enqueue_op(("C", op))

    def _extend(self, record_type: str, columns: tuple) -> None:
        """Add rows (given column by column, in ``_NAMES[record_type]`` order)."""
        batch = self.rows.get(record_type)
        if batch is None:
            batch = self.rows[record_type] = Columns(self._specs[record_type])
        if batch.__class__ is Columns:
            batch.extend(columns)
        else:  # rows of this type were emitted as dicts in this flush: stay dicts
            more = Columns(self._specs[record_type])
            more.extend(columns)
            batch.extend(more.rows())

    def _append(self, record_type: str, values: tuple) -> None:
        """Add one row (values in ``_NAMES[record_type]`` order)."""
        batch = self.rows.get(record_type)
        if batch is not None and batch.__class__ is Columns:
            batch.append(values)
        else:  # first row of this flush, or rows kept as dicts: one row as columns of one
            self._extend(record_type, tuple((v,) for v in values))

    def _add(self, record_type: str, row: dict[str, Any]) -> None:
        """Add one row given as a dict (``emit``, metrics)."""
        batch = self.rows.get(record_type)
        if batch is None:
            self.rows[record_type] = [row]
        elif batch.__class__ is Columns:
            self.rows[record_type] = batch.rows() + [row]
        else:
            batch.append(row)

    def _convert(self, item: tuple, force: bool = False) -> bool:
        """Turn one queue item into a row; False while its CUDA events are not done."""
        kind = item[0]
        cpu = self.cpu.to_epoch
        if kind == "c":  # normally converted in bulk (``_convert_all``)
            _, name, g, seq, step, mb, nbytes, dtype, peer, t0, t1, state = item
            if nbytes.__class__ is not int:
                nbytes, dtype = payload_of(nbytes)
            self._append("collectives", (step, mb, *g.row, seq, name, nbytes, dtype_name(dtype),
                                         peer, state,
                                         cpu(t0), cpu(t0), cpu(t1), t1 - t0))
        elif kind == "S":
            _, name, skind, step, mb, t0, t1, ev0, ev1, c0, c1 = item
            device_ns = -1
            if ev1 is not None and ev0 is not None:
                if not CudaTimer.done(ev1):
                    if not force:
                        return False
                else:
                    device_ns = CudaTimer.elapsed_ns(ev0, ev1)
            start, end = cpu(t0), cpu(t1)
            self._append("sections", (step, mb, name, skind, start, end,
                                      device_ns if device_ns >= 0 else end - start, device_ns,
                                      c1 - c0 if c0 >= 0 and c1 >= c0 else -1))
        elif kind == "C":
            op = item[1]
            if op.ev1 is not None and not CudaTimer.done(op.ev1) and not force:
                return False
            self._append("collectives", self._collective_values(op))
        elif kind == "T":
            _, n, t0, t1, info = item
            start, end = cpu(t0), cpu(t1)
            if info.keys() <= _STEP_INFO.keys():
                self._append("steps", (n, start, end, end - start, *(
                    info.get(k, default) for k, default in _STEP_INFO.items())))
            else:  # other keys: a plain row, as given (the encoder ignores extra fields)
                self._add("steps", dict(self.ident, step=n, start_ns=start, end_ns=end,
                                        duration_ns=end - start, **info))
        elif kind == "R":
            _, rt, row = item
            full = {k: v for k, v in self.ident.items() if k in RECORD_TYPES[rt].column_names}
            if "ts_ns" in RECORD_TYPES[rt].column_names:
                full["ts_ns"] = time.time_ns()
            full.update(row)
            self._add(rt, full)
        return True

    def _collective_values(self, op: Any) -> tuple:
        """One collective's values in ``_NAMES["collectives"]`` order."""
        cpu = self.cpu.to_epoch
        enq = cpu(op.t_enq)
        started, completed, duration, state = enq, -1, -1, op.state
        if op.t_done >= 0:
            completed = cpu(op.t_done)
            duration = completed - enq
        if op.ev1 is not None and op.ev0 is not None and self.cuda is not None and self.cuda.anchored:
            if CudaTimer.done(op.ev1):
                started, completed = self.cuda.to_epoch(op.ev0), self.cuda.to_epoch(op.ev1)
                duration = CudaTimer.elapsed_ns(op.ev0, op.ev1)
            else:
                started, completed, duration = -1, -1, -1
                state = "enqueued"
        if state == "completed" and completed < 0:
            state = "started"
        g = op.group
        return (op.step, op.mb, g.group_id, g.axis, g.group_rank, g.size, op.seq, op.name,
                op.nbytes, dtype_name(op.dtype), op.peer, state, enq, started, completed, duration)

    def _inflight(self) -> None:
        stack = self.stack
        ts = time.time_ns()
        try:
            top = marker(stack[-1])
        except IndexError:
            top = None
        if (top is None or top[0] == "section") and self.waiting:
            top = self._oldest_on_device() or top
        if self.level < FULL and (top is None or self.level < SECTIONS):
            # ops (and below ``sections``, sections) are not traced: say so, not "idle"
            values = (ts, self.step, "untraced", LEVELS[self.level], "", "", -1, -1, ts)
        elif top is None:
            values = (ts, self.step, "idle", "", "", "", -1, -1, ts)
        else:
            kind, op, group_id, axis, seq, peer, since, step = top
            values = (ts, step, kind, op, group_id, axis, seq, peer, self.cpu.to_epoch(since))
        self._append("inflight", values)

    def _oldest_on_device(self) -> tuple | None:
        """On GPU the training thread does not block in NCCL ops; a collective enqueued
        long ago whose end event has not fired is what the rank really waits on."""
        limit = perf_ns() - int(self.config.inflight_interval_s * 1e9)
        for item in self.waiting:
            if item[0] == "C" and item[1].t_enq < limit:
                op = item[1]
                kind = "p2p" if op.name in ("send", "recv") else "collective"
                return (kind, op.name, op.group.group_id, op.group.axis, op.seq, op.peer,
                        op.t_enq, op.step)
        return None

    def _metrics(self) -> None:
        now = time.monotonic_ns()
        prev_t, prev_o = self._metrics_prev
        overhead = self.overhead_ns
        self._metrics_prev = (now, overhead)
        s = self.stats()
        values = {
            "hooks.overhead_ns_total": overhead,
            "hooks.overhead_fraction": (overhead - prev_o) / max(1, now - prev_t),
            "hooks.hooked_calls_total": s["calls"],
            "hooks.overhead_ns_per_call": overhead / max(1, s["calls"]),
            "hooks.worker_cpu_ns_total": s["worker_cpu_ns"],
            "hooks.records_written_total": s["records_written"],
            "hooks.dropped_records_total": s["dropped_records"],
            "hooks.sink_errors_total": s["sink_errors"],
            "hooks.worker_errors_total": s["worker_errors"],
            "hooks.queue_len": s["queue_len"],
            "hooks.pending": s["pending"],
            "hooks.instrumentation_level": self.level,
            "hooks.cuda_errors_total": s["cuda_errors"],
        }
        ts = time.time_ns()
        for name, value in values.items():
            self._add("metrics", self._metric_row(ts, name, value))

    def _flush(self) -> None:
        try:
            self._flush_rows()
        finally:
            self.flushes += 1

    def _flush_rows(self) -> None:
        self._open_sink()
        rows, self.rows = self.rows, {}
        if not rows:
            return
        if "steps" in rows:  # a step's record after its ops and sections, in the spool too:
            rows["steps"] = rows.pop("steps")  # a reader cut between frames never sees it alone
        if not self._sink_open:
            self.sink_dropped += sum(map(len, rows.values()))
            return
        write_many = getattr(self.sink, "write_many", None)
        if write_many is None:  # plain Sink protocol: one call per record type
            failed = {}
            for rt, batch in rows.items():
                try:
                    self.sink.write(rt, rows_of(batch))
                except Exception as e:
                    failed[rt] = e
        else:  # e.g. SpoolSink: all frames of this flush in one write
            try:
                failed = write_many(rows)
            except Exception as e:
                failed = {rt: e for rt in rows}
        for rt, batch in rows.items():
            err = failed.get(rt)
            if err is None:
                self.records_written += len(batch)
            else:
                self.sink_errors += 1
                self.sink_dropped += len(batch)
                self.last_error = f"sink.write({rt}): {err!r}"[:500]

    def _final(self) -> None:
        deadline = time.monotonic() + self.config.resolve_timeout_s
        self._drain()
        while self.waiting and time.monotonic() < deadline:
            time.sleep(0.01)
            self._drain()
        for item in self.waiting:
            self._convert(item, force=True)
        self.waiting = []
        for key, op in list(self.pending_async.items()):
            if self.pending_async.pop(key, None) is not None:
                op.state = "started"
                self._append("collectives", self._collective_values(op))
        self._metrics()
        self._flush()
        if self._sink_open:
            try:
                self.sink.flush()
                self.sink.close()
            except Exception as e:
                self.sink_errors += 1
                self.last_error = f"sink.close: {e!r}"[:500]


def _cpu_times(c0s: Sequence[int], c1s: Sequence[int]) -> list[int]:
    """Sections' ``cpu_ns`` from their CPU-clock readings at entry and exit (-1 where the
    clock was not read: a CUDA device, or the section is still open)."""
    if min(c0s) >= 0 and min(c1s) >= 0:
        return list(map(sub, c1s, c0s))
    return [c1 - c0 if c0 >= 0 and c1 >= c0 else -1 for c0, c1 in zip(c0s, c1s)]


def marker(top: Sequence[Any]) -> tuple:
    """An entry of the training thread's stack as ``(kind, op, group_id, axis, seq, peer,
    since, step)``. Sections and synchronous CPU ops push their queue record itself (a
    list tagged ``"S"`` / ``"c"``, see ``_convert``), so the hot path builds one object;
    other entries are pushed in this form already."""
    tag = top[0]
    if tag == "c":
        _, name, g, seq, step, _, _, _, peer, since, _, _ = top
        kind = "p2p" if name in ("send", "recv") else "collective"
        return (kind, name, g.group_id, g.axis, seq, peer, since, step)
    if tag == "S":
        return ("section", top[1], "", "", -1, -1, top[5], top[3])
    return tuple(top)


def _pid() -> int:
    import os

    return os.getpid()
