"""Collective and p2p tracing: wrappers around ``torch.distributed`` functions.

:func:`install` replaces the public functions in the ``torch.distributed`` namespace
(``torch.distributed.all_reduce`` etc.) with tracing wrappers; code that calls
``dist.all_reduce(...)`` is traced from then on. The wrappers are also available
explicitly (:func:`traced`), e.g. for functions imported by name before ``init``.

Each op gets Flight-Recorder-like state: enqueued (CPU call), started and completed
(device events on CUDA; the CPU call/return on CPU), a per-group sequence number,
bytes, dtype and the peer for p2p. Collectives are numbered per process group (the
n-th collective of a group has the same ``seq`` on every member). P2P ops are
numbered per (group, peer, direction), so the k-th ``send`` from A to B has the
same ``seq`` as the k-th ``recv`` at B from A.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

from fleetscope.trainer_hooks import state
from fleetscope.trainer_hooks.control import FULL
from fleetscope.trainer_hooks.recorder import (
    UNRESOLVED_MAX,
    Recorder,
    dtype_name,
    payload_of,
    perf_ns,
    resolve,
)

# op name -> (kind, input arg (index, name), group arg, async arg or None/True, peer arg)
# peer arg: (index, name, group-relative name) for p2p.
_SPECS: dict[str, tuple] = {
    "all_reduce": ("collective", (0, "tensor"), (2, "group"), (3, "async_op"), None),
    "broadcast": ("collective", (0, "tensor"), (2, "group"), (3, "async_op"), None),
    "all_gather": ("collective", (1, "tensor"), (2, "group"), (3, "async_op"), None),
    "all_gather_into_tensor": ("collective", (1, "input_tensor"), (2, "group"), (3, "async_op"), None),
    "all_gather_single": ("collective", (1, "input_tensor"), (2, "group"), (3, "async_op"), None),
    "reduce_scatter": ("collective", (1, "input_list"), (3, "group"), (4, "async_op"), None),
    "reduce_scatter_tensor": ("collective", (1, "input"), (3, "group"), (4, "async_op"), None),
    "reduce_scatter_single": ("collective", (1, "input"), (3, "group"), (4, "async_op"), None),
    "all_to_all_single": ("collective", (1, "input"), (4, "group"), (5, "async_op"), None),
    "barrier": ("collective", None, (0, "group"), (1, "async_op"), None),
    "send": ("p2p", (0, "tensor"), (2, "group"), None, (1, "dst", "group_dst")),
    "recv": ("p2p", (0, "tensor"), (2, "group"), None, (1, "src", "group_src")),
    "isend": ("p2p", (0, "tensor"), (2, "group"), True, (1, "dst", "group_dst")),
    "irecv": ("p2p", (0, "tensor"), (2, "group"), True, (1, "src", "group_src")),
}
_P2P_NAME = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv"}
_keys = itertools.count()


class GroupInfo:
    """What the hooks know about one process group."""

    __slots__ = ("group", "group_id", "axis", "size", "group_rank", "ranks", "seq", "p2p_seq",
                 "row")

    def __init__(self, group: Any, group_id: str, axis: str, ranks: list[int], rank: int) -> None:
        self.group, self.group_id, self.axis = group, group_id, axis
        self.ranks = list(ranks)
        self.size = len(self.ranks)
        self.group_rank = self.ranks.index(rank) if rank in self.ranks else -1
        self.seq = 0
        self.p2p_seq: dict[tuple[str, int], int] = {}
        self.row = (group_id, axis, self.group_rank, self.size)
        """The group's columns of a ``collectives`` row (group_id, axis, rank, size)."""


class Op:
    """One traced op on its way through the recorder."""

    __slots__ = ("name", "group", "seq", "step", "mb", "nbytes", "dtype", "peer", "t_enq",
                 "t_done", "ev0", "ev1", "state", "work", "key")

    def __init__(self, name: str, group: GroupInfo, seq: int, step: int, mb: int, nbytes: int,
                 dtype: str, peer: int, t_enq: int) -> None:
        self.name, self.group, self.seq, self.step, self.mb = name, group, seq, step, mb
        self.nbytes, self.dtype, self.peer, self.t_enq = nbytes, dtype, peer, t_enq
        self.t_done = -1
        self.ev0 = self.ev1 = None
        self.state = "completed"
        self.work: Any = None
        self.key = 0


