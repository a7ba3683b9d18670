"""The server's per-request ingest work, made cheaper, gives the same answers.

``collector.validate.prepare`` decides most batches from each column's (min, max) and
runs the exact, row-naming checks only when a batch may fail; ``content_digest`` sums
integers without casts and string lengths from the offsets. The digest is part of the
stored batch id, so it must not change at all: a batch stored before an upgrade and
retried after it would otherwise be refused as a key conflict (409).
"""

from __future__ import annotations

import hashlib
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fleetscope.collector import content_digest
from fleetscope.collector.validate import DAY_NS, IngestLimits, _check, _check_limits, prepare
from fleetscope.sim.offline import job_tables

from fleetscope.codec import BatchError
from fleetscope.schema import RECORD_TYPES
from fleetscope.topology import Topology

NOW = time.time_ns()


def reference_digest(tables: dict[str, pa.Table]) -> str:
    """The digest as first written (cast to int64, then sum; sum of binary lengths)."""
    h = hashlib.sha256()
    for name in sorted(tables):
        t = tables[name]
        if not t.num_rows:
            continue
        h.update(f"{name}:{t.num_rows}".encode())
        for col_name, col in zip(t.column_names, t.columns):
            if pa.types.is_integer(col.type):
                v = pc.sum(col.cast(pa.int64())).as_py()
            elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                v = pc.sum(pc.binary_length(col)).as_py()
            else:
                continue
            h.update(f"|{col_name}={v}".encode())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def job() -> dict[str, pa.Table]:
    return job_tables(Topology(dp=2, tp=2, pp=2), 3, NOW - 60 * 10**9, job="cost", gpus_per_host=4)


def test_the_digest_is_unchanged_for_every_record_type_sliced_and_chunked(job):
    assert set(job) >= {"sections", "collectives", "steps", "inflight", "heartbeats", "metrics", "jobs"}
    assert content_digest(job) == reference_digest(job)
    for name, t in job.items():
        n = t.num_rows
        variants = [t, t.slice(1), t.slice(n // 3, max(1, n // 3)), pa.concat_tables([t.slice(n // 2), t.slice(0, n // 2)])]
        for v in variants:
            if v.num_rows:
                assert content_digest({name: v}) == reference_digest({name: v}), name
    big = pa.table({"job": pa.array(["é", "", "abc"], pa.large_string()), "rank": pa.array([1, 2, 3], pa.int32()),
                    "step": pa.array([2**62, 2**62, 2**62], pa.int64())})  # the int64 sum wraps
    assert content_digest({"x": big}) == reference_digest({"x": big})


def exact_prepare_error(tables, host, offset, lim) -> str | None:
    """What the exact checks say about the shifted, host-filled tables (None: valid)."""
    for name, t in tables.items():
        rt = RECORD_TYPES[name]
        for c in rt.time_columns:
            col = t[c]
            t = t.set_column(t.schema.get_field_index(c), c, pc.if_else(pc.equal(col, -1), col, pc.add(col, offset)))
        try:
            _check(rt, t)
            if t.num_rows:
                _check_limits(rt, t, lim, NOW)
        except BatchError as e:
            return str(e)
    return None


def with_value(t: pa.Table, col: str, row: int, value) -> pa.Table:
    vals = t[col].to_pylist()
    vals[row] = value
    return t.set_column(t.schema.get_field_index(col), col, pa.array(vals, t.schema.field(col).type))


@pytest.mark.parametrize("case", ["empty_job", "rank_below", "rank_world", "old_time", "future", "span"])
def test_each_refusal_names_the_same_row_as_the_exact_checks(job, case):
    lim = IngestLimits(max_world_size=64, max_future_s=60, max_batch_span_days=1)
    t = job["collectives"]
    bad = {
        "empty_job": lambda: with_value(t, "job", 5, ""),
        "rank_below": lambda: with_value(t, "rank", 7, -2),
        "rank_world": lambda: with_value(t, "rank", 9, 64),
        "old_time": lambda: with_value(t, "enqueued_ns", 3, 10**9),
        "future": lambda: with_value(t, "completed_ns", 4, NOW + 120 * 10**9),
        "span": lambda: with_value(t, "enqueued_ns", 2, NOW - 2 * DAY_NS),
    }[case]()
    with pytest.raises(BatchError) as e:
        prepare({"collectives": bad}, host="hx", clock_offset_ns=1000, limits=lim, now_ns=NOW)
    assert str(e.value) == exact_prepare_error({"collectives": bad}, "hx", 1000, lim)
    assert "collectives" in str(e.value)


def test_valid_batches_are_shifted_with_sentinels_kept_and_hosts_filled(job):
    t = job["collectives"]
    t = with_value(with_value(t, "completed_ns", 0, -1), "host", 1, "")
    out = prepare({**job, "collectives": t}, host="filled", clock_offset_ns=-5000, now_ns=NOW)
    got = out["collectives"]
    assert got["completed_ns"][0].as_py() == -1  # an in-flight op's sentinel
    assert got["completed_ns"][1].as_py() == t["completed_ns"][1].as_py() - 5000
    assert got["enqueued_ns"].to_pylist() == [v - 5000 for v in t["enqueued_ns"].to_pylist()]
    assert got["host"][1].as_py() == "filled" and got["host"][0].as_py() == t["host"][0].as_py()
    assert {n: x.num_rows for n, x in out.items()} == {n: x.num_rows for n, x in job.items()}
    assert exact_prepare_error(out, "", 0, IngestLimits()) is None


def test_an_offset_that_overflows_is_refused_by_column(job):
    t = with_value(job["steps"], "end_ns", 0, 2**63 - 10)
    with pytest.raises(BatchError, match=r"steps\.end_ns: adding X-Fleetscope-Clock-Offset-Ns=100 overflows int64"):
        prepare({"steps": t}, clock_offset_ns=100, now_ns=NOW)
