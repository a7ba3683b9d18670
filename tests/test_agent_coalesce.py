"""Coalescing of queued batches into bounded requests (``agent/coalesce.py``), and the
simulated agents that use it against a real server: fewer requests, every row stored
exactly once, a retried coalesced request stored once, nothing acknowledged lost when
the server is killed mid-stream."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pyarrow as pa
import pytest
from fleetscope.agent import coalesce
from fleetscope.agent.coalesce import NO_COALESCING, CoalesceLimits, Sized

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.data import sample_rows
from tests.helpers.server import ServerProcess

METRICS = RECORD_TYPES["metrics"]


def metrics_table(n: int, name: str, host: str = "h0", v0: float = 0.0) -> pa.Table:
    t = codec.rows_to_table(METRICS, sample_rows("metrics", n, name=name, host=host))
    return t.set_column(t.schema.get_field_index("value"), "value",
                        pa.array(np.arange(n, dtype=np.float64) + v0))


def queue_of(sizes: list[tuple[int, int]]) -> deque:
    return deque(Sized(i, rows, nbytes) for i, (rows, nbytes) in enumerate(sizes))


# ---------------------------------------------------------------------------- pure rules
def test_take_pops_the_oldest_batches_within_the_row_and_byte_bounds():
    lim = CoalesceLimits(max_rows=100, max_bytes=1000)
    q = queue_of([(40, 100), (40, 100), (40, 100), (10, 950), (5, 5)])
    assert [s.item for s in coalesce.take(q, lim)] == [0, 1]  # a third would pass 100 rows
    assert [s.item for s in coalesce.take(q, lim)] == [2]  # 40 + 10 rows, but 1,050 bytes
    assert [s.item for s in coalesce.take(q, lim)] == [3, 4]
    assert coalesce.take(q, lim) == [] and not q


def test_a_batch_over_the_bounds_travels_alone_and_disabled_means_one_per_request():
    lim = CoalesceLimits(max_rows=100, max_bytes=1000)
    q = queue_of([(500, 10), (1, 1), (1, 1)])
    assert [s.item for s in coalesce.take(q, lim)] == [0]
    assert [s.item for s in coalesce.take(q, lim)] == [1, 2]
    q = queue_of([(1, 1)] * 3)
    assert [[s.item for s in coalesce.take(q, NO_COALESCING)] for _ in range(3)] == [[0], [1], [2]]
    q = queue_of([(1, 1)] * 5)
    assert len(coalesce.take(q, CoalesceLimits(max_batches=2))) == 2


def test_bad_limits_are_refused_by_name():
    with pytest.raises(ValueError, match="max-rows must be a positive integer, got 0"):
        CoalesceLimits(max_rows=0)


def test_nagle_a_second_request_only_for_a_full_one():
    lim = CoalesceLimits(max_rows=100, max_bytes=1000)
    assert coalesce.should_send(0, 1, 1, lim)  # idle: every batch at once
    assert not coalesce.should_send(1, 99, 999, lim)  # one on the wire: keep filling
    assert coalesce.should_send(1, 100, 0, lim) and coalesce.should_send(3, 0, 1000, lim)
    assert coalesce.should_send(3, 1, 1, NO_COALESCING)


def test_merged_tables_keep_batch_order_per_record_type():
    parts = [{"metrics": metrics_table(3, "a", v0=0)}, {"metrics": metrics_table(0, "x")},
             {"metrics": metrics_table(2, "b", v0=3), "steps": codec.rows_to_table(
                 RECORD_TYPES["steps"], sample_rows("steps", 1))}]
    merged = coalesce.merge_tables(parts)
    assert merged["metrics"]["value"].to_pylist() == [0, 1, 2, 3, 4]
    assert merged["metrics"]["name"].to_pylist() == ["a"] * 3 + ["b"] * 2
    assert merged["steps"].num_rows == 1
    # the wire format round-trips the order
    assert codec.decode_batch(codec.encode_batch(merged))["metrics"]["value"].to_pylist() == [0, 1, 2, 3, 4]


def test_coalesced_keys_are_a_function_of_the_batches_in_order():
    assert coalesce.coalesced_key(["k1"]) == "k1"  # one batch keeps its own key
    k = coalesce.coalesced_key(["k1", "k2"])
    assert k == coalesce.coalesced_key(["k1", "k2"]) != coalesce.coalesced_key(["k2", "k1"])
    assert k != coalesce.coalesced_key(["k1", "k2", "k3"]) and k.startswith("fsc1-") and len(k) <= 200


def test_a_413_splits_the_request_into_halves_in_order():
    calls = []

    def send(items):
        calls.append(list(items))
        return (len(items) <= 2, 200 if len(items) <= 2 else 413)

    out = coalesce.send_splitting([1, 2, 3, 4, 5], send)
    assert calls == [[1, 2, 3, 4, 5], [1, 2], [3, 4, 5], [3], [4, 5]]
    assert out == [([1, 2], True), ([3], True), ([4, 5], True)]
    # other rejections are not split
    assert coalesce.send_splitting([1, 2], lambda items: (False, 422)) == [([1, 2], False)]


# ---------------------------------------------------------------------------- real server
def host_data(hosts: int, batch: int, rows: int) -> dict[str, tuple[pa.Table, np.ndarray]]:
    """``SimAgents.ship`` input: ``rows`` metrics rows per host, host-sorted, named by batch."""
    tables = [metrics_table(rows, f"b{batch}-h{h}", host=f"h{h}") for h in range(hosts)]
    return {"metrics": (pa.concat_tables(tables), np.arange(hosts + 1) * rows)}


def store_counts(workdir) -> dict[str, int]:
    from fleetscope.server.store import Store

    store = Store.open(f"chdb://{workdir / 'store'}", migrate_schema=False)
    try:
        rows = store.query_rows("SELECT name, count() AS n FROM metrics GROUP BY name", {})
    finally:
        store.close()
    return {r["name"]: int(r["n"]) for r in rows}


def make_agents(url: str, hosts: int, limits: CoalesceLimits, in_flight: int = 4, **kw):
    from fleetscope.sim.agents import SimAgents

    return SimAgents(url, [f"h{h}" for h in range(hosts)], run_id="coalesce-test", in_flight=in_flight,
                     senders=4, clock_sync=False, coalescing=limits, **kw)


def test_coalescing_agents_send_fewer_requests_and_store_every_row_once(tmp_path):
    hosts, batches, rows = 4, 30, 20
    proc = ServerProcess(tmp_path, diagnosis_enabled=False)
    proc.start()
    try:
        agents = make_agents(proc.base_url, hosts, CoalesceLimits(max_rows=200))
        try:
            for b in range(batches):  # faster than one request per batch can be answered
                agents.ship(host_data(hosts, b, rows))
            assert agents.drain(120)
            st = agents.stats
        finally:
            agents.close()
    finally:
        proc.stop()
    assert st.batches == hosts * batches and st.rows_acked == hosts * batches * rows
    assert st.requests < st.batches  # coalesced
    assert st.rejected == 0 and st.duplicates == 0
    counts = store_counts(tmp_path)
    assert counts == {f"b{b}-h{h}": rows for b in range(batches) for h in range(hosts)}


def test_a_retried_coalesced_request_is_stored_once(tmp_path):
    proc = ServerProcess(tmp_path, diagnosis_enabled=False)
    proc.start()
    try:
        agents = make_agents(proc.base_url, 1, CoalesceLimits())
        try:
            batch = [Sized((n, {"metrics": metrics_table(10, f"r{n}")}), 10, 1) for n in (1, 2, 3)]
            first = agents._post(0, batch)
            again = agents._post(0, batch)  # the same coalesced request once more (a retry)
            st = agents.stats
        finally:
            agents.close()
    finally:
        proc.stop()
    assert first == (True, 200) and again == (True, 200)
    assert st.requests == 2 and st.duplicates == 1  # the server knew the second one
    assert store_counts(tmp_path) == {"r1": 10, "r2": 10, "r3": 10}


def test_nothing_acknowledged_is_lost_when_the_server_is_killed_mid_stream(tmp_path):
    hosts, batches, rows = 4, 40, 50
    proc = ServerProcess(tmp_path, diagnosis_enabled=False)
    proc.start()
    agents = make_agents(proc.base_url, hosts, CoalesceLimits(max_rows=400), timeout_s=10.0, max_backoff_s=0.5)
    done = threading.Event()

    def feed() -> None:
        for b in range(batches):
            agents.ship(host_data(hosts, b, rows))
            time.sleep(0.05)
        done.set()

    t = threading.Thread(target=feed)
    t.start()
    try:
        for at in (batches * hosts // 4, batches * hosts // 2):
            deadline = time.monotonic() + 120
            while agents.stats.batches < at and time.monotonic() < deadline:
                time.sleep(0.01)
            proc.kill()  # SIGKILL with coalesced requests in flight
            proc.start()
        t.join(120)
        assert done.is_set()
        assert agents.drain(180), "not every batch was acknowledged after the restarts"
        st = agents.stats
    finally:
        agents.close()
        proc.stop()
    assert st.batches == hosts * batches and st.rejected == 0
    assert st.requests < st.batches and agents.retries > 0  # coalesced, and the kills hit requests
    counts = store_counts(tmp_path)
    want = {f"b{b}-h{h}": rows for b in range(batches) for h in range(hosts)}
    lost = sorted(k for k in want if counts.get(k, 0) < rows)
    dup = sorted(k for k in want if counts.get(k, 0) > rows)
    assert not lost and not dup and counts == want, (lost, dup)


def test_a_request_over_the_servers_row_limit_is_split_and_still_stored_once(tmp_path):
    """Agents bounded above the server's max_request_rows: the 413 (naming the limit)
    makes them send halves; nothing is rejected for good, nothing lost or doubled."""
    hosts, batches, rows = 2, 12, 100
    proc = ServerProcess(tmp_path, diagnosis_enabled=False, max_request_rows=450)
    proc.start()
    try:
        agents = make_agents(proc.base_url, hosts, CoalesceLimits(max_rows=100_000), in_flight=1)
        try:
            for b in range(batches):
                agents.ship(host_data(hosts, b, rows))
            assert agents.drain(120)
            st = agents.stats
        finally:
            agents.close()
    finally:
        proc.stop()
    assert st.splits_413 > 0 and st.rejected == 0
    assert st.batches == hosts * batches and st.rows_acked == hosts * batches * rows
    assert store_counts(tmp_path) == {f"b{b}-h{h}": rows for b in range(batches) for h in range(hosts)}


def test_the_413_names_the_row_limit(tmp_path):
    import httpx

    proc = ServerProcess(tmp_path, diagnosis_enabled=False, max_request_rows=450)
    proc.start()
    try:
        body = codec.encode_batch({"metrics": metrics_table(500, "big")})
        r = httpx.post(f"{proc.base_url}/api/v1/ingest", content=body,
                       headers={"Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": "k-big"})
    finally:
        proc.stop()
    assert r.status_code == 413 and r.headers.get("X-Fleetscope-Retry") == "no"
    assert "max_request_rows=450" in r.json()["detail"], r.json()
