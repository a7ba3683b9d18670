"""Spool files: the append-only, segmented per-rank files between hooks and agent.

Layout under a spool directory::

    <spool>/<job>/rank-00005/seg-00000000.fsp
    <spool>/<job>/rank-00005/seg-00000001.fsp      (a newer segment seals older ones)
    <spool>/<job>/rank-00005/rank.json             (pid, host, local rank, started)

A segment is a sequence of frames::

    b"FSP1" | uint32 LE payload length | uint32 LE crc32(payload) | payload

and every payload is an uncompressed Arrow IPC stream of one record type (the codec's
table format). A reader resumes at any frame boundary by byte offset. A frame whose
header or checksum is wrong is reported as corrupt and the reader resynchronises at
the next ``FSP1`` magic, so a torn or damaged write loses only what it touched.

Only the writer appends, and only to its newest segment; a segment for which a newer
one exists is sealed (complete) and may be deleted once its frames are acknowledged.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"FSP1"
HEADER = struct.Struct("<4sII")
SEGMENT_GLOB = "seg-*.fsp"
MAX_FRAME_BYTES = 256 * 1024 * 1024


def rank_dir(spool: str | os.PathLike, job: str, rank: int) -> Path:
    return Path(spool) / job / f"rank-{rank:05d}"


def segment_name(index: int) -> str:
    return f"seg-{index:08d}.fsp"


def segment_index(path: str | os.PathLike) -> int:
    return int(Path(path).stem.split("-")[1])


def list_segments(directory: str | os.PathLike) -> list[Path]:
    """Segments of one rank directory, oldest first."""
    return sorted(Path(directory).glob(SEGMENT_GLOB), key=segment_index)


def encode_frame(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True)
class Frame:
    start: int
    """Byte offset of the frame header."""
    end: int
    """Byte offset just after the frame (where the next read resumes)."""
    payload: bytes | None
    """The payload; ``None`` for a corrupt stretch of bytes [start, end) that was skipped."""

    @property
    def corrupt(self) -> bool:
        return self.payload is None


def read_frames(path: str | os.PathLike, offset: int = 0, sealed: bool = False,
                max_bytes: int | None = None) -> Iterator[Frame]:
    """Read frames from ``offset``.

    An incomplete frame at the end of the file is left for later (the writer may still
    be writing it) unless ``sealed`` is true, in which case the tail is reported as a
    corrupt frame. Stops once ``max_bytes`` of payload have been yielded, when given
    (segments are bounded in size, so reading the rest of one is cheap).
    """
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    pos, n, total = 0, len(data), 0
    while pos < n:
        if max_bytes is not None and total >= max_bytes:
            return
        if n - pos < HEADER.size:
            if sealed:
                yield Frame(offset + pos, offset + n, None)
            return
        magic, length, crc = HEADER.unpack_from(data, pos)
        if magic == MAGIC and length <= MAX_FRAME_BYTES:
            end = pos + HEADER.size + length
            if end > n:
                if sealed:
                    yield Frame(offset + pos, offset + n, None)
                return
            payload = data[pos + HEADER.size : end]
            if zlib.crc32(payload) == crc:
                yield Frame(offset + pos, offset + end, payload)
                total += length
                pos = end
                continue
        # corrupt: resynchronise at the next magic after this position
        nxt = data.find(MAGIC, pos + 1)
        if nxt < 0:
            if sealed:
                yield Frame(offset + pos, offset + n, None)
            return
        yield Frame(offset + pos, offset + nxt, None)
        pos = nxt


def write_rank_info(directory: str | os.PathLike, info: dict) -> None:
    """Atomically write ``rank.json`` (pid, host, local_rank, ...) for the agent."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".rank.json.{os.getpid()}"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, d / "rank.json")


def read_rank_info(directory: str | os.PathLike) -> dict:
    try:
        return json.loads((Path(directory) / "rank.json").read_text())
    except (OSError, ValueError):
        return {}
