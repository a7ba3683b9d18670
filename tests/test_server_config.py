"""Settings validators, store URLs, the server CLI, docker-compose and the demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from fleetscope.server.api.routes.jobs import parse_ranks
from fleetscope.server.settings import Settings
from fleetscope.server.store.url import StoreURLError, parse_store_url
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]


def test_store_urls():
    assert parse_store_url("chdb:///var/lib/fs").path == "/var/lib/fs"
    assert parse_store_url("chdb://data/store", cwd="/srv").path == "/srv/data/store"
    assert parse_store_url(None, cwd="/w").path == "/w/.fleetscope/store"  # the default
    u = parse_store_url("https://alice:p%40ss@ch.example:9443/telemetry")
    assert (u.scheme, u.host, u.port, u.username, u.password, u.database) == (
        "https", "ch.example", 9443, "alice", "p@ss", "telemetry",
    )  # fmt: skip
    assert "p@ss" not in u.redacted() and "***" in u.redacted()
    assert parse_store_url("http://ch").port == 8123
    for bad, named in [("mysql://x/y", "mysql"), ("chdb://", "chdb://"), ("http://:9/db", "no host"),
                       ("http://u:secret@h:notaport/db", "bad port")]:  # fmt: skip
        with pytest.raises(StoreURLError, match=named) as e:
            parse_store_url(bad)
        assert "secret" not in str(e.value)


def test_settings_defaults_and_env(monkeypatch):
    s = Settings()
    assert s.host == "127.0.0.1" and s.token is None and s.store_url.startswith("chdb://")
    monkeypatch.setenv("FLEETSCOPE_TTL_DAYS", "7")
    monkeypatch.setenv("FLEETSCOPE_PORT", "9100")
    s = Settings()
    assert (s.ttl_days, s.port) == (7, 9100)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"host": "0.0.0.0"}, "FLEETSCOPE_TOKEN"),
        ({"token": "short"}, "16 characters"),
        ({"ttl_days": -1}, "ttl_days"),
        ({"max_request_bytes": 10}, "max_request_bytes"),
        ({"store_url": "ftp://x"}, "ftp"),
        ({"db_url": "mysql://x"}, "db_url"),
        ({"port": 70000}, "port"),
    ],
)
def test_settings_refuse_unsafe_values(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        Settings(**kwargs)


def test_remote_bind_allowed_with_token_or_explicit_opt_in():
    assert Settings(host="0.0.0.0", token="x" * 16).host == "0.0.0.0"
    assert Settings(host="10.0.0.5", allow_unauthenticated_remote=True).host == "10.0.0.5"


def test_parse_ranks():
    assert parse_ranks("0,3,8-11") == [0, 3, 8, 9, 10, 11]
    assert parse_ranks(None) == []


def test_docker_compose_env_matches_settings():
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    assert {"clickhouse", "postgres", "fleetscope"} <= set(services)
    env = services["fleetscope"]["environment"]
    fields = set(Settings.model_fields)
    for key in env:
        assert key.startswith("FLEETSCOPE_"), key
        assert key.removeprefix("FLEETSCOPE_").lower() in fields, f"{key} is not a server setting"
    values = {k.removeprefix("FLEETSCOPE_").lower(): str(v) for k, v in env.items() if "${" not in str(v)}
    s = Settings(**values, token="t" * 16)  # every value is accepted by the validators
    store = parse_store_url(s.store_url)
    ch = services["clickhouse"]["environment"]
    assert (store.host, store.username, store.password, store.database) == (
        "clickhouse", ch["CLICKHOUSE_USER"], ch["CLICKHOUSE_PASSWORD"], ch["CLICKHOUSE_DB"],
    )  # fmt: skip
    db = urlsplit(s.db_url)
    pg = services["postgres"]["environment"]
    assert (db.hostname, db.username, db.password, db.path.strip("/")) == (
        "postgres", pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"],
    )  # fmt: skip
    assert "FLEETSCOPE_TOKEN" in env  # non-loopback bind needs a token
    assert set(services["fleetscope"]["depends_on"]) == {"clickhouse", "postgres"}


def _cli(*args, cwd=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)  # fmt: skip


def test_server_cli_help_and_errors(tmp_path):
    r = _cli("server", "--help")
    assert r.returncode == 0 and "--store" in r.stdout and "FLEETSCOPE_TOKEN" in r.stdout
    r = _cli("server", "--store", "ftp://nowhere/x")
    assert r.returncode == 2 and "ftp" in r.stderr
    r = _cli("server", "--host", "0.0.0.0", "--store", f"chdb://{tmp_path}/s")
    assert r.returncode == 2 and "FLEETSCOPE_TOKEN" in r.stderr


@pytest.mark.slow
def test_demo_serves_synthetic_job(tmp_path):
    r = _cli("demo", "--synthetic", "--port", "0", "--exit-after", "0.2", "--no-ui", "--steps", "12", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "posted" in r.stdout and "last step 11" in r.stdout and "/api/v1/jobs/demo-" in r.stdout
    assert (tmp_path / ".fleetscope" / "demo" / "store").is_dir()
