"""The result of one probe, and how it becomes a ``probes`` record."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

PROBES: Final = ("matmul", "membw", "numerics", "allreduce", "alltoall", "p2p")
"""Every probe name, as stored in the ``probes.probe`` column."""
COLLECTIVE_PROBES: Final = ("allreduce", "alltoall", "p2p")

Progress = Callable[[str], None]
"""Receives one human-readable progress line per probe step."""


def stderr_progress(message: str) -> None:
    """Default progress sink: one line on stderr, flushed (a probe may take seconds)."""
    print(f"[selfcheck] {message}", file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    """A progress sink that discards everything."""


@dataclass(frozen=True)
class ProbeResult:
    """One measurement of one probe on one device (or one process group)."""

    probe: str
    """One of :data:`PROBES`."""
    device: str
    """``cuda:0``, ``cpu``; ``gloo:2`` / ``nccl:8`` for a group; ``cuda:0->cuda:1`` for p2p."""
    device_model: str
    variant: str
    """What exactly was measured (dtype, size, kernel); only equal variants are compared."""
    value: float
    unit: str
    peak: float = math.nan
    """Nominal peak in ``unit``; NaN if unknown."""
    passed: bool = True
    detail: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def peak_fraction(self) -> float:
        """``value / peak``; NaN when the peak is unknown."""
        if math.isnan(self.peak) or self.peak <= 0:
            return math.nan
        return self.value / self.peak

    def to_record(self, *, host: str, job: str = "", ts_ns: int | None = None) -> dict[str, Any]:
        """This result as a row of the ``probes`` record type."""
        detail = {"variant": self.variant, "peak": self.peak, "duration_s": self.duration_s}
        detail.update(self.detail)
        return {
            "ts_ns": time.time_ns() if ts_ns is None else ts_ns,
            "job": job,
            "host": host,
            "device": self.device,
            "device_model": self.device_model,
            "probe": self.probe,
            "value": float(self.value),
            "unit": self.unit,
            "peak_fraction": float(self.peak_fraction),
            "passed": bool(self.passed),
            "detail": json.dumps(_json_safe(detail), sort_keys=True),
        }


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Mapping):
        return {str(k): _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def human_bytes(nbytes: int) -> str:
    """``1073741824`` -> ``1GiB``, ``262144`` -> ``256KiB`` (exact binary units)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{nbytes}B"


def failed_result(
    probe: str, device: str, device_model: str, variant: str, unit: str, error: BaseException
) -> ProbeResult:
    """A probe that raised: value 0, not passed, the error in the detail."""
    return ProbeResult(
        probe=probe,
        device=device,
        device_model=device_model,
        variant=variant,
        value=0.0,
        unit=unit,
        passed=False,
        detail={"error": f"{type(error).__name__}: {error}"},
    )


def format_table(results: list[ProbeResult]) -> str:
    """A fixed-width table of results for the terminal."""
    header = ("probe", "device", "variant", "value", "unit", "of peak", "status")
    rows = [header]
    for r in results:
        frac = r.peak_fraction
        rows.append(
            (
                r.probe,
                r.device,
                r.variant,
                f"{r.value:.4g}",
                r.unit,
                "-" if math.isnan(frac) else f"{frac:.1%}",
                "ok" if r.passed else "FAIL " + str(r.detail.get("reason", r.detail.get("error", ""))),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
