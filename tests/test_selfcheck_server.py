"""Probe records through a real server: ingest (Arrow and JSON), CLI, scoring routes."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import torch
from fleetscope.kernels import devices
from fleetscope.kernels.matmul import matmul_probe
from fleetscope.kernels.ship import ShipError, ship_records

from tests.helpers.server import running_server

TOKEN = "selfcheck-token-0123456789"


def test_probe_results_are_ingested_scored_and_served(tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu = devices.cpu_info(num_threads=1)
        runs = {h: matmul_probe(cpu, n=128, dtype="fp32", budget_s=0.12,
                                slowdown=3.0 if h == "node-c" else 1.0)
                for h in ("node-a", "node-b", "node-c", "node-d")}
    finally:
        torch.set_num_threads(before)

    with running_server(tmp_path, token=TOKEN) as url:
        for i, (host, r) in enumerate(runs.items()):
            ack = ship_records(url, [r.to_record(host=host, job="maint-7")], host=host,
                               fmt="arrow" if i % 2 else "json", token=TOKEN)
            assert ack["accepted"] is True and ack["rows"]["probes"] == 1

        # the CLI on "another host": the numerics probe only, shipped as Arrow
        cli = subprocess.run(
            [sys.executable, "-m", "fleetscope.cli", "selfcheck", "--server", url,
             "--host", "cli-host", "--job", "maint-7", "--probes", "numerics",
             "--nprocs", "1", "--output", "json"],
            capture_output=True, text=True, timeout=120,
            env={"PATH": "/usr/bin:/bin", "FLEETSCOPE_TOKEN": TOKEN},
        )
        assert cli.returncode == 0, cli.stderr
        printed = [json.loads(line) for line in cli.stdout.splitlines()]
        assert [p["probe"] for p in printed] == ["numerics"]
        assert "shipped 1 probes records" in cli.stderr

        auth = url.auth_headers
        fleet = httpx.get(f"{url.api}/selfcheck/hosts", headers=auth, timeout=30).json()
        status = {h["host"]: h["status"] for h in fleet["hosts"]}
        assert status == {"node-a": "ok", "node-b": "ok", "node-c": "outlier",
                          "node-d": "ok", "cli-host": "ok"}, fleet
        assert [(f["host"], f["kind"]) for f in fleet["findings"]] == [("node-c", "fleet_outlier")]

        one = httpx.get(f"{url.api}/hosts/node-c/selfcheck", headers=auth, timeout=30).json()
        assert one["status"] == "outlier" and one["findings"][0]["ratio"] < 0.6
        (probe,) = one["probes"]
        assert probe["probe"] == "matmul" and probe["job"] == "maint-7"
        assert probe["fleet_samples"] == 4 and probe["variant"] == "fp32 n=128"

        missing = httpx.get(f"{url.api}/hosts/nowhere/selfcheck", headers=auth, timeout=30)
        assert missing.status_code == 404 and "'nowhere'" in missing.json()["detail"]
        bad = httpx.get(f"{url.api}/selfcheck/hosts?window_s=-5", headers=auth, timeout=30)
        assert bad.status_code == 422
        assert httpx.get(f"{url.api}/selfcheck/hosts", timeout=30).status_code == 401

        # a record the server refuses: the error names the field
        rec = runs["node-a"].to_record(host="node-a")
        rec["passed"] = "maybe"
        with pytest.raises(ShipError, match="passed"):
            ship_records(url, [rec], host="node-a", fmt="json", token=TOKEN)
