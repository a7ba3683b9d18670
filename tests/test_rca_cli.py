"""``fleetscope jobs | job | stragglers | hang | incidents | ack`` against a real server
(with a bearer token): tables for people, JSON for scripts, exit codes a script can
test (hang: 1 while hung; errors: 2 with a clear message)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
from test_diagnosis_api import wait_for

from tests.helpers.ops_jobs import HungJob, post_straggler_job
from tests.helpers.server import free_port, running_server

TOKEN = "rca-token-0123456789abcdef"
HTTP = httpx.Client(timeout=60)


def fs(url: str | None, *args: str, token: str | None = TOKEN, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    e["COLUMNS"] = "200"
    if url:
        e["FLEETSCOPE_SERVER"] = url
    if token:
        e["FLEETSCOPE_TOKEN"] = token
    e.update(env)
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", *args], env=e, capture_output=True,
                          text=True, timeout=120)


def test_rca_commands_answer_from_a_real_server(tmp_path):
    # the hung job stopped 300 s ago; the straggler job's last step stays recent (< 150 s)
    with running_server(tmp_path, token=TOKEN, diagnosis_tick_s=0.5, hang_min_s=150, hang_op_min_s=150) as url:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        post_straggler_job(url)
        wait_for(lambda: [i for i in HTTP.get(f"{url.api}/incidents", params={"job": "strag"}, headers=auth)
                          .json()["items"] if i["kind"] == "slow_compute"], 90, "straggler incident")
        hung = HungJob(url, "hung", ago_s=300)
        try:
            wait_for(lambda: HTTP.get(f"{url.api}/jobs/hung/hang", headers=auth).json()["culprits"], 60, "hang")
            check_commands(url, tmp_path)
        finally:
            hung.stop()

    dead = f"http://127.0.0.1:{free_port()}"
    r = fs(None, "hang", "hung", "--server", dead)
    assert r.returncode == 2 and f"cannot reach the fleetscope server at {dead}" in r.stderr, r.stderr
    assert r.stdout == ""


def check_commands(url, tmp_path) -> None:
    # hang first (the straggler job must still count as recent): exit 1 while hung, 0 when not
    r = fs(url, "hang", "hung")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "HUNG" in r.stdout and "culprit rank(s) 3" in r.stdout, r.stdout
    r = fs(url, "hang", "hung", "-o", "json")
    assert r.returncode == 1 and json.loads(r.stdout)["culprits"] == [3]
    r = fs(url, "hang", "strag")
    assert r.returncode == 0 and "not hung" in r.stdout, r.stdout

    # jobs
    r = fs(url, "jobs", "--output", "json")
    assert r.returncode == 0, r.stderr
    assert {j["id"] for j in json.loads(r.stdout)} == {"strag", "hung"}
    r = fs(url, "jobs")
    assert r.returncode == 0 and "strag" in r.stdout and "dp2 tp2 pp2 (8 ranks)" in r.stdout, r.stdout
    # job
    r = fs(url, "job", "strag")
    assert r.returncode == 0, r.stderr
    assert "steps/s" in r.stdout and "slow_compute" in r.stdout, r.stdout
    d = json.loads(fs(url, "job", "strag", "-o", "json").stdout)
    assert d["id"] == "strag" and d["last_step"] == 29 and d["active_incidents"]
    # stragglers
    d = json.loads(fs(url, "stragglers", "strag", "-o", "json").stdout)
    assert d["items"][0]["ranks"] == [5] and d["items"][0]["kind"] == "slow_compute"
    r = fs(url, "stragglers", "strag", "--limit", "1")
    assert r.returncode == 0 and "slow_compute" in r.stdout and "est. slowdown" in r.stdout, r.stdout
    # incidents + ack
    d = json.loads(fs(url, "incidents", "--job", "strag", "-o", "json").stdout)
    inc = next(i for i in d["items"] if i["kind"] == "slow_compute")
    assert all(i["job"] == "strag" for i in d["items"])
    r = fs(url, "incidents")
    assert r.returncode == 0 and "hang" in r.stdout and "slow_compute" in r.stdout, r.stdout
    r = fs(url, "ack", str(inc["id"]), "--by", "alice")
    assert r.returncode == 0 and "acknowledged by alice" in r.stdout, (r.stdout, r.stderr)
    d = json.loads(fs(url, "incidents", "--status", "acknowledged", "-o", "json").stdout)
    assert [i["id"] for i in d["items"]] == [inc["id"]] and d["items"][0]["acknowledged_by"] == "alice"

    # the token from a file works; errors exit 2 with one clear line
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    r = fs(url, "jobs", "--token-file", str(tok), token=None)
    assert r.returncode == 0, r.stderr
    r = fs(url, "jobs", token=None)
    assert r.returncode == 2 and "HTTP 401" in r.stderr and "FLEETSCOPE_TOKEN" in r.stderr, r.stderr
    r = fs(url, "job", "nope")
    assert r.returncode == 2 and "job 'nope' not found" in r.stderr, r.stderr
    r = fs(url, "ack", "999999")
    assert r.returncode == 2 and "incident 999999 not found" in r.stderr, r.stderr
    r = fs(url, "ack", "zero")
    assert r.returncode == 2 and "'zero' is not an integer" in r.stderr, r.stderr
    r = fs(url, "jobs", "--token-file", str(tmp_path / "missing"), token=None)
    assert r.returncode == 2 and "--token-file" in r.stderr, r.stderr



def test_rca_cli_module_imports_nothing_heavy():
    code = ("import sys, fleetscope.rca.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('httpx', 'rich', 'fastapi', 'torch', 'dash', 'pandas') or m.startswith('fleetscope.server')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
