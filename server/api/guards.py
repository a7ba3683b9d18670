"""Request guards in front of every route: Host/Origin checks and the dashboard's login.

:class:`HostOriginGuard` (DNS rebinding, cross-site writes):

* the ``Host`` header must name an allowed host (``FLEETSCOPE_ALLOWED_HOSTS``; by default
  the loopback names when the server is bound to loopback, any host otherwise), so a
  web page whose DNS name was re-pointed at 127.0.0.1 cannot talk to the server;
* a state-changing request (not GET/HEAD/OPTIONS) that a browser marks cross-origin
  (``Origin`` of another host, ``Origin: null``, ``Sec-Fetch-Site: cross-site``) is
  refused unless it carries an ``Authorization`` header, which a cross-site form or
  ``fetch`` cannot add without a CORS preflight the server never grants.

:class:`UiGate` puts the mounted dashboard (``/ui``) behind the API's authentication:
without a valid ``read``/``admin`` credential a browser gets the login page
(``/ui/login``), which checks the token and sets it as an ``HttpOnly``,
``SameSite=Strict`` cookie scoped to ``/ui``. The dashboard forwards that browser's
credential on its REST calls (never a token of the server's own).
"""

from __future__ import annotations

import html
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fleetscope.config import UI_COOKIE

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
MAX_LOGIN_BODY = 16 * 1024


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


def host_of(netloc: str) -> str:
    """``example.com:8000`` / ``[::1]:80`` -> ``example.com`` / ``::1`` (lower case)."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1:].split("]", 1)[0]
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def allowed_hosts(setting: str, bind_host: str) -> tuple[str, ...] | None:
    """The allowed Host names: the setting (comma-separated; ``*``: any), or by default
    the loopback names when bound to loopback; ``None`` means any host."""
    from fleetscope.server.settings import is_loopback

    names = tuple(h.strip().lower() for h in setting.split(",") if h.strip())
    if "*" in names:
        return None
    if names:  # the dashboard mounted in the server calls the API on loopback
        return tuple(dict.fromkeys(names + LOOPBACK_NAMES))
    return LOOPBACK_NAMES if is_loopback(bind_host) else None


async def _send_json(send: Callable, status: int, detail: str, extra: list | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class HostOriginGuard:
    """ASGI middleware: refuse unknown Host names and cross-origin unauthenticated writes."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...] | None, explicit: bool) -> None:
        self.app = app
        self.hosts = hosts
        self.explicit = explicit
        """Whether the allowed hosts were configured (then they may also be Origins)."""

    def host_ok(self, host: str) -> bool:
        return self.hosts is None or host in self.hosts

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        h = _headers(scope)
        host = h.get("host", "")
        if not self.host_ok(host_of(host)):
            return await _send_json(send, 400, f"Host {host!r} is not allowed: set "
                                    "FLEETSCOPE_ALLOWED_HOSTS to the names clients use")
        if scope.get("method", "GET") not in SAFE_METHODS and "authorization" not in h:
            origin = h.get("origin")
            cross = h.get("sec-fetch-site") == "cross-site"
            if origin is not None:
                o = urlsplit(origin)
                same = o.netloc.lower() == host.lower()
                cross = cross or not (same or (self.explicit and o.hostname is not None
                                               and self.host_ok(o.hostname.lower())))
            if cross:
                return await _send_json(send, 403, f"cross-origin {scope.get('method')} without "
                                        f"an Authorization header refused (Origin {origin!r})")
        return await self.app(scope, receive, send)


