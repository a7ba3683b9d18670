"""Fault injection for the reference job: the scenarios diagnosis is judged on.

Specs (``--inject``, repeatable)::

    straggler:rank=R:factor=F[:from_step=S][:until_step=U][:section=compute|dataloader]
    hang:rank=R:step=S[:where=compute|dataloader|collective|p2p|in_collective|in_p2p]
    crash:rank=R:step=S
    slowlink:group=tp|dp|pp:rank=R:delay_ms=D
    gc:rank=R:every=N:pause_ms=P

A straggler with ``until_step`` is slow from ``from_step`` up to (not including)
``until_step`` only (repeat the spec for intermittent slowdowns).

Hangs: ``compute`` blocks inside the forward pass; ``dataloader`` inside the data-loading
section (a stalled input pipeline); ``collective`` / ``p2p`` block the
rank just before it would enter its next collective / p2p op, so it never reaches it
while its peers wait there (the classic "one rank never joined"); ``in_collective`` /
``in_p2p`` enter the op and never complete it, as a broken link or NCCL fault would.

Injections act on the process only (sleeps, hangs, exits, delays below the tracing
layer). They write nothing to the telemetry: the ground truth stays with whoever
launched the job.
"""

from __future__ import annotations

import gc
import os
import random
import time
from dataclasses import dataclass
from typing import Any

CRASH_EXIT_CODE = 1
_SLEEP_CREDIT_S = 0.05
"""The most oversleeping a straggler's later stretches pay back (see FaultInjector._sleep)."""

_FIELDS: dict[str, dict[str, tuple[type, Any]]] = {
    # kind -> field -> (type, default; ... = required)
    "straggler": {"rank": (int, ...), "factor": (float, ...), "from_step": (int, 0),
                  "until_step": (int, -1), "section": (str, "compute")},
    "hang": {"rank": (int, ...), "step": (int, ...), "where": (str, "compute")},
    "crash": {"rank": (int, ...), "step": (int, ...)},
    "slowlink": {"group": (str, ...), "rank": (int, ...), "delay_ms": (float, ...)},
    "gc": {"rank": (int, ...), "every": (int, ...), "pause_ms": (float, ...)},
}
_CHOICES = {("straggler", "section"): ("compute", "dataloader"),
            ("hang", "where"): ("compute", "dataloader", "collective", "p2p", "in_collective", "in_p2p"),
            ("slowlink", "group"): ("tp", "dp", "pp")}


@dataclass(frozen=True)
class Fault:
    """One parsed ``--inject`` spec."""

    kind: str
    rank: int
    params: tuple[tuple[str, Any], ...]
    spec: str

    def get(self, name: str) -> Any:
        return dict(self.params)[name]


def parse_fault(spec: str, world_size: int | None = None) -> Fault:
    """Parse one spec; ``ValueError`` names the bad part and the accepted values."""
    kind, *parts = spec.strip().split(":")
    if kind not in _FIELDS:
        raise ValueError(f"--inject {spec!r}: unknown fault {kind!r}; expected one of {sorted(_FIELDS)}")
    fields = _FIELDS[kind]
    values: dict[str, Any] = {}
    for part in parts:
        key, eq, raw = part.partition("=")
        if not eq or key not in fields:
            raise ValueError(f"--inject {spec!r}: bad field {part!r}; {kind} takes {'/'.join(fields)}")
        typ = fields[key][0]
        try:
            value = typ(raw)
        except ValueError:
            raise ValueError(f"--inject {spec!r}: {key} must be {typ.__name__}, got {raw!r}") from None
        values[key] = value
    for key, (_, default) in fields.items():
        if key not in values:
            if default is ...:
                raise ValueError(f"--inject {spec!r}: missing {key}=")
            values[key] = default
    for (k, key), allowed in _CHOICES.items():
        if k == kind and values[key] not in allowed:
            raise ValueError(f"--inject {spec!r}: {key} must be one of {'|'.join(allowed)}, got {values[key]!r}")
    _check_ranges(spec, kind, values, world_size)
    return Fault(kind, values["rank"], tuple(sorted(values.items())), spec)


def _check_ranges(spec: str, kind: str, v: dict[str, Any], world_size: int | None) -> None:
    if v["rank"] < 0 or (world_size is not None and v["rank"] >= world_size):
        bound = f" [0, {world_size})" if world_size is not None else " >= 0"
        raise ValueError(f"--inject {spec!r}: rank={v['rank']} out of range{bound}")
    checks = {"factor": lambda x: x >= 1.0, "from_step": lambda x: x >= 0,
              "step": lambda x: x >= 0, "delay_ms": lambda x: x > 0,
              "every": lambda x: x >= 1, "pause_ms": lambda x: x > 0}
    for key, ok in checks.items():
        if key in v and not ok(v[key]):
            raise ValueError(f"--inject {spec!r}: {key}={v[key]} out of range")


