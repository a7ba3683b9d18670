"""bench/finding_split.py (issue 14, onset -> finding): the split of a straggler finding's
time into evidence, ingest and serving, and the store query that dates each step's arrival."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from fleetscope.server.store import Store

from tests.helpers.bench_module import load_bench


@pytest.fixture(scope="module")
def fs():
    return load_bench("finding_split", "bench_finding_split")


def test_split_adds_up_to_onset_to_finding(fs):
    ev, ing, serve, total = fs.split(100.0, 104.5, 110.0, 112.0)
    assert (ev, ing, serve, total) == (4.5, 5.5, 2.0, 12.0)
    assert ev + ing + serve == total


def test_split_without_a_replayed_evidence_step_keeps_only_the_total(fs):
    assert fs.split(100.0, None, None, 130.0) == (None, None, None, 30.0)
    assert fs.split(100.0, 104.0, 108.0, None) == (4.0, 4.0, None, None)


def test_evidence_step_is_the_last_step_the_first_naming_window_holds(fs):
    seen: list[int] = []

    def names_at(n: int) -> bool:  # names the culprit once steps 0..10 are judged
        seen.append(n)
        return n >= 11

    assert fs.evidence_step(names_at, onset=8, last_step=20) == 10
    assert seen == [9, 10, 11]  # windows up to the onset step first, then one more step each
    assert fs.evidence_step(lambda n: False, onset=8, last_step=20) is None


def test_step_arrivals_reads_when_the_store_took_each_steps_rows(fs, tmp_path):
    store = Store.open(f"chdb://{tmp_path / 'store'}", ttl_days=0)
    try:
        before = int(time.time())

        def steps(job: str, step: int, batch: str) -> pa.Table:
            return pa.table({"job": [job, job], "rank": pa.array([0, 1], pa.int32()),
                             "step": pa.array([step, step], pa.int64()),
                             "start_ns": pa.array([0, 0], pa.int64()), "end_ns": pa.array([1, 1], pa.int64()),
                             "_batch": [batch, batch]})

        store.insert_arrow("steps", steps("a", 0, "h\x1fk1\x1fd"))
        store.insert_arrow("steps", steps("a", 1, "h\x1fk2\x1fd"))
        store.insert_arrow("steps", steps("b", 0, "h\x1fk3\x1fd"))
        after = int(time.time())
        got = fs.step_arrivals(store, ["a"])
        assert set(got) == {("a", 0), ("a", 1)}  # only the jobs asked for
        for last, first in got.values():
            assert before <= first <= last <= after + 1
        assert fs.step_arrivals(store, []) == {}
    finally:
        store.close()
