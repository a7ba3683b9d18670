"""Runtime control: bring each job's instrumentation level from the server to the hooks.

A thread of the agent asks the server for the level of every job in the spool
(``GET /api/v1/jobs/{job}/instrumentation``) every ``control_poll_s`` and, when the
server's version is newer than the one on disk, writes ``<spool>/<job>/control.json``
atomically; the hooks' background thread picks it up within its poll period. The
trainer never talks to the network, and an unreachable server changes nothing.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from fleetscope.config import API_PREFIX
from fleetscope.control import control_path, level_index, read_control, write_control

log = logging.getLogger("fleetscope.agent")


class ControlPoller(threading.Thread):
    """Polls the server for the jobs found in ``spool`` and writes their control files."""

    def __init__(self, client: Any, spool: Path, stop_event: threading.Event,
                 interval_s: float = 2.0, job: str | None = None) -> None:
        super().__init__(name="fleetscope-control", daemon=True)
        self.client, self.spool, self.stop_event = client, Path(spool), stop_event
        self.interval_s, self.job = float(interval_s), job
        self.errors = 0
        self.written = 0

    def jobs(self) -> list[str]:
        """Jobs with rank directories in the spool (or the one job the agent ships)."""
        if self.job is not None:
            return [self.job]
        try:
            return sorted(p.name for p in self.spool.iterdir()
                          if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
                          and any(p.glob("rank-*")))
        except OSError:
            return []

    def poll_once(self) -> None:
        for job in self.jobs():
            try:
                r = self.client.get(f"{API_PREFIX}/jobs/{job}/instrumentation")
            except Exception as e:  # server unreachable: keep what is on disk
                self.errors += 1
                log.debug("control poll for %s failed: %r", job, e)
                continue
            if r.status_code != 200:
                continue
            try:
                doc = r.json()
                level_index(doc["level"])
                for name in (doc.get("ranks") or {}).values():
                    level_index(name)
                self._write(job, doc)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                self.errors += 1
                log.warning("control for job %s not applied: %s", job, e)

    def _write(self, job: str, doc: dict[str, Any]) -> None:
        path = control_path(self.spool, job)
        try:
            current = read_control(path)
        except (OSError, ValueError):
            current = {}
        want = {"level": doc["level"], "ranks": doc.get("ranks") or {},
                "version": int(doc.get("version", 0))}
        if current == want:
            return
        if int(current.get("version", -1)) > want["version"]:
            return  # never go back to an older setting
        write_control(path, want)
        self.written += 1
        log.info("job %s: instrumentation level %s%s (version %d)", job, want["level"],
                 f", ranks {want['ranks']}" if want["ranks"] else "", want["version"])

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.poll_once()
            self.stop_event.wait(self.interval_s)
