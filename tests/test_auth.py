"""Authentication: scoped tokens, the dashboard behind the API's auth, Host/Origin guard.

Issue #13 item 1 (``/ui`` and its Dash routes behind authentication, the browser's
credential forwarded, ids quoted), item 7 (scoped tokens, ``/readyz``), item 8 (Host /
Origin). Real uvicorn servers on loopback (chDB, SQLite); tokens are made with the real
``fleetscope token`` command against the server's DB.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from fleetscope import codec
from tests.helpers.data import sample_rows
from tests.helpers.server import running_server

STATIC = "static-admin-token-0123456789"


def token_cli(db: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", "token", "--db", db, *args],
                          capture_output=True, text=True, timeout=120)


def make_token(db: str, scope: str, *extra: str) -> str:
    r = token_cli(db, "create", "--scope", scope, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def ingest_body() -> bytes:
    # host "": filled from X-Fleetscope-Host (a host-limited token may not write rows for other hosts)
    return codec.encode_batch({"steps": sample_rows("steps", 3, job="authjob", host="")})


def ingest(url, token: str, key: str, host: str = "node-1") -> httpx.Response:
    return httpx.post(f"{url.api}/ingest", content=ingest_body(), timeout=60, headers={
        **bearer(token), "Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": key,
        "X-Fleetscope-Host": host})


RULE = {"name": "r1", "kind": "straggler", "min_slowdown": 0.1}


def dash_delete(url, kind: str, item_id: str, cookie: str | None = None, **headers) -> httpx.Response:
    """The request a browser's click on a rule/webhook "Delete" button sends."""
    comp = {"id": item_id, "type": f"{kind}-delete"}
    cid = json.dumps(comp, separators=(",", ":"), sort_keys=True)
    list_id = "rules-list" if kind == "rule" else "webhooks-list"
    sig_id = "rules-sig" if kind == "rule" else "webhooks-sig"
    body = {
        "output": f"..{list_id}.children...{sig_id}.data..",
        "outputs": [{"id": list_id, "property": "children"}, {"id": sig_id, "property": "data"}],
        "inputs": [{"id": "tick", "property": "data", "value": 1},
                   {"id": f"{kind}-create-status", "property": "children", "value": None},
                   [{"id": comp, "property": "n_clicks", "value": 1}]],
        "changedPropIds": [f"{cid}.n_clicks"],
        "state": [{"id": sig_id, "property": "data", "value": None}],
    }
    h = {"Content-Type": "application/json", **headers}
    if cookie:
        h["Cookie"] = f"fleetscope_ui={cookie}"
    return httpx.post(f"{url}/ui/_dash-update-component", json=body, headers=h, timeout=60)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    work = tmp_path_factory.mktemp("auth")
    with running_server(work, token=STATIC, ui=True, diagnosis_enabled=False, token_cache_s=0.5) as url:
        url.db = f"sqlite:///{work / 'control.db'}"  # type: ignore[attr-defined]
        yield url


@pytest.fixture(scope="module")
def toks(srv):
    return {s: make_token(srv.db, s, "--name", f"{s}-t") for s in ("ingest", "read", "admin")}


def test_ingest_token_ingests_but_cannot_read_or_change_alert_rules(srv, toks):
    t = toks["ingest"]
    assert ingest(srv, t, "ing-1").status_code == 200
    assert httpx.get(f"{srv.api}/clock", headers=bearer(t)).status_code == 200  # agents align clocks
    for method, path in (("GET", "/alerts/rules"), ("POST", "/alerts/rules"), ("GET", "/jobs"),
                         ("GET", "/incidents"), ("DELETE", "/alerts/rules/1"), ("GET", "/alerts/webhooks")):
        r = httpx.request(method, f"{srv.api}{path}", headers=bearer(t), json=RULE)
        assert r.status_code == 403, (method, path, r.text)
        assert "'ingest'" in r.json()["detail"]


