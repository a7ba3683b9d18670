"""The alert dispatcher: delivers due outbox rows to webhooks, grouped, signed, retried.

Runs as a background service of the server (``async start()/stop()``). Each pass takes
the due rows from the SQL outbox, groups them by (webhook, group key) into one
Alertmanager payload, POSTs it with the webhook's timeout and an HMAC signature, and
marks the rows delivered on a 2xx answer; anything else schedules a retry with
exponential backoff, up to the webhook's ``max_attempts``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx
from fleetscope.server.db.diagnosis_models import Webhook
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from .outbox import alerts_of, due_groups, mark_delivered, mark_failed
from .payload import build_payload
from .signing import sign_headers

log = logging.getLogger(__name__)


class AlertDispatcher:
    """Delivers the outbox; ``wake()`` (from any thread) makes it look at the outbox now."""

    def __init__(self, db: sessionmaker[Session], poll_s: float = 1.0, retry_base_s: float = 1.0,
                 retry_max_s: float = 300.0, external_url: str = "") -> None:
        self.db = db
        self.poll_s = poll_s
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self.external_url = external_url
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.num_delivered = 0
        self.num_failed_attempts = 0

    async def start(self) -> None:
        self._stopping = False
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="fleetscope-alert-dispatcher")

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
        async with httpx.AsyncClient(follow_redirects=False) as client:
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

    async def deliver_due(self, client: httpx.AsyncClient) -> int:
        """One pass over the due outbox rows; returns the number of payloads delivered."""
        now = time.time_ns()
        jobs = await asyncio.to_thread(self._load_due, now)
        if not jobs:
            return 0
        results = await asyncio.gather(*(self._post(client, j) for j in jobs))
        await asyncio.to_thread(self._record, jobs, results)
        return sum(1 for ok, _ in results if ok)

    def _load_due(self, now: int) -> list[dict[str, Any]]:
        with self.db() as s:
            groups = due_groups(s, now)
            hooks = {h.id: h for h in s.scalars(select(Webhook))}
            out = []
            for (hook_id, _key), rows in groups.items():
                hook = hooks.get(hook_id)
                if hook is None:
                    continue
                payload = build_payload(hook.name, alerts_of(rows), self.external_url)
                out.append({"ids": [r.id for r in rows], "url": hook.url, "secret": hook.secret,
                            "timeout_s": hook.timeout_s, "max_attempts": hook.max_attempts,
                            "body": json.dumps(payload, separators=(",", ":")).encode()})
            return out

    async def _post(self, client: httpx.AsyncClient, job: dict[str, Any]) -> tuple[bool, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "fleetscope-alerts/1",
                   **sign_headers(job["secret"], job["body"])}
        try:
            r = await client.post(job["url"], content=job["body"], headers=headers,
                                  timeout=httpx.Timeout(job["timeout_s"]))
        except httpx.HTTPError as e:
            return False, f"{type(e).__name__}: {e}"
        if 200 <= r.status_code < 300:
            return True, ""
        return False, f"HTTP {r.status_code}: {r.text[:200]}"

    def _record(self, jobs: list[dict[str, Any]], results: list[tuple[bool, str]]) -> None:
        from fleetscope.server.db.diagnosis_models import AlertOutbox

        now = time.time_ns()
        with self.db() as s:
            for job, (ok, err) in zip(jobs, results):
                rows = list(s.scalars(select(AlertOutbox).where(AlertOutbox.id.in_(job["ids"]))))
                if ok:
                    mark_delivered(s, rows, now)
                    self.num_delivered += 1
                else:
                    log.warning("webhook %s failed: %s", job["url"], err)
                    self.num_failed_attempts += 1
                    mark_failed(s, rows, err, now, job["max_attempts"], self.retry_base_s, self.retry_max_s)
