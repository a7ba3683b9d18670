"""deploy/: the Grafana dashboard is valid JSON whose every PromQL expression names metrics
a live server exports (or DCGM exporter metrics, for the GPU row); the Prometheus scrape
config passes ``promtool check config``; docker-compose provisions both from deploy/."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from tests.helpers.ops_jobs import post_straggler_job
from tests.helpers.server import running_server

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
PROM_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}
EXTERNAL_PREFIXES = ("DCGM_",)
"""Metrics of other exporters a dashboard may chart (the DCGM exporter's GPU metrics)."""


def dashboard_exprs(dash: dict) -> list[str]:
    out = []

    def walk(panels: list[dict]) -> None:
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash.get("templating", {}).get("list", []):
        q = var.get("query")
        if var.get("type") == "query":
            out.append((q.get("query") if isinstance(q, dict) else q) or "")
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (or a Grafana ``label_values(metric, label)``)."""
    m = re.fullmatch(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*\w+\s*\)\s*", expr)
    if m:
        return {m.group(1)}
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)  # label lists
    names = set()
    for tok in re.finditer(r"[A-Za-z_:][\w:]*(?=\s*(\()?)", e):
        if tok.group(1) or tok.group(0).lower() in PROMQL_WORDS:
            continue  # a function call or a keyword
        names.add(tok.group(0))
    return names


def exported_sample_names(text: str) -> set[str]:
    """Every sample name the scrape's families can have (from their # TYPE lines)."""
    out = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        out.add(name)
        if kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif kind == "summary":
            out |= {f"{name}_sum", f"{name}_count"}
    return out


def test_metric_names_are_parsed_out_of_promql():
    expr = ('histogram_quantile(0.9, sum by (le) (rate(fleetscope_job_step_duration_seconds_bucket'
            '{job_id="$job", le!="x"}[$__rate_interval]))) / on (job_id) group_left max(up) or vector(0)')
    assert metric_names(expr) == {"fleetscope_job_step_duration_seconds_bucket", "up"}
    assert metric_names("label_values(fleetscope_job_info, job_id)") == {"fleetscope_job_info"}


def test_dashboard_promql_names_only_exported_metrics(tmp_path):
    assert DASHBOARDS, "no dashboard JSON in deploy/grafana/dashboards"
    with running_server(tmp_path) as url:
        post_straggler_job(url)
        text = httpx.get(f"{url}/metrics", timeout=60).text
    exported = exported_sample_names(text)
    assert "fleetscope_job_step_duration_seconds_bucket" in exported
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())  # valid JSON
        assert dash["uid"] and dash["title"] and dash["panels"]
        exprs = dashboard_exprs(dash)
        assert len(exprs) >= 10, path
        used = set().union(*(metric_names(e) for e in exprs))
        ours = {n for n in used if not n.startswith(EXTERNAL_PREFIXES)}
        assert ours and all(n.startswith("fleetscope_") for n in ours), ours
        missing = sorted(ours - exported)
        assert not missing, f"{path.name}: PromQL names metrics the server does not export: {missing}"
        # the panels the issue asks for are there
        for family in ("fleetscope_job_step_duration_seconds_bucket", "fleetscope_job_mfu_ratio",
                       "fleetscope_straggler_rank", "fleetscope_incidents_active"):
            assert family in used, family
        assert any(n.startswith("DCGM_") for n in used), "no DCGM exporter panel"
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids)), "duplicate panel ids"


def test_prometheus_config_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; run `make prometheus-deps`)")
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    token = tmp_path / "token"
    token.write_text("x" * 24)
    for job in cfg["scrape_configs"]:  # the secret and target files live elsewhere in a deployment
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(tmp_path / "targets" / "*.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {j["job_name"] for j in cfg["scrape_configs"]} == {"fleetscope", "dcgm"}


def test_docker_compose_provisions_prometheus_and_grafana_from_deploy():
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prom, graf = doc["services"]["prometheus"], doc["services"]["grafana"]
    mounts = [v.split(":")[:2] for v in prom["volumes"] + graf["volumes"] if v.startswith("./")]
    for src, _dst in mounts:
        assert (ROOT / src).exists(), src
    assert ["./deploy/prometheus", "/etc/prometheus"] in mounts
    assert ["./deploy/grafana/provisioning", "/etc/grafana/provisioning"] in mounts
    # the scrape token: a compose secret mounted where prometheus.yml reads it
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    cred = next(j for j in cfg["scrape_configs"] if j["job_name"] == "fleetscope")["authorization"]["credentials_file"]
    assert cred == "/run/secrets/" + prom["secrets"][0]["target"]
    assert doc["secrets"][prom["secrets"][0]["source"]] == {"environment": "FLEETSCOPE_TOKEN"}
    # the provisioned dashboards folder is the one the JSON is mounted at
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/fleetscope.yml").read_text())
    path = prov["providers"][0]["options"]["path"]
    assert ["./deploy/grafana/dashboards", path] in mounts
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
