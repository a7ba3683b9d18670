"""Runtime-control file format shared by the server, the agent and the hooks.

The server keeps each job's instrumentation level; the agent writes it into the spool
as ``<spool>/<job>/control.json``; the hooks' background thread reads it (see
``fleetscope.trainer_hooks.control``). The document::

    {"level": "full", "ranks": {"3": "off"}, "version": 7}

``level`` applies to every rank, ``ranks`` overrides it for the ranks it names,
``version`` grows with every change (the agent writes only newer versions).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

OFF, STEPS, SECTIONS, FULL = 0, 1, 2, 3
LEVELS: tuple[str, ...] = ("off", "steps", "sections", "full")
"""Level names by index; each level records what the ones before it do, and more."""
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
    """The level a control document sets for ``rank`` (``None``: it sets none)."""
    per_rank = doc.get("ranks") or {}
    if isinstance(per_rank, dict) and str(rank) in per_rank:
        return level_index(per_rank[str(rank)])
    name = doc.get("level")
    return None if name is None else level_index(name)


def write_control(path: str | os.PathLike, doc: dict[str, Any]) -> None:
    """Write a control file atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


def read_control(path: str | os.PathLike) -> dict[str, Any]:
    """Read a control file (``ValueError``/``OSError`` when it is not one)."""
    path = Path(path)
    if path.stat().st_size > MAX_CONTROL_BYTES:
        raise ValueError(f"control file over {MAX_CONTROL_BYTES} bytes")
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict):
        raise ValueError("control file is not a JSON object")
    return doc
