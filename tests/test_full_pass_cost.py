"""The full pass's cost cuts (issue #12) change nothing a pass finds: the same simulated job
in a real chdb store, passed with the cuts off (``loader.fast_pass(False)``, the previous
pass) and on, gives the same frames, reductions, findings and hang verdict, pass after
pass as steps arrive; and each new query returns what the queries it replaces did."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from fleetscope.server.diagnosis import loader, rollups
from fleetscope.server.diagnosis.engine import JobInfo, diagnose
from fleetscope.server.store import Store
from fleetscope.sim.offline import job_tables

from fleetscope import codec
from fleetscope.schema import JOBS, METRICS, RECORD_TYPES
from fleetscope.topology import Topology

TOPO = Topology(dp=2, tp=2, pp=2)
JOB = "fp-cost"
STEPS = 14


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A 2x2x2 job with a compute straggler (rank 5) and an xid on one host, stored up to
    step 11; steps 12..13 are kept back to arrive between passes."""
    store = Store.open(f"chdb://{tmp_path_factory.mktemp('fpcost') / 'store'}", ttl_days=0)
    t0 = time.time_ns() - STEPS * 600_000_000
    tables = job_tables(TOPO, STEPS, t0, job=JOB, faults=["straggler:rank=5:factor=1.5:from_step=4"],
                        num_mb=2, step_ms=400.0, gpus_per_host=4, host_prefix="fpc-h")
    held = {}
    for name, table in tables.items():
        df = table.to_pandas()
        if "step" in df.columns:
            held[name] = df[df["step"] >= 12]
            df = df[df["step"] < 12]
        store.insert_arrow(name, pa.Table.from_pandas(df, preserve_index=False))
    now = int(tables["steps"].column("end_ns").to_numpy().max()) + 10**9
    store.insert_arrow("metrics", codec.rows_to_table(METRICS, [
        {"ts_ns": now - 5 * 10**9, "job": JOB, "host": "fpc-h1", "rank": 5, "source": "gpu", "device": "gpu1",
         "name": "gpu.xid", "value": 79.0},
        {"ts_ns": now - 5 * 10**9, "job": "", "host": "other-host", "rank": -1, "source": "gpu", "device": "gpu0",
         "name": "gpu.xid", "value": 79.0}]))
    yield store, held, now
    store.close()


def _pass(store, cache, now, fast: bool):
    info = JobInfo(job=JOB, topology=TOPO, num_microbatches=2)
    with loader.fast_pass(fast):
        frames = loader.load_reduced_frames(store, JOB, now, cache, TOPO.world_size, 2)
        return frames, diagnose(info, frames, now)


def _same_frame(a: pd.DataFrame, b: pd.DataFrame, keys: list[str]) -> None:
    assert sorted(a.columns) == sorted(b.columns)
    if a.empty and b.empty:
        return
    a = a.sort_values(keys).reset_index(drop=True)[sorted(a.columns)]
    b = b.sort_values(keys).reset_index(drop=True)[sorted(a.columns)]
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def _check_same(old, new) -> None:
    (fo, ro), (fn, rn) = old, new
    assert [(f.kind, f.ranks, f.group_id, f.first_step, f.last_step) for f in ro.findings] == \
        [(f.kind, f.ranks, f.group_id, f.first_step, f.last_step) for f in rn.findings]
    assert [f.evidence for f in ro.findings] == [f.evidence for f in rn.findings]
    assert (ro.hang.stalled, ro.hang.culprits, ro.hang.hang_class) == (rn.hang.stalled, rn.hang.culprits,
                                                                        rn.hang.hang_class)
    assert (fo.attempt, fo.last_step, fo.first_step) == (fn.attempt, fn.last_step, fn.first_step)
    assert fo.last_seen == fn.last_seen and fo.last_seen
    assert fo.host_last_ns == fn.host_last_ns and fo.host_last_ns
    _same_frame(fo.progress, fn.progress, ["rank", "group_id"])
    _same_frame(fo.metrics, fn.metrics, ["ts_ns", "host", "name"])
    assert "fpc-h1" in set(fn.metrics["host"]) and "other-host" not in set(fn.metrics["host"])
    assert fo.reduced.quiet_since_ns == fn.reduced.quiet_since_ns > 0
    _same_frame(fo.reduced.breakdown, fn.reduced.breakdown, ["rank", "step"])
    _same_frame(fo.reduced.groups, fn.reduced.groups, ["group_id", "axis", "step"])
    assert sorted(fo.reduced.fwd) == sorted(fn.reduced.fwd)
    for s in fo.reduced.fwd:
        np.testing.assert_array_equal(fo.reduced.fwd[s], fn.reduced.fwd[s])
        np.testing.assert_array_equal(fo.reduced.bwd[s], fn.reduced.bwd[s])


