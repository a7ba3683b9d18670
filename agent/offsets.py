"""Durable agent state: acknowledged read offsets, the batches in flight, counters.

The state is one small JSON file rewritten atomically (write a temporary file, fsync
it, rename it over the old one, fsync the directory), so after a crash at any point the
file holds either the previous or the new state, never a torn one.

Exactly-once shipping rests on two rules:

* an offset moves only after the server acknowledged the bytes before it;
* before a batch is sent, its byte ranges and idempotency key are recorded here as
  ``pending``, in the order the batches were cut from the files. A restarted agent
  re-sends exactly those batches, in that order and with the same keys, before
  anything else, so a batch that reached the store just before a crash is
  deduplicated by the server instead of arriving again under a different key.

Several batches are in flight at once and may be acknowledged out of order
(:mod:`fleetscope.agent.window`): an offset moves only over a file's contiguous
acknowledged prefix, and a batch acknowledged beyond a gap stays pending until the gap
closes. The pending list is therefore short (bounded by the window) but may hold
batches the server already has; their re-send is answered ``duplicate``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_VERSION = 1
log = logging.getLogger("fleetscope.agent")


class UnsupportedState(ValueError):
    """The state file was written by another (newer) agent version: not reset silently."""


def _entries(doc: object, name: str) -> dict[str, dict[str, int]]:
    """Validate ``{"key": {"ino": int, "offset": int}}``."""
    if not isinstance(doc, dict):
        raise ValueError(f"{name}: expected an object")
    for k, e in doc.items():
        if not (isinstance(e, dict) and all(
                isinstance(e.get(f), int) and not isinstance(e.get(f), bool) and e[f] >= 0
                for f in ("ino", "offset"))):
            raise ValueError(f"{name}[{k!r}]: expected {{'ino': int, 'offset': int}}")
    return doc


@dataclass(frozen=True)
class Range:
    """Bytes ``[start, end)`` of one file (identified by key and inode)."""

    file: str
    """File key: path relative to the spool (or ``@outbox/...`` for the agent's own)."""
    ino: int
    start: int
    end: int


@dataclass(frozen=True)
class Pending:
    """A batch in flight: what was (maybe) sent and under which key."""

    key: str
    ranges: tuple[Range, ...]
    clock_offset_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "clock_offset_ns": self.clock_offset_ns,
                "ranges": [asdict(r) for r in self.ranges]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pending:
        ranges = tuple(Range(str(r["file"]), int(r["ino"]), int(r["start"]), int(r["end"]))
                       for r in d["ranges"])
        if not isinstance(d["key"], str) or any(r.start < 0 or r.end < r.start for r in ranges):
            raise ValueError(f"pending batch {d.get('key')!r}: bad key or byte range")
        return cls(d["key"], ranges, int(d.get("clock_offset_ns", 0)))


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably (tmp + fsync + rename + fsync dir)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class OffsetStore:
    """Thread-safe, durable offsets of spool segments and log files."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.files: dict[str, dict[str, int]] = {}
        self.logs: dict[str, dict[str, int]] = {}
        self.counters: dict[str, int] = {}
        self.pending: list[Pending] = []
        self.reset_from: Path | None = None
        """Where an unreadable state file was moved aside at start (``None``: it was fine)."""
        if self.path.exists():
            try:
                self._load(self.path.read_bytes())
            except UnsupportedState:
                raise
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                self._reset(f"{type(e).__name__}: {e}")

    def _load(self, raw: bytes) -> None:
        doc = json.loads(raw.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("state is not a JSON object")
        if doc.get("version") != STATE_VERSION:
            raise UnsupportedState(f"{self.path}: state version {doc.get('version')!r} not supported")
        files = _entries(doc.get("files", {}), "files")
        logs = _entries(doc.get("logs", {}), "logs")
        counters = doc.get("counters", {})
        if not isinstance(counters, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in counters.values()):
            raise ValueError("counters: expected an object of integers")
        raw_p = doc.get("pending") or []
        pending = [Pending.from_json(d) for d in (raw_p if isinstance(raw_p, list) else [raw_p])]
        self.files, self.logs, self.counters, self.pending = files, logs, dict(counters), pending

    def _reset(self, why: str) -> None:
        """An empty, torn or corrupt state file: keep it aside and start from nothing.

        Every file is then re-read from its start: nothing acknowledged is lost, and what
        was shipped before may be sent again (under new batch keys, so the server may
        store some rows twice); the reset is counted (``state_resets``) and logged.
        """
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.time_ns()}")
        try:
            os.replace(self.path, aside)
            self.reset_from = aside
        except OSError:
            self.reset_from = self.path
        log.error("agent state %s is unreadable (%s); moved to %s and starting over: spool "
                  "files are re-read from their start", self.path, why, aside)
        self.counters = {"state_resets": 1}
        self._save()

    # -- spool segments ------------------------------------------------------------------
    def offset(self, file: str, ino: int) -> int:
        """Acknowledged offset of a file; 0 for a file not seen (or replaced: new inode)."""
        with self._lock:
            e = self.files.get(file)
            return e["offset"] if e and e["ino"] == ino else 0

    def begin(self, pending: Pending) -> None:
        """Record a batch about to be sent (durably, before its first byte goes out)."""
        with self._lock:
            if all(p.key != pending.key for p in self.pending):
                self.pending.append(pending)
            self._save()

    def commit(self, pending: Pending, counters: dict[str, int] | None = None) -> None:
        """The server acknowledged ``pending``: advance its files' offsets, clear it."""
        self.skip(list(pending.ranges), counters or {}, done_key=pending.key)

    def skip(self, ranges: list[Range], counters: dict[str, int], done_key: str | None = None,
             done: Iterable[str] = ()) -> None:
        """Move past bytes (acknowledged, corrupt or rejected), durably, in one write.

        Offsets only move forward, so these calls may be applied in any order; the
        caller passes only ranges whose bytes before them are all acknowledged.
        ``done_key`` and ``done`` name pending batches that are finished.
        """
        finished = set(done)
        if done_key is not None:
            finished.add(done_key)
        with self._lock:
            for r in ranges:
                e = self.files.get(r.file)
                if e is None or e["ino"] != r.ino or e["offset"] < r.end:
                    self.files[r.file] = {"ino": r.ino, "offset": r.end}
            if finished:
                self.pending = [p for p in self.pending if p.key not in finished]
            for k, v in counters.items():
                self.counters[k] = self.counters.get(k, 0) + v
            self._save()

    def pending_files(self) -> set[str]:
        with self._lock:
            return {r.file for p in self.pending for r in p.ranges}

    def forget(self, file: str) -> None:
        """Drop a deleted file's entry."""
        with self._lock:
            if self.files.pop(file, None) is not None:
                self._save()

    def add_counters(self, counters: dict[str, int]) -> None:
        with self._lock:
            for k, v in counters.items():
                self.counters[k] = self.counters.get(k, 0) + v
            self._save()

    # -- log files ---------------------------------------------------------------------
    def log_offset(self, path: str, ino: int) -> int:
        with self._lock:
            e = self.logs.get(path)
            return e["offset"] if e and e["ino"] == ino else 0

    def commit_log(self, path: str, ino: int, offset: int) -> None:
        with self._lock:
            self.logs[path] = {"ino": ino, "offset": offset}
            self._save()

    def snapshot_counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counters)

    def _save(self) -> None:
        doc = {
            "version": STATE_VERSION,
            "files": self.files,
            "logs": self.logs,
            "counters": self.counters,
            "pending": [p.to_json() for p in self.pending],
        }
        atomic_write(self.path, json.dumps(doc, sort_keys=True).encode())
