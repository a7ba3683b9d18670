"""``fleetscope import fr``: Flight Recorder dumps from real gloo hangs (2-3 ranks)."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fleetscope.server.importers.flight_recorder import DumpError, import_dir

from tests.helpers.ranks import run_ranks
from tests.helpers.server import running_server

FR_ENV = {"TORCH_FR_BUFFER_SIZE": "1000"}


@pytest.fixture(scope="module")
def stuck(tmp_path_factory):
    """3 ranks: rank 1 never reaches world#6, rank 2 dies without a dump; rank 0 dumps
    JSON, rank 1 pickle."""
    work = tmp_path_factory.mktemp("stuck")
    run_ranks("tests.helpers.fr_scenarios:stuck_rank", 3, work, timeout_s=120, env=FR_ENV)
    return work / "fr"


@pytest.fixture(scope="module")
def desync(tmp_path_factory):
    """2 ranks: world#2 is an all_reduce on rank 0 and a broadcast on rank 1."""
    work = tmp_path_factory.mktemp("desync")
    run_ranks("tests.helpers.fr_scenarios:desync", 2, work, timeout_s=120, env=FR_ENV)
    return work / "fr"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", "import", "fr", *args],
                          capture_output=True, text=True, timeout=120)


def test_gloo_dumps_have_an_empty_pg_config_and_are_read_anyway(stuck):
    raw = (stuck / "nccl_trace_rank_1").read_bytes()
    assert pickle.loads(raw)["pg_config"][""]["ranks"] == "[]"  # what breaks torch's fr_trace
    rows, analysis = import_dir(stuck, "j", world_size=3)
    assert {r["rank"] for r in rows} == {0, 1}
    world = [r for r in rows if r["group_id"] == "world"]
    assert [r["seq"] for r in world if r["rank"] == 0] == [1, 2, 3, 4, 5, 6]
    assert {r["op"] for r in world} == {"all_reduce", "all_gather"}
    assert all(r["bytes"] == 32 and r["dtype"] == "float32" for r in world)
    sub = [r for r in rows if r["group_id"] != "world"]
    assert {(r["rank"], r["op"], r["seq"]) for r in sub} == {(0, "broadcast", 1), (1, "broadcast", 1)}


def test_stuck_rank_is_the_culprit_and_the_dead_one_is_missing(stuck):
    _, a = import_dir(stuck, "j", world_size=3)
    assert a.kind == "never_arrived" and a.culprits == [1] and a.missing == [2]
    top = a.stops[0]
    assert (top.group_id, top.seq, top.op, top.waiting) == ("world", 6, "all_reduce", [0])
    assert top.last_seq == {"0": 6, "1": 5}


def test_desync_is_an_op_mismatch_naming_the_odd_rank(desync):
    _, a = import_dir(desync, "j")
    assert a.kind == "mismatch" and a.culprits == [1]
    (m,) = a.mismatches
    assert (m["group_id"], m["seq"]) == ("world", 2)
    assert m["calls"] == {"0": "all_reduce/32/float32", "1": "broadcast/32/float32"}


def test_cli_prints_the_analysis_and_writes_the_store(stuck, tmp_path):
    store = f"chdb://{tmp_path / 'store'}"
    proc = _cli(str(stuck), "--job", "frjob", "--world-size", "3", "--store", store)
    assert proc.returncode == 0, proc.stderr
    assert "culprit ranks: [1]" in proc.stdout and "missing [2]" in proc.stdout
    from fleetscope.server.store import Store

    st = Store.open(store)
    try:
        n = st.query_rows("SELECT rank, count() AS n FROM collectives WHERE job = {j:String} "
                          "GROUP BY rank ORDER BY rank", {"j": "frjob"})
        inflight = st.query_rows("SELECT rank, op, group_id, seq FROM inflight WHERE job = {j:String}",
                                 {"j": "frjob"})
    finally:
        st.close()
    assert [(r["rank"], r["n"]) for r in n] == [(0, 7), (1, 6)]
    assert [(r["rank"], r["op"], r["group_id"], r["seq"]) for r in inflight] == [(0, "all_reduce", "world", 6)]
    js = _cli(str(stuck), "--job", "frjob", "--world-size", "3", "--json")
    assert json.loads(js.stdout)["culprits"] == [1]


