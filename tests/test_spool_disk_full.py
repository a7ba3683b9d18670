"""Fault: the spool disk fills up under a running trainer (issue #13, fault tests).

A real trainer-like process (the real hooks and spool sink) runs with
``RLIMIT_FSIZE`` set low and ``SIGXFSZ`` ignored, so every write past the limit fails
with ``EFBIG`` exactly where a full disk fails with ``ENOSPC`` (both are ``OSError``s the
sink sees, mid-frame included). Then a real agent ships the spool to a real server.

Checked: the training loop completes every step without slowing down or raising; the
hooks count what they could not write; every complete frame that reached the disk is
acknowledged and stored exactly once; the torn tail is skipped and counted by the agent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from fleetscope.agent.batch import decode_frame
from fleetscope.agent.tailer import ReadFrame, Segment

from fleetscope import spool
from tests.helpers.server import running_server
from tests.test_agent_e2e import ROOT, all_acked, query, start_agent, wait_for

pytestmark = pytest.mark.slow
LIMIT = 96 * 1024
STEPS = 150

TRAINER = textwrap.dedent(f"""
    import json, resource, signal, sys, time
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
    from fleetscope import trainer_hooks as hooks
    from fleetscope.trainer_hooks import HookConfig
    hooks.init(job="full-job", rank=0, spool=sys.argv[1], trace_collectives=False,
               config=HookConfig(flush_interval_s=0.05, poll_interval_s=0.05))
    worst = 0.0
    for n in range({STEPS}):
        t0 = time.perf_counter()
        with hooks.step(n, num_microbatches=2, tokens=64, loss=1.0):
            for mb in range(2):
                with hooks.section("forward", microbatch=mb):
                    time.sleep(0.001)
                with hooks.section("backward", microbatch=mb):
                    time.sleep(0.001)
        worst = max(worst, time.perf_counter() - t0)
    stats = hooks.stats()
    hooks.shutdown()
    print(json.dumps({{"steps": {STEPS}, "worst_step_s": worst, "stats": stats}}))
""")


def _frames_on_disk(spool_dir) -> dict[str, int]:
    """Rows per record type in the complete, valid frames on disk (the ground truth)."""
    rows: dict[str, int] = {}
    for d in (spool_dir / "full-job").glob("rank-*"):
        for seg in spool.list_segments(d):
            s = Segment(f"full-job/{d.name}/{seg.name}", seg, 0, 0, 0, True, "full-job", 0)
            for f in spool.read_frames(seg, sealed=True):
                dec, _ = decode_frame(ReadFrame(s, f.start, f.end, f.payload))
                if dec is not None:
                    rows[dec.record] = rows.get(dec.record, 0) + dec.table.num_rows
    return rows


def test_spool_disk_full_trainer_keeps_running_and_nothing_acked_is_lost(tmp_path):
    sp = tmp_path / "spool"
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", TRAINER, str(sp)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["steps"] == STEPS
    assert res["stats"]["sink_dropped"] > 0 and res["stats"]["records_written"] > 0
    assert res["worst_step_s"] < 1.0, res  # never blocked on the failing disk
    print(f"trainer: {STEPS} steps in {took:.1f}s, hooks stats {res['stats']}")
    segs = [p for d in (sp / "full-job").glob("rank-*") for p in spool.list_segments(d)]
    assert segs and max(p.stat().st_size for p in segs) <= LIMIT
    truth = _frames_on_disk(sp)
    assert truth.get("sections", 0) > 0

    with running_server(tmp_path / "srv", diagnosis_enabled=False) as url:
        log = tmp_path / "agent.log"
        agent = start_agent(sp, url, log, "--job", "full-job", "--no-clock-sync", "--batch-delay", "0.1")
        try:
            wait_for(lambda: all_acked(sp, "full-job"), 90, "the agent to ack the whole spool")
        finally:
            agent.terminate()
            agent.wait(30)
        store_url = url.process.store_url
    sql = ["SELECT count() AS n, uniqExact(rank, step, start_ns, name) AS u FROM sections WHERE job = 'full-job'",
           "SELECT count() AS n, uniqExact(step) AS u FROM steps WHERE job = 'full-job'"]
    (sec,), (stp,) = query(store_url, *sql)
    assert sec["n"] == truth["sections"] and sec["u"] == sec["n"], (sec, truth)
    assert stp["n"] == truth.get("steps", 0) and stp["u"] == stp["n"], (stp, truth)
    st = json.loads((sp / ".fleetscope-agent" / "offsets.json").read_text())
    print(f"stored {truth}; agent counters {st['counters']}")
