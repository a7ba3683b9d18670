"""The diagnosis worker: the diagnosis loop in its own process (``fleetscope worker``).

Ingest and analysis never share a process, so a long pass never delays an ingest
request and an ingest burst never starves a pass. ``fleetscope server`` starts one
worker by default (``FLEETSCOPE_DIAGNOSIS_WORKER=process``); more can run elsewhere
(``fleetscope worker --server URL --db URL [--store URL]``). Every worker claims a job's
lease in the control-plane DB before diagnosing it (:mod:`fleetscope.server.db.leases`),
so two workers never diagnose the same job at once; within one worker up to
``diagnosis_concurrency`` jobs run at once, round-robin, and the per-step reductions of
at most ``diagnosis_cache_jobs`` jobs are kept (memory stays bounded).

How the worker reaches the telemetry store depends on its URL:

* ``http(s)://`` (a ClickHouse server or cluster): it opens the store itself.
* ``chdb://`` (embedded): one process only may open a chdb directory, and that is the
  server (it ingests). The worker sends named queries to the server's internal route
  (:mod:`fleetscope.server.api.routes.internal`) and gets Arrow back: ClickHouse runs
  inside the server process, the pandas/detector work in the worker. The queries
  return reductions (O(ranks) rows), so the hop costs little (see README "Diagnosis
  worker" for the figures).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa

from .incidents import IncidentSink
from .loader import named_queries

log = logging.getLogger(__name__)
ARROW_STREAM = "application/vnd.apache.arrow.stream"


class RemoteStore:
    """The store's query methods over the server's internal diagnosis route."""

    def __init__(self, server_url: str, token: str | None = None, timeout_s: float = 120.0) -> None:
        self.base = server_url.rstrip("/") + "/api/v1/internal/diagnosis"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(headers=headers, timeout=timeout_s)
        self._names = {sql: name for name, sql in named_queries().items()}
        self.bytes_received = 0

    def query_arrow(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        name = self._names.get(sql)
        if name is None:
            raise ValueError("not a named diagnosis query (a remote worker sends names only)")
        r = self.http.post(f"{self.base}/query", json={"name": name, "params": _jsonable(params or {})})
        if r.status_code != 200:
            raise RuntimeError(f"diagnosis query {name}: HTTP {r.status_code}: {r.text[:300]}")
        self.bytes_received += len(r.content)
        table = pa.ipc.open_stream(r.content).read_all()
        cols = [c.dictionary_decode() if pa.types.is_dictionary(c.type) else c for c in table.columns]
        return pa.table(cols, names=table.column_names)

    def query_df(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
        df = self.query_arrow(sql, params).to_pandas()
        for c in df.columns:
            if pd.api.types.is_integer_dtype(df[c].dtype) and not pd.api.types.is_bool_dtype(df[c].dtype):
                df[c] = df[c].astype("int64")
        return df

    def query_rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self.query_arrow(sql, params).to_pylist()

    def host_seen(self) -> dict[str, int]:
        r = self.http.get(f"{self.base}/host-seen")
        r.raise_for_status()
        return {str(k): int(v) for k, v in r.json().items()}

    def job_seen(self) -> dict[str, int]:
        r = self.http.get(f"{self.base}/job-seen")
        r.raise_for_status()
        return {str(k): int(v) for k, v in r.json().items()}

    def report_passes(self, worker: str, passes: dict[str, Any]) -> None:
        """Hand this worker's pass times to the server (its GET /metrics exports them)."""
        body = {"worker": worker, "passes": {k: [float(x) for x in v] for k, v in passes.items()}}
        try:
            self.http.post(f"{self.base}/passes", json=body)
        except httpx.HTTPError:  # the next report carries the same cumulative figures
            log.debug("reporting pass times failed", exc_info=True)

    def publish(self, result: Any, took_s: float) -> None:
        """Hand a full pass's verdict to the server (its /stragglers and /hang answer it)."""
        from .findings import finding_to_dict, hang_to_dict

        body = {"job": result.job, "computed_ns": int(result.computed_ns), "took_s": float(took_s),
                "findings": [finding_to_dict(f) for f in result.findings], "hang": hang_to_dict(result.hang)}
        try:
            self.http.post(f"{self.base}/verdict", content=json.dumps(body, allow_nan=False, default=str),
                           headers={"Content-Type": "application/json"})
        except (httpx.HTTPError, ValueError):  # the next pass publishes again
            log.debug("publishing a verdict failed", exc_info=True)

    def wake_alerts(self) -> None:
        try:
            self.http.post(f"{self.base}/wake-alerts")
        except httpx.HTTPError:  # the dispatcher polls anyway
            log.debug("waking the alert dispatcher failed", exc_info=True)

    def close(self) -> None:
        self.http.close()


def _jsonable(params: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in params.items():
        if isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, (list, tuple)):
            v = [x.item() if isinstance(x, np.generic) else x for x in v]
        out[k] = v
    return out


class _RemoteCollector:
    """``host_seen_ns`` and ``job_seen_ns`` of the server's collector, each read at most
    once per second."""

    def __init__(self, remote: RemoteStore | None) -> None:
        self.remote = remote
        self._cache: dict[str, dict[str, int]] = {}
        self._at: dict[str, float] = {}

    def _read(self, what: str) -> dict[str, int]:
        if self.remote is None:
            return {}
        if time.monotonic() - self._at.get(what, 0.0) > 1.0:
            try:
                self._cache[what] = self.remote.host_seen() if what == "host" else self.remote.job_seen()
            except Exception:
                log.debug("reading %s-seen from the server failed", what, exc_info=True)
            self._at[what] = time.monotonic()
        return self._cache.get(what, {})

    @property
    def host_seen_ns(self) -> dict[str, int]:
        return self._read("host")

    @property
    def job_seen_ns(self) -> dict[str, int]:
        return self._read("job")