def test_agents_read_the_instrumentation_level_but_only_admin_sets_it(srv, toks):
    body = codec.encode_batch({"jobs": sample_rows("jobs", 1, job="ctl-job")})
    r = httpx.post(f"{srv.api}/ingest", content=body, timeout=60, headers={
        **bearer(toks["ingest"]), "Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": "ctl-1",
        "X-Fleetscope-Host": "node-1"})
    assert r.status_code == 200, r.text
    path = f"{srv.api}/jobs/ctl-job/instrumentation"
    for scope in ("ingest", "read", "admin"):  # the agent polls it with its ingest token
        r = httpx.get(path, headers=bearer(toks[scope]))
        assert r.status_code == 200, (scope, r.text)
    for scope in ("ingest", "read"):
        r = httpx.put(path, headers=bearer(toks[scope]), json={"level": "off"})
        assert r.status_code == 403, (scope, r.text)
    assert httpx.put(path, headers=bearer(toks["admin"]), json={"level": "steps"}).status_code == 200
    assert httpx.get(path, headers=bearer(toks["ingest"])).json()["level"] == "steps"


def test_read_token_reads_but_cannot_ingest_or_change_anything(srv, toks):
    t = toks["read"]
    assert httpx.get(f"{srv.api}/jobs", headers=bearer(t)).status_code == 200
    assert httpx.get(f"{srv.api}/alerts/rules", headers=bearer(t)).status_code == 200
    assert ingest(srv, t, "read-1").status_code == 403
    assert httpx.post(f"{srv.api}/alerts/rules", headers=bearer(t), json=RULE).status_code == 403
    assert httpx.post(f"{srv.api}/incidents/1/acknowledge", headers=bearer(t), json={}).status_code == 403


def test_admin_and_static_tokens_do_everything(srv, toks):
    for t in (toks["admin"], STATIC):
        r = httpx.post(f"{srv.api}/alerts/rules", headers=bearer(t), json={**RULE, "name": f"a-{t[:6]}"})
        assert r.status_code == 201, r.text
        assert httpx.delete(f"{srv.api}/alerts/rules/{r.json()['id']}", headers=bearer(t)).status_code == 204
        assert ingest(srv, t, f"adm-{t[:6]}").status_code == 200


def test_unknown_or_revoked_token_is_refused(srv):
    assert httpx.get(f"{srv.api}/jobs", headers=bearer("fst_" + "x" * 43)).status_code == 401
    t = make_token(srv.db, "read", "--name", "to-revoke")
    assert httpx.get(f"{srv.api}/jobs", headers=bearer(t)).status_code == 200
    listed = json.loads(token_cli(srv.db, "list", "--json").stdout)
    (rec,) = [x for x in listed if x["name"] == "to-revoke"]
    r = token_cli(srv.db, "revoke", str(rec["id"]))
    assert r.returncode == 0 and "revoked" in r.stdout
    time.sleep(1.0)  # token_cache_s=0.5
    assert httpx.get(f"{srv.api}/jobs", headers=bearer(t)).status_code == 401
    assert token_cli(srv.db, "revoke", "99999").returncode == 2


def test_tokens_are_stored_hashed_and_shown_only_once(srv):
    t = make_token(srv.db, "read", "--name", "hashed")
    raw = open(srv.db.removeprefix("sqlite:///"), "rb").read()
    con = sqlite3.connect(srv.db.removeprefix("sqlite:///"))
    try:
        rows = con.execute("SELECT digest, prefix FROM api_tokens WHERE name='hashed'").fetchall()
    finally:
        con.close()
    assert rows == [(hashlib.sha256(t.encode()).hexdigest(), t[:10])]
    assert t.encode() not in raw and t[10:].encode() not in raw
    listing = token_cli(srv.db, "list", "--all").stdout + token_cli(srv.db, "list", "--json").stdout
    assert "hashed" in listing and t[10:] not in listing
    assert len(t) >= 40 and t.startswith("fst_")