# ------------------------------------------------------------------------------ groups
def register_group(rec: Recorder, group: Any, axis: str, group_id: str | None = None) -> GroupInfo:
    """Tell the hooks which parallel axis a process group is (``dp``/``tp``/``pp``/``world``)."""
    import torch.distributed as dist

    pg = _resolve(group)
    ranks = list(dist.get_process_group_ranks(pg))
    if group_id is None:
        group_id = "world" if axis == "world" or rec.topology is None else rec.topology.group_id(axis, rec.rank)
    info = GroupInfo(pg, group_id, axis, ranks, rec.rank)
    rec.groups[id(pg)] = info
    return info


def _resolve(group: Any) -> Any:
    import torch.distributed as dist

    if group is None:
        return dist.distributed_c10d._get_default_group()
    return group


def group_info(rec: Recorder, group: Any) -> GroupInfo:
    info = rec.groups.get(id(group)) if group is not None else rec.groups.get(0)
    if info is not None:
        return info
    import torch.distributed as dist

    pg = _resolve(group)
    info = rec.groups.get(id(pg))
    if info is None:
        info = _infer(rec, pg, list(dist.get_process_group_ranks(pg)))
        rec.groups[id(pg)] = info
    if group is None:
        rec.groups[0] = info
    return info


def _infer(rec: Recorder, pg: Any, ranks: list[int]) -> GroupInfo:
    """Name an unregistered group by matching its members against the topology."""
    import torch.distributed as dist

    if len(ranks) == dist.get_world_size():
        return GroupInfo(pg, "world", "world", ranks, rec.rank)
    topo = rec.topology
    if topo is not None:
        for axis in ("tp", "dp", "pp"):
            if sorted(topo.group_ranks(axis, rec.rank)) == sorted(ranks):
                return GroupInfo(pg, topo.group_id(axis, rec.rank), axis, ranks, rec.rank)
    return GroupInfo(pg, "group." + "-".join(map(str, ranks)), "world", ranks, rec.rank)


# ------------------------------------------------------------------------------ wrapping
def _arg(args: tuple, kwargs: dict, spec: tuple | None, default: Any = None) -> Any:
    if spec is None:
        return default
    i, name = spec[0], spec[1]
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


_DTYPES: dict[Any, str] = {}


def _dtype(dtype: Any) -> str:
    name = _DTYPES.get(dtype)
    if name is None:
        name = _DTYPES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _payload(t: Any) -> tuple[int, str]:
    if t is None:
        return 0, ""
    if isinstance(t, (list, tuple)):
        return sum(x.numel() * x.element_size() for x in t), (_dtype(t[0].dtype) if t else "")
    return t.numel() * t.element_size(), _dtype(t.dtype)


def _peer(rec: Recorder, g: GroupInfo, args: tuple, kwargs: dict, spec: tuple) -> int:
    peer = _arg(args, kwargs, spec)
    if peer is not None:
        return int(peer)
    gpeer = kwargs.get(spec[2])
    if gpeer is not None and 0 <= gpeer < g.size:
        return g.ranks[gpeer]
    return -1


def begin(rec: Recorder, name: str, args: tuple, kwargs: dict) -> Op:
    """Build the record of an op about to be called, and mark it in flight."""
    spec = _SPECS[name]
    g, opname, seq, peer, nbytes, dtype = _describe(rec, name, spec, args, kwargs)
    kind = spec[0]
    t = perf_ns()
    op = Op(opname, g, seq, rec.step, rec.microbatch, nbytes, dtype, peer, t)
    if rec.cuda is not None:
        op.ev0 = rec.cuda.event()
    rec.stack.append((kind, opname, g.group_id, g.axis, seq, peer, t, rec.step))
    return op


def finish(rec: Recorder, op: Op, failed: bool = False) -> None:
    op.t_done = perf_ns()
    if failed:
        op.state = "failed"
    elif rec.cuda is not None:
        op.ev1 = rec.cuda.event()
    rec.enqueue_op(("C", op))


