"""The process-wide hook state: the active recorder, or ``None`` when disabled.

Forked children (e.g. data-loader workers) start disabled: they must not write into
the parent rank's spool segment, and the parent's background thread does not exist
in them.
"""

from __future__ import annotations

import os
from typing import Any

recorder: Any = None
"""The active :class:`~fleetscope.trainer_hooks.recorder.Recorder`, or ``None``."""


def _after_fork_in_child() -> None:
    global recorder
    recorder = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
