"""Tracing functional collectives (``torch.distributed._functional_collectives``).

DTensor redistribution, torchtitan's tensor/sequence parallelism and
``funcol.all_reduce(...)`` call the ``torch.ops._c10d_functional`` operators, which
run in C++ and never touch the Python ``ProcessGroup`` methods. The op returns at once
(its output is an "async" tensor) and completes when ``wait_tensor`` is called on the
output - by ``AsyncCollectiveTensor.wait()``, or implicitly when the tensor is first used.

:func:`install` replaces the operator packets on the ``torch.ops._c10d_functional``
(and ``_c10d_functional_autograd``) namespaces with tracing proxies (callers look them
up there on every call; attributes such as ``.default`` still reach the real packet).
The op is recorded as enqueued when called, and as completed when ``wait_tensor`` on
one of its outputs returns (matched by data pointer: DTensor waits on an alias of
the output, not the output object itself); while a rank waits there, its in-flight record names the
collective, so a hang inside a functional collective is in the wait-for graph. Outputs
waited on by nobody are found by the background thread once the tensor is freed, and
recorded as ``started`` (their end is unknown). Under ``torch.compile`` tracing the
proxies step aside (compiled graphs call the ops from C++; see the README).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, cast

from fleetscope.trainer_hooks import state
from fleetscope.trainer_hooks.collectives import GroupInfo, Op, group_info
from fleetscope.trainer_hooks.control import FULL
from fleetscope.trainer_hooks.pg_tracing import number, payload
from fleetscope.trainer_hooks.recorder import Recorder, perf_ns

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
OPS: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced_": "all_reduce_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
"""Functional operator -> the c10d op name its records carry."""
_ORIGINALS: dict[tuple[str, str], Any] = {}


def _compiling() -> bool:
    try:
        import torch.compiler

        return torch.compiler.is_compiling()
    except Exception:
        return False


def _group(rec: Recorder, arg: Any) -> GroupInfo:
    """The group of a functional op's ``group_name`` argument (a name or a group)."""
    if isinstance(arg, str):
        g = rec.groups.get(arg)
        if g is None:
            from torch.distributed.distributed_c10d import _resolve_process_group

            # the op's schema passes group names as plain str; torch types them GroupName
            g = rec.groups[arg] = group_info(rec, _resolve_process_group(cast("GroupName", arg)))
        return g
    return group_info(rec, arg)


