"""Property tests (hypothesis): mutated spool bytes never raise out of the readers.

* :func:`fleetscope.spool.read_frames` and the agent's window reader
  (:func:`fleetscope.agent.tailer.scan_frames`) on any bytes: no exception, the frames
  they report tile the bytes with no gap or overlap, and every frame reported valid is
  one whose checksum matches;
* the agent's frame decoder (:func:`fleetscope.agent.batch.decode_frame`) on any
  mutation of a real frame's payload: a decoded table or ``(None, reason)``, never an
  exception; :func:`fleetscope.spool.read_rank_info` on any bytes: a dict;
* :func:`fleetscope.spool.job_dirname`: any job id becomes one path component that
  maps back to the id.
"""

from __future__ import annotations

import os
import zlib

import pytest

hypothesis = pytest.importorskip("hypothesis")
from fleetscope.agent.batch import decode_frame  # noqa: E402
from fleetscope.agent.tailer import ReadFrame, Segment, scan_frames  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fleetscope import codec, spool  # noqa: E402
from fleetscope.schema import record_type  # noqa: E402

EXAMPLES = int(os.environ.get("FLEETSCOPE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _payload(n: int = 3) -> bytes:
    t = codec.rows_to_table(record_type("steps"), [
        {"job": "j", "rank": 1, "step": s, "start_ns": s, "end_ns": s + 1, "duration_ns": 1,
         "loss": 0.5} for s in range(n)])
    return codec.table_to_ipc(t, compression=None)


GOOD = _payload()
SEGMENT = spool.encode_frame(GOOD) + spool.encode_frame(_payload(1)) + spool.encode_frame(GOOD)


@st.composite
def mutated(draw, base: bytes) -> bytes:
    """``base`` with bit flips, overwritten runs, cuts and inserted bytes."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "overwrite", "cut", "insert", "magic"]))
        if not data:
            data += draw(st.binary(max_size=16))
            continue
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=12))
            data[i:i + len(chunk)] = chunk
        elif op == "cut":
            del data[i:i + draw(st.integers(1, 64))]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=32))
        else:  # a fake header with a random length and checksum
            data[i:i] = spool.HEADER.pack(spool.MAGIC, draw(st.integers(0, 2**32 - 1)),
                                          draw(st.integers(0, 2**32 - 1)))
    return bytes(data)


def _check_tiling(frames: list[tuple[int, int, bytes | None]], n: int, base: int = 0) -> None:
    pos = base
    for start, end, payload in frames:
        assert start == pos and end > start
        if payload is not None:
            assert end - start == spool.HEADER.size + len(payload)
        pos = end
    assert pos <= base + n


@FUZZ
@given(data=st.one_of(mutated(SEGMENT), st.binary(max_size=600)), sealed=st.booleans())
def test_read_frames_on_any_bytes_tiles_and_never_raises(tmp_path_factory, data, sealed):
    path = tmp_path_factory.mktemp("seg") / spool.segment_name(0)
    path.write_bytes(data)
    frames = [(f.start, f.end, f.payload) for f in spool.read_frames(path, sealed=sealed)]
    _check_tiling(frames, len(data))
    for start, _end, payload in frames:
        if payload is not None:
            magic, length, crc = spool.HEADER.unpack_from(data, start)
            assert magic == spool.MAGIC and length == len(payload) and crc == zlib.crc32(payload)
    if sealed and frames:
        assert frames[-1][1] == len(data)  # a sealed file is reported to its end


@FUZZ
@given(data=st.one_of(mutated(SEGMENT), st.binary(max_size=600)), final=st.booleans(),
       at_eof=st.booleans(), base=st.integers(0, 2**40))
def test_agent_window_reader_on_any_bytes_tiles_and_never_raises(data, final, at_eof, base):
    frames = list(scan_frames(data, base, final=final, at_eof=at_eof))
    _check_tiling(frames, len(data), base)
    for start, _end, payload in frames:
        if payload is not None:
            magic, length, crc = spool.HEADER.unpack_from(data, start - base)
            assert magic == spool.MAGIC and crc == zlib.crc32(payload)


SEG = Segment("j/rank-00001/seg-00000000.fsp", spool.rank_dir("/nonexistent", "j", 1) / "seg", 1, 0, 0,
              True, "j", 1)


@FUZZ
@given(payload=st.one_of(mutated(GOOD), st.binary(max_size=400)))
def test_agent_frame_decoder_on_mutated_payloads_never_raises(payload):
    d, why = decode_frame(ReadFrame(SEG, 0, len(payload) + spool.HEADER.size, payload))
    assert (d is None) == bool(why)
    if d is not None:  # what it accepts is a valid, canonical table
        d.table.validate(full=True)
        assert d.table.schema.equals(record_type(d.record).arrow_schema(), check_metadata=False)


@FUZZ
@given(data=st.one_of(st.binary(max_size=300),
                      st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                   lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                       st.sampled_from(["pid", "host", "local_rank", "x"]), c, max_size=4),
                                   max_leaves=10).map(lambda v: __import__("json").dumps(v).encode())))
def test_rank_info_on_any_bytes_is_a_dict_of_typed_fields(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("rank")
    (d / "rank.json").write_bytes(data)
    info = spool.read_rank_info(d)
    assert isinstance(info, dict)
    for k, types in spool.RANK_INFO_TYPES.items():
        if k in info:
            assert isinstance(info[k], types) and not isinstance(info[k], bool)


@FUZZ
@given(job=st.text(min_size=1, max_size=40))
def test_any_job_id_is_one_path_component_that_maps_back(job):
    name = spool.job_dirname(job)
    assert "/" not in name and "\\" not in name and "\0" not in name
    assert name not in (".", "..") and not name.startswith(".")
    assert spool.job_from_dirname(name) == job
    d = spool.rank_dir("/spool", job, 0)
    assert d.parent.parent == spool.Path("/spool")