def test_fast_pass_gives_the_old_pass_result_as_steps_arrive(job):
    store, held, now = job
    old_cache, new_cache = rollups.StepCache(), rollups.StepCache()
    first = _pass(store, old_cache, now, False), _pass(store, new_cache, now, True)
    _check_same(*first)
    assert any(5 in f.ranks for f in first[1][1].findings), "the straggler is found"
    for s in (12, 13):  # a step arrives between passes: both reduce it, the same way
        for name, df in held.items():
            part = df[df["step"] == s]
            if len(part):
                store.insert_arrow(name, pa.Table.from_pandas(part, preserve_index=False))
        _check_same(_pass(store, old_cache, now + s * 10**8, False), _pass(store, new_cache, now + s * 10**8, True))
    # cached matrices are reused, not rebuilt: the same array object on the next pass
    a = _pass(store, new_cache, now + 2 * 10**9, True)[0].reduced.fwd
    b = _pass(store, new_cache, now + 2 * 10**9, True)[0].reduced.fwd
    assert all(a[s] is b[s] for s in a)


def test_new_queries_return_what_the_old_ones_did(job):
    store, _, now = job
    hosts = [f"fpc-h{h}" for h in range(2)] + ["other-host"]
    p = {"job": JOB, "attempt": 0, "from_step": 9, "since_ns": now - 600 * 10**9, "hosts": hosts}
    a = store.query_rows(loader.ATTEMPT_LAST_STEP, {"job": JOB})[0]
    b = store.query_rows(loader.LAST_STEP, p)[0]
    assert a["latest_attempt"] == loader.latest_attempt(store, JOB) == 0
    assert (a["last_step"], a["first_step"], a["n"]) == (b["last_step"], b["first_step"], b["n"]) and a["n"]
    none = store.query_rows(loader.ATTEMPT_LAST_STEP, {"job": "no-such-job"})[0]
    assert none["latest_attempt"] == 0 and none["n"] == 0
    store.insert_arrow("jobs", codec.rows_to_table(JOBS, [{"ts_ns": now, "job": "fp-later", "attempt": 2, "dp": 1, "tp": 1, "pp": 1}]))
    later = store.query_rows(loader.ATTEMPT_LAST_STEP, {"job": "fp-later"})[0]  # a record, no steps yet
    assert later["latest_attempt"] == loader.latest_attempt(store, "fp-later") == 2 and later["n"] == 0
    inflight = loader._df(store, loader.INFLIGHT_NEWEST, p)
    _same_frame(inflight, loader._df(store, loader.INFLIGHT_LATEST, p), ["rank"])
    assert len(inflight) == TOPO.world_size
    progress, seen, quiet = loader._recent(store, p, inflight)
    raw = loader._recent(store, p, inflight, loader.RECENT_WORK)  # the rows kept at insert time = raw rows
    _same_frame(progress, raw[0], ["rank", "group_id"])
    assert (seen, quiet) == raw[1:]
    assert len(store.query_df(loader.PROGRESS_NEWEST, p)) <= TOPO.world_size * 8  # O(ranks x groups)
    _same_frame(progress, loader._df(store, loader.PROGRESS, p), ["rank", "group_id"])
    old_seen = loader._df(store, loader.LAST_SEEN, p)
    assert seen == {int(r): int(t) for r, t in old_seen.itertuples(index=False)} and seen
    assert quiet == int(store.query_rows(rollups.QUIET_SINCE_SQL, p)[0]["t"]) > 0
    empty = loader._recent(store, {**p, "job": "no-such-job"},
                           loader._df(store, loader.INFLIGHT_NEWEST, {**p, "job": "no-such-job"}))
    assert empty[0].empty and empty[1] == {} and empty[2] == 0
    hb = RECORD_TYPES["heartbeats"]
    store.insert_arrow("heartbeats", codec.rows_to_table(hb, [  # rank 3 dies; another host's row
        {"ts_ns": now - k * 10**9, "job": JOB, "host": "fpc-h0", "rank": 3, "local_rank": 3, "pid": 77,
         "alive": int(k > 3), "last_step": 11, "acked_through_ns": now - (k + 1) * 10**9} for k in range(8)] + [
        {"ts_ns": now - 10**9, "job": "", "host": "other-host", "rank": -1},
        {"ts_ns": now - 10**9, "job": "other-job", "host": "fpc-h1", "rank": -1}]))
    got, want = (loader._df(store, q, p, loader.HEARTBEAT_COLUMNS) for q in (loader.HEARTBEATS_NEWEST,
                                                                          loader.HEARTBEATS_LATEST))
    _same_frame(got, want, ["rank", "host"])
    assert len(got) >= TOPO.world_size and set(got["host"]) <= set(hosts)
    died = got[got["rank"] == 3].iloc[0]
    assert (died["alive"], died["pid"], died["dead_since_ns"], died["acked_through_ns"]) == (0, 77, now - 3 * 10**9, now - 10**9)
    for new, old, keys in ((loader.HOSTS_LAST_NEWEST, loader.HOSTS_LAST, ["host"]),
                           (loader.HW_METRICS_IN, loader.HW_METRICS, ["ts_ns", "host", "name"])):
        got, want = store.query_df(new, p), store.query_df(old, p)
        assert len(got) and set(got["host"]) <= set(hosts)
        _same_frame(got, want, keys)
    assert {"fpc-h1", "other-host"} <= set(store.query_df(loader.HW_METRICS_IN, p)["host"])


