"""Environment variables read outside the server's Settings, declared in one place.

The server process is configured by :class:`fleetscope.server.settings.Settings`
(pydantic-settings, ``FLEETSCOPE_<FIELD>``). The other components (dashboard, agent,
kernels, command-line clients) cannot import the server (see the dependency rules), so
the variables they read are declared here, each once with its default, parser and
meaning, and read through :meth:`EnvVar.get`. ``tests/test_settings_once.py`` checks that
every ``FLEETSCOPE_*`` name in the sources is either a Settings field or declared here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def positive_float(name: str, raw: str) -> float:
    """``raw`` as a float > 0; ``ValueError`` naming the variable otherwise."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be a positive number")
    return value


def text(name: str, raw: str) -> str:
    return raw


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, default, parser and meaning."""

    name: str
    default: T
    parse: Callable[[str, str], T]
    doc: str

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        """The parsed value, or the default when unset or blank."""
        raw = (os.environ if environ is None else environ).get(self.name, "").strip()
        return self.parse(self.name, raw) if raw else self.default


UI_REFRESH_S: EnvVar[float] = EnvVar(
    "FLEETSCOPE_UI_REFRESH_S", 5.0, positive_float,
    "live-update interval of the dashboard pages in seconds (mounted or standalone)",
)  # fmt: skip
PEAK_TFLOPS: EnvVar[float | None] = EnvVar(
    "FLEETSCOPE_PEAK_TFLOPS", None, positive_float,
    "self-check: dense peak of the matmul dtype in TFLOP/s, overriding the datasheet",
)  # fmt: skip
PEAK_MEM_GBPS: EnvVar[float | None] = EnvVar(
    "FLEETSCOPE_PEAK_MEM_GBPS", None, positive_float,
    "self-check: nominal memory bandwidth in GB/s (10^9 bytes/s), overriding the datasheet",
)  # fmt: skip
TOKEN: EnvVar[str | None] = EnvVar(
    "FLEETSCOPE_TOKEN", None, text,
    "bearer token of the command-line clients and the agent (prefer FLEETSCOPE_TOKEN_FILE)",
)  # fmt: skip
TOKEN_FILE: EnvVar[str | None] = EnvVar(
    "FLEETSCOPE_TOKEN_FILE", None, text, "file whose first line is the bearer token",
)  # fmt: skip
SERVER: EnvVar[str | None] = EnvVar(
    "FLEETSCOPE_SERVER", None, text, "server base URL of the RCA command line",
)  # fmt: skip
SPOOL: EnvVar[str | None] = EnvVar(
    "FLEETSCOPE_SPOOL", None, text, "spool directory the trainer hooks write (default ./.fleetscope/spool)",
)  # fmt: skip
NODE: EnvVar[str | None] = EnvVar(
    "FLEETSCOPE_NODE", None, text, "node name the agent reports (before NODE_NAME, POD_NAME, ...)",
)  # fmt: skip

ALL: tuple[EnvVar[Any], ...] = (UI_REFRESH_S, PEAK_TFLOPS, PEAK_MEM_GBPS, TOKEN, TOKEN_FILE,
                                SERVER, SPOOL, NODE)  # fmt: skip
"""Every variable declared here (docs/configuration.md lists them)."""
