"""Runtime control end to end: ``fleetscope instrument`` -> server -> agent control
poller -> spool control file -> the hooks of a running gloo rank, within 5 s."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch
import torch.distributed as dist
from fleetscope.agent.control import ControlPoller
from fleetscope.trainer.launcher import free_port

from fleetscope import codec
from fleetscope import trainer_hooks as hooks
from fleetscope.topology import Topology
from tests.helpers.server import running_server

TOKEN = "runtime-control-token-0123456789"
H = {"Authorization": f"Bearer {TOKEN}"}


def _instrument(url, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fleetscope.cli", "instrument", *args,
                           "--server", str(url), "--token", TOKEN],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("srv"), token=TOKEN) as url:
        body = codec.encode_json({"jobs": [{"ts_ns": time.time_ns(), "job": "rc", "dp": 2, "tp": 1,
                                            "pp": 1, "status": "running"}]})
        r = httpx.post(f"{url}/api/v1/ingest", content=body, timeout=30,
                       headers={**H, "Content-Type": codec.JSON_CONTENT_TYPE, "Idempotency-Key": "rc-job"})
        assert r.status_code == 200, r.text
        yield url


def test_level_reaches_a_running_rank_within_5_s(server, tmp_path):
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    spool = tmp_path / "spool"
    rec = hooks.init(job="rc", rank=0, topology=Topology(), spool=spool)  # default intervals
    stop = threading.Event()
    client = httpx.Client(base_url=str(server), headers=H, timeout=10)
    poller = ControlPoller(client, spool, stop)  # default 2 s period
    try:
        with hooks.step(0):
            dist.all_reduce(torch.ones(4))
        deadline = time.monotonic() + 10
        while not (spool / "rc").is_dir() and time.monotonic() < deadline:
            time.sleep(0.05)
        poller.start()
        for args, want in ((["--level", "off"], 0), (["--level", "sections", "--ranks", "0"], 2),
                           (["--level", "full"], 3)):
            proc = _instrument(server, "rc", *args)
            assert proc.returncode == 0, proc.stderr
            t0 = time.monotonic()
            while rec.level != want:
                assert time.monotonic() - t0 < 5.0, f"level {want} not applied within 5 s"
                time.sleep(0.02)
        show = _instrument(server, "rc")
        assert show.returncode == 0 and "level full" in show.stdout and "version 3" in show.stdout
    finally:
        stop.set()
        poller.join(5)
        client.close()
        hooks.shutdown()
        dist.destroy_process_group()
    assert poller.written == 4 and poller.errors == 0  # the initial state, then 3 changes


def test_bad_requests_are_clear_4xx(server):
    base = f"{server}/api/v1/jobs"
    r = httpx.put(f"{base}/rc/instrumentation", json={"level": "verbose"}, headers=H)
    assert r.status_code == 422 and "level" in r.text
    r = httpx.put(f"{base}/rc/instrumentation", json={"level": "off", "ranks": [0, 7]}, headers=H)
    assert r.status_code == 422 and "ranks: [7] outside the job's world size 2" in r.text
    r = httpx.put(f"{base}/nope/instrumentation", json={"level": "off"}, headers=H)
    assert r.status_code == 404
    r = httpx.put(f"{base}/rc/instrumentation", json={"level": "off"})
    assert r.status_code == 401
    proc = _instrument(server, "rc", "--level", "off", "--ranks", "3-1")
    assert proc.returncode == 2 and "bad --ranks range '3-1'" in proc.stderr
    assert httpx.get(f"{base}/fresh/instrumentation", headers=H).json()["level"] == "full"
