"""Which ranks run with reduced instrumentation (runtime control), from their telemetry.

While a rank's hooks run below ``full`` they write in-flight rows of kind ``untraced``
(``op`` = the level: off | steps | sections) instead of naming the op they are in, and
below ``steps`` no ``steps`` rows at all. A detector that reads silence as a stall
must treat those ranks as "not observable", not as stuck or idle. This module is pure
(frames in, sets out) so the hang and progress rules can call it.
"""

from __future__ import annotations

import pandas as pd

UNTRACED = "untraced"


def untraced_ranks(inflight: pd.DataFrame) -> dict[int, str]:
    """Rank -> level for the ranks whose latest in-flight row says ops are not traced."""
    if inflight is None or inflight.empty or "kind" not in inflight:
        return {}
    latest = inflight[inflight["rank"] >= 0].sort_values("ts_ns").groupby("rank").tail(1)
    rows = latest[latest["kind"] == UNTRACED]
    return {int(r): str(op) for r, op in zip(rows["rank"], rows["op"])}


def steps_unobservable(inflight: pd.DataFrame) -> set[int]:
    """Ranks that write no ``steps`` rows now (level ``off``): a step stall is unknowable."""
    return {r for r, level in untraced_ranks(inflight).items() if level == "off"}
