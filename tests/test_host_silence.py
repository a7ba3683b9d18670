"""``host_down`` means one host silent while the job's other hosts report: judged against
the other hosts' silence, so a server that runs behind (every host's last batch ageing
together) reports no host as down, and a dead host still is."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
from fleetscope.server.diagnosis.health import _median_of_others, detect_silence

S = 1_000_000_000
NOW = 1_800_000_000 * S


def _frames(num_hosts: int, gpus: int = 8) -> SimpleNamespace:
    hosts = {r: f"node-{r // gpus:05d}" for r in range(num_hosts * gpus)}
    return SimpleNamespace(hosts=hosts, last_seen={r: NOW - 300 * S for r in hosts}, heartbeats=None,
                           host_last_ns={}, steps=pd.DataFrame(), job_seen_ns=NOW - 1 * S, last_step=40)


def _down(findings) -> list[str]:
    return sorted(h for f in findings if f.evidence.get("what") == "host_down" for h in f.hosts)


def test_median_of_others_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    for n in range(1, 12):
        for _ in range(20):
            v = rng.integers(0, 6, n).astype(float)
            want = [np.median(np.delete(v, i)) for i in range(n)] if n > 1 else [0.0]
            assert np.allclose(_median_of_others(v), want)


def test_a_dead_host_among_reporting_hosts_is_down() -> None:
    f = _frames(16)
    seen = {h: NOW - int(0.5 * S) for h in set(f.hosts.values())}
    seen["node-00003"] = NOW - 25 * S
    assert _down(detect_silence("j", f, NOW, 20.0, seen)) == ["node-00003"]


def test_a_server_running_behind_reports_no_host_down() -> None:
    """1,536 agents queued behind an overloaded server: each host's last batch is 0-40 s old
    (uniformly), most of them beyond silent_s, none down."""
    f = _frames(1536)
    rng = np.random.default_rng(3)
    seen = {h: NOW - int(a * S) for h, a in zip(sorted(set(f.hosts.values())), rng.uniform(0, 40, 1536))}
    assert sum((NOW - t) / S >= 20 for t in seen.values()) > 500  # the old rule flagged these
    assert _down(detect_silence("j", f, NOW, 20.0, seen)) == []


def test_a_dead_host_is_found_while_the_server_runs_behind() -> None:
    f = _frames(1536)
    rng = np.random.default_rng(4)
    names = sorted(set(f.hosts.values()))
    seen = {h: NOW - int(a * S) for h, a in zip(names, rng.uniform(0, 40, 1536))}
    # the others: median about 20 s, robust sd about 15 s -> own once past 20 + 3 x 15 s
    seen[names[700]] = NOW - 70 * S
    found = detect_silence("j", f, NOW, 20.0, seen)
    assert _down(found) == [names[700]]
    assert 15 < found[0].evidence["others_silent_for_s"] < 25
    seen[names[700]] = NOW - 45 * S  # not yet: within what the others show right now
    assert _down(detect_silence("j", f, NOW, 20.0, seen)) == []


def test_two_hosts_one_dead() -> None:
    f = _frames(2)
    seen = {"node-00000": NOW - 1 * S, "node-00001": NOW - 22 * S}
    found = detect_silence("j", f, NOW, 20.0, seen)
    assert _down(found) == ["node-00001"]
    assert found[0].evidence["others_silent_for_s"] == 1.0


def _heartbeats(ages_s: list[float]) -> pd.DataFrame:
    rows = []
    for h, age in enumerate(ages_s):
        for r in range(h * 8, h * 8 + 8):
            rows.append({"host": f"node-{h:05d}", "rank": r, "ts_ns": NOW - int(age * S), "alive": 1,
                         "pid": 1000 + r})
    return pd.DataFrame(rows)


def test_heartbeats_of_every_host_ageing_together_are_ingest_lag() -> None:
    from fleetscope.server.diagnosis.health import detect_heartbeat_loss

    rng = np.random.default_rng(5)
    ages = list(rng.uniform(18, 75, 512))  # the 12,288-rank fleet bench under load: 20-70 s old
    hb = _heartbeats(ages)
    assert detect_heartbeat_loss("j", hb, NOW, stale_s=15.0) == []
    ages[100] = 200.0  # one agent really gone
    lost = detect_heartbeat_loss("j", _heartbeats(ages), NOW, stale_s=15.0)
    assert [f.hosts for f in lost] == [("node-00100",)]


def test_one_silent_agent_among_fresh_ones_is_lost() -> None:
    from fleetscope.server.diagnosis.health import detect_heartbeat_loss

    lost = detect_heartbeat_loss("j", _heartbeats([1.0, 0.5, 16.5, 2.0]), NOW, stale_s=15.0)
    assert [f.hosts for f in lost] == [("node-00002",)]


def test_a_host_whose_request_is_in_hand_is_not_silent() -> None:
    """On a starved server one write can outlast the silence thresholds, and a coalescing
    agent sends its next batch only once this one is answered: while the server still works
    on a host's request, that host and the request's jobs count as heard from now; once it
    is answered, as of then. A request in hand for over ``BUSY_MAX_S`` proves nothing."""
    import time

    import pyarrow as pa
    from fleetscope.collector import IngestWriter
    from fleetscope.collector import writer as writer_mod

    w = IngestWriter(None, None)
    try:
        t0 = time.time_ns()
        w.note_arrival("h1", {"steps": pa.table({"job": ["j1", "j1"]})}, t0 - 60 * S)
        assert w.host_seen_ns["h1"] == t0 - 60 * S and w.job_seen_ns["j1"] == t0 - 60 * S
        tok = w.busy_begin("h1")
        assert w.host_seen_ns["h1"] >= t0 and w.job_seen_ns["j1"] == t0 - 60 * S  # jobs: once decoded
        w.busy_jobs(tok, w.note_arrival("h1", {"steps": pa.table({"job": ["j1"]})}, time.time_ns()))
        assert w.host_seen_ns["h1"] >= t0 and w.job_seen_ns["j1"] >= t0
        w.busy_end(tok)
        assert w.host_seen_ns["h1"] >= t0 and w.job_seen_ns["j1"] >= t0 and not w._busy
        # a request that carried nothing (or was refused) does not refresh the host at its end
        tok = w.busy_begin("h2")
        assert "h2" in w.host_seen_ns
        w.busy_end(tok)
        assert "h2" not in w.host_seen_ns
        # a request stuck for longer than BUSY_MAX_S is the server's failure, not proof of life
        tok = w.busy_begin("h3")
        w._busy[tok] = ("h3", frozenset({"j3"}), t0 - int((writer_mod.BUSY_MAX_S + 1) * S))
        assert "h3" not in w.host_seen_ns and "j3" not in w.job_seen_ns
        # the views are copies: a caller cannot change what the server heard
        w.host_seen_ns["h9"] = 1
        assert "h9" not in w.host_seen_ns
    finally:
        w._executor.shutdown(wait=False)
        w._insert_pool.shutdown(wait=False)
