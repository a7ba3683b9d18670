"""A throwaway PostgreSQL server on a free loopback port, from the machine's own binaries.

Usage::

    from tests.helpers.postgres import postgres_server

    with postgres_server() as url:   # postgresql+psycopg://fleetscope@127.0.0.1:PORT/postgres
        ...

Skips the calling test (``pytest.skip``) when no ``initdb``/``pg_ctl`` is installed or the
``psycopg`` driver is missing. PostgreSQL refuses to run as root, so under root the server
runs as the ``nobody`` user (through ``runuser``). ``fsync`` is off: the data is thrown away.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.server import free_port


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


@contextlib.contextmanager
def postgres_server(timeout_s: float = 60.0) -> Iterator[str]:
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")
    as_user: list[str] = []
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL cannot start")
    # not under tmp_path: pytest's base temp dir is private to its user, and `nobody` must reach it
    root = Path(tempfile.mkdtemp(prefix="fleetscope-pg-"))
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "nobody", "--"]
        shutil.chown(root, user="nobody")
    data, port = root / "data", free_port()
    run: dict = dict(capture_output=True, text=True, timeout=timeout_s, cwd=root)
    r = subprocess.run([*as_user, initdb, "-D", str(data), "-U", "fleetscope", "--auth=trust", "-E", "UTF8"], **run)
    if r.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{r.stdout}\n{r.stderr}")
    opts = f"-k {root} -p {port} -h 127.0.0.1 -c fsync=off -c max_connections=50"
    r = subprocess.run([*as_user, pg_ctl, "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "start"], **run)
    if r.returncode != 0:
        raise RuntimeError(f"pg_ctl start failed:\n{r.stdout}\n{r.stderr}\n{(root / 'log').read_text()}")
    try:
        yield f"postgresql+psycopg://fleetscope@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"], **run)
        shutil.rmtree(root, ignore_errors=True)
