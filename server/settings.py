"""Server settings: one pydantic-settings object, read from ``FLEETSCOPE_*`` env vars.

Command-line flags of ``fleetscope server`` override the environment. Validators
refuse unsafe or nonsensical values with a message naming the setting.
"""

from __future__ import annotations

import ipaddress

from fleetscope.server.diagnosis.engine import DiagnosisConfig
from fleetscope.server.diagnosis.hangs import HangConfig
from fleetscope.server.diagnosis.stragglers import StragglerConfig
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetscope.config import (
    DEFAULT_DB_URL,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_STORE_URL,
    ENV_PREFIX,
)

MiB = 1024 * 1024


class Settings(BaseSettings):
    """Configuration of the fleetscope server (API + collector + background services)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    store_url: str = DEFAULT_STORE_URL
    """ClickHouse store: ``chdb:///abs/dir``, ``chdb://rel/dir`` or ``http(s)://user:pass@host:port/db``
    (``...db?cluster=NAME``: a ClickHouse cluster, schema created ON CLUSTER)."""
    db_url: str = DEFAULT_DB_URL
    """Control-plane SQL database (SQLAlchemy URL): SQLite by default, PostgreSQL by URL."""
    host: str = DEFAULT_HOST
    """Interface to bind. Loopback unless told otherwise."""
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    """TCP port (0: any free port)."""
    token: SecretStr | None = None
    """Static bearer token (admin scope) required on every /api/v1 route except health, if
    set; scoped tokens (``fleetscope token create``) turn authentication on as well."""
    token_cache_s: float = Field(2.0, ge=0, le=300)
    """Seconds a token look-up is cached (a revoked token stops working within this)."""
    allowed_hosts: str = ""
    """Host names clients may use (the ``Host`` header; comma-separated, ``*``: any), a
    guard against DNS rebinding. '' = the loopback names when bound to loopback, else any."""
    allow_unauthenticated_remote: bool = False
    """Permit binding a non-loopback interface without a token (e.g. behind a trusted proxy)."""
    ui: bool = True
    """Mount the dashboard at /ui when the dashboard component is installed."""
    ttl_days: int = Field(30, ge=0, le=3650)
    """Days raw telemetry is kept (0: forever)."""
    max_request_bytes: int = Field(64 * MiB, ge=1024, le=1024 * MiB)
    """Largest accepted ingest body; bigger requests get 413."""
    max_queue_rows: int = Field(8_000_000, ge=1000, le=200_000_000)
    """Rows accepted but not yet written; beyond it ingest answers 429 + Retry-After."""
    max_insert_rows: int = Field(2_000_000, ge=1000, le=50_000_000)
    """Most rows the writer coalesces into one insert per table."""
    coalesce_linger_ms: float = Field(50.0, ge=0, le=10_000)
    """Longest wait for more batches before an insert smaller than min_insert_rows."""
    min_insert_rows: int = Field(200_000, ge=1, le=50_000_000)
    """Queued rows at which the writer inserts at once, without lingering."""
    insert_threads: int = Field(1, ge=1, le=16)
    """Record tables of one coalesced group inserted in parallel."""
    retry_after_s: int = Field(1, ge=1, le=300)
    """Retry-After sent with 429 responses."""
    log_level: str = "info"
    """Python / uvicorn log level."""
    # ---- diagnosis and alerts (server/diagnosis, server/alerts) ----
    diagnosis_enabled: bool = True
    """Run the diagnosis loop and the alert dispatcher."""
    diagnosis_tick_s: float = Field(2.0, ge=0.1, le=600)
    """Seconds between diagnosis passes."""
    diagnosis_max_jobs_per_tick: int = Field(8, ge=1, le=10_000)
    """Active jobs diagnosed per pass (round-robin beyond that)."""
    diagnosis_window_steps: int = Field(StragglerConfig.window_steps, ge=8, le=1000)
    """Steps of detailed events each pass loads per job."""
    hang_min_s: float = Field(HangConfig.hang_min_s, ge=1, le=86_400)
    """A hang needs at least this many seconds without a completed step..."""
    hang_first_step_min_s: float = Field(HangConfig.first_step_min_s, ge=1, le=86_400)
    """...or, before the job's first completed step, this many (start-up: imports,
    rendezvous, compilation, a checkpoint's load), unless a rank is blocked in an op or dead."""
    hang_k: float = Field(HangConfig.hang_k, ge=1, le=1000)
    """...and at least this many times the recent p99 step time (also the multiple of the
    recent p99 job-wide op-completion gap in the op-progress rule)."""
    hang_op_min_s: float = Field(HangConfig.hang_op_min_s, ge=1, le=86_400)
    """Earlier hang rule: no traced op (collective, p2p, section) completed anywhere in the
    job for this many seconds (and hang_k x the recent p99 per-step longest gap) while ranks
    wait in ops. The default is the largest floor that still pages within the 30 s target
    (why, and the pipeline's share of it: docs/diagnosis.md). Jobs with rarer traced-op-free
    phases longer than this (e.g. a checkpoint save behind a barrier) should raise it."""
    incident_resolve_s: float = Field(20.0, ge=0, le=86_400)
    """An incident not detected for this long is resolved."""
    selfcheck_tick_s: float = Field(15.0, ge=0.1, le=3600)
    """Seconds between fleet self-check scoring passes (probe findings -> incidents)."""
    alert_retry_base_s: float = Field(1.0, ge=0.01, le=3600)
    """First retry delay of a failed webhook delivery (doubles each attempt)."""
    alert_retry_max_s: float = Field(300.0, ge=0.1, le=86_400)
    """Longest delay between webhook delivery attempts."""
    public_url: str = ""
    """Base URL of this server as operators reach it (links in alerts); '' for none."""
    # ---- diagnosis worker, scheduling, silence (server/diagnosis/worker.py, loop.py) ----
    diagnosis_worker: str = "process"
    """Where the diagnosis loop runs: ``process`` (a ``fleetscope worker`` child process of
    the server, the default), ``thread`` (inside the server process) or ``off`` (only
    workers started elsewhere with ``fleetscope worker``)."""
    diagnosis_query_nice: int = Field(10, ge=0, le=19)
    """Nice value of the threads that run the diagnosis passes' store queries (ClickHouse's
    ``os_threads_nice_value_query``; older servers: ``os_thread_priority``): when CPU is
    short, ingest's inserts and the API's reads go first and a pass waits; 0 runs them at
    the same priority as everything else."""
    diagnosis_concurrency: int = Field(2, ge=1, le=64)
    """Jobs one worker diagnoses at once (round-robin over the active jobs)."""
    diagnosis_cache_jobs: int = Field(16, ge=1, le=10_000)
    """Jobs whose per-step reductions a worker keeps between passes (memory bound)."""
    silent_s: float = Field(DiagnosisConfig.silent_s, ge=2, le=3600)
    """Nothing arrived from a running job (status becomes ``lost``) or from one of its hosts
    (``host_down``) for this many seconds: a ``heartbeat_lost`` incident that pages."""

    @field_validator("diagnosis_worker")
    @classmethod
    def _worker(cls, v: str) -> str:
        if v not in ("process", "thread", "off"):
            raise ValueError(f"diagnosis_worker {v!r}: expected process, thread or off")
        return v
    # ---- webhooks and the outbox (server/alerts) ----
    webhook_allow: str = ""
    """Webhook targets exempt from the SSRF guard (loopback, private, link-local and other
    non-global addresses are refused otherwise): IP addresses, CIDR networks or exact host
    names, comma-separated, e.g. ``127.0.0.1,10.20.0.0/16,alertmanager.internal``."""
    webhook_secret_key: SecretStr | None = None
    """Key (32+ characters) that seals webhook secrets in the database; every replica sharing
    a database needs the same one. Unset: a random key in ./.fleetscope/webhook-secret.key."""
    alert_lease_s: float = Field(60.0, ge=2, le=3600)
    """How long a replica's claim on outbox rows lasts; a crashed replica's claimed rows are
    delivered by another (or by itself after restart) once it expires. Deliveries time out
    after at most half of it."""
    # ---- ingest and query limits (collector, server/api/routes/{ingest,jobs,views}) ----
    max_decoded_bytes: int = Field(256 * MiB, ge=1024, le=16 * 1024 * MiB)
    """Most bytes one ingest request may decode to (Arrow buffers after decompression,
    dictionary-to-string expansion included); checked before decompressing. 413 beyond."""
    max_request_rows: int = Field(2_000_000, ge=1, le=100_000_000)
    """Most rows one ingest request may carry (all record types together). 413 beyond."""
    max_string_bytes: int = Field(1 * MiB, ge=64, le=256 * MiB)
    """Longest free-text value (log message, context, command...) in UTF-8 bytes. 422 beyond."""
    max_symbol_bytes: int = Field(200, ge=16, le=4096)
    """Longest name/id value (job, host, op, group id, ...); the SQL job and host columns
    hold 200. 422 beyond."""
    max_world_size: int = Field(2**20, ge=1, le=2**24)
    """Largest job (dp x tp x pp) and 1 + the largest rank accepted. 422 beyond."""
    max_future_s: float = Field(3600.0, ge=0, le=7 * 86_400)
    """Latest accepted time (after the clock offset): now + this. 422 beyond."""
    max_clock_offset_s: float = Field(86_400.0, ge=0, le=365 * 86_400)
    """Largest |X-Fleetscope-Clock-Offset-Ns| accepted. 400 beyond."""
    max_batch_span_days: int = Field(900, ge=1, le=100_000)
    """Largest span of one record type's partition time in one request (ClickHouse
    refuses inserts touching more than 1000 day partitions). 422 beyond."""
    max_inflight_bytes: int = Field(256 * MiB, ge=1024, le=64 * 1024 * MiB)
    """Ingest body bytes being read, decoded or written at once; a request that would
    pass it gets 429 + Retry-After before its body is read (one request is always let in)."""
    max_ranks_expanded: int = Field(2**20, ge=1, le=2**24)
    """Most ranks a ``ranks=`` query parameter may select (before expanding it). 422 beyond."""
    # ---- Prometheus metrics (GET /metrics, fleetscope/server/metrics.py) ----
    metrics_cache_s: float = Field(5.0, ge=0, le=300)
    """Seconds one computed /metrics snapshot is reused (scrapes never re-query sooner)."""
    metrics_top_k: int = Field(5, ge=1, le=50)
    """Straggler suspects exported per job (series per job stay at most this many, at any
    world size)."""
    metrics_job_window_s: float = Field(3600.0, ge=0, le=30 * 86_400)
    """Finished or failed jobs stay in /metrics this long after their last update."""
    metrics_max_jobs: int = Field(200, ge=1, le=10_000)
    """Most jobs exported per scrape (running ones first, then the latest updated)."""

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.lower()
        if v not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError(f"log_level {v!r}: expected critical, error, warning, info or debug")
        return v

    @field_validator("store_url")
    @classmethod
    def _store(cls, v: str) -> str:
        from fleetscope.server.store.url import parse_store_url

        parse_store_url(v)  # raises naming the URL
        return v

    @field_validator("db_url")
    @classmethod
    def _db(cls, v: str) -> str:
        if not v.startswith(("sqlite:", "postgresql:", "postgresql+")):
            raise ValueError(f"db_url {v!r}: expected sqlite:///path or postgresql://...")
        return v

    @field_validator("webhook_allow")
    @classmethod
    def _allow(cls, v: str) -> str:
        from fleetscope.server.alerts.guard import AllowList

        AllowList.parse(v)  # raises naming the entry
        return v

    @field_validator("webhook_secret_key")
    @classmethod
    def _wkey(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 32:
            raise ValueError("webhook_secret_key: must be at least 32 characters")
        return v

    @model_validator(mode="after")
    def _safe_bind(self) -> Settings:
        if not is_loopback(self.host) and self.token is None and not self.allow_unauthenticated_remote:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: set FLEETSCOPE_TOKEN (a bearer "
                "token) or FLEETSCOPE_ALLOW_UNAUTHENTICATED_REMOTE=true to serve it unauthenticated"
            )
        if self.token is not None and len(self.token.get_secret_value()) < 16:
            raise ValueError("token: must be at least 16 characters")
        return self


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
