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

import json
import os
from pathlib import Path
from typing import Any

OFF, STEPS, SECTIONS, FULL = 0, 1, 2, 3
LEVELS: tuple[str, ...] = ("off", "steps", "sections", "full")
"""Level names by index."""
CONTROL_FILE = "control.json"
MAX_CONTROL_BYTES = 1 << 20


def level_index(name: str) -> int:
    """The index of a level name; ``ValueError`` naming the allowed values otherwise."""
    try:
        return LEVELS.index(str(name))
    except ValueError:
        raise ValueError(f"level {name!r} is not one of {', '.join(LEVELS)}") from None


def control_path(spool: str | os.PathLike, job: str) -> Path:
    """Where the agent writes a job's control file."""
    return Path(spool) / job / CONTROL_FILE


def level_for_rank(doc: dict[str, Any], rank: int) -> int | None:
    """The level a control document sets for ``rank`` (``None``: it sets none).

    The document is ``{"level": name, "ranks": {"<rank>": name, ...}}``; a rank listed
    under ``ranks`` takes its own level, every other rank the job-wide one.
    """
    per_rank = doc.get("ranks") or {}
    name = per_rank.get(str(rank), doc.get("level")) if isinstance(per_rank, dict) else doc.get("level")
    if name is None:
        return None
    return level_index(name)


def write_control(path: str | os.PathLike, doc: dict[str, Any]) -> None:
    """Write a control file atomically (temp file + rename), as the agent does."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


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
            if st.st_size > MAX_CONTROL_BYTES:
                raise ValueError(f"control file over {MAX_CONTROL_BYTES} bytes")
            doc = json.loads(self.path.read_text())
            if not isinstance(doc, dict):
                raise ValueError("control file is not a JSON object")
            return level_for_rank(doc, rank)
        except (OSError, ValueError):
            self.errors += 1
            return None
