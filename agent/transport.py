"""HTTP to the server: POST batches with retries, backoff and jitter; honour 429.

Outcomes of one batch: ``ok`` (200, rows are in the store), ``rejected`` (400, 409,
413, 415, 422: the server will never take these bytes as they are; it also says so
with ``X-Fleetscope-Retry: no``) or ``stopped`` (the agent
is shutting down; the batch stays pending and is re-sent on the next start). Anything
else (connection refused, timeouts, 5xx, 429) is retried until one of those happens.

Only a fleetscope answer counts: an ack is a 200 whose body is the ingest route's JSON
object (``accepted: true``, ``rows`` per table, boolean ``duplicate``), and a rejection
is a 4xx whose body is a JSON object with ``detail``. Anything else (a proxy's or a
wrong ``--server``'s HTML page answering 200 or 400) is retried, never taken as an
acknowledgement: offsets stay where they are and no segment is deleted.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

import httpx
from fleetscope.agent.config import MAX_BACKOFF_S

from fleetscope import codec
from fleetscope.config import API_PREFIX

log = logging.getLogger("fleetscope.agent")

REJECTED_STATUSES = frozenset({400, 409, 413, 415, 422})


@dataclass
class PostResult:
    outcome: str
    """ok | rejected | stopped"""
    status: int = 0
    detail: str = ""
    attempts: int = 0
    duplicate: bool = False


def backoff_s(attempt: int, cap_s: float, base_s: float = 0.1) -> float:
    """Exponential backoff with "equal jitter": uniform in [d/2, d], d = min(cap, base * 2**attempt).

    (Not "full jitter", [0, d]: a retry never comes back sooner than half the backoff.)
    """
    d = min(cap_s, base_s * (2 ** min(attempt, 30)))
    return d / 2 + random.uniform(0, d / 2)


def retry_after_s(value: str | None, default: float) -> float:
    """Seconds from a ``Retry-After`` header (delta-seconds form), else ``default``."""
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
    return default


class Transport:
    """One keep-alive HTTP client to the server, shared by the concurrent senders.

    ``httpx.Client`` is thread-safe (its pool hands each request its own connection);
    the counters and the warn-once state below are guarded by a lock.
    """

    def __init__(self, server: str, host: str, timeout_s: float = 30.0, max_backoff_s: float = MAX_BACKOFF_S,
                 token: str | None = None):
        self.server = server.rstrip("/")
        self.host = host
        self.max_backoff_s = max_backoff_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.server, timeout=timeout_s, headers=headers)
        self._lock = threading.Lock()
        self.num_retries = 0
        self.num_throttled = 0
        self.num_bad_acks = 0
        """200 answers that were not a fleetscope ack (retried, never committed)."""
        self.connected = False
        self._warned = False

    def close(self) -> None:
        self.client.close()

    def post_batch(self, body: bytes, key: str, clock_offset_ns: int, clock_uncertainty_ns: int,
                   stop: threading.Event) -> PostResult:
        """POST one batch until it is acknowledged, rejected, or ``stop`` is set."""
        headers = {
            "Content-Type": codec.ARROW_CONTENT_TYPE,
            "Idempotency-Key": key,
            "X-Fleetscope-Host": self.host,
            "X-Fleetscope-Clock-Offset-Ns": str(int(clock_offset_ns)),
            "X-Fleetscope-Clock-Uncertainty-Ns": str(int(clock_uncertainty_ns)),
        }
        attempt = 0
        while not stop.is_set():
            attempt += 1
            try:
                r = self.client.post(f"{API_PREFIX}/ingest", content=body, headers=headers)
            except httpx.HTTPError as e:
                wait = backoff_s(attempt, self.max_backoff_s)
                self._unreachable(f"{type(e).__name__}: {e}", wait)
            else:
                ack = parse_ack(r) if r.status_code == 200 else None
                if ack is not None:
                    with self._lock:
                        if not self.connected or self._warned:
                            log.info("server %s acknowledged a batch; shipping", self.server)
                        self.connected, self._warned = True, False
                    return PostResult("ok", 200, attempts=attempt, duplicate=ack["duplicate"])
                detail = _detail(r)
                if r.status_code == 200:
                    with self._lock:
                        self.num_bad_acks += 1
                    wait = backoff_s(attempt, self.max_backoff_s)
                    self._unreachable(f"HTTP 200 that is not a fleetscope ack "
                                      f"({r.headers.get('content-type', '?')}: {detail[:80]!r}); "
                                      "is --server a fleetscope server?", wait)
                elif r.status_code in REJECTED_STATUSES and _is_fleetscope_error(r):
                    return PostResult("rejected", r.status_code, detail, attempt)
                elif r.status_code == 429:
                    with self._lock:
                        self.num_throttled += 1
                    wait = retry_after_s(r.headers.get("Retry-After"),
                                         backoff_s(attempt, self.max_backoff_s))
                    wait += random.uniform(0, min(0.25, wait / 4 + 0.01))
                    log.debug("server busy (429), retrying in %.2fs", wait)
                else:
                    wait = backoff_s(attempt, self.max_backoff_s)
                    self._unreachable(f"HTTP {r.status_code}: {detail}", wait)
            with self._lock:
                self.num_retries += 1
            stop.wait(wait)
        return PostResult("stopped", attempts=attempt)

    def _unreachable(self, why: str, wait: float) -> None:
        with self._lock:
            first, self._warned, self.connected = not self._warned, True, False
        if first:
            log.warning("cannot ship to %s (%s); retrying with backoff, spool data is kept",
                        self.server, why)
        else:
            log.debug("still cannot ship (%s); next try in %.2fs", why, wait)


def parse_ack(r: httpx.Response) -> dict | None:
    """The ingest route's acknowledgement, or ``None`` if ``r`` is not one.

    A well-formed ack is a JSON object with ``accepted: true``, ``rows`` (rows stored per
    record table, non-negative integers) and a boolean ``duplicate``
    (:class:`fleetscope.server.api.models.IngestResponse`).
    """
    if "json" not in r.headers.get("content-type", ""):
        return None
    try:
        body = r.json()
    except ValueError:
        return None
    if not isinstance(body, dict) or body.get("accepted") is not True:
        return None
    rows, dup = body.get("rows"), body.get("duplicate")
    counts = list(rows.values()) if isinstance(rows, dict) else [rows]
    if not isinstance(dup, bool) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return None
    return body


def _is_fleetscope_error(r: httpx.Response) -> bool:
    """A 4xx from the fleetscope API: a JSON object with ``detail``."""
    try:
        body = r.json()
    except ValueError:
        return False
    return isinstance(body, dict) and "detail" in body


def _detail(r: httpx.Response) -> str:
    try:
        d = r.json()
        if isinstance(d, dict) and "detail" in d:
            return str(d["detail"])
    except ValueError:
        pass
    return r.text[:500]
