"""Tracing one layer below the c10d functions: the ``ProcessGroup`` methods.

Every eager c10d collective issued from Python ends in a method of
``torch.distributed.ProcessGroup`` (``dist.all_reduce`` calls ``group.allreduce``,
``_coalescing_manager`` calls ``group.allreduce_coalesced``, FSDP2 and
``batch_isend_irecv`` reach ``_allgather_base`` / ``send`` ...). :func:`install`
replaces those methods on the class, so calls that bypass the wrapped c10d functions -
names bound before ``init`` (``from torch.distributed import all_reduce`` at import
time), libraries calling group methods directly, coalesced ops - are traced too.

A call already traced one layer up (inside a wrapped c10d function) is not traced
again (``Recorder.suppress``). Records use the c10d op names (``allreduce`` ->
``all_reduce``, ``_allgather_base`` -> ``all_gather_into_tensor``), the same
per-group numbering and the same states, so the path a rank took does not show.
A group method always returns a ``Work``: the op is recorded when that ``Work`` is
waited on (a :class:`~.collectives.TracedWork`, a real ``Work`` subclass), or found
completed by the background thread.
"""

from __future__ import annotations

import functools
from typing import Any

from fleetscope.trainer_hooks import state
from fleetscope.trainer_hooks.collectives import (
    _DTYPES,
    GroupInfo,
    Op,
    TracedWork,
    _dtype,
    _keys,
    group_info,
)
from fleetscope.trainer_hooks.control import FULL
from fleetscope.trainer_hooks.recorder import Recorder, perf_ns

# method -> (c10d op name, index of the payload argument (None: none), index of the
# group-relative peer argument for p2p (None: a collective; -1: any source))
PG_METHODS: dict[str, tuple[str, int | None, int | None]] = {
    "allreduce": ("all_reduce", 0, None),
    "allreduce_coalesced": ("all_reduce_coalesced", 0, None),
    "broadcast": ("broadcast", 0, None),
    "reduce": ("reduce", 0, None),
    "allgather": ("all_gather", 1, None),
    "_allgather_base": ("all_gather_into_tensor", 1, None),
    "allgather_coalesced": ("all_gather_coalesced", 1, None),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor_coalesced", 1, None),
    "gather": ("gather", 1, None),
    "scatter": ("scatter", 0, None),
    "reduce_scatter": ("reduce_scatter", 1, None),
    "_reduce_scatter_base": ("reduce_scatter_tensor", 1, None),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", 1, None),
    "alltoall_base": ("all_to_all_single", 1, None),
    "alltoall": ("all_to_all", 1, None),
    "barrier": ("barrier", None, None),
    "send": ("send", 0, 1),
    "recv": ("recv", 0, 1),
    "recv_anysource": ("recv", 0, -1),
}
_ORIGINALS: dict[str, Any] = {}


def payload(x: Any) -> tuple[int, str]:
    """(bytes, dtype) of a tensor or (nested) list of tensors."""
    if x is None:
        return 0, ""
    if x.__class__ in (list, tuple):
        total, dtype = 0, ""
        for item in x:
            n, d = payload(item)
            total += n
            dtype = dtype or d
        return total, dtype
    try:
        return x.nbytes, _DTYPES.get(x.dtype) or _dtype(x.dtype)
    except AttributeError:  # options objects, ints: no payload
        return 0, ""


def number(g: GroupInfo, opname: str, peer: int) -> int:
    """Advance and return the group's sequence number for one op (p2p: per peer and
    direction)."""
    if peer == -2:
        g.seq += 1
        return g.seq
    k = (opname, peer)
    seq = g.p2p_seq[k] = g.p2p_seq.get(k, 0) + 1
    return seq


def _traced_method(method: str, fn: Any) -> Any:
    opname, data_at, peer_at = PG_METHODS[method]

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None or rec.suppress:
            return fn(self, *args, **kwargs)
        t_in = perf_ns()
        try:
            g = rec.groups.get(id(self))
            if g is None:
                g = group_info(rec, self)
            peer = -2  # a collective
            if peer_at is not None:  # a p2p op
                peer = -1
                if peer_at >= 0 and len(args) > peer_at:
                    gp = int(args[peer_at])
                    peer = g.ranks[gp] if 0 <= gp < g.size else -1
            seq = number(g, opname, peer)
        except Exception:  # odd arguments, unknown group: never fail the caller
            return fn(self, *args, **kwargs)
        if rec.level < FULL:
            rec.overhead_ns += perf_ns() - t_in
            return fn(self, *args, **kwargs)
        nbytes, dtype = payload(args[data_at]) if data_at is not None and len(args) > data_at else (0, "")
        return _call(rec, fn, self, args, kwargs, opname, g, seq, max(peer, -1), nbytes, dtype,
                     t_in)

    functools.update_wrapper(wrapper, fn)
    wrapper._fleetscope_traced = True  # type: ignore[attr-defined]
    return wrapper


def _call(rec: Recorder, fn: Any, pg: Any, args: tuple, kwargs: dict, opname: str, g: GroupInfo,
          seq: int, peer: int, nbytes: int, dtype: str, t_in: int) -> Any:
    kind = "p2p" if opname in ("send", "recv") else "collective"
    t = perf_ns()
    op = Op(opname, g, seq, rec.step, rec.microbatch, nbytes, dtype, peer, t)
    cuda = rec.cuda
    if cuda is not None:
        op.ev0 = cuda.event()
    stack = rec.stack
    stack.append((kind, opname, g.group_id, g.axis, seq, peer, t, op.step))
    rec.overhead_ns += perf_ns() - t_in
    rec.suppress += 1
    try:
        work = fn(pg, *args, **kwargs)
    except BaseException:
        op.state = "failed"
        op.t_done = perf_ns()
        rec.enqueue_op(("C", op))
        raise
    finally:
        rec.suppress -= 1
        stack.pop()
    t_out = perf_ns()
    rec.calls += 1
    if work is None:
        op.t_done = t_out
        rec.enqueue_op(("C", op))
        rec.overhead_ns += perf_ns() - t_out
        return work
    op.work, op.key = work, next(_keys)
    pending = rec.pending_async
    if len(pending) < rec.config.max_pending:
        pending[op.key] = op
    else:  # bounded: recorded as started, its end not tracked
        rec.dropped += 1
        rec.enqueue_op(("C", op))
        rec.overhead_ns += perf_ns() - t_out
        return work
    traced = TracedWork(work, rec, [op])
    rec.overhead_ns += perf_ns() - t_out
    return traced


def install() -> list[str]:
    """Wrap the ``ProcessGroup`` methods (idempotent). Returns the method names."""
    from torch.distributed import ProcessGroup

    done = []
    for method in PG_METHODS:
        fn = getattr(ProcessGroup, method, None)
        if fn is None:
            continue
        if method not in _ORIGINALS and not getattr(fn, "_fleetscope_traced", False):
            # keep the class's own descriptor to put back (the looked-up function does
            # not bind ``self`` when set on the class again)
            _ORIGINALS[method] = ProcessGroup.__dict__.get(method)
            setattr(ProcessGroup, method, _traced_method(method, fn))
        done.append(method)
    return done


def uninstall() -> None:
    """Restore the original ``ProcessGroup`` methods."""
    from torch.distributed import ProcessGroup

    for method, descriptor in _ORIGINALS.items():
        if descriptor is None:  # inherited: drop the wrapper, the base's method shows again
            delattr(ProcessGroup, method)
        else:
            setattr(ProcessGroup, method, descriptor)
    _ORIGINALS.clear()
