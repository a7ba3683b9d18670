"""The instrumentation level in the telemetry, as the detectors read it."""

from __future__ import annotations

import pandas as pd
from fleetscope.server.diagnosis.instrumentation import steps_unobservable, untraced_ranks


def _row(rank, ts, kind, op=""):
    return {"rank": rank, "ts_ns": ts, "kind": kind, "op": op}


def test_latest_row_per_rank_decides():
    df = pd.DataFrame([
        _row(0, 1, "untraced", "off"), _row(0, 2, "collective", "all_reduce"),  # back to full
        _row(1, 1, "idle"), _row(1, 2, "untraced", "off"),
        _row(2, 3, "untraced", "sections"),
    ])
    assert untraced_ranks(df) == {1: "off", 2: "sections"}
    assert steps_unobservable(df) == {1}
    assert untraced_ranks(pd.DataFrame()) == {}
