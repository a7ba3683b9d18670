"""The one webhook receiver of the test suite: a loopback HTTP server that records every
POST, answers a chosen status, and lets a test wait for deliveries without sleeping.

    with WebhookReceiver() as rx:
        ...  # point a webhook at rx.url
        first = rx.wait_for_deliveries(1, timeout_s=30)[0]
        assert first.json()["status"] == "firing"

``status`` / ``answer`` may be changed while it runs (fail on demand); ``on_post`` runs in
the handler thread after the delivery is recorded and may block (hold a request open) or
return a status code for that one request.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Delivery:
    """One POST the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at_s: float  # time.time() on receipt
    at_monotonic_s: float  # time.monotonic() on receipt

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # several replicas may connect at once


class WebhookReceiver:
    """A webhook receiver on ``127.0.0.1`` (a free port unless ``port`` is given)."""

    def __init__(
        self,
        status: int = 200,
        answer: bytes = b"",
        delay_s: float = 0.0,
        on_post: Callable[[Delivery], int | None] | None = None,
        port: int = 0,
        path: str = "/hook",
    ) -> None:
        self.status = status
        self.answer = answer
        self.delay_s = delay_s
        self.on_post = on_post
        self.path = path
        self.deliveries: list[Delivery] = []
        self._cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                delivery = Delivery(self.path, dict(self.headers), body, time.time(), time.monotonic())
                with outer._cond:
                    outer.deliveries.append(delivery)
                    outer._cond.notify_all()
                status = outer.on_post(delivery) if outer.on_post else None
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                answer = outer.answer
                try:
                    self.send_response(status or outer.status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:  # the sender gave up (or died) meanwhile
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", port), Handler)
        self.port: int = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}{self.path}"

    @property
    def num_posts(self) -> int:
        return len(self.deliveries)

    def payloads(self) -> list[Any]:
        """Every body so far, parsed as JSON."""
        with self._cond:
            return [d.json() for d in self.deliveries]

    def notification_counts(self) -> collections.Counter[str]:
        """How many times each alert's ``annotations.notification_id`` was received."""
        counts: collections.Counter[str] = collections.Counter()
        for body in self.payloads():
            for alert in body.get("alerts", ()):
                counts[alert["annotations"]["notification_id"]] += 1
        return counts

    def wait_for_deliveries(self, n: int, timeout_s: float = 30.0) -> list[Delivery]:
        """Block until at least ``n`` POSTs arrived (woken on each), return them all."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.deliveries) >= n, timeout_s):
                raise AssertionError(
                    f"webhook receiver got {len(self.deliveries)} POST(s), expected {n} "
                    f"within {timeout_s}s"
                )
            return list(self.deliveries)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