def _work_base() -> Any:
    """``torch.distributed.Work``: FSDP2 and c10d test ``isinstance(work, Work)``, and C++
    (``_register_work``, coalescing) accepts only real ``Work`` objects, so the proxy
    below subclasses it (c10d's Python trampoline routes C++ calls back to it)."""
    try:
        from torch._C._distributed_c10d import Work
    except ImportError:  # no torch.distributed build
        return object
    return Work


class TracedWork(_work_base()):  # type: ignore[misc]
    """Proxy for an async ``Work`` that records completion when it is waited on (or
    found completed by ``is_completed()``); the background thread polls only the ones
    nobody asks about. A real ``Work`` subclass (see :func:`_work_base`)."""

    def __init__(self, work: Any, rec: Recorder, ops: list[Op]) -> None:
        super().__init__()
        self._work, self._rec = work, rec
        self._ops: Sequence[Op] = ops  # () once recorded

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        rec, ops = self._rec, self._ops
        if not ops or rec is not state.recorder:
            return self._work.wait(*args, **kwargs)
        t_in = perf_ns()
        first = ops[0]
        kind = "p2p" if first.peer >= 0 or first.name in ("send", "recv") else "collective"
        rec.stack.append((kind, first.name, first.group.group_id, first.group.axis, first.seq,
                          first.peer, first.t_enq, first.step))
        rec.overhead_ns += perf_ns() - t_in
        try:
            result = self._work.wait(*args, **kwargs)
        finally:
            rec.stack.pop()
        self._done(rec, perf_ns())
        return result

    def is_completed(self) -> bool:
        done = self._work.is_completed()
        rec = self._rec
        if done and self._ops and rec is state.recorder:
            self._done(rec, perf_ns())
        return done

    def _done(self, rec: Recorder, t1: int, events: bool = True) -> None:
        """The ops completed at ``t1`` (each is recorded once, by whoever sees it first)."""
        pending = rec.pending_async
        for op in self._ops:
            if pending.pop(op.key, None) is not None:
                op.t_done = t1
                if events and rec.cuda is not None:
                    op.ev1 = rec.cuda.event()
                rec.enqueue_op(("C", op))
        self._ops = ()
        if events:
            rec.overhead_ns += perf_ns() - t1

    # ``Work``'s own methods would answer for the empty base object: delegate them.
    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> Any:
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def _source_rank(self) -> int:
        return self._work._source_rank()

    def result(self) -> Any:
        return self._work.result()

    def synchronize(self) -> Any:
        return self._work.synchronize()

    def get_future(self) -> Any:
        """The work's future; its completion also completes the record (DDP comm hooks
        and other future chains never call ``wait()`` on the work itself)."""
        fut = self._work.get_future()
        rec = self._rec
        if self._ops and rec is state.recorder:
            def completed(_fut: Any) -> None:  # runs on the backend's thread
                if rec is state.recorder:
                    self._done(rec, perf_ns(), events=False)

            try:
                fut.add_done_callback(completed)
            except Exception:  # an odd future: the background thread polls the work
                pass
        return fut

    def get_future_result(self) -> Any:
        return self._work.get_future_result()

    def block_current_stream(self) -> Any:
        return self._work.block_current_stream()

    def _get_duration(self) -> float:
        return self._work._get_duration()

    def _get_op_type(self) -> Any:
        return self._work._get_op_type()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_work") or name in ("_rec", "_ops"):
            raise AttributeError(name)
        return getattr(self._work, name)


def _track_async(rec: Recorder, op: Op, work: Any) -> None:
    if work is None:
        rec.enqueue_op(("C", op))
        return
    op.work, op.key = work, next(_keys)
    if len(rec.pending_async) < rec.config.max_pending:
        rec.pending_async[op.key] = op
    else:  # bounded: recorded as started, its end not tracked
        rec.dropped += 1
        rec.enqueue_op(("C", op))


