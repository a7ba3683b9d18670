"""Settings validators, store URLs, the server CLI, docker-compose and the demo."""

from __future__ import annotations

import os
import re
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


def test_docker_compose_cluster_profile_is_consistent():
    """Profile "cluster": 2 shards x 2 replicas + Keeper, two stateless fleetscope replicas.

    Checks the compose file against the ClickHouse configs it mounts (no Docker runs here):
    every node is in remote_servers once, at the shard its macros name; replica names are
    unique; Keeper is where the nodes look for it; the replicas' settings validate and point
    at the cluster by name; the macros the rendered DDL uses are defined on every node.
    """
    import xml.etree.ElementTree as ET

    from fleetscope.server.store.cluster import KEEPER_PATH, KEEPER_PATH_ALL

    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = doc["services"]
    profiled = {name for name, svc in services.items() if "cluster" in svc.get("profiles", [])}
    nodes = sorted(n for n in profiled if n.startswith("ch-"))
    replicas = sorted(n for n in profiled if n.startswith("fleetscope-"))
    assert "keeper" in profiled and len(nodes) == 4 and replicas == ["fleetscope-1", "fleetscope-2"]
    assert not {"clickhouse", "fleetscope", "postgres"} & profiled  # the default stack is untouched

    def mounted(svc: dict, target: str) -> Path:
        (src,) = [v.split(":")[0] for v in svc["volumes"] if v.split(":")[1] == target]
        path = ROOT / src
        assert path.is_file(), src
        return path

    keeper = ET.parse(mounted(services["keeper"], "/etc/clickhouse-keeper/keeper_config.xml")).getroot()
    keeper_port = keeper.findtext("keeper_server/tcp_port")
    layout: dict[str, tuple[int, str]] = {}
    cluster_name = None
    for node in nodes:
        svc = services[node]
        assert svc["hostname"] == node and "keeper" in svc["depends_on"]
        cfg = ET.parse(mounted(svc, "/etc/clickhouse-server/config.d/cluster.xml")).getroot()
        (cluster,) = list(cfg.find("remote_servers"))
        cluster_name = cluster.tag
        shards = cluster.findall("shard")
        assert len(shards) == 2 and all(len(s.findall("replica")) == 2 for s in shards)
        assert all(s.findtext("internal_replication") == "true" for s in shards)
        hosts = [[r.findtext("host") for r in s.findall("replica")] for s in shards]
        assert sorted(h for hs in hosts for h in hs) == nodes  # every node once
        assert cfg.findtext("zookeeper/node/host") == "keeper" and cfg.findtext("zookeeper/node/port") == keeper_port
        macros = ET.parse(mounted(svc, "/etc/clickhouse-server/config.d/macros.xml")).getroot().find("macros")
        shard_of_node = next(i for i, hs in enumerate(hosts, 1) if node in hs)
        assert int(macros.findtext("shard")) == shard_of_node, node
        layout[node] = (shard_of_node, macros.findtext("replica"))
    replica_names = [r for _, r in layout.values()]
    assert len(set(replica_names)) == 4  # unique cluster-wide: schema_migrations spans all nodes
    for path in (KEEPER_PATH, KEEPER_PATH_ALL):  # macros used by the rendered DDL
        assert set(re.findall(r"\{(\w+)\}", path)) <= {"shard", "database", "table"}
    fields = set(Settings.model_fields)
    envs = []
    for name in replicas:
        svc = services[name]
        env = svc["environment"]
        assert all(k.startswith("FLEETSCOPE_") and k.removeprefix("FLEETSCOPE_").lower() in fields for k in env)
        values = {k.removeprefix("FLEETSCOPE_").lower(): str(v) for k, v in env.items() if "${" not in str(v)}
        s = Settings(**values, token="t" * 16, webhook_secret_key="k" * 32)
        store = parse_store_url(s.store_url)
        assert store.cluster == cluster_name and store.host in nodes
        ch = services[store.host]["environment"]
        assert (store.username, store.password, store.database) == (
            ch["CLICKHOUSE_USER"], ch["CLICKHOUSE_PASSWORD"], ch["CLICKHOUSE_DB"])  # fmt: skip
        assert urlsplit(s.db_url).hostname == "postgres"  # one outbox, claimed per row
        assert set(svc["depends_on"]) == {*nodes, "postgres"}
        envs.append(env)
    assert envs[0]["FLEETSCOPE_TOKEN"] == envs[1]["FLEETSCOPE_TOKEN"]
    assert "${FLEETSCOPE_WEBHOOK_SECRET_KEY" in envs[0]["FLEETSCOPE_WEBHOOK_SECRET_KEY"]  # required, shared
    assert envs[0]["FLEETSCOPE_WEBHOOK_SECRET_KEY"] == envs[1]["FLEETSCOPE_WEBHOOK_SECRET_KEY"]
    assert parse_store_url(envs[0]["FLEETSCOPE_STORE_URL"]).host != parse_store_url(envs[1]["FLEETSCOPE_STORE_URL"]).host
    ports = [services[n]["ports"][0].split(":")[0] for n in replicas]
    assert len(set(ports)) == 2 and "8000" not in ports  # beside the default stack's port