LOGIN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>fleetscope - sign in</title>
<style>body{{font-family:sans-serif;max-width:28em;margin:4em auto}}input{{width:100%;padding:.4em}}
.err{{color:#b00}}</style></head><body><h2>fleetscope</h2>
<p>This server requires a token (scope <code>read</code> or <code>admin</code>;
<code>fleetscope token create --scope read</code>).</p>
<form method="post" action="{action}"><input type="hidden" name="next" value="{next}">
<label>Token <input type="password" name="token" id="token" autocomplete="current-password" autofocus></label>
<p><button type="submit" id="login">Sign in</button></p></form><p class="err" id="login-error">{error}</p>
</body></html>"""


class UiGate:
    """ASGI middleware: the dashboard under ``path`` needs a read/admin credential.

    Args:
        app: the wrapped app.
        path: where the dashboard is mounted (``/ui``).
        authority: callable returning the :class:`~fleetscope.server.api.deps.Authority`.
    """

    def __init__(self, app: ASGIApp, path: str, authority: Callable[[], Any]) -> None:
        self.app = app
        self.path = path.rstrip("/")
        self.login = self.path + "/login"
        self.logout = self.path + "/logout"
        self.authority = authority

    def _under(self, p: str) -> bool:
        return p == self.path or p.startswith(self.path + "/")

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self._under(path):
            return await self.app(scope, receive, send)
        auth = self.authority()
        if not auth.enabled():
            return await self.app(scope, receive, send)
        if path == self.login:
            return await self._login(scope, receive, send)
        if path == self.logout:
            return await self._redirect(send, self.login, _cookie(scope, "", 0))
        h = _headers(scope)
        p = auth.principal(h, cookie=_cookies(h).get(UI_COOKIE))
        if p is not None and p.scope in ("read", "admin"):
            return await self.app(scope, receive, send)
        if scope.get("method") == "GET" and "text/html" in h.get("accept", ""):
            target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
            return await self._redirect(send, f"{self.login}?next={quote(target, safe='')}")
        why = "an ingest token cannot open the dashboard" if p is not None else \
            "missing or wrong credential: sign in at " + self.login
        await _send_json(send, 401 if p is None else 403, why)

    async def _login(self, scope: Scope, receive: Callable, send: Callable) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        nxt = _safe_next(query.get("next", [""])[-1], self.path)
        if scope.get("method") == "GET":
            return await self._page(send, 200, nxt, "")
        if scope.get("method") != "POST":
            return await _send_json(send, 405, "use GET or POST")
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if len(body) > MAX_LOGIN_BODY:
                return await _send_json(send, 413, f"login form larger than {MAX_LOGIN_BODY} bytes")
            if not msg.get("more_body"):
                break
        form = parse_qs(body.decode("utf-8", "replace"))
        token = form.get("token", [""])[-1].strip()
        nxt = _safe_next(form.get("next", [nxt])[-1], self.path)
        p = self.authority().verify(token) if token else None
        if p is None:
            return await self._page(send, 401, nxt, "wrong or revoked token")
        if p.scope not in ("read", "admin"):
            return await self._page(send, 403, nxt, f"a {p.scope!r} token cannot open the dashboard")
        await self._redirect(send, nxt, _cookie(scope, token, None))

    async def _page(self, send: Callable, status: int, nxt: str, error: str) -> None:
        body = LOGIN_PAGE.format(action=html.escape(self.login), next=html.escape(nxt),
                                 error=html.escape(error)).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"), (b"x-frame-options", b"DENY")]})
        await send({"type": "http.response.body", "body": body})

    async def _redirect(self, send: Callable, location: str, cookie: bytes | None = None) -> None:
        headers = [(b"location", location.encode("latin-1", "replace")), (b"content-length", b"0"),
                   (b"cache-control", b"no-store")]
        if cookie is not None:
            headers.append((b"set-cookie", cookie))
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _cookies(h: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in h.get("cookie", "").split(";"):
        k, _, v = part.strip().partition("=")
        if k:
            out[k] = v
    return out


def _cookie(scope: Scope, value: str, max_age: int | None) -> bytes:
    secure = scope.get("scheme") == "https" or _headers(scope).get("x-forwarded-proto") == "https"
    parts = [f"{UI_COOKIE}={value}", "Path=/ui", "HttpOnly", "SameSite=Strict"]
    if secure:
        parts.append("Secure")
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    return "; ".join(parts).encode("latin-1")


def _safe_next(nxt: str, base: str) -> str:
    """A redirect target inside the dashboard only (no open redirect)."""
    u = urlsplit(nxt)
    if u.scheme or u.netloc or not (u.path == base or u.path.startswith(base + "/")) or "\\" in nxt:
        return base + "/"
    return nxt
