"""Local ranks: what the agent knows about each rank process on this host.

Filled from the ``rank.json`` the hooks write next to the segments (pid, host,
local_rank, job, rank) and from the records the agent reads (last record time, last
step, current in-flight op). Heartbeats, GPU->rank mapping and log scanning read it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from fleetscope import spool

INFO_RECHECK_S = 0.5
"""How often a rank's ``rank.json`` is looked at again (it changes when a rank restarts)."""
FINAL_STEP_SEGMENTS = 2
"""Segments read back from the newest for a dead rank's final step (:func:`spool_final_step`)."""


@dataclass
class RankState:
    job: str
    rank: int
    directory: Path
    pid: int = -1
    local_rank: int = -1
    host: str = ""
    cuda_visible_devices: str | None = None
    last_record_ns: int = -1
    """Latest time in any record of the rank."""
    last_progress_ns: int = -1
    """Latest time in a record other than ``inflight`` (a completed op or section)."""
    last_step: int = -1
    inflight_op: str = ""
    inflight_ts_ns: int = -1
    acked_through_ns: int = 0
    """Newest in-flight time whose batch and every batch before it are acknowledged (0: none
    yet): the server certifies the rank's silence only up to here."""
    info_mtime_ns: int = -1
    info_checked: float = 0.0
    final_step: int = -1
    """The last step in the rank's spool, read once its process is found gone (-1: none)."""
    final_pid: int = -1
    """The process whose spool ``final_step`` was read for (a restarted rank reads again)."""


def pid_alive(pid: int) -> bool:
    """Whether a process exists (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def rank_from_dirname(name: str) -> int | None:
    if name.startswith("rank-"):
        try:
            return int(name[5:])
        except ValueError:
            return None
    return None


class RankRegistry:
    """Thread-safe table of the local ranks, keyed by (job, rank)."""

    def __init__(self, host: str | None = None):
        self.host = host or socket.gethostname()
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, int], RankState] = {}

    def get(self, job: str, rank: int, directory: Path) -> RankState:
        key = (job, rank)
        with self._lock:
            st = self._ranks.get(key)
            if st is None:
                st = self._ranks[key] = RankState(job, rank, Path(directory))
        self._refresh_info(st)
        return st

    def all(self) -> list[RankState]:
        with self._lock:
            ranks = list(self._ranks.values())
        for st in ranks:
            self._refresh_info(st)
        return sorted(ranks, key=lambda s: (s.job, s.rank))

    def writer_alive(self, st: RankState) -> bool:
        """False only when rank.json names a dead process on this host."""
        if st.pid <= 0 or (st.host and st.host != self.host):
            return True
        return pid_alive(st.pid)

    def heartbeat_step(self, st: RankState, alive: bool) -> int:
        """The last step a heartbeat reports for the rank.

        While the process lives: the last step the shipper has read. Once it is gone:
        the last step in its spool, read from the spool's tail the first time (O(one
        segment), once per exit). The server judges a job all of whose ranks died with
        some behind the others as a crash of those, but only once the store holds every
        step the heartbeats report; a heartbeat that saw the exits before the shipper
        read the final steps reported the steps read so far (bench, 2026-12-07: a clean
        2x2x2 job, seven ranks at step 18 and one at 19, paged as a hang of seven).
        The exit itself is reported at once, so the order in which ranks died holds."""
        if alive:
            return st.last_step
        if st.final_pid != st.pid:
            final = spool_final_step(st.directory)
            with self._lock:
                st.final_step, st.final_pid = final, st.pid
        return max(st.last_step, st.final_step)

    def observe(self, job: str, rank: int, directory: Path, record: str, last_ns: int,
                last_step: int = -1, inflight: tuple[int, str] | None = None) -> None:
        """Update a rank's liveness facts from records just read from its spool."""
        st = self.get(job, rank, directory)
        with self._lock:
            st.last_record_ns = max(st.last_record_ns, last_ns)
            if record != "inflight":
                st.last_progress_ns = max(st.last_progress_ns, last_ns)
            if last_step > st.last_step:
                st.last_step = last_step
            if inflight is not None and inflight[0] >= st.inflight_ts_ns:
                st.inflight_ts_ns, st.inflight_op = inflight

    def acked(self, through: dict[tuple[str, int], int]) -> None:
        """Ranks' in-flight times now covered by the acknowledged prefix of the batches."""
        with self._lock:
            for key, ts in through.items():
                st = self._ranks.get(key)
                if st is not None and ts > st.acked_through_ns:
                    st.acked_through_ns = ts

    def _refresh_info(self, st: RankState) -> None:
        now = time.monotonic()
        if now - st.info_checked < INFO_RECHECK_S:
            return
        st.info_checked = now
        path = st.directory / "rank.json"
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return
        if mtime == st.info_mtime_ns:
            return
        info = spool.read_rank_info(st.directory)
        if not info:
            return
        with self._lock:
            st.info_mtime_ns = mtime
            st.pid = int(info.get("pid", -1))
            st.local_rank = int(info.get("local_rank", -1))
            st.host = str(info.get("host", ""))
            cvd = info.get("cuda_visible_devices")
            st.cuda_visible_devices = None if cvd is None else str(cvd)


def spool_final_step(directory: Path) -> int:
    """The highest step of the ``steps`` records in a rank's newest spool segments (-1:
    none). Only a frame's schema is read unless it holds steps; a damaged frame is
    skipped."""
    for seg in reversed(spool.list_segments(directory)[-FINAL_STEP_SEGMENTS:]):
        best = -1
        try:
            frames = list(spool.read_frames(seg, sealed=False))
        except (OSError, spool.SpoolError):
            continue
        for fr in frames:
            if fr.payload is None:
                continue
            try:
                with ipc.open_stream(pa.py_buffer(fr.payload)) as r:
                    if (r.schema.metadata or {}).get(b"fleetscope.record") != b"steps":
                        continue
                    col = r.read_all().column("step")
            except (pa.ArrowException, OSError, KeyError):
                continue
            if len(col):
                best = max(best, int(pc.max(col).as_py()))
        if best >= 0:
            return best
    return -1


def current_inflight(st: RankState) -> str:
    """The rank's in-flight op, '' once a later record shows it moved on."""
    if st.inflight_op and st.inflight_ts_ns > st.last_progress_ns:
        return st.inflight_op
    return ""


def describe_inflight(kind: str, op: str, group_id: str, seq: int, peer: int) -> str:
    """One-line description of an in-flight record, '' when the rank is idle."""
    if kind in ("", "idle"):
        return ""
    parts = [f"{kind}:{op}" if op else kind]
    if group_id:
        parts.append(group_id)
    if seq >= 0:
        parts.append(f"seq={seq}")
    if peer >= 0:
        parts.append(f"peer={peer}")
    return " ".join(parts)
