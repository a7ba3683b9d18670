"""Host-limited ingest tokens cover the rows, not only the header: a token made with
``fleetscope token create --scope ingest --hosts node-1`` may write rows whose ``host`` is
node-1 (or empty: filled from ``X-Fleetscope-Host`` as before), never rows for another host
(403 naming that host, nothing stored). Real server on loopback, tokens made by the real
``fleetscope token`` CLI, Arrow and JSON bodies; stored rows checked through the REST API."""

from __future__ import annotations

import httpx
import pytest

from fleetscope import codec
from tests.helpers.data import sample_rows
from tests.helpers.server import running_server
from tests.test_auth import bearer, make_token

STATIC = "static-admin-token-0123456789"


def post(url, token: str, key: str, records: dict, header_host: str = "node-1", fmt: str = "arrow") -> httpx.Response:
    h = {**bearer(token), "Idempotency-Key": key, "X-Fleetscope-Host": header_host}
    if fmt == "arrow":
        h["Content-Type"] = codec.ARROW_CONTENT_TYPE
        return httpx.post(f"{url.api}/ingest", content=codec.encode_batch(records), headers=h, timeout=60)
    return httpx.post(f"{url.api}/ingest", json={"records": records}, headers=h, timeout=60)


def steps(job: str, host: str, n: int = 2) -> list[dict]:
    return sample_rows("steps", n, job=job, host=host)


def host_jobs(url, host: str) -> dict[str, int]:
    """job -> steps stored for ``host`` (GET /hosts/{host}); {} when none."""
    r = httpx.get(f"{url.api}/hosts/{host}", headers=bearer(STATIC), timeout=60)
    if r.status_code == 404:
        return {}
    r.raise_for_status()
    return {j["job"]: j["num_steps"] for j in r.json()["jobs"]}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    work = tmp_path_factory.mktemp("token-hosts")
    with running_server(work, token=STATIC, diagnosis_enabled=False, token_cache_s=0.5) as url:
        url.db = f"sqlite:///{work / 'control.db'}"  # type: ignore[attr-defined]
        yield url


def test_host_limited_token_may_not_write_rows_for_another_host(srv):
    tok = make_token(srv.db, "ingest", "--hosts", "node-1", "--name", "node-1-agent")
    # its own host, and rows without a host (filled from the header)
    assert post(srv, tok, "own", {"steps": steps("j-own", "node-1")}).status_code == 200
    ok = post(srv, tok, "empty", {"steps": steps("j-empty", "")}, fmt="json")
    assert ok.status_code == 200, ok.text
    # rows claiming another host, behind a header that names the token's own host
    r = post(srv, tok, "forged", {"steps": steps("j-forged", "node-2")})
    assert r.status_code == 403, r.text
    assert "'node-2'" in r.json()["detail"] and "steps.host" in r.json()["detail"]
    assert "node-1" in r.json()["detail"]
    assert r.headers.get("X-Fleetscope-Retry") == "no"  # the agent quarantines, never retries
    # one foreign row among own rows, in another record type, as JSON: the whole batch is refused
    mixed = {"steps": steps("j-mixed", "node-1"),
             "heartbeats": [*sample_rows("heartbeats", 1, job="j-mixed", host="node-1"),
                            *sample_rows("heartbeats", 1, job="j-mixed", host="node-3")]}
    r = post(srv, tok, "mixed", mixed, fmt="json")
    assert r.status_code == 403 and "'node-3'" in r.json()["detail"] and "heartbeats.host" in r.json()["detail"]
    # the header check still holds
    assert post(srv, tok, "hdr", {"steps": steps("j-hdr", "node-2")}, header_host="node-2").status_code == 403

    assert host_jobs(srv, "node-1") == {"j-own": 2, "j-empty": 2}
    assert host_jobs(srv, "node-2") == {}
    assert "j-mixed" not in host_jobs(srv, "node-1")


def test_unlimited_tokens_still_write_rows_for_any_host(srv):
    agent = make_token(srv.db, "ingest", "--name", "fleet-agent")
    assert post(srv, agent, "any-1", {"steps": steps("j-any", "node-5")}, header_host="node-9").status_code == 200
    assert post(srv, STATIC, "any-2", {"steps": steps("j-static", "node-6")}).status_code == 200
    assert host_jobs(srv, "node-5") == {"j-any": 2}
    assert host_jobs(srv, "node-6") == {"j-static": 2}
