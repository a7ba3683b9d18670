"""Log scanning: the pattern library on real-looking lines, context, tracebacks, resume."""

from __future__ import annotations

import pytest
from fleetscope.agent.logscan import LogScanner, rank_of_log
from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.patterns import match_line

from tests.test_agent_metrics import outbox_rows

SAMPLES = [
    ("node3:1234:1290 [2] NCCL INFO misc/socket.cc:47 -> 3 NCCL WARN Net : Connection closed by remote peer", "nccl_warn"),
    ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1042, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.", "nccl_timeout"),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "nccl_error"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete", "gloo_timeout"),
    ("[ 8801.123] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "xid"),
    ("kernel: NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', An uncorrectable double bit error (DBE) has been detected", "xid"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_error"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("[12345.6] Out of memory: Killed process 4242 (python) total-vm:100kB", "oom"),
    ("Fatal Python error: Segmentation fault", "segfault"),
    ("python[4242]: segfault at 0 ip 00007f sp 00007ff error 4 in libc.so", "segfault"),
    ("Uncorrectable ECC error detected on GPU 3", "ecc"),
    ("step 100: loss is nan, skipping update", "nan"),
]


@pytest.mark.parametrize("line,kind", SAMPLES)
def test_pattern_library(line, kind):
    p = match_line(line)
    assert p is not None and p.kind == kind


@pytest.mark.parametrize("line", [
    "step 10 loss 2.345 tokens/s 12345",
    "NCCL INFO Channel 00/32 : 0[0] -> 1[1] via P2P/IPC",
    "CUBLAS_STATUS_SUCCESS",
])
def test_ordinary_lines_do_not_match(line):
    assert match_line(line) is None


def scanner(tmp_path, **kw):
    box = Outbox(tmp_path / "outbox")
    offsets = OffsetStore(tmp_path / "offsets.json")
    return LogScanner(box, offsets, "h1", tmp_path / "spool", flush_after_s=0.0, **kw), box, offsets


def test_matches_carry_rank_context_and_tracebacks_are_one_event(tmp_path):
    log = tmp_path / "spool" / "job9" / "rank-00003" / "stderr.log"
    log.parent.mkdir(parents=True)
    log.write_text("\n".join([
        "step 1 ok", "step 2 ok",
        "host:1:1 [0] NCCL WARN Net : Connection closed by remote peer",
        "step 3 ok",
        "Traceback (most recent call last):",
        '  File "train.py", line 10, in <module>',
        "    loss.backward()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "after",
    ]) + "\n")
    s, box, _ = scanner(tmp_path)
    assert s.scan_once() == 2
    box.close()
    rows = outbox_rows(tmp_path / "outbox", "log_events")
    by_kind = {r["kind"]: r for r in rows}
    assert len(rows) == 2
    warn, oom = by_kind["nccl_warn"], by_kind["oom"]
    assert (warn["kind"], warn["rank"], warn["job"], warn["severity"]) == ("nccl_warn", 3, "job9", "warning")
    assert "step 2 ok" in warn["context"] and "step 3 ok" in warn["context"]
    assert oom["kind"] == "oom" and oom["message"].startswith("torch.OutOfMemoryError")
    assert "loss.backward()" in oom["context"] and oom["context"].startswith("Traceback")


def test_scan_resumes_from_the_durable_offset_and_follows_appends(tmp_path):
    log = tmp_path / "train-rank7.log"
    log.write_text("Fatal Python error: Segmentation fault\n")
    s, box, _ = scanner(tmp_path, extra=[log])
    assert s.scan_once() == 1
    with open(log, "a") as f:
        f.write("RuntimeError: CUDA error: an illegal memory access was encountered\npartial line no newl")
    assert s.scan_once() == 1
    box.close()
    # a restarted scanner does not report the old lines again
    s2, box2, _ = scanner(tmp_path, extra=[log])
    assert s2.scan_once() == 0
    with open(log, "a") as f:
        f.write("ine: NCCL WARN x\n")
    assert s2.scan_once() == 1
    box2.close()
    kinds = [(r["kind"], r["rank"]) for r in outbox_rows(tmp_path / "outbox", "log_events")]
    assert kinds == [("segfault", 7), ("cuda_error", 7), ("nccl_warn", 7)]


def test_rank_of_log_names():
    from pathlib import Path

    assert rank_of_log(Path("/s/j/rank-00012/stdout.log")) == 12
    assert rank_of_log(Path("/var/log/train_rank3.log")) == 3
    assert rank_of_log(Path("/var/log/train.log")) == -1