def test_tokens_limited_to_jobs_and_hosts(srv):
    tj = make_token(srv.db, "read", "--jobs", "authjob")
    assert httpx.get(f"{srv.api}/jobs/authjob", headers=bearer(tj)).status_code in (200, 404)
    assert httpx.get(f"{srv.api}/jobs/otherjob", headers=bearer(tj)).status_code == 403
    assert httpx.get(f"{srv.api}/incidents?job=authjob", headers=bearer(tj)).status_code == 200
    assert httpx.get(f"{srv.api}/jobs", headers=bearer(tj)).status_code == 403  # lists every job
    th = make_token(srv.db, "ingest", "--hosts", "node-1")
    assert ingest(srv, th, "h-1", host="node-1").status_code == 200
    r = ingest(srv, th, "h-2", host="node-2")
    assert r.status_code == 403 and "node-1" in r.json()["detail"]


def test_readyz_shows_no_store_details_without_a_token(srv, toks):
    anon = httpx.get(f"{srv}/readyz")
    assert anon.status_code == 200 and anon.json() == {"status": "ready"}
    assert "store" not in httpx.get(f"{srv}/readyz", headers=bearer(toks["ingest"])).json()
    full = httpx.get(f"{srv}/readyz", headers=bearer(toks["read"])).json()
    assert full["store"].startswith("chdb://") and "queued_rows" in full


UI_ROUTES = ["/ui/", "/ui/incidents", "/ui/_dash-layout", "/ui/_dash-dependencies",
             "/ui/_dash-component-suites/dash/dcc/async-graph.js", "/ui/assets/style.css"]


@pytest.mark.parametrize("path", UI_ROUTES)
def test_every_dashboard_route_needs_a_credential(srv, path):
    r = httpx.get(f"{srv}{path}")
    assert r.status_code == 401, (path, r.status_code)
    r = httpx.get(f"{srv}{path}", headers={"Accept": "text/html"})
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=")


def test_dash_update_component_needs_a_credential(srv):
    r = dash_delete(srv, "rule", "1")
    assert r.status_code == 401
    assert dash_delete(srv, "rule", "1", cookie="fst_wrong").status_code == 401


