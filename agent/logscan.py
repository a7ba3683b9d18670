"""Log scanning: tail trainer stdout/stderr files, ship matched lines as ``log_events``.

Files come from ``--log`` and from the convention ``<spool>/<job>/rank-*/*.log`` (the
reference trainer writes each rank's output there). The rank is taken from the
``rank-NNNNN`` directory, or from a ``rankN`` in the file name, else -1.

Each match carries up to ``context_lines`` lines before and after it (a match is held
back until the lines after it arrive or ``flush_after_s`` passes). A Python traceback
becomes one event: message = the exception line, context = the whole traceback.
Offsets are kept durably, after the events are in the outbox, so a restart resumes
where the last scan ended.
"""

from __future__ import annotations

import glob
import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.patterns import TRACEBACK_START, match_line
from fleetscope.agent.ranks import rank_from_dirname

from fleetscope import spool

log = logging.getLogger("fleetscope.agent")
MAX_LINE = 4096
MAX_TRACEBACK_LINES = 200
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass
class _Pending:
    row: dict[str, Any]
    after: list[str] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


@dataclass
class _FileState:
    path: Path
    job: str
    rank: int
    ino: int = -1
    offset: int = 0
    partial: bytes = b""
    before: deque = field(default_factory=lambda: deque(maxlen=5))
    pending: list[_Pending] = field(default_factory=list)
    traceback: list[str] | None = None
    tb_since: float = 0.0


def rank_of_log(path: Path) -> int:
    r = rank_from_dirname(path.parent.name)
    if r is not None:
        return r
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else -1


class LogScanner:
    """Scans log files incrementally; :meth:`scan_once` is one pass over all of them."""

    def __init__(self, outbox: Outbox, offsets: OffsetStore, host: str, spool: Path,
                 extra: list[Path] | tuple[Path, ...] = (), job: str | None = None, context_lines: int = 5,
                 flush_after_s: float = 1.0):
        self.outbox = outbox
        self.offsets = offsets
        self.host = host
        self.spool = Path(spool)
        self.extra = [Path(p) for p in extra]
        self.job = job
        self.context_lines = context_lines
        self.flush_after_s = flush_after_s
        self.files: dict[Path, _FileState] = {}
        self.num_events = 0

    def discover(self) -> list[Path]:
        job = glob.escape(spool.job_dirname(self.job)) if self.job else "[!.]*"
        found = sorted(p for p in self.spool.glob(f"{job}/rank-*/*.log")
                       if not _links_inside(self.spool, p)) if self.spool.is_dir() else []
        return found + [p for p in self.extra if p not in found]

    def scan_once(self) -> int:
        """Read what was appended to every log; returns the number of events written."""
        n = 0
        for path in self.discover():
            st = self.files.get(path)
            if st is None:
                job = spool.job_from_dirname(path.parent.parent.name) if rank_from_dirname(path.parent.name) is not None else ""
                st = self.files[path] = _FileState(path, job, rank_of_log(path),
                                                   before=deque(maxlen=self.context_lines))
            try:
                n += self._scan(st)
            except OSError as e:
                log.debug("cannot read log %s: %s", path, e)
        return n

    def _scan(self, st: _FileState) -> int:
        stat = st.path.stat()
        if stat.st_ino != st.ino:
            st.ino, st.partial = stat.st_ino, b""
            st.offset = self.offsets.log_offset(str(st.path), st.ino)
        if stat.st_size < st.offset:  # truncated (log rotated by copytruncate)
            st.offset, st.partial = 0, b""
        events: list[dict[str, Any]] = []
        if stat.st_size > st.offset:
            with open(st.path, "rb") as f:
                f.seek(st.offset)
                data = f.read(8 << 20)
            st.offset += len(data)
            lines = (st.partial + data).split(b"\n")
            st.partial = lines.pop()[-MAX_LINE:]
            for raw in lines:
                self._line(st, raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r"), events)
        events += self._flush(st, by_time=True)
        if events:
            self.outbox.write("log_events", events)
            self.num_events += len(events)
        # commit only with nothing held back, so a restart never skips an unsent event
        done = st.offset - len(st.partial)
        if not st.pending and st.traceback is None and \
                self.offsets.log_offset(str(st.path), st.ino) != done:
            self.offsets.commit_log(str(st.path), st.ino, done)
        return len(events)

    def _line(self, st: _FileState, line: str, events: list[dict[str, Any]]) -> None:
        for p in st.pending:
            if len(p.after) < self.context_lines:
                p.after.append(line)
        if st.traceback is not None:
            st.traceback.append(line)
            st.before.append(line)
            # the exception line (first unindented line) ends a traceback
            if (line and not line[0].isspace()) or len(st.traceback) >= MAX_TRACEBACK_LINES:
                events.append(self._end_traceback(st, line))
            return
        if TRACEBACK_START.match(line):
            st.traceback, st.tb_since = [line], time.monotonic()
            st.before.append(line)
            return
        p = match_line(line)
        if p is not None:
            row = self._row(st, p.kind, p.severity, line.strip(), "\n".join(st.before))
            st.pending.append(_Pending(row))
        st.before.append(line)
        events += self._flush(st, by_time=False)

    def _end_traceback(self, st: _FileState, last: str) -> dict[str, Any]:
        """One event for a traceback: kind of the exception line if it matches, else traceback."""
        assert st.traceback is not None
        p = match_line(last)
        kind, severity = (p.kind, p.severity) if p is not None else ("traceback", "error")
        row = self._row(st, kind, severity, last.strip(), "\n".join(st.traceback))
        st.traceback = None
        return row

    def _flush(self, st: _FileState, by_time: bool) -> list[dict[str, Any]]:
        """Events whose after-context is complete (or, ``by_time``, waited ``flush_after_s``)."""
        out, keep = [], []
        now = time.monotonic()
        for p in st.pending:
            waited = by_time and now - p.since >= self.flush_after_s
            if len(p.after) >= self.context_lines or waited:
                if p.after:
                    p.row["context"] = (p.row["context"] + "\n>>> " + p.row["message"] + "\n"
                                        + "\n".join(p.after)).lstrip("\n")
                out.append(p.row)
            else:
                keep.append(p)
        st.pending = keep
        # a traceback cut off (the process died mid-print) is shipped as it is
        if by_time and st.traceback is not None and now - st.tb_since >= 5 * self.flush_after_s:
            out.append(self._end_traceback(st, st.traceback[-1]))
        return out

    def _row(self, st: _FileState, kind: str, severity: str, message: str,
             context: str) -> dict[str, Any]:
        return {"ts_ns": time.time_ns(), "job": st.job or (self.job or ""), "host": self.host,
                "rank": st.rank, "source": str(st.path), "kind": kind, "severity": severity,
                "message": message[:MAX_LINE], "context": context[-16384:]}


class LogScanThread(threading.Thread):
    def __init__(self, scanner: LogScanner, stop: threading.Event, period_s: float = 0.5):
        super().__init__(name="fleetscope-logscan", daemon=True)
        self.scanner = scanner
        self.stop_event = stop
        self.period_s = period_s

    def run(self) -> None:
        while not self.stop_event.wait(self.period_s):
            try:
                self.scanner.scan_once()
            except Exception as e:
                log.warning("log scan failed: %s", e)


def _links_inside(root: Path, path: Path) -> bool:
    """Whether ``path`` or a directory between it and ``root`` is a symbolic link."""
    p = path
    while p != root and p != p.parent:
        if p.is_symlink():
            return True
        p = p.parent
    return False
