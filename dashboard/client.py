"""A small REST client for the fleetscope API: the dashboard's only data source.

Every call returns an :class:`ApiResult` instead of raising, so a view can show an
explicit "not available" or error state (a missing route, an unknown job, a server
that is down) rather than a stack trace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

API_PREFIX = "/api/v1"
INCIDENTS_PAGE = 100
"""Incidents the dashboard asks for per refresh (the server pages in SQL)."""


@dataclass(frozen=True)
class ApiResult:
    """Outcome of one REST call."""

    data: Any = None
    """Decoded JSON body (or raw bytes for ``get_bytes``) when the call succeeded."""
    error: str = ""
    """Human-readable reason when it did not; empty on success."""
    status: int = 0
    """HTTP status, 0 when the server could not be reached."""
    detail: Any = None
    """The error body's ``detail`` as sent (FastAPI: a list of ``{loc, msg}`` for 422), so
    a form can put each message next to its field."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def not_available(self) -> bool:
        """The server has no such route (an older server, or a component not installed)."""
        return self.status in (404, 405) and self.error.lower().strip(". ") in (
            "not found",
            "method not allowed",
        )


def normalize_api_base(url: str) -> str:
    """``http://h:p`` or ``http://h:p/api/v1`` -> ``http://h:p/api/v1``.

    A wildcard bind address (``0.0.0.0``, ``::``) is replaced by loopback, because the
    dashboard calls the API from the same host when it is mounted in the server.

    Raises:
        ValueError: the URL is not an absolute http(s) URL.
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"API URL must look like http://host:port, got {url!r}")
    netloc = parts.netloc.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]")
    path = parts.path.rstrip("/")
    if not path.endswith(API_PREFIX):
        path += API_PREFIX
    return urlunsplit((parts.scheme, netloc, path, "", ""))


class ApiClient:
    """Thin, failure-tolerant wrapper over the fleetscope REST API.

    Args:
        api_base: server URL, with or without the ``/api/v1`` prefix.
        timeout_s: per-request timeout.
        token: a fixed bearer token (the standalone dashboard's ``--token``).
        credential: called per request for the bearer token to send (the browser's,
            when mounted in the server); wins over ``token`` when it returns one.
    """

    def __init__(
        self, api_base: str | Callable[[], str], timeout_s: float = 60.0, token: str | None = None,
        credential: Callable[[], str | None] | None = None,
    ) -> None:
        if callable(api_base):
            self._resolve: Callable[[], str] | None = api_base
            self._fixed_base = ""
        else:
            self._resolve = None
            self._fixed_base = normalize_api_base(api_base)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._credential = credential
        self._http = httpx.Client(timeout=timeout_s, headers=headers)

    @property
    def api_base(self) -> str:
        """The API URL (resolved now when it is computed per request)."""
        return normalize_api_base(self._resolve()) if self._resolve else self._fixed_base

    def close(self) -> None:
        self._http.close()

    # ---- generic -------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        raw: bool = False,
    ) -> ApiResult:
        clean = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        try:
            base = self.api_base
        except ValueError as e:
            return ApiResult(error=str(e))
        headers = None
        if self._credential is not None:
            given = self._credential()
            if given:
                headers = {"Authorization": f"Bearer {given}"}
        try:
            resp = self._http.request(method, base + path, params=clean, json=json, headers=headers)
        except httpx.HTTPError as e:
            return ApiResult(error=f"API unreachable at {base}: {type(e).__name__}")
        if resp.status_code >= 400:
            return ApiResult(error=_detail(resp), status=resp.status_code, detail=_raw_detail(resp))
        if raw:
            return ApiResult(data=resp.content, status=resp.status_code)
        if not resp.content:
            return ApiResult(data={}, status=resp.status_code)
        try:
            return ApiResult(data=resp.json(), status=resp.status_code)
        except ValueError:
            return ApiResult(error=f"{path}: response is not JSON", status=resp.status_code)

    def get(self, path: str, **params: Any) -> ApiResult:
        return self.request("GET", path, params=params)

    # ---- fleet & jobs (engineer A) -------------------------------------------------
    def jobs(self) -> ApiResult:
        return self.get("/jobs")

    def job(self, job: str) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}")

    def instrumentation(self, job: str) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/instrumentation")

    # ---- views (this component's server routes) ------------------------------------
    def heatmap(self, job: str, **params: Any) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/heatmap", **params)

    def grid(self, job: str, **params: Any) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/grid", **params)

    def timeline(self, job: str, **params: Any) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/timeline", **params)

    def trend(self, job: str, **params: Any) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/trend", **params)

    def hardware(self, job: str, **params: Any) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/hardware", **params)

    def trace(self, job: str, **params: Any) -> ApiResult:
        return self.request("GET", f"/jobs/{_q(job)}/trace.json", params=params, raw=True)

    # ---- diagnosis & alerts (engineer D) -------------------------------------------
    def stragglers(self, job: str) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/stragglers")

    def hang(self, job: str) -> ApiResult:
        return self.get(f"/jobs/{_q(job)}/hang")

    def hosts(self) -> ApiResult:
        return self.get("/hosts")

    def host(self, host: str, **params: Any) -> ApiResult:
        """One host across jobs: ranks it served, straggler rate, incidents, self-check."""
        return self.get(f"/hosts/{_q(host)}", **params)

    def selfcheck_hosts(self, **params: Any) -> ApiResult:
        """Every host's self-check status, worst first, and all findings."""
        return self.get("/selfcheck/hosts", **params)

    def host_selfcheck(self, host: str, **params: Any) -> ApiResult:
        """One host's latest self-check probe results with fleet/history scores and findings."""
        return self.get(f"/hosts/{_q(host)}/selfcheck", **params)

    def incidents(self, **params: Any) -> ApiResult:
        """One bounded page of incidents, newest first (``limit`` defaults to
        :data:`INCIDENTS_PAGE`; the answer's ``total`` counts every match)."""
        params.setdefault("limit", INCIDENTS_PAGE)
        return self.get("/incidents", **params)

    def incident(self, incident_id: str | int) -> ApiResult:
        return self.get(f"/incidents/{_q(str(incident_id))}")

    def incident_action(self, incident_id: str | int, action: str) -> ApiResult:
        return self.request("POST", f"/incidents/{_q(str(incident_id))}/{action}", json={"by": "dashboard"})

    def alert_rules(self) -> ApiResult:
        return self.get("/alerts/rules")

    def webhooks(self) -> ApiResult:
        return self.get("/alerts/webhooks")

    def create(self, path: str, body: Mapping[str, Any]) -> ApiResult:
        return self.request("POST", path, json=dict(body))

    def delete(self, path: str, item_id: str | int | None = None) -> ApiResult:
        """DELETE ``path`` or, with ``item_id``, ``path/<item_id>`` (the id quoted as one
        path segment: ``../rules/3`` cannot reach another resource)."""
        if item_id is not None:
            path = f"{path}/{_q(str(item_id))}"
        return self.request("DELETE", path)

    def test_webhook(self, hook_id: str | int) -> ApiResult:
        """Send one test notification to a webhook now (``delivered`` / ``error``)."""
        return self.request("POST", f"/alerts/webhooks/{_q(str(hook_id))}/test")


def items_of(data: Any, *keys: str) -> list[dict]:
    """The list inside a list endpoint's answer: the body itself, or its ``items`` (or
    one of ``keys``) field for paged answers such as ``{"total": 3, "items": [...]}``."""
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        for k in (*keys, "items"):
            if isinstance(data.get(k), list):
                return data[k]
    return []


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _raw_detail(resp: httpx.Response) -> Any:
    try:
        body = resp.json()
    except ValueError:
        return None
    return body.get("detail") if isinstance(body, dict) else None


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return f"HTTP {resp.status_code}"
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # FastAPI validation errors
        return "; ".join(
            f"{'.'.join(str(x) for x in d.get('loc', []))}: {d.get('msg', '')}" for d in detail
        )
    return str(detail) if detail else f"HTTP {resp.status_code}"
