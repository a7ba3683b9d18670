"""Runtime control of the hooks: the instrumentation level, set from outside the trainer.

The server keeps each job's level (``PUT /api/v1/jobs/{job}/instrumentation``); the
host's agent writes it into the spool as ``<spool>/<job>/control.json``; the hooks'
background thread reads that file when it changes (an ``os.stat`` per poll, about
every 0.5 s) and switches the level the training thread checks. The trainer itself
never makes a network call, and a missing or unreadable file leaves the level as it is.

Levels, each including the ones before it:

* ``off``: nothing is recorded (collectives are still numbered, one integer add, so
  sequence numbers stay aligned across ranks when tracing comes back);
* ``steps``: step markers;
* ``sections``: timed sections;
* ``full``: collectives and p2p ops too (the default).

The level in force is recorded in the telemetry (``metrics`` rows named
``hooks.instrumentation_level`` with the level's index, on every change and every
metrics period; in-flight rows of kind ``untraced`` while ops are not traced), so a
gap in the data is explained by the level rather than taken for a hang.
"""

from __future__ import annotations

import os
from pathlib import Path

from fleetscope.control import (  # noqa: F401  (re-exported for the hooks' users)
    CONTROL_FILE,
    FULL,
    LEVELS,
    OFF,
    SECTIONS,
    STEPS,
    control_path,
    level_for_rank,
    level_index,
    read_control,
    write_control,
)


class ControlFile:
    """Watches one control file for the background thread (never raises)."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = None if path is None else Path(path)
        self._seen: tuple[int, int, int] | None = None
        self.errors = 0

    def poll(self, rank: int) -> int | None:
        """The level the file now sets for ``rank`` if it changed since the last poll."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._seen:
            return None
        self._seen = key
        try:
            return level_for_rank(read_control(self.path), rank)
        except (OSError, ValueError):
            self.errors += 1
            return None