def test_mb_matrix_numpy_matches_the_loop():
    rows = pd.DataFrame({
        "rank": [0, 3, 7, -1, 9],
        "fwd_k": [[0, 1], [1], None, [0], [0]],
        "fwd_v": [[10, 11], [31], None, [5], [6]],
    })
    got = rollups._mb_matrix_np(rows, "fwd", 8, 2)
    np.testing.assert_array_equal(got, rollups._mb_matrix(rows, "fwd", 8, 2))
    assert got[0, 1] == 11 and got[3, 1] == 31 and np.isnan(got[7]).all()
    rows.loc[0, "fwd_k"] = [0, 5]  # a micro-batch index past num_mb is left out, as before
    np.testing.assert_array_equal(rollups._mb_matrix_np(rows, "fwd", 8, 2), rollups._mb_matrix(rows, "fwd", 8, 2))
    np.testing.assert_array_equal(rollups._mb_matrix_np(rows.iloc[:0], "fwd", 8, 2), np.full((8, 2), np.nan))


def test_mb_matrix_from_arrow_lists_matches_the_loop():
    """The fast pass builds the matrices from the query's Arrow list columns (no Python
    object per row): the same matrix as the row loop, edge cases included (a rank out of
    range, an empty list, a micro-batch index past num_mb, several chunks)."""
    rows = pd.DataFrame({
        "rank": [0, 3, 7, -1, 9, 5],
        "step": [4] * 6,
        "fwd_k": [[0, 1], [1], [], [0], [0], [1, 0]],
        "fwd_v": [[10, 11], [31], [], [5], [6], [51, 50]],
        "bwd_k": [[1], [0, 1, 5], [0], [], [1], [0]],
        "bwd_v": [[21], [30, 32, 99], [70], [], [8], [52]],
    })
    typed = pa.schema([("rank", pa.int32()), ("step", pa.int64()),
                       ("fwd_k", pa.list_(pa.uint16())), ("fwd_v", pa.list_(pa.int64())),
                       ("bwd_k", pa.list_(pa.uint16())), ("bwd_v", pa.list_(pa.int64()))])
    table = pa.Table.from_pandas(rows, schema=typed, preserve_index=False)
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2)])
    for t in (table, chunked):
        got = rollups.step_matrices_arrow(t, 8, 2)
        for col in ("fwd", "bwd"):
            np.testing.assert_array_equal(got[col], rollups._mb_matrix(rows, col, 8, 2))
    assert got["fwd"][5, 1] == 51 and got["bwd"][3, 1] == 32 and np.isnan(got["fwd"][7]).all()
    np.testing.assert_array_equal(rollups.step_matrices_arrow(table.slice(0, 0), 8, 2)["fwd"],
                                  np.full((8, 2), np.nan))
