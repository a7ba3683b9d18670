"""A real fleetscope server (uvicorn in a subprocess) on a free loopback port.

Usage::

    from tests.helpers.server import running_server

    def test_x(tmp_path):
        with running_server(tmp_path, token="s3cret-token-0123456789") as url:
            httpx.get(f"{url}/api/v1/jobs", headers=url.auth_headers)
            url.restart()          # same store and DB dirs, same port
            url.log()              # the server's output so far

``settings_env`` keys are :class:`fleetscope.server.settings.Settings` fields; each is
passed as ``FLEETSCOPE_<KEY>``. The store (``<tmp_path>/store``) and the SQLite DB
(``<tmp_path>/control.db``) live under ``tmp_path`` unless ``store_url``/``db_url``
are given, so a second ``running_server(tmp_path)`` reopens the same data.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.helpers.net import free_port

__all__ = ["ServerProcess", "RunningServer", "free_port", "running_server"]

READY_TIMEOUT_S = 90.0


class ServerProcess:
    """One ``python -m fleetscope.cli server`` subprocess; restartable on the same dirs."""

    def __init__(self, workdir: Path, port: int | None = None, **settings_env: Any) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.settings_env = settings_env
        self.store_url = str(settings_env.pop("store_url", f"chdb://{self.workdir / 'store'}"))
        self.db_url = str(settings_env.pop("db_url", f"sqlite:///{self.workdir / 'control.db'}"))
        self.log_path = self.workdir / "server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
        env.setdefault("FLEETSCOPE_UI", "false")
        for k, v in self.settings_env.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            env[f"FLEETSCOPE_{k.upper()}"] = str(v)
        return env

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "fleetscope.cli", "server",
            "--store", self.store_url, "--db", self.db_url,
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, cwd=self.workdir, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.wait_ready()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout_s}s:\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (graceful: the writer drains its queue), SIGKILL after ``timeout_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        rc, self.proc = self.proc.returncode, None
        return rc

    def kill(self) -> None:
        """SIGKILL, no shutdown (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""


class RunningServer(str):
    """The base URL (a ``str``), with the process attached."""

    process: ServerProcess

    def __new__(cls, process: ServerProcess) -> RunningServer:
        obj = super().__new__(cls, process.base_url)
        obj.process = process
        return obj

    @property
    def api(self) -> str:
        return f"{self}/api/v1"

    @property
    def auth_headers(self) -> dict[str, str]:
        token = self.process.settings_env.get("token")
        return {"Authorization": f"Bearer {token}"} if token else {}

    def restart(self) -> None:
        self.process.restart()

    def log(self) -> str:
        return self.process.log()


@contextlib.contextmanager
def running_server(tmp_path: Path, **settings_env: Any) -> Iterator[RunningServer]:
    """Start a real server on a free loopback port; yield its base URL; stop it."""
    proc = ServerProcess(Path(tmp_path), **settings_env)
    proc.start()
    try:
        yield RunningServer(proc)
    finally:
        proc.stop()
