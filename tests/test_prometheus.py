"""A real Prometheus (Debian's ``prometheus``) scrapes a real fleetscope server, with the
bearer token, while the real reference job (8 gloo ranks, DP2 x TP2 x PP2) runs with an
injected straggler; Prometheus's HTTP API then has the job's step time and the straggler
incident, and evaluates every expression of the Grafana dashboard.

Prometheus listens on loopback on a free port with its own storage under tmp_path; its
config is deploy/prometheus/prometheus.yml with the target, token file and interval of
this test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from test_deploy import DASHBOARDS, PROM_CONFIG, dashboard_exprs

from tests.helpers.server import free_port, running_server

pytestmark = pytest.mark.slow
TOKEN = "prometheus-scrape-token-0123"
JOB = "prom-strag"
STRAGGLER = 5
MODEL = ["--dp", "2", "--tp", "2", "--pp", "2", "--hidden", "128", "--seq-len", "64",
         "--global-batch", "8", "--microbatches", "4"]  # fmt: skip


def prometheus_config(tmp_path: Path, target: str) -> Path:
    cfg = yaml.safe_load(PROM_CONFIG.read_text())
    token = tmp_path / "scrape-token"
    token.write_text(TOKEN)
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "1s"
    fs = next(j for j in cfg["scrape_configs"] if j["job_name"] == "fleetscope")
    fs["authorization"]["credentials_file"] = str(token)
    fs["static_configs"] = [{"targets": [target]}]
    cfg["scrape_configs"] = [fs]  # no DCGM exporter here
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Prometheus:
    def __init__(self, tmp_path: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("prometheus not installed (Debian package prometheus; run `make prometheus-deps`)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "prometheus.log"
        cmd = [binary, f"--config.file={prometheus_config(tmp_path, target)}",
               f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}",
               "--storage.tsdb.retention.time=1h", "--log.level=warn"]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"prometheus not ready:\n{self.log.read_text()}")

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=30)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_query(prom: Prometheus, expr: str, timeout_s: float, what: str) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = prom.query(expr)
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"Prometheus has no {what} after {timeout_s}s ({expr})")


def test_real_prometheus_scrapes_step_time_and_straggler_of_a_real_job(tmp_path):
    with running_server(tmp_path / "srv", token=TOKEN, diagnosis_tick_s=1, metrics_cache_s=1) as url:
        prom = Prometheus(tmp_path, f"127.0.0.1:{url.process.port}")
        train = None
        try:
            up = wait_query(prom, 'up{job="fleetscope"} == 1', 60, "successful scrape of the server")
            assert up[0]["metric"]["instance"] == f"127.0.0.1:{url.process.port}"
            # 400 steps, stopped once every answer is in: the incident is what Prometheus
            # scrapes and a finished job's incidents are resolved, so the job must outlive
            # the diagnosis. On a loaded 2-core CI host a pass took 10-25 s while the 8
            # ranks ran, and a 60-step job (about 60 s) once ended before its incident
            # opened. 2.5x own work: the injector delivers its factor.
            cmd = [sys.executable, "-m", "fleetscope.cli", "train", *MODEL, "--steps", "400", "--job", JOB,
                   "--server", url, "--spool", str(tmp_path / "spool"), "--timeout-s", "900",
                   "--inject", f"straggler:rank={STRAGGLER}:factor=2.5:from_step=4"]  # fmt: skip
            train = subprocess.Popen(cmd, env={**_env(), "FLEETSCOPE_TOKEN": TOKEN},
                                     stdout=open(tmp_path / "train.log", "wb"), stderr=subprocess.STDOUT)
            # the step time: counted steps and a quantile from the histogram
            wait_query(prom, f'fleetscope_job_step_duration_seconds_count{{job_id="{JOB}"}} > 5', 300,
                       "counted steps of the job")
            # (> 0 leaves out NaN: no step counted within the window yet)
            p50 = wait_query(prom, 'histogram_quantile(0.5, sum by (le) (rate('
                                   f'fleetscope_job_step_duration_seconds_bucket{{job_id="{JOB}"}}[1m]))) > 0', 180,
                             "a step-time quantile")
            assert 0 < float(p50[0]["value"][1]) < 60, p50
            # the straggler incident, and rank 5 as the top suspect
            inc = wait_query(prom, f'fleetscope_incidents_active{{job_id="{JOB}", kind="slow_compute"}} >= 1', 300,
                             "the straggler incident")
            assert inc[0]["metric"]["severity"] in ("info", "warning", "critical")
            # (waited for, not read once: the incident can close and reopen between scrapes
            # while the detector's evidence on a loaded host hovers at its threshold)
            top = wait_query(prom, f'fleetscope_straggler_rank{{job_id="{JOB}", position="1"}}', 120,
                             "the top straggler suspect")
            assert [float(s["value"][1]) for s in top] == [STRAGGLER], top
            # every dashboard expression is valid PromQL that this Prometheus evaluates
            for path in DASHBOARDS:
                for expr in dashboard_exprs(json.loads(path.read_text())):
                    if expr.startswith("label_values("):
                        continue  # a Grafana template function, not PromQL
                    prom.query(expr.replace("$job", JOB).replace("$__rate_interval", "30s"))
        finally:
            if train is not None and train.poll() is None:
                train.terminate()
                try:
                    train.wait(60)
                except subprocess.TimeoutExpired:
                    train.kill()
                    train.wait()
            prom.stop()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
