"""The agent survives bad bytes and bad state, and takes only a real ack as an ack.

Issue #13 items 13-15: a non-UTF-8 frame, a malformed rank.json, an empty or corrupt
offsets.json; a wrong --server answering 200 HTML; a capped rejected/; symlinks in the
spool; job ids that would be paths. The shipper runs against the loopback ingest
endpoint of tests/test_agent_pipeline.py (a real HTTP server).
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest
from fleetscope.agent.batch import build_batch, decode_frame
from fleetscope.agent.cli import build_config
from fleetscope.agent.config import read_token
from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.ranks import RankRegistry
from fleetscope.agent.tailer import ReadFrame, Segment, SpoolTailer
from fleetscope.trainer_hooks.sinks import SpoolSink

from fleetscope import codec, spool
from fleetscope.schema import record_type
from tests.test_agent_pipeline import (
    Ingest,
    assert_everything_acked,
    make_shipper,
    run_until_idle,
    state,
    stored_rows,
    write_spool,
)


def _seg(path: Path = Path("x")) -> Segment:
    return Segment("j/rank-00000/seg-00000000.fsp", path, 1, 0, 0, True, "j", 0)


def _steps_table(rank: int, steps: range) -> pa.Table:
    return codec.rows_to_table(record_type("steps"), [
        {"job": "j", "rank": rank, "step": s, "start_ns": s, "end_ns": s + 1, "duration_ns": 1}
        for s in steps])


def _invalid_utf8_inflight() -> bytes:
    """An ``inflight`` frame whose ``op`` string column holds the bytes ff fe."""
    t = codec.rows_to_table(record_type("inflight"), [
        {"job": "j", "rank": 0, "ts_ns": 5, "step": 1, "since_ns": 4, "kind": "collective", "op": "xx", "group_id": "g",
         "seq": 1, "peer": -1}])
    i = t.column_names.index("op")
    bad = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(b"\0\0\0\0\2\0\0\0"),
                                                 pa.py_buffer(b"\xff\xfe")])
    return codec.table_to_ipc(t.set_column(i, t.schema.field(i), bad), compression=None)


def _non_utf8_metadata() -> bytes:
    t = _steps_table(0, range(2))
    t = t.replace_schema_metadata({b"fleetscope.record": b"st\xffeps"})
    return codec.table_to_ipc(t, compression=None)


@pytest.mark.parametrize("payload", [_invalid_utf8_inflight(), _non_utf8_metadata()],
                         ids=["utf8-in-string-column", "utf8-in-metadata"])
def test_non_utf8_frame_is_a_bad_frame_not_a_crash(payload):
    fr = ReadFrame(_seg(), 0, len(payload) + 12, payload)
    d, why = decode_frame(fr)
    assert d is None and "UTF-8" in why
    batch = build_batch("h", [fr], RankRegistry("h"))  # the liveness pass must not raise either
    assert not batch.frames and len(batch.bad) == 1


def test_shipper_skips_non_utf8_frame_and_ships_the_rest(tmp_path):
    expected = write_spool(tmp_path / "spool", ranks=2, frames=3, rows=5)
    seg = spool.rank_dir(tmp_path / "spool", "j", 0) / spool.segment_name(0)
    with open(seg, "ab") as f:  # a bad frame, then more good ones after it
        f.write(spool.encode_frame(_invalid_utf8_inflight()))
        f.write(spool.encode_frame(codec.table_to_ipc(_steps_table(0, range(100, 105)), compression=None)))
    expected += [(0, s) for s in range(100, 105)]
    srv = Ingest()
    srv.serve()
    try:
        sh = make_shipper(tmp_path, srv.url, in_flight=2, batch_bytes=2000)
        run_until_idle(sh)
    finally:
        srv.shutdown()
    assert sorted(stored_rows(srv)) == sorted(expected)
    assert sh.stats.num_corrupt_frames == 1
    assert_everything_acked(tmp_path)
    assert state(tmp_path)["counters"]["corrupt_frames"] == 1


@pytest.mark.parametrize("content", [b'{"pid": "abc", "host": 7}', b"[1, 2]", b'"x"', b"\xff\xfe{",
                                     b'{"pid": 1e999}', b"[" * 100_000])
def test_malformed_rank_json_is_ignored_field_by_field(tmp_path, content):
    d = spool.rank_dir(tmp_path / "spool", "j", 0)
    d.mkdir(parents=True)
    (d / "rank.json").write_bytes(content)
    info = spool.read_rank_info(d)
    assert isinstance(info, dict) and not isinstance(info.get("pid", -1), str)
    reg = RankRegistry("h")
    st = reg.get("j", 0, d)  # reads rank.json: must not raise
    assert st.pid == -1 and reg.writer_alive(st)


def test_malformed_rank_json_does_not_stop_the_tailer(tmp_path):
    write_spool(tmp_path / "spool", ranks=1, frames=2, rows=3)
    d = spool.rank_dir(tmp_path / "spool", "j", 0)
    (d / "rank.json").write_text('{"pid": "not-a-pid", "local_rank": [1]}')
    offsets = OffsetStore(tmp_path / "state" / "offsets.json")
    tailer = SpoolTailer(tmp_path / "spool", None, offsets, RankRegistry("h"))
    frames = tailer.read(1 << 20)
    assert len(frames) == 2 and all(f.payload for f in frames)


@pytest.mark.parametrize("content", [b"", b"{", b"\xff\xfe", b"[]", b'{"version": 1, "files": []}',
                                     b'{"version": 1, "files": {"a": {"ino": "x", "offset": 3}}}',
                                     b'{"version": 1, "pending": [{"key": "k", "ranges": [{"file": 1}]}]}'],
                         ids=["empty", "torn", "binary", "list", "files-list", "bad-entry", "bad-pending"])
def test_empty_or_corrupt_offsets_json_is_set_aside_and_the_agent_starts(tmp_path, content):
    path = tmp_path / "state" / "offsets.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    store = OffsetStore(path)
    assert store.files == {} and store.pending == []
    assert store.reset_from is not None and store.reset_from.read_bytes() == content
    assert json.loads(path.read_text())["counters"] == {"state_resets": 1}


def test_agent_reships_everything_after_an_empty_offsets_json(tmp_path):
    expected = write_spool(tmp_path / "spool", ranks=2, frames=4, rows=5)
    path = tmp_path / "state" / "offsets.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")  # e.g. a crash on a filesystem without ordered writes
    srv = Ingest()
    srv.serve()
    try:
        run_until_idle(make_shipper(tmp_path, srv.url, in_flight=2, batch_bytes=2000))
    finally:
        srv.shutdown()
    assert set(stored_rows(srv)) == set(expected)
    assert_everything_acked(tmp_path)


def test_newer_state_version_still_refuses_to_start(tmp_path):
    path = tmp_path / "offsets.json"
    path.write_text('{"version": 99}')
    with pytest.raises(ValueError, match="version 99"):
        OffsetStore(path)


class _Impostor(ThreadingHTTPServer):
    """Answers every request like a web server that is not fleetscope."""

    daemon_threads = True

    def __init__(self, status: int, body: bytes, ctype: str) -> None:
        super().__init__(("127.0.0.1", 0), _ImpostorHandler)
        self.status, self.body, self.ctype = status, body, ctype
        self.hits = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ImpostorHandler(BaseHTTPRequestHandler):
    server: _Impostor

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.hits += 1
        self.send_response(self.server.status)
        self.send_header("Content-Type", self.server.ctype)
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)


@pytest.mark.parametrize("status,body,ctype", [
    (200, b"<html><body>Welcome to nginx!</body></html>", "text/html"),
    (200, b'{"ok": true}', "application/json"),
    (400, b"<html>400 Bad Request</html>", "text/html"),
], ids=["200-html", "200-other-json", "400-html"])
def test_wrong_server_answer_never_advances_offsets_or_deletes_segments(tmp_path, status, body, ctype):
    write_spool(tmp_path / "spool", ranks=1, frames=3, rows=5)
    seg = spool.rank_dir(tmp_path / "spool", "j", 0) / spool.segment_name(0)
    (seg.parent / spool.segment_name(1)).write_bytes(b"")  # seals seg 0: deletable once acked
    srv = _Impostor(status, body, ctype)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    sh = make_shipper(tmp_path, srv.url, in_flight=1, batch_bytes=100_000)
    t = threading.Thread(target=sh.run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while srv.hits < 3 and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.05)
        sh.retention.apply(sh.tailer.segments(), sh.offsets.pending_files())
    finally:
        sh.stop()
        t.join(30)
        srv.shutdown()
    assert srv.hits >= 3  # retried, not taken as an ack nor as a rejection
    st = state(tmp_path)
    assert not any(v["offset"] for v in st["files"].values())
    assert st["pending"], "the batch stays pending for the real server"
    assert seg.exists() and not (tmp_path / "state" / "rejected").exists()
    assert sh.stats.num_batches == 0 and sh.transport.num_bad_acks >= (status == 200)


def test_rejected_dir_is_capped(tmp_path):
    write_spool(tmp_path / "spool", ranks=1, frames=12, rows=40)
    srv = _Impostor(422, b'{"detail": "no"}', "application/json")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        sh = make_shipper(tmp_path, srv.url, in_flight=1, batch_bytes=1 << 20)
        frame_size = len(next(spool.read_frames(
            spool.rank_dir(tmp_path / "spool", "j", 0) / spool.segment_name(0))).payload)
        sh.rejected_max_bytes = 3 * frame_size + 500
        run_until_idle(sh)
    finally:
        srv.shutdown()
    rejected = tmp_path / "state" / "rejected"
    total = sum(p.stat().st_size for p in rejected.iterdir())
    assert total <= sh.rejected_max_bytes
    assert len(list(rejected.glob("*.frame"))) >= 1
    st = state(tmp_path)
    assert st["counters"]["rejected_frames"] == 12 and st["counters"]["rejected_evicted"] > 0
    assert_everything_acked(tmp_path)


def test_spool_symlinks_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    write_spool(outside, ranks=1, frames=2, rows=3)  # outside/j/rank-00000/seg-0
    root = tmp_path / "spool"
    write_spool(root, ranks=1, frames=1, rows=3)
    os.symlink(outside / "j", root / "linkedjob")  # a job dir that is a link
    os.symlink(outside / "j" / "rank-00000", root / "j" / "rank-00001")  # a rank dir link
    d = spool.rank_dir(root, "j", 0)
    os.symlink(outside / "j" / "rank-00000" / spool.segment_name(0), d / spool.segment_name(1))
    os.symlink("/etc/hostname", d / "rank.json")
    tailer = SpoolTailer(root, None, OffsetStore(tmp_path / "state" / "o.json"), RankRegistry("h"))
    keys = [s.key for s in tailer.segments()]
    assert keys == ["j/rank-00000/seg-00000000.fsp"]
    assert spool.read_rank_info(d) == {}
    with pytest.raises(spool.SpoolError):
        spool.open_nofollow(d / spool.segment_name(1))


@pytest.mark.parametrize("job", ["../../escape", "/abs/path", "..", ".", ".hidden", "a\\b", "x%2Fy"])
def test_job_ids_never_become_paths_in_the_hooks(tmp_path, job):
    root = tmp_path / "spool"
    sink = SpoolSink(root)
    sink.open({"job": job, "rank": 3, "pid": os.getpid(), "host": "h"})
    assert sink.write_many({"steps": [{"job": job, "rank": 3, "step": 1, "start_ns": 1, "end_ns": 2,
                                       "duration_ns": 1}]}) == {}
    sink.close()
    made = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert made and all(root in p.parents for p in made)
    (jobdir,) = [p for p in root.iterdir()]
    assert jobdir.parent == root and not jobdir.name.startswith(".")
    assert spool.job_from_dirname(jobdir.name) == job
    # the agent finds it, under the real job id
    tailer = SpoolTailer(root, None, OffsetStore(tmp_path / "o.json"), RankRegistry("h"), job=job)
    srcs = tailer.sources()
    assert [(s[2], s[3]) for s in srcs] == [(job, 3)]


def test_token_from_file_or_env_not_argv(tmp_path, monkeypatch):
    f = tmp_path / "agent.token"
    f.write_text("fst_secret-from-file\n")
    monkeypatch.setenv("FLEETSCOPE_TOKEN", "from-env")
    assert read_token(f) == "fst_secret-from-file"
    assert read_token(None) == "from-env"
    monkeypatch.setenv("FLEETSCOPE_TOKEN_FILE", str(f))
    assert read_token(None) == "fst_secret-from-file"
    from fleetscope.cli import CliError, build_parser

    args = build_parser().parse_args(["agent", "--server", "http://127.0.0.1:1", "--spool", str(tmp_path),
                                      "--token-file", str(f)])
    assert build_config(args).token == "fst_secret-from-file"
    (tmp_path / "empty").write_text("\n")
    args = build_parser().parse_args(["agent", "--server", "http://127.0.0.1:1", "--spool", str(tmp_path),
                                      "--token-file", str(tmp_path / "empty")])
    with pytest.raises(CliError, match="empty"):
        build_config(args)
    helptext = build_parser()._subparsers._group_actions[0].choices["agent"].format_help()
    assert "--token-file" in helptext and "DISCOURAGED" in helptext