def _describe(rec: Recorder, name: str, spec: tuple, args: tuple,
              kwargs: dict) -> tuple[GroupInfo, str, int, int, int, str]:
    """(group, op name, seq, peer, bytes, dtype) of an op about to be called; advances
    the group's sequence number."""
    kind, inp, grp, _, peer_spec = spec
    i, key = grp
    group = args[i] if len(args) > i else kwargs.get(key)
    g = rec.groups.get(id(group) if group is not None else 0)
    if g is None:
        g = group_info(rec, group)
    if inp is None:
        nbytes, dtype = 0, ""
    else:
        i, key = inp
        t = args[i] if len(args) > i else kwargs.get(key)
        if t is None:
            nbytes, dtype = 0, ""
        elif isinstance(t, (list, tuple)):
            nbytes, dtype = _payload(t)
        else:
            nbytes = t.nbytes
            dtype = _DTYPES.get(t.dtype) or _dtype(t.dtype)
    if peer_spec is None:
        g.seq += 1
        return g, name, g.seq, -1, nbytes, dtype
    peer = _peer(rec, g, args, kwargs, peer_spec)
    opname = _P2P_NAME[name]
    k = (opname, peer)
    seq = g.p2p_seq[k] = g.p2p_seq.get(k, 0) + 1
    return g, opname, seq, peer, nbytes, dtype


_DEFERRED_IN_COALESCING = frozenset({"all_reduce", "all_gather_into_tensor",
                                     "reduce_scatter_tensor"})
"""Inside ``_coalescing_manager`` c10d only queues these; on leaving it issues one
coalesced op per group (``allreduce_coalesced``...), traced on the ProcessGroup layer."""


def _coalesce_state() -> dict:
    """c10d's ``{group: queued ops}`` of open ``_coalescing_manager`` blocks (cleared,
    never replaced, by c10d)."""
    try:
        from torch.distributed.distributed_c10d import _world

        return _world.pg_coalesce_state
    except (ImportError, AttributeError):
        return {}


def _deferred(coalescing: dict, args: tuple, kwargs: dict, group_at: int, group_key: str) -> bool:
    group = args[group_at] if len(args) > group_at else kwargs.get(group_key)
    if group is None:
        group = _resolve(None)
    return group in coalescing