def test_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "rank0.pkl").write_bytes(b"\x80\x04not a pickle")
    proc = _cli(str(tmp_path), "--job", "j")
    assert proc.returncode == 2 and "rank0.pkl: not a Flight Recorder dump" in proc.stderr
    (tmp_path / "rank0.pkl").write_bytes(pickle.dumps({"entries": []}))
    (tmp_path / "dump.json").write_text("{}")
    proc = _cli(str(tmp_path), "--job", "j")
    assert proc.returncode == 2 and "no rank number in the file name" in proc.stderr
    with pytest.raises(DumpError, match="is not allowed"):
        (tmp_path / "dump.json").unlink()
        (tmp_path / "rank1.pkl").write_bytes(pickle.dumps({"entries": [], "x": DumpError("boom")}))
        import_dir(tmp_path, "j")


def test_size_and_dtype_mismatches_in_a_real_dump_are_named(stuck, tmp_path):
    # gloo aborts the job on a size mismatch before anything can dump, so the mismatch
    # is put into a real dump: rank 1's 3rd all-reduce becomes float64 x 16
    doc = pickle.loads((stuck / "nccl_trace_rank_1").read_bytes())
    third = next(e for e in doc["entries"] if e["collective_seq_id"] == 3 and e["pg_id"] == 0)
    third["input_dtypes"], third["input_sizes"] = ["Double"], [[16]]
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(doc))
    (tmp_path / "nccl_trace_rank_0.json").write_bytes((stuck / "nccl_trace_rank_0.json").read_bytes())
    _, a = import_dir(tmp_path, "j", world_size=3)
    (m,) = [m for m in a.mismatches if m["seq"] == 3]
    assert m["group_id"] == "world" and m["calls"]["1"] == "all_reduce/128/float64"
    assert a.culprits == [1] and a.kind == "never_arrived"  # the hang itself is unchanged