class _RemoteWaker:
    def __init__(self, remote: RemoteStore | None) -> None:
        self.remote = remote

    def wake(self) -> None:
        if self.remote is not None:
            self.remote.wake_alerts()


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def build_state(settings: Any, server_url: str | None) -> SimpleNamespace:
    """The ``app.state`` a :class:`.loop.DiagnosisLoop` needs, for a worker process."""
    from fleetscope.server.db import open_db
    from fleetscope.server.store import Store, diagnosis_query_settings
    from fleetscope.server.store.url import parse_store_url

    token = settings.token.get_secret_value() if settings.token is not None else None
    remote = RemoteStore(server_url, token) if server_url else None
    if parse_store_url(settings.store_url).embedded:
        if remote is None:
            raise ValueError("an embedded (chdb://) store is owned by the server: give --server URL")
        store: Any = remote
    else:
        store = Store.open(settings.store_url, settings.ttl_days, migrate_schema=False)
        store.query_settings = diagnosis_query_settings(settings.diagnosis_query_nice, store)
    return SimpleNamespace(settings=settings, db=open_db(settings.db_url), store=store,
                           collector=_RemoteCollector(remote), alert_dispatcher=_RemoteWaker(remote),
                           remote=remote)


async def run_worker(settings: Any, server_url: str | None, sink: IncidentSink,
                     parent_pid: int | None = None) -> None:
    """Run the diagnosis loop until SIGTERM/SIGINT (or until ``parent_pid`` exits); changed
    incidents go to ``sink`` (the alert outbox in the shared SQL DB)."""
    from .loop import DiagnosisLoop

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per query otherwise
    state = build_state(settings, server_url)
    if server_url:  # wait for the server (it may still be starting)
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(server_url.rstrip("/") + "/healthz", timeout=5)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server {server_url} not reachable") from None
                await asyncio.sleep(0.5)
    loop = DiagnosisLoop(SimpleNamespace(state=state), sink, lease_owner=worker_id())
    if state.remote is not None:
        loop.on_result = state.remote.publish
    stop = asyncio.Event()
    aloop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aloop.add_signal_handler(sig, stop.set)
    await loop.start()
    log.info("diagnosis worker %s started (store via %s)", loop.lease_owner,
             f"server {server_url}" if isinstance(state.store, RemoteStore) else "its own connection")
    reported = 0
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=1.0)
            except asyncio.TimeoutError:
                if parent_pid and os.getppid() != parent_pid:
                    log.info("server process %s gone: worker stops", parent_pid)
                    break
                total = sum(int(v[0]) for v in loop.pass_seconds.values())
                if state.remote is not None and total != reported:  # new passes: tell the server
                    await asyncio.to_thread(state.remote.report_passes, loop.lease_owner, dict(loop.pass_seconds))
                    reported = total
    finally:
        await loop.stop()
        loop.release_leases()
        if state.remote is not None:
            state.remote.close()
        if not isinstance(state.store, RemoteStore):
            state.store.close()


class WorkerProcess:
    """Server service: runs ``fleetscope worker`` as a child process and restarts it if it
    dies (``FLEETSCOPE_DIAGNOSIS_WORKER=process``)."""

    def __init__(self, app: Any, sink: IncidentSink) -> None:
        self.app = app
        self.sink = sink
        """Installs the default rules before the child starts (the child has its own)."""
        self.proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.restarts = 0

    def command(self) -> list[str]:
        import sys

        s = self.app.state.settings
        host = "127.0.0.1" if s.host in ("0.0.0.0", "::", "") else s.host
        url = f"http://{'[' + host + ']' if ':' in host else host}:{s.port}"
        return [sys.executable, "-m", "fleetscope.cli", "worker", "--server", url, "--store", s.store_url,
                "--db", s.db_url, "--parent-pid", str(os.getpid())]

    async def _spawn(self) -> None:
        env = dict(os.environ)
        s = self.app.state.settings
        if s.token is not None:  # the token reaches the child by environment, never argv
            env["FLEETSCOPE_TOKEN"] = s.token.get_secret_value()
        self.proc = await asyncio.create_subprocess_exec(*self.command(), env=env)
        log.info("diagnosis worker process %s started", self.proc.pid)

    async def start(self) -> None:
        def defaults() -> None:  # the rules exist once the server is ready, as with the in-process loop
            with self.app.state.db() as s:
                self.sink.install(s)

        await asyncio.to_thread(defaults)
        await self._spawn()
        self._task = asyncio.create_task(self._supervise(), name="fleetscope-worker-supervisor")

    async def _supervise(self) -> None:
        while not self._stopping:
            assert self.proc is not None
            rc = await self.proc.wait()
            if self._stopping:
                return
            self.restarts += 1
            log.warning("diagnosis worker exited (%s); restarting", rc)
            await asyncio.sleep(min(2.0 * self.restarts, 30.0))
            await self._spawn()

    async def stop(self) -> None:
        self._stopping = True
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=20)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._task is not None:
            self._task.cancel()