def traced(name: str, fn: Any) -> Any:
    """A tracing wrapper of the ``torch.distributed`` function ``fn`` named ``name``.

    A synchronous op on CPU is queued as one flat list (``"c"``); async ops, CUDA ops
    and failed ops go through an :class:`Op` (completion or device events come later).
    """
    spec = _SPECS[name]
    kind, (tensor_at, tensor_key), (group_at, group_key), async_spec, _ = (
        spec[0], spec[1] or (1 << 30, ""), *spec[2:])
    p2p = spec[4] is not None
    always_async = async_spec is True
    async_at, async_key = async_spec if isinstance(async_spec, tuple) else (1 << 30, "")

    deferrable = name in _DEFERRED_IN_COALESCING
    coalescing = _coalesce_state() if deferrable else {}

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None or rec.suppress:
            return fn(*args, **kwargs)
        if coalescing and _deferred(coalescing, args, kwargs, group_at, group_key):
            return fn(*args, **kwargs)  # queued, not issued: the coalesced op is traced
        t_in = perf_ns()
        try:
            if p2p:
                g, opname, seq, peer, nbytes, dtype = _describe(rec, name, spec, args, kwargs)
                full = rec.level >= FULL
            else:  # inline: the hot path (tensor-parallel all-reduces)
                group = args[group_at] if len(args) > group_at else kwargs.get(group_key)
                g = rec.groups.get(id(group) if group is not None else 0)
                if g is None:
                    g = group_info(rec, group)
                seq = g.seq = g.seq + 1
                opname, peer = name, -1
                full = rec.level >= FULL
                if full:  # below it only the number is needed
                    tensor = args[tensor_at] if len(args) > tensor_at else kwargs.get(tensor_key)
                    if tensor is None or tensor.__class__ in (list, tuple):
                        nbytes, dtype = _payload(tensor)
                    else:  # read later, in a batch: see ``Recorder.unresolved``
                        nbytes, dtype = tensor, None
        except Exception:  # unknown group, odd arguments: never fail the caller
            return fn(*args, **kwargs)
        if not full:  # runtime control: numbered (so seq stays aligned), not traced
            rec.overhead_ns += perf_ns() - t_in
            rec.suppress += 1
            try:
                return fn(*args, **kwargs)
            finally:
                rec.suppress -= 1
        cuda = rec.cuda
        if always_async:
            is_async = True
        elif len(args) > async_at:
            is_async = bool(args[async_at])
        else:
            is_async = bool(kwargs) and bool(kwargs.get(async_key))
        if cuda is None and not is_async:
            # the hot path, a synchronous op on CPU: one list is both the in-flight
            # marker on the stack and, once the op returns, the queued record
            t = perf_ns()
            item = ["c", opname, g, seq, rec.step, rec.microbatch, nbytes, dtype, peer, t, -1,
                    "completed"]
            stack = rec.stack
            stack.append(item)
            rec.suppress += 1
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                rec.suppress -= 1
                stack.pop()
                if dtype is None:
                    nbytes, dtype = payload_of(nbytes)
                finish(rec, Op(opname, g, seq, item[4], item[5], nbytes, dtype_name(dtype), peer, t),
                       failed=True)
                raise
            rec.suppress -= 1
            t_out = item[10] = perf_ns()
            stack.pop()
            q = rec.ops
            if len(q) < rec.capacity:
                q.append(item)
                if dtype is None:
                    unresolved = rec.unresolved
                    unresolved.append(item)
                    if len(unresolved) >= UNRESOLVED_MAX:
                        resolve(unresolved)
            else:
                rec.dropped += 1
            rec.calls += 1
            rec.overhead_ns += t - t_in + perf_ns() - t_out
            return result
        if dtype is None:
            nbytes, dtype = payload_of(nbytes)
        return _call_op(rec, fn, args, kwargs, kind, opname, g, seq, peer, nbytes,
                        dtype_name(dtype), t_in, cuda, is_async)

    if name in ("isend", "irecv"):  # P2POp compares these against the originals
        return _Traced(wrapper, fn, name)
    functools.update_wrapper(wrapper, fn)
    return wrapper


def _call_op(rec: Recorder, fn: Any, args: tuple, kwargs: dict, kind: str, opname: str,
             g: GroupInfo, seq: int, peer: int, nbytes: int, dtype: str, t_in: int,
             cuda: Any, is_async: bool) -> Any:
    """An async op or a CUDA op, through an :class:`Op` (its completion or device events
    come later); see :func:`traced`."""
    step, mb = rec.step, rec.microbatch
    t = perf_ns()
    stack = rec.stack
    stack.append((kind, opname, g.group_id, g.axis, seq, peer, t, step))
    if cuda is None:
        ev0 = None
        rec.overhead_ns += t - t_in
    else:
        ev0 = cuda.event()
        rec.overhead_ns += perf_ns() - t_in
    rec.suppress += 1
    try:
        result = fn(*args, **kwargs)
    except BaseException:
        rec.suppress -= 1
        stack.pop()
        op = Op(opname, g, seq, step, mb, nbytes, dtype, peer, t)
        op.ev0 = ev0
        finish(rec, op, failed=True)
        raise
    rec.suppress -= 1
    t_out = perf_ns()
    stack.pop()
    op = Op(opname, g, seq, step, mb, nbytes, dtype, peer, t)
    op.ev0 = ev0
    if is_async:
        _track_async(rec, op, result)
        result = TracedWork(result, rec, [op]) if result is not None else None
    else:
        op.t_done = t_out
        op.ev1 = cuda.event()
        rec.enqueue_op(("C", op))
    rec.calls += 1
    rec.overhead_ns += perf_ns() - t_out
    return result


class _Traced:
    """A wrapper that still compares equal to the function it wraps.

    ``torch.distributed.P2POp`` checks ``op in [isend, irecv]`` against the originals.
    """

    __wrapped__: Any  # set by ``functools.update_wrapper``

    def __init__(self, wrapper: Any, fn: Any, name: str) -> None:
        self._call = wrapper
        functools.update_wrapper(self, fn)
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.__wrapped__

    def __hash__(self) -> int:
        return hash(self.__wrapped__)


