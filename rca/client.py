"""The REST calls of the RCA commands; every failure becomes a one-line CliError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from fleetscope import env
from fleetscope.cli import CliError
from fleetscope.config import API_PREFIX


def read_token(token_file: str | None) -> str | None:
    """The bearer token: ``token_file``'s first line, else ``$FLEETSCOPE_TOKEN``."""
    if token_file:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as e:
            raise CliError(f"--token-file {token_file!r}: {e.strerror or e}") from None
        if not text:
            raise CliError(f"--token-file {token_file!r} is empty")
        return text.splitlines()[0].strip()
    return env.TOKEN.get()


class RcaClient:
    """``GET``/``POST`` on the server's ``/api/v1``; raises :class:`CliError` on failure.

    Args:
        server: base URL (``http://host:port``, with or without ``/api/v1``).
        token: bearer token, or ``None``.
        timeout_s: per-request timeout.
    """

    def __init__(self, server: str, token: str | None, timeout_s: float = 30.0) -> None:
        base = server.strip().rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise CliError(f"--server {server!r}: expected an http(s):// URL")
        self.base = base if base.endswith(API_PREFIX) else base + API_PREFIX
        self.server = server
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(timeout=timeout_s, headers=headers, follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, json=body)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._http.request(method, self.base + path, **kw)
        except httpx.TimeoutException:
            raise CliError(f"server {self.server} did not answer {method} {path} in time (--timeout-s)") from None
        except httpx.HTTPError as e:
            raise CliError(f"cannot reach the fleetscope server at {self.server} ({type(e).__name__}: {e}); "
                           "set --server or FLEETSCOPE_SERVER") from None
        if r.status_code == 401:
            raise CliError(f"server {self.server} refused the request (HTTP 401): set FLEETSCOPE_TOKEN "
                           "or --token-file to a valid token")
        if r.status_code == 403:
            raise CliError(f"server {self.server}: the token may not {method} {path} (HTTP 403): {_detail(r)}")
        if r.status_code >= 400:
            raise CliError(f"{_detail(r)} (HTTP {r.status_code})")
        try:
            return r.json()
        except ValueError:
            raise CliError(f"{method} {path}: the answer of {self.server} is not JSON; is it a fleetscope server?") from None


def _detail(r: httpx.Response) -> str:
    try:
        d = r.json().get("detail")
    except (ValueError, AttributeError):
        return r.text[:200] or r.reason_phrase
    if isinstance(d, list):  # FastAPI validation errors
        return "; ".join(f"{'.'.join(str(x) for x in e.get('loc', [])[1:])}: {e.get('msg', '')}" for e in d)
    return str(d)