# ---- FR groups -> the hooks' topology group names --------------------------------------
def tp_stuck(rank: int, world: int, workdir: Path) -> dict:
    """dp=2 x tp=2 (rank = tp + 2 dp): the tp groups are FR's pg1 {0,1}, pg2 {2,3}, the dp
    groups pg3 {0,2}, pg4 {1,3}. Rank 3 never reaches the 3rd all-reduce of its tp group;
    rank 2 waits in it; ranks 0 and 1 finish theirs and wait in their dp groups."""
    import torch
    import torch.distributed as dist

    from tests.helpers.fr_scenarios import HANG_S, _dump_then_exit

    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][rank // 2]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
    x = torch.ones(8)
    for _ in range(2):
        dist.all_reduce(x, group=tp)
    dist.all_reduce(x, group=dp)
    dist.all_reduce(x)
    _dump_then_exit(workdir / "fr" / f"rank{rank}.pkl", False, HANG_S)
    if rank == 3:
        time.sleep(60)  # stuck before the tp collective
    if rank in (0, 1):
        time.sleep(0.5)  # rank 2 is in its tp all-reduce first
    dist.all_reduce(x, group=tp)
    dist.all_reduce(x, group=dp)
    time.sleep(60)
    return {}


@pytest.fixture(scope="module")
def tp_dumps(tmp_path_factory):
    work = tmp_path_factory.mktemp("tp-stuck")
    run_ranks("tests.test_import_fr:tp_stuck", 4, work, timeout_s=120, env=FR_ENV)
    return work / "fr"


def test_fr_groups_take_the_hooks_topology_names(tp_dumps, tmp_path):
    from fleetscope.topology import Topology

    topo = Topology(dp=2, tp=2)
    raw, _ = import_dir(tp_dumps, "j")
    assert {r["group_id"] for r in raw} == {"world", "pg1", "pg2", "pg3", "pg4"}  # FR's own names
    rows, a = import_dir(tp_dumps, "j", topology=topo)
    assert {r["group_id"] for r in rows} == {"world", "tp.pp0.dp0", "tp.pp0.dp1", "dp.pp0.tp0", "dp.pp0.tp1"}
    for r in rows:  # exactly the hooks' names, axes and group ranks for each rank
        if r["group_id"] != "world":
            axis = r["group_id"].split(".")[0]
            assert r["group_id"] == topo.group_id(axis, r["rank"]) and r["axis"] == axis
            assert r["group_rank"] == topo.group_ranks(axis, r["rank"]).index(r["rank"]) and r["group_size"] == 2
    assert a.kind == "never_arrived" and a.culprits == [3]
    top = a.stops[0]
    assert (top.group_id, top.seq, top.op, top.waiting) == ("tp.pp0.dp1", 3, "all_reduce", [2])
    assert {s.group_id for s in a.stops} >= {"tp.pp0.dp1", "dp.pp0.tp0", "dp.pp0.tp1"}

    # rank 3 left no dump: its groups are seen only through ranks 1 and 2, still matched
    # (the other candidates are taken), and rank 3 is named missing in its tp group
    part = tmp_path / "three"
    part.mkdir()
    for r in (0, 1, 2):
        shutil.copy(tp_dumps / f"rank{r}.pkl", part)
    rows, a = import_dir(part, "j", topology=topo)
    assert {r["group_id"] for r in rows} == {"world", "tp.pp0.dp0", "tp.pp0.dp1", "dp.pp0.tp0", "dp.pp0.tp1"}
    top = a.stops[0]
    assert (top.group_id, top.waiting, top.missing) == ("tp.pp0.dp1", [2], [3])
    assert a.kind == "missing_only" and a.culprits == [3] and a.missing == [3]
    _, plain = import_dir(part, "j", world_size=4)  # without the topology FR's pg2 looks like {2} alone
    assert plain.stops[0].group_id == "pg2" and plain.stops[0].missing == []

    with pytest.raises(DumpError, match="topology"):
        import_dir(tp_dumps, "j", world_size=8, topology=topo)


def test_cli_maps_groups_by_flags_and_by_the_servers_job_row(tp_dumps, tmp_path):
    from fleetscope.server.store import Store

    from fleetscope import codec
    from tests.helpers.data import sample_rows

    js = _cli(str(tp_dumps), "--job", "j", "--dp", "2", "--tp", "2", "--json")
    assert js.returncode == 0, js.stderr
    doc = json.loads(js.stdout)
    assert doc["culprits"] == [3] and doc["stops"][0]["group_id"] == "tp.pp0.dp1"
    bad = _cli(str(tp_dumps), "--job", "j", "--dp", "0")
    assert bad.returncode == 2 and "--dp 0" in bad.stderr

    with running_server(tmp_path, diagnosis_enabled=False) as url:
        job = sample_rows("jobs", 1, job="live", dp=2, tp=2, pp=1, order="tp-dp-pp", status="running",
                          name="llama-live")[0]
        import httpx

        httpx.post(f"{url.api}/ingest", content=codec.encode_batch({"jobs": [job]}), timeout=60,
                   headers={"Content-Type": codec.ARROW_CONTENT_TYPE}).raise_for_status()
        proc = _cli(str(tp_dumps), "--job", "live", "--server", url)  # no flags: the job's row
        assert proc.returncode == 0, proc.stderr
        assert "culprit ranks: [3]" in proc.stdout and "tp.pp0.dp1#3" in proc.stdout
        got = httpx.get(f"{url.api}/jobs/live", timeout=60).json()
        assert got["name"] == "llama-live" and got["topology"]["tp"] == 2  # the job's row is kept
    st = Store.open(f"chdb://{tmp_path / 'store'}")
    try:
        groups = st.query_rows("SELECT DISTINCT group_id, axis FROM collectives WHERE job = {j:String} "
                               "ORDER BY group_id", {"j": "live"})
        inflight = st.query_rows("SELECT rank, group_id, seq FROM inflight WHERE job = {j:String} ORDER BY rank",
                                 {"j": "live"})
    finally:
        st.close()
    assert [(g["group_id"], g["axis"]) for g in groups] == [
        ("dp.pp0.tp0", "dp"), ("dp.pp0.tp1", "dp"), ("tp.pp0.dp0", "tp"), ("tp.pp0.dp1", "tp"), ("world", "world")]
    assert [(r["rank"], r["group_id"], r["seq"]) for r in inflight] == [
        (0, "dp.pp0.tp0", 2), (1, "dp.pp0.tp1", 2), (2, "tp.pp0.dp1", 3)]

    # --store: the job's row in the store gives the topology
    from fleetscope.schema import record_type

    store = f"chdb://{tmp_path / 'store2'}"
    st = Store.open(store)
    try:
        st.insert_arrow("jobs", codec.rows_to_table(record_type("jobs"), [job]))
    finally:
        st.close()
    proc = _cli(str(tp_dumps), "--job", "live", "--store", store)
    assert proc.returncode == 0, proc.stderr
    assert "tp.pp0.dp1#3" in proc.stdout and "(the job's row)" in proc.stderr
