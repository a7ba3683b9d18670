"""Coalescing: batches queued behind a busy sender leave as one bounded request.

The server's cost of a request is mostly fixed (decode, validation and dedup work per
record type and per request, a few ms whatever its size; see ``docs/ingest.md``), so a
fleet of agents that each POST a small batch every ``batch_delay_s`` spends the
server's CPU on request overhead, falls behind, and then queues ever more small
batches. Instead, a sender that becomes free takes *everything* queued for its host at
that moment, up to :class:`CoalesceLimits`, and sends it as one request; and while
one of its requests is on the wire, a host starts another only for a full request's
worth (:func:`should_send`). The request size adapts to the server's latency (Nagle's
algorithm, for batches), while an idle server still gets each batch as soon as it is
cut.

Rules every user of this module keeps:

* Order: batches are taken oldest first and their tables are concatenated in that
  order per record type, so a host's rows reach the store in the order they were cut.
* Bounds: a coalesced request never has more than ``max_rows`` rows or (Arrow,
  uncompressed) ``max_bytes`` bytes, unless a single batch is already larger (then it
  travels alone, as before). The defaults are well under the server's
  ``max_request_rows`` / ``max_request_bytes``; a 413 answer makes the sender split.
* Idempotency: the key of a coalesced request is a function of the batches it covers
  (their keys, in order), and a retry re-sends the same bytes under the same key, so
  the server stores a retried coalesced request once.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import pyarrow as pa

DEFAULT_MAX_ROWS: Final = 250_000
"""Rows of one coalesced request (server default ``max_request_rows``: 2,000,000)."""
DEFAULT_MAX_BYTES: Final = 24 << 20
"""Uncompressed Arrow bytes of one coalesced request (server default
``max_request_bytes``: 64 MiB of body, ``max_decoded_bytes``: 256 MiB)."""

T = TypeVar("T")


@dataclass(frozen=True)
class CoalesceLimits:
    """Bounds of one coalesced request."""

    max_rows: int = DEFAULT_MAX_ROWS
    """Most rows in one request (a single larger batch still travels, alone)."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Most uncompressed bytes in one request (same exception)."""
    max_batches: int = 4096
    """Most batches merged into one request (bounds the key and the bookkeeping)."""
    enabled: bool = True
    """False: one request per batch (the behaviour before coalescing; for benchmarks)."""

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes", "max_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"coalesce {name.replace('_', '-')} must be a positive integer, got {v!r}")


NO_COALESCING: Final = CoalesceLimits(enabled=False)


@dataclass(frozen=True)
class Sized(Generic[T]):
    """A queued batch with what the bounds count."""

    item: T
    num_rows: int
    num_bytes: int


def take(queue: deque[Sized[T]], limits: CoalesceLimits) -> list[Sized[T]]:
    """Pop the oldest queued batches that fit in one request (at least one if any).

    Not thread-safe: the caller holds the queue's lock.
    """
    if not queue:
        return []
    out = [queue.popleft()]
    if not limits.enabled:
        return out
    rows, size = out[0].num_rows, out[0].num_bytes
    while queue and len(out) < limits.max_batches:
        nxt = queue[0]
        if rows + nxt.num_rows > limits.max_rows or size + nxt.num_bytes > limits.max_bytes:
            break
        out.append(queue.popleft())
        rows += nxt.num_rows
        size += nxt.num_bytes
    return out


def should_send(num_in_flight: int, queued_rows: int, queued_bytes: int, limits: CoalesceLimits) -> bool:
    """Whether a host with ``num_in_flight`` requests on the wire starts another now.

    Nagle's rule: with nothing on the wire, yes (an idle server gets every batch at
    once); with a request on the wire, only for a full request's worth of queued
    batches, else the queue keeps growing and leaves as one request when the answer
    comes. Without coalescing: always (one request per batch, up to ``in_flight``).
    """
    if not limits.enabled or num_in_flight == 0:
        return True
    return queued_rows >= limits.max_rows or queued_bytes >= limits.max_bytes


def merge_tables(parts: Sequence[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    """Concatenate batches' tables per record type, in the order given (zero-copy)."""
    groups: dict[str, list[pa.Table]] = {}
    for tables in parts:
        for name, t in tables.items():
            if t.num_rows:
                groups.setdefault(name, []).append(t)
    return {name: ts[0] if len(ts) == 1 else pa.concat_tables(ts) for name, ts in groups.items()}


def table_bytes(tables: dict[str, pa.Table]) -> int:
    """Uncompressed Arrow size of a batch (what :class:`CoalesceLimits.max_bytes` counts)."""
    return sum(t.nbytes for t in tables.values())


def coalesced_key(keys: Sequence[str], prefix: str = "fsc1-") -> str:
    """The idempotency key of a request covering batches ``keys`` (in order).

    A single batch keeps its own key, so turning coalescing off or on never changes
    the key of a request that carries one batch.
    """
    if len(keys) == 1:
        return keys[0]
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode() + b"\n")
    return prefix + h.hexdigest()[:40]


def split_halves(items: list[T]) -> tuple[list[T], list[T]]:
    """Halves of a coalesced request the server refused as too large (413), in order."""
    mid = len(items) // 2
    return items[:mid], items[mid:]


def send_splitting(items: list[T], send: Callable[[list[T]], tuple[bool, int]]) -> list[tuple[list[T], bool]]:
    """Send ``items`` as one request; on a 413 with more than one batch, send each half
    the same way (recursively, in order). ``send`` returns (accepted, HTTP status).

    Returns the requests made, each (its batches, accepted?).
    """
    ok, status = send(items)
    if ok or status != 413 or len(items) < 2:
        return [(items, ok)]
    first, second = split_halves(items)
    return send_splitting(first, send) + send_splitting(second, send)
