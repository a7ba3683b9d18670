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

A job id becomes one directory name through :func:`job_dirname`: ``/``, ``\\``, NUL,
``%`` and a leading ``.`` are percent-encoded, so ``../x`` or ``/etc`` never name a
path outside the spool. Readers never follow symbolic links inside the spool
(:func:`list_segments` skips them, :func:`open_nofollow` refuses them).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"FSP1"
HEADER = struct.Struct("<4sII")
SEGMENT_GLOB = "seg-*.fsp"
MAX_FRAME_BYTES = 256 * 1024 * 1024


_UNSAFE = {"/": "%2F", "\\": "%5C", "\0": "%00", "%": "%25"}


class SpoolError(ValueError):
    """A spool name or file that cannot be used (bad job id, a symlink, ...)."""


def job_dirname(job: str) -> str:
    """The directory name of a job id: one path component, never ``.``/``..``.

    Ordinary ids (letters, digits, ``-_.:@``...) are unchanged; ``/``, ``\\``, NUL and
    ``%`` are percent-encoded and so is a leading ``.`` (the agent skips hidden names).

    Raises:
        SpoolError: ``job`` is empty or not a string.
    """
    if not isinstance(job, str) or not job:
        raise SpoolError(f"job id {job!r}: must be a non-empty string")
    out = "".join(_UNSAFE.get(c, c) for c in job)
    if out.startswith("."):
        out = "%2E" + out[1:]
    return out


def job_from_dirname(name: str) -> str:
    """The job id of a directory made by :func:`job_dirname` (its inverse)."""
    from urllib.parse import unquote

    return unquote(name) if "%" in name else name


def rank_dir(spool: str | os.PathLike, job: str, rank: int) -> Path:
    """``<spool>/<job_dirname(job)>/rank-XXXXX``; always inside ``spool``."""
    if not isinstance(rank, int) or rank < 0:
        raise SpoolError(f"rank {rank!r}: must be a non-negative integer")
    return Path(spool) / job_dirname(job) / f"rank-{rank:05d}"


def open_nofollow(path: str | os.PathLike):
    """Open a spool file for reading in binary mode, refusing a symbolic link.

    Raises:
        SpoolError: ``path`` is a symbolic link.
        OSError: any other failure to open it.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        if os.path.islink(path):
            raise SpoolError(f"{path}: is a symbolic link; spool files are never followed") from e
        raise
    return os.fdopen(fd, "rb")


def segment_name(index: int) -> str:
    return f"seg-{index:08d}.fsp"


def segment_index(path: str | os.PathLike) -> int:
    return int(Path(path).stem.split("-")[1])


def list_segments(directory: str | os.PathLike) -> list[Path]:
    """Segments of one rank directory, oldest first (symbolic links and names that are
    not ``seg-<number>.fsp`` are left out)."""
    out = []
    for p in Path(directory).glob(SEGMENT_GLOB):
        try:
            segment_index(p)
        except (IndexError, ValueError):
            continue
        if not p.is_symlink():
            out.append(p)
    return sorted(out, key=segment_index)


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
    with open_nofollow(path) as f:
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


RANK_INFO_TYPES: dict[str, tuple[type, ...]] = {
    "pid": (int,), "local_rank": (int,), "rank": (int,), "host": (str,), "job": (str,),
    "cuda_visible_devices": (str, type(None)),
}
"""Known ``rank.json`` fields and their types; a field of another type is dropped."""


def read_rank_info(directory: str | os.PathLike) -> dict[str, Any]:
    """``rank.json`` as a dict; ``{}`` when it is missing, a symlink, not UTF-8 JSON, or
    not an object. Known fields of the wrong type (:data:`RANK_INFO_TYPES`) are dropped,
    so a reader may use ``int(info.get("pid", -1))`` safely."""
    try:
        with open_nofollow(Path(directory) / "rank.json") as f:
            doc = json.loads(f.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # SpoolError, UnicodeDecodeError are ValueErrors
        return {}
    if not isinstance(doc, dict):
        return {}
    out: dict[str, Any] = {}
    for k, v in doc.items():
        types = RANK_INFO_TYPES.get(k)
        if types is not None and (not isinstance(v, types) or isinstance(v, bool)):
            continue
        out[k] = v
    return out