def test_login_sets_an_httponly_samesite_strict_cookie(srv, toks):
    page = httpx.get(f"{srv}/ui/login")
    assert page.status_code == 200 and 'name="token"' in page.text
    bad = httpx.post(f"{srv}/ui/login", data={"token": "fst_nope"})
    assert bad.status_code == 401 and "set-cookie" not in bad.headers
    ing = httpx.post(f"{srv}/ui/login", data={"token": toks["ingest"]})
    assert ing.status_code == 403 and "set-cookie" not in ing.headers
    ok = httpx.post(f"{srv}/ui/login", data={"token": toks["read"], "next": "/ui/incidents"})
    assert ok.status_code == 303 and ok.headers["location"] == "/ui/incidents"
    cookie = ok.headers["set-cookie"]
    assert cookie.startswith(f"fleetscope_ui={toks['read']};")
    flags = {f.strip().lower() for f in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/ui"} <= flags
    # no open redirect through ?next=
    evil = httpx.post(f"{srv}/ui/login", data={"token": toks["read"], "next": "https://evil.example/"})
    assert evil.headers["location"] == "/ui/"
    page = httpx.get(f"{srv}/ui/", headers={"Cookie": f"fleetscope_ui={toks['read']}"})
    assert page.status_code == 200 and "react-entry-point" in page.text


def test_dashboard_calls_the_api_with_the_browsers_credential(srv, toks):
    admin = bearer(toks["admin"])
    rid = httpx.post(f"{srv.api}/alerts/rules", headers=admin, json={**RULE, "name": "ui-del"}).json()["id"]
    # a read-only browser: its click reaches the API with its own (read) token -> refused
    r = dash_delete(srv, "rule", str(rid), cookie=toks["read"])
    assert r.status_code == 200, r.text
    ids = [x["id"] for x in httpx.get(f"{srv.api}/alerts/rules", headers=admin).json()]
    assert rid in ids, "a read token deleted a rule through the dashboard"
    # an admin browser may
    assert dash_delete(srv, "rule", str(rid), cookie=toks["admin"]).status_code == 200
    ids = [x["id"] for x in httpx.get(f"{srv.api}/alerts/rules", headers=admin).json()]
    assert rid not in ids


def test_unknown_host_header_is_refused(srv, toks):
    r = httpx.get(f"{srv.api}/jobs", headers={**bearer(toks["read"]), "Host": "rebound.evil.example"})
    assert r.status_code == 400 and "FLEETSCOPE_ALLOWED_HOSTS" in r.json()["detail"]
    assert httpx.get(f"{srv}/ui/login", headers={"Host": "rebound.evil.example:80"}).status_code == 400
    assert httpx.get(f"{srv.api}/jobs", headers={**bearer(toks["read"]), "Host": "localhost"}).status_code == 200


def test_cross_origin_writes_without_a_token_are_refused(srv, toks):
    cross = {"Origin": "http://evil.example"}
    r = httpx.post(f"{srv}/ui/login", data={"token": toks["admin"]}, headers=cross)
    assert r.status_code == 403
    r = dash_delete(srv, "rule", "1", cookie=toks["admin"], **cross)
    assert r.status_code == 403
    r = dash_delete(srv, "rule", "1", cookie=toks["admin"], **{"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    same = {"Origin": srv.rstrip("/")}
    assert dash_delete(srv, "rule", "999999", cookie=toks["admin"], **same).status_code == 200
    # scripts with a bearer token are not browsers' ambient credentials: allowed
    assert httpx.post(f"{srv.api}/alerts/rules", json={**RULE, "name": "xo"},
                      headers={**bearer(toks["admin"]), **cross}).status_code == 201


def test_open_server_dashboard_quotes_ids_and_db_tokens_turn_auth_on(tmp_path):
    """On an unauthenticated loopback server, a forged delete id ``../webhooks/N`` must
    not reach another resource; and the first token made turns authentication on."""
    with running_server(tmp_path, ui=True, diagnosis_enabled=False, token_cache_s=0.5,
                        webhook_allow="127.0.0.1") as url:
        hook = httpx.post(f"{url.api}/alerts/webhooks", json={"name": "h", "url": "http://127.0.0.1:9/x"})
        assert hook.status_code == 201, hook.text
        hid = hook.json()["id"]
        assert dash_delete(url, "rule", f"../webhooks/{hid}").status_code == 200
        assert [h["id"] for h in httpx.get(f"{url.api}/alerts/webhooks").json()] == [hid]
        # cross-origin writes are refused on the open loopback server too (DNS rebinding, CSRF)
        r = httpx.post(f"{url.api}/alerts/rules", json=RULE, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        t = make_token(f"sqlite:///{tmp_path / 'control.db'}", "read")
        time.sleep(1.0)
        assert httpx.get(f"{url.api}/jobs").status_code == 401
        assert httpx.get(f"{url.api}/jobs", headers=bearer(t)).status_code == 200
        assert httpx.get(f"{url}/ui/").status_code == 401


def test_standalone_dashboard_with_a_token_refuses_a_non_loopback_bind():
    from fleetscope.cli import main

    rc = main(["dashboard", "--api", "http://127.0.0.1:1", "--host", "0.0.0.0", "--token", "t" * 20])
    assert rc == 2


def test_token_cli_names_bad_values(tmp_path):
    db = f"sqlite:///{tmp_path / 'c.db'}"
    r = token_cli(db, "create", "--scope", "ingest", "--jobs", "a")
    assert r.returncode == 2 and "--jobs" in r.stderr
    r = token_cli(db, "create", "--scope", "root")
    assert r.returncode == 2 and "root" in r.stderr
    r = token_cli(db)
    assert r.returncode == 2 and "create, list or revoke" in r.stderr
