"""Optional components found by name, so one component can use another without importing it.

The CLI dispatcher finds the subcommands of the installed components the same way
(:data:`fleetscope.cli.SUBCOMMAND_MODULES`). A name here is an extension point: the
component that offers it may be missing from an install (the trainer's site-packages
need not hold the self-check kernels), and the caller then says what to install instead
of failing on an import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

PREFLIGHT = "fleetscope.kernels.preflight:check_before_training"
"""The quick self-check a trainer runs on every rank before step 0 (``--preflight``)."""
DASHBOARD_MOUNT = "fleetscope.dashboard.mount:mount_dashboard"
"""Mounts the Dash UI at ``/ui`` of the server's app (``fleetscope server``); the UI
itself reaches the server over REST only."""


class ComponentMissing(RuntimeError):
    """The component offering an extension point is not installed."""


def resolve(ref: str) -> Callable[..., Any]:
    """The function ``module:attr`` names; :class:`ComponentMissing` when the module is
    not part of this install (any other import error propagates)."""
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise ComponentMissing(f"{module_name} is not installed (needed for {attr})") from None
        raise
    return getattr(module, attr)
