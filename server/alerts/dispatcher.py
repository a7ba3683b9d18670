"""The alert dispatcher: delivers claimed outbox rows to webhooks, grouped, signed, retried.

Runs as a background service of the server (``async start()/stop()``). Each pass claims
due rows from the SQL outbox (a lease per row, see :mod:`.outbox`, so replicas sharing
the outbox never post the same row at once), groups them by (webhook, group key) into
one Alertmanager payload, checks and pins the target (:mod:`.guard`), POSTs it with the
webhook's timeout and an HMAC signature, and marks the rows delivered on a 2xx answer;
anything else schedules a retry with exponential backoff, up to the webhook's
``max_attempts``. A URL that is malformed or refused by the guard fails its rows at once.

Every failure is contained to its own payload: one bad webhook (or row) never stops the
pass or the other webhooks' deliveries. Receivers' answers are never read: only their
status is recorded (``last_error`` is e.g. ``HTTP 503``).

Each alert of a payload carries ``annotations.notification_id`` (stable across attempts
and replicas) and each request the header ``X-Fleetscope-Delivery`` (a hash of the ids
it carries), so receivers can deduplicate the rare redelivery after a crash.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

import httpx
from fleetscope.server.db.diagnosis_models import AlertOutbox, Webhook
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from .guard import WebhookGuard, WebhookURLError, install_log_redaction, redact_url
from .outbox import claim_due, held_rows, mark_delivered, mark_failed, notification_id
from .payload import build_payload
from .secrets import SecretBox, SecretKeyError
from .signing import sign_headers

log = logging.getLogger(__name__)

DELIVERY_HEADER = "X-Fleetscope-Delivery"


@dataclass
class Delivery:
    """One payload to post: the rows it carries and what is needed to send it."""

    ids: list[int]
    hook_name: str
    url: str
    secret: str
    timeout_s: float
    max_attempts: int
    body: bytes = b""
    notification_ids: list[str] = field(default_factory=list)
    error: str = ""
    """Set when the payload could not be prepared (the rows fail without a request)."""
    permanent: bool = False


@dataclass(frozen=True)
class Outcome:
    ok: bool
    error: str = ""
    permanent: bool = False


class AlertDispatcher:
    """Delivers the outbox; ``wake()`` (from any thread) makes it look at the outbox now."""

    def __init__(self, db: sessionmaker[Session], poll_s: float = 1.0, retry_base_s: float = 1.0,
                 retry_max_s: float = 300.0, external_url: str = "", guard: WebhookGuard | None = None,
                 secrets: SecretBox | None = None, lease_s: float = 60.0, batch: int = 200,
                 replica: str | None = None) -> None:  # fmt: skip
        self.db = db
        self.poll_s = poll_s
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.external_url = external_url
        self.guard = guard or WebhookGuard()
        self.secrets = secrets
        self.lease_s = lease_s
        self.batch = batch
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """Identity of this dispatcher in claim tokens (unique per process start)."""
        self._passes = 0
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.num_delivered = 0
        self.num_failed_attempts = 0
        install_log_redaction()

    async def start(self) -> None:
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        if self.secrets is not None:
            await asyncio.to_thread(self._seal_legacy)
        self._task = asyncio.create_task(self._run(), name="fleetscope-alert-dispatcher")

    def _seal_legacy(self) -> None:
        from .secrets import seal_legacy

        if self.secrets is None:
            return
        try:
            with self.db() as s:
                seal_legacy(s, self.secrets)
        except Exception:  # a replica racing on the same rows; the next start retries
            log.warning("sealing plaintext webhook secrets failed", exc_info=True)

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task:
            try:
                await asyncio.wait_for(self._task, timeout=10)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()

    def wake(self) -> None:
        """Start a delivery pass now; safe from worker threads (the diagnosis passes)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._wake.set()
            return
        try:
            in_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
            while not self._stopping:
                self._wake.clear()  # before the pass: a wake during it starts another one
                try:
                    await self.deliver_due(client)
                except Exception:
                    log.exception("alert dispatch pass failed")
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
                except asyncio.TimeoutError:
                    pass

    def new_token(self) -> str:
        self._passes += 1
        return f"{self.replica}:{self._passes}"

    async def deliver_due(self, client: httpx.AsyncClient) -> int:
        """One pass: claim due rows, post them, record the outcomes; returns payloads delivered."""
        token = self.new_token()
        jobs = await asyncio.to_thread(self._claim, time.time_ns(), token)
        if not jobs:
            return 0
        results = await asyncio.gather(*(self._deliver(client, j, token) for j in jobs))
        return sum(1 for ok in results if ok)

    async def _deliver(self, client: httpx.AsyncClient, job: Delivery, token: str) -> bool:
        """Post one payload and record its outcome at once (not after the slowest receiver of
        the pass), so a crash re-sends only what was really in flight."""
        try:
            res = await self._post(client, job)
        except Exception as e:  # contained to this payload
            res = Outcome(False, f"internal error: {type(e).__name__}")
        try:
            await asyncio.to_thread(self._record, [job], [res], token)
        except Exception:  # the claim expires and the rows are delivered again
            log.exception("recording a webhook delivery failed")
        return res.ok

    async def send_now(self, client: httpx.AsyncClient, hook: Webhook, body: bytes) -> Outcome:
        """POST ``body`` to ``hook`` once, outside the outbox (a test notification, say), with
        everything a real delivery gets: the SSRF guard and pinning, the opened secret's
        signature, the timeout cap, status-only errors. Never raises."""
        base = Delivery(ids=[], hook_name=hook.name, url=hook.url, secret="", max_attempts=1,
                        timeout_s=max(0.1, min(float(hook.timeout_s or 5.0), self.lease_s / 2)), body=body)
        try:
            stored = hook.secret or ""
            base.secret = self.secrets.open(stored) if self.secrets is not None else stored
        except SecretKeyError as e:
            return Outcome(False, str(e))
        try:
            return await self._post(client, base)
        except Exception as e:  # contained, as in a delivery pass
            return Outcome(False, f"internal error: {type(e).__name__}")

    def _claim(self, now: int, token: str) -> list[Delivery]:
        with self.db() as s:
            groups = claim_due(s, now, token, int(self.lease_s * 1e9), self.batch)
            if not groups:
                return []
            hook_ids = {h for h, _ in groups}
            hooks = {h.id: h for h in s.scalars(select(Webhook).where(Webhook.id.in_(hook_ids)))}
            out: list[Delivery] = []
            for (hook_id, _key), rows in groups.items():
                hook = hooks.get(hook_id)
                if hook is None:  # deleted meanwhile (the rows cascade away)
                    continue
                out.extend(self._prepare(hook, rows))
            return out

    def _prepare(self, hook: Webhook, rows: list[AlertOutbox]) -> list[Delivery]:
        """The payload of one group, or, where a row cannot be built, one failure per bad row."""
        base = {"hook_name": hook.name, "url": hook.url, "max_attempts": hook.max_attempts,
                "timeout_s": max(0.1, min(float(hook.timeout_s), self.lease_s / 2))}
        try:
            secret = self.secrets.open(hook.secret) if self.secrets is not None else hook.secret
        except SecretKeyError as e:
            return [Delivery(ids=[r.id for r in rows], secret="", error=str(e), **base)]
        good, alerts, bad = [], [], []
        for r in rows:
            try:
                a = json.loads(r.alert)
                a.setdefault("annotations", {})["notification_id"] = notification_id(r)
                alerts.append(a)
                good.append(r)
            except (ValueError, TypeError, AttributeError) as e:
                bad.append(Delivery(ids=[r.id], secret="", error=f"unreadable alert row: {type(e).__name__}",
                                    permanent=True, **base))  # fmt: skip
        if not good:
            return bad
        try:
            body = json.dumps(build_payload(hook.name, alerts, self.external_url), separators=(",", ":")).encode()
        except Exception as e:  # a malformed alert object among good JSON
            return bad + [Delivery(ids=[r.id], secret="", error=f"cannot build payload: {type(e).__name__}",
                                   permanent=True, **base) for r in good]  # fmt: skip
        nids = [a["annotations"]["notification_id"] for a in alerts]
        return bad + [Delivery(ids=[r.id for r in good], secret=secret, body=body, notification_ids=nids, **base)]

    async def _post(self, client: httpx.AsyncClient, job: Delivery) -> Outcome:
        if job.error:
            return Outcome(False, job.error, job.permanent)
        try:
            target = await asyncio.to_thread(self.guard.pin, job.url)
        except WebhookURLError as e:
            return Outcome(False, f"refused: {e}", permanent=not e.transient)
        delivery_id = hashlib.sha256(",".join(sorted(job.notification_ids)).encode()).hexdigest()[:32]
        headers = {"Content-Type": "application/json", "User-Agent": "fleetscope-alerts/1",
                   DELIVERY_HEADER: delivery_id, **target.headers, **sign_headers(job.secret, job.body)}
        try:
            request = client.build_request("POST", target.url, content=job.body, headers=headers,
                                           timeout=httpx.Timeout(job.timeout_s), extensions=target.extensions)
            response = await client.send(request, stream=True)  # the answer's body is never read
            await response.aclose()
        except httpx.HTTPError as e:
            return Outcome(False, type(e).__name__)
        except Exception as e:  # anything else about this one request stays with it
            return Outcome(False, f"delivery error: {type(e).__name__}")
        if 200 <= response.status_code < 300:
            return Outcome(True)
        return Outcome(False, f"HTTP {response.status_code}")

    def _record(self, jobs: list[Delivery], results: list[Outcome], token: str) -> None:
        now = time.time_ns()
        with self.db() as s:
            for job, res in zip(jobs, results):
                rows = held_rows(s, job.ids, token)
                if res.ok:
                    mark_delivered(s, rows, now)
                    self.num_delivered += 1
                else:
                    log.warning("webhook %r (%s) failed: %s", job.hook_name, redact_url(job.url), res.error)
                    self.num_failed_attempts += 1
                    mark_failed(s, rows, res.error, now, job.max_attempts, self.retry_base_s, self.retry_max_s,
                                permanent=res.permanent)  # fmt: skip