def hang_forever() -> None:
    """Block this thread until the process is killed (signals still work)."""
    while True:
        time.sleep(3600)


class _HungWork:
    """An async work handle that never completes."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        hang_forever()
        return False

    def is_completed(self) -> bool:
        return False


_COMM_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
             "reduce_scatter_tensor", "broadcast", "barrier", "send", "recv", "batch_isend_irecv")


def _burn_cpu(cpu_s: float) -> None:
    """Keep this thread busy until it has used ``cpu_s`` more seconds of CPU time."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


class FaultInjector:
    """The faults that apply to one rank, and the points where the trainer calls them."""

    def __init__(self, faults: list[Fault], rank: int, group_axes: dict[int, str] | None = None,
                 device: Any = None) -> None:
        self.faults = [f for f in faults if f.rank == rank]
        self.rank, self.step = rank, 0
        self.group_axes = group_axes or {}
        self.device = device
        self._patched: dict[str, Any] = {}
        self._entry_patched: dict[str, tuple[Any, Any]] = {}
        self._hang_armed = True
        self._sleep_debt_s = 0.0
        """Injected delay still owed (> 0) or already overslept (< 0, at most
        ``_SLEEP_CREDIT_S``): see :meth:`_sleep`."""
        self._comm_spans: list[tuple[float, float]] = []
        """(start, end) perf_counter times of the blocking comm calls since the open section
        began (a straggler's stretch leaves them out: see :meth:`stretch`)."""

    def _of(self, kind: str) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind]

    # ---- called by the training loop ----------------------------------------------------
    def step_start(self, step: int) -> None:
        self.step = step
        for f in self._of("crash"):
            if step >= f.get("step"):
                os._exit(CRASH_EXIT_CODE)  # a hard crash: no cleanup, no flush

    def in_forward(self, step: int, microbatch: int, num_microbatches: int) -> None:
        for f in self._of("hang"):
            if f.get("where") == "compute" and step >= f.get("step") and microbatch == 0:
                hang_forever()
        for f in self._of("gc"):
            every = f.get("every")
            if step > 0 and step % every == 0:
                pick = random.Random(self.rank * 7919 + step).randrange(num_microbatches)
                if microbatch == pick:
                    self._gc_pause(f.get("pause_ms") / 1e3)

    def _gc_pause(self, pause_s: float) -> None:
        """A ``gc.collect()`` topped up with busy work to ``pause_s`` of wall time: a
        collector runs on the CPU (a sleeping thread would look like one the host took
        the core from, which the diagnosis tells apart); on a crowded host the thread
        gets less CPU time than that."""
        end = time.perf_counter() + pause_s
        gc.collect()
        while time.perf_counter() < end:
            pass

    def stretch(self, step: int, section: str, started: float, started_cpu: float | None = None) -> None:
        """Make a section's own work F times as long (call at its end with its perf_counter
        start and, for compute on a CPU device, its ``time.thread_time()`` start).

        Compute on a CPU device is stretched with work, not sleep: the thread burns
        ``(F - 1)`` times the CPU time the section used, as a slow device would (its own
        work takes longer on the device; a sleeping rank's device would be idle). Data
        loading, and compute on CUDA (where the device time is the kernels'), sleep.

        Own work is the section's wall time minus the time spent in blocking communication
        inside it (a forward pass holds TP all-reduces, which wait for the slowest peer):
        stretching the wall time instead made the injected delay grow with the time spent
        *waiting for others* - a "1.5x" straggler on a loaded CPU machine, whose sections
        are mostly waits, ran its own compute 5-8x as long as its peers'.
        """
        if section == "dataloader":
            for f in self._of("hang"):
                if f.get("where") == "dataloader" and step >= f.get("step"):
                    hang_forever()
        for f in self._of("straggler"):
            until = f.get("until_step")
            if f.get("section") == section and step >= f.get("from_step") and (until < 0 or step < until):
                if self.device is not None and self.device.type == "cuda":
                    import torch

                    torch.cuda.synchronize(self.device)
                elif section == "compute" and started_cpu is not None:
                    _burn_cpu((time.thread_time() - started_cpu) * (f.get("factor") - 1.0))
                    continue
                now = time.perf_counter()
                waited = sum(max(0.0, min(b, now) - max(a, started)) for a, b in self._comm_spans)
                self._sleep(max(now - started - waited, 0.0) * (f.get("factor") - 1.0))
        self._comm_spans = [s for s in self._comm_spans if s[1] > time.perf_counter()]

    def _sleep(self, want_s: float) -> None:
        """Add ``want_s`` to the delay owed and sleep off what is owed.

        A section's own work is often a few ms, so its stretch is a ms or two, while a
        sleep on an oversubscribed CPU wakes 5-25 ms late: sleeping each stretch as asked
        made a "1.6x" straggler 2.2-3.1x. The lateness is carried as credit instead, and
        the next stretches sleep only once it is spent, so the injected delay summed over
        a step matches the factor. The credit is capped (``_SLEEP_CREDIT_S``): one long
        descheduling does not cancel the stretches of many steps.
        """
        self._sleep_debt_s += want_s
        if self._sleep_debt_s <= 0.0:
            return
        t0 = time.perf_counter()
        time.sleep(self._sleep_debt_s)
        self._sleep_debt_s = max(self._sleep_debt_s - (time.perf_counter() - t0), -_SLEEP_CREDIT_S)

    # ---- below the tracing layer ------------------------------------------------------
    def install_comm(self) -> None:
        """Patch ``torch.distributed`` for slow links and comm hangs (before hooks init)."""
        if not (self._of("slowlink") or self._of("straggler") or self._hangs("in_collective", "in_p2p")):
            return
        self._patch(self._wrap)

    def install_entry_hangs(self) -> None:
        """Patch ``torch.distributed`` ABOVE the tracing layer (call after hooks init) for
        hangs before a collective/p2p op: the rank never enters the op, so no record of
        it exists on this rank while its peers wait inside it."""
        if not self._hangs("collective", "p2p"):
            return
        import torch.distributed as dist

        for name in _COMM_OPS:
            fn = getattr(dist, name, None)
            if fn is not None:
                wrapper = self._wrap_entry(name, fn)
                self._entry_patched[name] = (fn, wrapper)
                setattr(dist, name, wrapper)

    def _hangs(self, *wheres: str) -> bool:
        return any(f.get("where") in wheres for f in self._of("hang"))

    def _patch(self, wrapper: Any) -> None:
        import torch.distributed as dist

        for name in _COMM_OPS:
            fn = getattr(dist, name, None)
            if fn is not None and name not in self._patched:
                self._patched[name] = fn
                setattr(dist, name, wrapper(name, fn))

    def _wrap_entry(self, name: str, fn: Any) -> Any:
        is_p2p = name in ("send", "recv", "batch_isend_irecv")

        def entry(*args: Any, **kwargs: Any) -> Any:
            for f in self._of("hang"):
                if self.step >= f.get("step") and f.get("where") == ("p2p" if is_p2p else "collective"):
                    hang_forever()
            return fn(*args, **kwargs)

        entry.__wrapped__ = fn  # type: ignore[attr-defined]
        return entry

    def uninstall_comm(self) -> None:
        import torch.distributed as dist

        for name, (prev, wrapper) in self._entry_patched.items():
            if getattr(dist, name, None) is wrapper:  # unless the hooks already unpatched
                setattr(dist, name, prev)
        self._entry_patched.clear()
        for name, fn in self._patched.items():
            setattr(dist, name, fn)
        self._patched.clear()

    def _wrap(self, name: str, fn: Any) -> Any:
        from fleetscope.trainer_hooks.collectives import _SPECS, _arg

        is_p2p = name in ("send", "recv", "batch_isend_irecv")

        def injected(*args: Any, **kwargs: Any) -> Any:
            if name == "batch_isend_irecv":
                ops = args[0] if args else kwargs["p2p_op_list"]
                group = ops[0].group if ops else None
                is_async = True
            else:
                group = _arg(args, kwargs, _SPECS[name][2])
                async_spec = _SPECS[name][3]
                is_async = async_spec is not None and bool(_arg(args, kwargs, async_spec, False))
            axis = self.group_axes.get(id(group), "world")
            for f in self._of("slowlink"):
                if f.get("group") == axis:
                    time.sleep(f.get("delay_ms") / 1e3)
            for f in self._of("hang"):
                where = f.get("where")
                if self.step >= f.get("step") and where == ("in_p2p" if is_p2p else "in_collective"):
                    if name == "batch_isend_irecv":
                        return [_HungWork() for _ in ops]
                    if is_async:
                        return _HungWork()
                    hang_forever()
            if not self._of("straggler"):
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:  # the time this call blocked, left out of a stretched section
                self._comm_spans.append((t0, time.perf_counter()))
                del self._comm_spans[:-256]

        injected.__wrapped__ = fn  # type: ignore[attr-defined]
        return injected
