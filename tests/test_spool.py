import os

from fleetscope import spool


def write(path, payloads):
    with open(path, "ab") as f:
        for p in payloads:
            f.write(spool.encode_frame(p))


def test_frames_resume_by_offset(tmp_path):
    seg = tmp_path / spool.segment_name(0)
    write(seg, [b"a" * 10, b"b" * 20])
    frames = list(spool.read_frames(seg))
    assert [f.payload for f in frames] == [b"a" * 10, b"b" * 20]
    write(seg, [b"c"])
    more = list(spool.read_frames(seg, frames[-1].end))
    assert [f.payload for f in more] == [b"c"]


def test_partial_tail_waits_unless_sealed(tmp_path):
    seg = tmp_path / spool.segment_name(0)
    frame = spool.encode_frame(b"x" * 100)
    seg.write_bytes(spool.encode_frame(b"ok") + frame[:50])
    assert [f.payload for f in spool.read_frames(seg)] == [b"ok"]
    sealed = list(spool.read_frames(seg, sealed=True))
    assert sealed[0].payload == b"ok" and sealed[1].corrupt
    assert sealed[1].end == os.path.getsize(seg)


def test_corrupt_bytes_are_skipped_and_reading_resyncs(tmp_path):
    seg = tmp_path / spool.segment_name(3)
    good = [spool.encode_frame(bytes([i]) * 50) for i in range(3)]
    damaged = bytearray(good[1])
    damaged[20] ^= 0xFF  # payload bit flip -> crc mismatch
    seg.write_bytes(good[0] + b"garbage" + bytes(damaged) + good[2])
    frames = list(spool.read_frames(seg))
    payloads = [f.payload for f in frames if not f.corrupt]
    assert payloads == [bytes([0]) * 50, bytes([2]) * 50]
    assert sum(f.corrupt for f in frames) >= 1
    # the offsets tile the file with no gaps
    assert frames[0].start == 0 and frames[-1].end == os.path.getsize(seg)
    assert all(a.end == b.start for a, b in zip(frames, frames[1:]))


def test_segments_sorted_and_rank_info(tmp_path):
    d = spool.rank_dir(tmp_path, "job1", 5)
    d.mkdir(parents=True)
    for i in (10, 2, 1):
        (d / spool.segment_name(i)).write_bytes(b"")
    assert [spool.segment_index(p) for p in spool.list_segments(d)] == [1, 2, 10]
    spool.write_rank_info(d, {"pid": 123})
    assert spool.read_rank_info(d) == {"pid": 123}
