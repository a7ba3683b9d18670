"""The agent's CPU priority: ahead of a job that saturates the host's CPUs.

The agent uses a few percent of one core, but it must use them *when* the data is
there: a step it ships ten seconds late is a straggler found ten seconds late. On a
host whose CPUs the job keeps busy (data-loader workers, CPU ranks), the kernel's group
scheduling gives a group that mostly sleeps - the agent's session (autogroup) or its
cgroup - far less than its share whenever it wakes up: measured on a 2-core host with
8 CPU-bound ranks, the agent's threads spent ~9 s of 11 s runnable and waiting, and
steps reached the server 7.5 s after they ended (``docs/agent.md``, "CPU priority").

:func:`apply_nice` gives every thread of the agent the nice value ``nice`` and, when
the agent leads its own session under autogroup scheduling, its autogroup too (the
nice of a thread only orders the threads *inside* its group). Lowering nice below 0
needs ``CAP_SYS_NICE`` (root); without it nothing changes and the agent says so once.
Under a cgroup (a systemd service, a Kubernetes pod) the cgroup's ``cpu.weight`` rules
between groups: the unit or pod sets it (``CPUWeight=``), see ``docs/agent.md``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("fleetscope.agent")

NICE_MIN, NICE_MAX = -20, 19


@dataclass(frozen=True)
class PriorityResult:
    """What :func:`apply_nice` changed."""

    threads: int
    """Threads whose nice value was set."""
    autogroup: bool
    """Whether the session's autogroup nice was set too."""
    denied: str
    """Why it could not be done ('' if it was): the first permission error."""


def _autogroup_applies(proc_root: Path) -> bool:
    """Autogroup scheduling is on and this process leads its own session (so the
    autogroup holds the agent and nothing else of the caller's)."""
    try:
        enabled = (proc_root / "sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False
    return enabled and os.getsid(0) == os.getpid() and (proc_root / "self/autogroup").exists()


def apply_nice(nice: int, proc_root: Path = Path("/proc")) -> PriorityResult:
    """Set this process's threads (those running now and, by inheritance, those started
    later) and, where it applies, its autogroup to ``nice``. Never raises for lack of
    permission: the result says what was done."""
    if not NICE_MIN <= nice <= NICE_MAX:
        raise ValueError(f"nice must be in {NICE_MIN}..{NICE_MAX}, got {nice}")
    denied = ""
    done = 0
    try:
        tids = [int(t) for t in os.listdir(proc_root / "self/task")]
    except OSError:
        tids = [0]  # no procfs: this thread only (threads started later inherit it)
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)  # on Linux, per thread
            done += 1
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except OSError as e:
            denied = denied or f"setpriority: {e.strerror}"
            break
    group = False
    if not denied and _autogroup_applies(proc_root):
        try:
            (proc_root / "self/autogroup").write_text(str(nice))
            group = True
        except OSError as e:
            denied = f"autogroup: {e.strerror}"
    return PriorityResult(done, group, denied)


def raise_priority(nice: int, proc_root: Path = Path("/proc")) -> PriorityResult | None:
    """:func:`apply_nice` for the agent's start, logged; ``None`` (nothing done) when
    ``nice`` is 0: the agent keeps the priority it was started with."""
    if nice == 0:
        return None
    res = apply_nice(nice, proc_root)
    if res.denied:
        log.info("CPU priority: could not set nice %d (%s; lowering it needs CAP_SYS_NICE); "
                 "on a host whose CPUs the job saturates the agent may ship late (--nice 0 "
                 "silences this)", nice, res.denied)
    else:
        log.info("CPU priority: nice %d on %d thread(s)%s", nice, res.threads,
                 " and the session's autogroup" if res.autogroup else "")
    return res