class TracedOp:
    """A tracing proxy of one ``torch.ops._c10d_functional`` packet."""

    def __init__(self, name: str, packet: Any) -> None:
        self._name, self._op, self._packet = name, OPS[name], packet
        self.__name__ = getattr(packet, "__name__", name)

    def __getattr__(self, name: str) -> Any:  # .default, overloads, schema...
        return getattr(self._packet, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        packet = self._packet
        if rec is None or rec.suppress:
            return packet(*args, **kwargs)
        t_in = perf_ns()
        try:
            if _compiling():
                return packet(*args, **kwargs)
            grp = kwargs["group_name"] if "group_name" in kwargs else args[-1]
            g = _group(rec, grp)
            opname = self._op
            seq = number(g, opname, -2)
        except Exception:  # odd arguments: never fail the caller
            return packet(*args, **kwargs)
        if rec.level < FULL:
            rec.overhead_ns += perf_ns() - t_in
            return packet(*args, **kwargs)
        nbytes, dtype = payload(args[0] if args else kwargs.get("input", kwargs.get("inputs")))
        t = perf_ns()
        op = Op(opname, g, seq, rec.step, rec.microbatch, nbytes, dtype, -1, t)
        cuda = rec.cuda
        if cuda is not None:
            op.ev0 = cuda.event()
        stack = rec.stack
        stack.append(("collective", opname, g.group_id, g.axis, seq, -1, t, op.step))
        rec.overhead_ns += perf_ns() - t_in
        try:
            out = packet(*args, **kwargs)
        except BaseException:
            op.state = "failed"
            op.t_done = perf_ns()
            rec.enqueue_op(("C", op))
            raise
        finally:
            stack.pop()
        t_out = perf_ns()
        rec.calls += 1
        _track(rec, op, out)
        rec.overhead_ns += perf_ns() - t_out
        return out


def _track(rec: Recorder, op: Op, out: Any) -> None:
    """Remember the outputs whose ``wait_tensor`` completes ``op`` (bounded)."""
    pending = rec.functional_pending
    outs = out if isinstance(out, (list, tuple)) else (out,)
    if len(pending) + len(outs) > rec.config.max_pending:
        rec.dropped += 1
        rec.enqueue_op(("C", op))  # recorded as started; its end is not tracked
        return
    for t in outs:
        try:
            key = t.data_ptr()
            ref = weakref.ref(t)
        except (AttributeError, TypeError, RuntimeError):
            continue
        if not key:  # no storage (empty tensor): nothing to match a wait by
            continue
        old = pending.get(key)
        pending[key] = (ref, op)
        if old is not None and old[1] is not op and old[1].t_done < 0 and not old[1].work:
            old[1].work = True  # memory reused: the old op's wait can no longer be matched
            rec.enqueue_op(("C", old[1]))


class TracedWait:
    """A tracing proxy of ``torch.ops._c10d_functional.wait_tensor``."""

    def __init__(self, packet: Any) -> None:
        self._packet = packet
        self.__name__ = getattr(packet, "__name__", "wait_tensor")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._packet, name)

    def __call__(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        rec = state.recorder
        if rec is None:
            return self._packet(tensor, *args, **kwargs)
        try:
            entry = rec.functional_pending.pop(tensor.data_ptr(), None)
        except Exception:
            entry = None
        if entry is None:
            return self._packet(tensor, *args, **kwargs)
        op = entry[1]
        if op.t_done >= 0:  # another output of the same (coalesced) op completed it
            return self._packet(tensor, *args, **kwargs)
        t_in = perf_ns()
        stack = rec.stack
        stack.append(("collective", op.name, op.group.group_id, op.group.axis, op.seq, -1,
                      op.t_enq, op.step))
        rec.overhead_ns += perf_ns() - t_in
        try:
            result = self._packet(tensor, *args, **kwargs)
        except BaseException:
            op.state = "failed"
            op.t_done = perf_ns()
            rec.enqueue_op(("C", op))
            raise
        finally:
            stack.pop()
        t1 = op.t_done = perf_ns()
        if rec.cuda is not None:
            op.ev1 = rec.cuda.event()
        rec.enqueue_op(("C", op))
        rec.overhead_ns += perf_ns() - t1
        return result


def sweep(rec: Recorder) -> None:
    """Background thread: record ops whose outputs were freed without a ``wait_tensor``."""
    pending = rec.functional_pending
    if not pending:
        return
    for key, entry in list(pending.items()):
        if entry[0]() is None and pending.pop(key, None) is not None:
            op = entry[1]
            if op.t_done < 0 and not op.work:
                op.work = True  # recorded once (a coalesced op has several outputs)
                rec.enqueue_op(("C", op))


def install() -> list[str]:
    """Put tracing proxies on the functional-collective namespaces (idempotent)."""
    import torch
    import torch.distributed._functional_collectives  # noqa: F401  (registers the ops)

    done = []
    for ns_name in NAMESPACES:
        ns = getattr(torch.ops, ns_name)
        for name in [*OPS, "wait_tensor"]:
            key = (ns_name, name)
            if key in _ORIGINALS:
                done.append(f"{ns_name}.{name}")
                continue
            try:
                packet = getattr(ns, name)
            except (AttributeError, RuntimeError):
                continue
            if isinstance(packet, (TracedOp, TracedWait)):
                continue
            _ORIGINALS[key] = packet
            setattr(ns, name, TracedWait(packet) if name == "wait_tensor" else TracedOp(name, packet))
            done.append(f"{ns_name}.{name}")
    return done


def uninstall() -> None:
    """Put the real operator packets back."""
    import torch

    for (ns_name, name), packet in _ORIGINALS.items():
        setattr(getattr(torch.ops, ns_name), name, packet)
    _ORIGINALS.clear()
