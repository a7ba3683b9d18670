"""``fleetscope train --preflight``: the quick self-check runs on every rank before step 0
and its results travel with the job's telemetry (spool files) under the job id."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

from fleetscope import codec, spool


def probes_in_spool(root):
    out = defaultdict(list)
    for seg in sorted(root.glob("rank-*/seg-*.fsp")):
        for frame in spool.read_frames(seg, sealed=True):
            table = codec.ipc_to_table(frame.payload)
            if table.schema.metadata[b"fleetscope.record"] == b"probes":
                out[seg.parent.name] += table.to_pylist()
    return out


def test_train_preflight_records_probes_on_every_rank_before_step_0(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "fleetscope.cli", "train", "--dp", "2", "--steps", "1",
         "--preflight", "--job", "pf-job", "--spool", str(tmp_path), "--timeout-s", "240"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = probes_in_spool(tmp_path / "pf-job")
    assert sorted(got) == ["rank-00000", "rank-00001"]
    rank0 = {r["probe"] for r in got["rank-00000"]}
    assert rank0 == {"matmul", "membw", "numerics", "allreduce", "alltoall"}
    assert {r["probe"] for r in got["rank-00001"]} == {"matmul", "membw", "numerics"}
    rows = got["rank-00000"] + got["rank-00001"]
    assert all(r["job"] == "pf-job" and r["passed"] == 1 and r["host"] for r in rows)
    hashes = {r["detail"] for r in rows if r["probe"] == "numerics"}
    assert len({h.split('"hash": "')[1][:16] for h in hashes}) == 1  # same bits on both ranks
    log = (tmp_path / "pf-job" / "rank-00000" / "trainer.log").read_text()
    assert log.index("preflight rank 0") < log.index("step 0")  # before training
