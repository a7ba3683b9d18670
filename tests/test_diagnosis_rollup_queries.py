"""The op-gap and mismatch queries of server/diagnosis/rollups.py against their previous
forms (kept in bench/rollup_queries.py, which times both, as the oracle): the gaps come
from ~1 ms buckets instead of a window over every completion (exact from a bucket up), the
mismatch test from min/max instead of exact distinct counts. Same rows on a synthetic job with mismatched ops,
sizes and dtypes, duplicates and late rows, over several step ranges."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from fleetscope.server.diagnosis import rollups
from fleetscope.server.store import Store

from fleetscope.topology import Topology
from tests.helpers.synthetic import SynthJob

_spec = importlib.util.spec_from_file_location(
    "rollup_queries", Path(__file__).resolve().parents[1] / "bench" / "rollup_queries.py")
assert _spec is not None and _spec.loader is not None
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
OLD_STEP_GAPS_SQL = _bench.PREVIOUS_STEP_GAPS_SQL
OLD_MISMATCH_SQL = _bench.previous_mismatch_sql()

JOB = "rq"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store.open(f"chdb://{tmp_path_factory.mktemp('rq') / 'store'}", ttl_days=0)
    frames = SynthJob(job=JOB, num_steps=10, topo=Topology(dp=2, tp=2, pp=2),
                      pause_ms=lambda r, s: 40.0 if r == 3 and s == 6 else 0.0).build()
    c = frames["collectives"]
    coll = c[~c["op"].isin(["send", "recv", "isend", "irecv"])]
    keys = coll[["group_id", "seq"]].drop_duplicates().reset_index(drop=True)
    assert len(keys) >= 40
    bad = []
    for i, (col, value) in enumerate([("op", "all_gather"), ("bytes", 12345), ("dtype", "int8"),
                                      ("op", "broadcast"), ("bytes", 1)]):
        g, s = keys.loc[7 * i + 3, "group_id"], keys.loc[7 * i + 3, "seq"]
        row = coll[(coll["group_id"] == g) & (coll["seq"] == s)].head(1).copy()
        row[col] = value  # one member disagrees
        bad.append(row)
    dup = coll.sample(20, random_state=0)  # re-sent rows: the same values twice
    late = frames["sections"][frames["sections"]["step"] == 2].head(5).copy()
    late["end_ns"] += 7  # a late, slightly different section row
    mutated = coll.index.isin(pd.concat(bad).index)
    frames["collectives"] = pd.concat([c[~c.index.isin(coll.index[mutated])], *bad, dup],
                                      ignore_index=True)
    frames["sections"] = pd.concat([frames["sections"], late], ignore_index=True)
    for table in ("sections", "collectives", "steps"):
        st.insert_arrow(table, pa.Table.from_pandas(frames[table], preserve_index=False))
    yield st
    st.close()


RANGES = [(0, 9), (0, 3), (4, 6), (5, 5), (8, 9), (9, 12)]


def _rows(store, sql, params, by):
    df = store.query_df(sql, params)
    return df.sort_values(by).reset_index(drop=True) if not df.empty else df


@pytest.mark.parametrize(("lo", "hi"), RANGES)
def test_mismatch_query_matches_the_distinct_count_form(store, lo, hi):
    p = {"job": JOB, "attempt": 0, "from_step": lo, "to_step": hi}
    by = ["rank", "group_id", "seq", "op"]
    new = _rows(store, rollups.MISMATCH_SQL, p, by)
    old = _rows(store, OLD_MISMATCH_SQL, p, by)
    pd.testing.assert_frame_equal(new, old)
    if (lo, hi) == (0, 9):  # every injected disagreement is found
        assert new[["group_id", "seq"]].drop_duplicates().shape[0] == 5


@pytest.mark.parametrize(("lo", "hi"), RANGES)
@pytest.mark.parametrize("first_step", [0, 2])
def test_gap_query_matches_the_window_form(store, lo, hi, first_step):
    ctx = lo - 1 if lo - 1 > first_step else lo
    p = {"job": JOB, "attempt": 0, "from_step": lo, "to_step": hi, "ctx_step": ctx,
         "first_step": first_step}
    new = _rows(store, rollups.STEP_GAPS_SQL, p, ["step"])
    old = _rows(store, OLD_STEP_GAPS_SQL, p, ["step"])
    assert new["step"].tolist() == old["step"].tolist()  # every step seen has a row
    # exact from a bucket up; a shorter longest gap may read up to a bucket less
    w = rollups.GAP_BUCKET_NS / 1e9
    for a, b in zip(new["gap_s"], old["gap_s"]):
        assert a == pytest.approx(b, abs=1e-12) if b >= w else b - w < a <= b + 1e-12
    if lo <= 9 and first_step < hi:
        assert not new.empty and (new["gap_s"] > 0).all()