def traced_batch_isend_irecv(fn: Any) -> Any:
    """Wrapper of ``batch_isend_irecv``: one record per P2POp, works proxied."""
    import torch.distributed.distributed_c10d as c10d

    def wrapper(p2p_op_list: list) -> Any:
        rec = state.recorder
        if rec is None or rec.suppress:
            return fn(p2p_op_list)
        t_in = perf_ns()
        ops = []
        try:
            for p in p2p_op_list:
                if isinstance(p.op, _Traced):
                    p.op = p.op.__wrapped__  # the original: c10d checks ``op.op is isend``
                base = p.op
                name = "isend" if base is c10d.isend else "irecv"
                args = (p.tensor, None, p.group)
                kwargs = {"group_dst" if name == "isend" else "group_src": p.group_peer}
                op = begin(rec, name, args, kwargs)
                rec.stack.pop()
                ops.append(op)
        except Exception:
            ops = []
        rec.overhead_ns += perf_ns() - t_in
        if rec.level < FULL:  # numbered above, not traced
            ops = []
        rec.suppress += 1
        try:
            works = fn(p2p_op_list)
        except BaseException:
            for op in ops:
                finish(rec, op, failed=True)
            raise
        finally:
            rec.suppress -= 1
        t_out = perf_ns()
        if not ops:
            return works
        out = []
        if works is not None and len(works) == len(ops):
            groups = [[op] for op in ops]
        else:
            groups = [[] for _ in works or ()]
            if groups:
                groups[-1] = ops
        for work, group in zip(works or (), groups):
            for op in group:
                op.work, op.key = work, next(_keys)
                if len(rec.pending_async) < rec.config.max_pending:
                    rec.pending_async[op.key] = op
                else:  # bounded: the op is recorded as started, its end is not tracked
                    rec.dropped += 1
                    rec.enqueue_op(("C", op))
            out.append(TracedWork(work, rec, group))
        rec.calls += 1
        rec.overhead_ns += perf_ns() - t_out
        return out

    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


_ORIGINALS: dict[str, Any] = {}
"""``torch.distributed`` namespace name -> the function it held before :func:`install`."""
_C10D_ORIGINALS: dict[str, Any] = {}
"""The same for ``torch.distributed.distributed_c10d`` (its own module attributes)."""


def _wrap(name: str, fn: Any) -> Any:
    return traced_batch_isend_irecv(fn) if name == "batch_isend_irecv" else traced(name, fn)


def install() -> list[str]:
    """Wrap the public c10d functions (idempotent). Returns the names wrapped.

    Both the ``torch.distributed`` namespace (``dist.all_reduce``, and names imported
    from it after ``init``) and ``torch.distributed.distributed_c10d``'s own attributes
    (``distributed_c10d.all_reduce``, c10d's internal calls such as
    ``all_gather_object``) are wrapped. What bypasses both - names bound before
    ``init``, direct ``ProcessGroup`` method calls, coalesced ops - is traced one layer
    down (:mod:`.pg_tracing`); functional collectives by :mod:`.functional`.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    done = []
    for name in list(_SPECS) + ["batch_isend_irecv"]:
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        if name not in _ORIGINALS:
            _ORIGINALS[name] = fn
            setattr(dist, name, _wrap(name, fn))
        # c10d compares ``op is isend`` against its own globals: those two stay as they
        # are there (their calls are traced on the ProcessGroup layer)
        base = None if name in ("isend", "irecv") else getattr(c10d, name, None)
        if base is not None and name not in _C10D_ORIGINALS:
            _C10D_ORIGINALS[name] = base
            # the same wrapper when both held the same function, else one of its own
            setattr(c10d, name, getattr(dist, name) if base is fn else _wrap(name, base))
        done.append(name)
    return done


def uninstall() -> None:
    """Restore the original ``torch.distributed`` functions."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for name, fn in _ORIGINALS.items():
        setattr(dist, name, fn)
    for name, fn in _C10D_ORIGINALS.items():
        setattr(c10d, name, fn)
    _ORIGINALS.clear()
    _C10D_ORIGINALS.clear()
