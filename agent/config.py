"""Agent configuration: one dataclass; ``agent/cli.py`` generates its flags from the fields."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from fleetscope.agent.priority import NICE_MAX, NICE_MIN

from fleetscope import env
from fleetscope.dataclass_cli import flag

AGENT_VERSION = "0.1.0"
STATE_DIR_NAME = ".fleetscope-agent"
"""Default state directory, inside the spool (names starting with '.' are not jobs)."""


BATCH_BYTES = 4 << 20
"""Default of :attr:`AgentConfig.batch_bytes` (also the :class:`Shipper`'s)."""
BATCH_DELAY_S = 0.5
"""Default of :attr:`AgentConfig.batch_delay_s` (also the :class:`Shipper`'s)."""
POLL_S = 0.1
"""Default of :attr:`AgentConfig.poll_s` (also the :class:`Shipper`'s)."""
MAX_BACKOFF_S = 5.0
"""Default of :attr:`AgentConfig.max_backoff_s` (also the :class:`Transport`'s)."""
REJECTED_MAX_BYTES = 64 << 20

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'512M', '20G', '1.5GiB', '1000' -> bytes (binary multiples).

    Raises:
        ValueError: naming the text.
    """
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}; use e.g. 500M, 20G or a number of bytes")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


class ConfigError(ValueError):
    """A bad value of one :class:`AgentConfig` field (the CLI names its flag)."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        super().__init__(f"{field_name} {reason}, got {value!r}")
        self.field = field_name
        self.value = value
        self.reason = reason


BATCHING = "batching and retries"
RETENTION = "retention"
METRICS = "metrics, heartbeats, clock"


@dataclass
class AgentConfig:
    """Everything one agent process needs; defaults keep end-to-end latency under 2 s.

    The ``fleetscope agent`` flags are generated from these fields (their ``flag``
    metadata, their docstrings as help, their defaults), see :mod:`fleetscope.dataclass_cli`.
    """

    server: str
    """Base URL of the fleetscope server, e.g. ``http://ctl:8000``."""
    spool: Path
    """Spool directory written by the trainer hooks (``<spool>/<job>/rank-*/seg-*.fsp``)."""
    token: str | None = None
    """Bearer token for a server that requires one (``--token-file``, ``FLEETSCOPE_TOKEN_FILE``
    or ``FLEETSCOPE_TOKEN``; see :func:`read_token`)."""
    job: str | None = field(default=None, metadata=flag("--job", metavar="ID"))
    """Ship only this job's directory (default: every job found in the spool)."""
    state_dir: Path | None = field(default=None, metadata=flag(
        "--state-dir", metavar="DIR", default_text="<spool>/.fleetscope-agent"))
    """Offsets, the agent's own outbox and rejected frames."""
    host: str = field(default_factory=socket.gethostname, metadata=flag("--host", metavar="NAME"))
    """Host name sent as ``X-Fleetscope-Host`` and written into host-level records (default:
    this host's name)."""
    batch_bytes: int = field(default=BATCH_BYTES, metadata=flag(
        "--batch-bytes", group=BATCHING, metavar="SIZE", parse=parse_size, default_text="4M"))
    """Ship as soon as this much spool payload is pending."""
    batch_delay_s: float = field(default=BATCH_DELAY_S, metadata=flag(
        "--batch-delay", group=BATCHING, metavar="S"))
    """...or once the oldest pending frame has waited this many seconds."""
    in_flight: int = field(default=4, metadata=flag("--in-flight", group=BATCHING, metavar="N"))
    """Batches on the wire at once; 1 = one request at a time (acks may come back in any
    order; offsets still move only over each file's contiguous acknowledged prefix)."""
    coalesce: bool = field(default=True, metadata=flag("--no-coalesce", group=BATCHING, negate=True))
    """While a batch is on the wire, keep filling the next one (up to ``batch_bytes``)
    instead of cutting one every ``batch_delay_s``: fewer, larger requests when the
    server is slow (--no-coalesce: cut on the delay whenever the window has room)."""
    poll_s: float = field(default=POLL_S, metadata=flag("--poll", group=BATCHING, metavar="S"))
    """Spool scan period when idle, in seconds."""
    compression: str | None = field(default="zstd", metadata=flag(
        "--compression", group=BATCHING, choices=("zstd", "lz4", "none")))
    """Arrow IPC compression on the wire."""
    request_timeout_s: float = 30.0
    """Timeout of one POST."""
    max_backoff_s: float = field(default=MAX_BACKOFF_S, metadata=flag(
        "--max-backoff", group=BATCHING, metavar="S"))
    """Cap of the exponential retry backoff in seconds (each wait is drawn uniformly from
    [d/2, d], d = min(cap, 0.1 s * 2**attempt); see ``agent/transport.py``)."""
    clock_sync: bool = field(default=True, metadata=flag("--no-clock-sync", group=METRICS,
                                                          negate=True))
    """Estimate this host's clock offset to the server; off (--no-clock-sync): send 0."""
    clock_interval_s: float = 60.0
    """How often the clock offset is re-estimated."""
    heartbeat_s: float = field(default=2.0, metadata=flag("--heartbeat", group=METRICS, metavar="S"))
    """Heartbeat period in seconds."""
    metrics_interval_s: float = field(default=10.0, metadata=flag(
        "--metrics-interval", group=METRICS, metavar="S"))
    """Period of GPU, host and NIC metric collection in seconds."""
    gpu: bool = field(default=True, metadata=flag("--no-gpu", group=METRICS, negate=True))
    """Collect NVML GPU metrics when a driver is present (--no-gpu: do not use NVML)."""
    proc_root: Path = field(default=Path("/proc"), metadata=flag(
        "--proc-root", group=METRICS, metavar="DIR"))
    """Root of procfs (a fixture tree in tests)."""
    sys_root: Path = field(default=Path("/sys"), metadata=flag(
        "--sys-root", group=METRICS, metavar="DIR"))
    """Root of sysfs (a fixture tree in tests)."""
    otlp_endpoint: str | None = field(default=None, metadata=flag(
        "--otlp-endpoint", group=METRICS, metavar="URL"))
    """Also export metrics over OTLP/HTTP to this endpoint, e.g. http://otel:4318/v1/metrics."""
    logs: list[Path] = field(default_factory=list)
    """Extra trainer log files to scan (``<spool>/<job>/rank-*/*.log`` are found by convention)."""
    disk_budget_bytes: int | None = field(default=None, metadata=flag(
        "--disk-budget", group=RETENTION, metavar="SIZE", parse=parse_size))
    """Spool disk budget, e.g. 20G; none = unlimited. See ``agent/retention.py`` for the policy."""
    budget_policy: str = field(default="keep", metadata=flag(
        "--budget-policy", group=RETENTION, choices=("keep", "drop-oldest")))
    """At the budget with only unacked data left: 'keep' (warn, delete nothing) or
    'drop-oldest' (delete the oldest sealed unacked segments, counted and logged)."""
    rejected_max_bytes: int = field(default=REJECTED_MAX_BYTES, metadata=flag(
        "--rejected-max", group=RETENTION, metavar="SIZE", parse=parse_size, default_text="64M"))
    """Cap on ``<state>/rejected/`` (frames the server refused); oldest deleted beyond it."""
    retain_acked: bool = field(default=False, metadata=flag("--retain-acked", group=RETENTION))
    """Keep fully acked sealed segments until the budget needs the space (oldest first)."""
    dead_writer_grace_s: float = 5.0
    """A segment whose writer process is gone and that has not changed this long is sealed."""
    nice: int = field(default=-5, metadata=flag("--nice", metavar="N"))
    """CPU priority of the agent's threads and, when it leads its own session, of its
    autogroup (-20..19; lower runs first). Below 0 needs root / CAP_SYS_NICE, otherwise
    it is left as started and the log says so; 0 leaves it as started. Keeps the agent
    shipping on time beside a job that saturates the CPUs; see docs/agent.md, "CPU priority"."""
    control_poll_s: float = 2.0
    """How often the jobs' instrumentation levels are fetched from the server (runtime
    control; the hooks apply a change within their 0.5 s poll, so within ~2.5 s)."""

    def __post_init__(self) -> None:
        self.spool = Path(self.spool)
        if self.state_dir is None:
            self.state_dir = self.spool / STATE_DIR_NAME
        self.state_dir = Path(self.state_dir)
        self.proc_root = Path(self.proc_root)
        self.sys_root = Path(self.sys_root)
        self.logs = [Path(p) for p in self.logs]
        if self.compression in ("none", ""):
            self.compression = None
        if self.compression not in (None, "zstd", "lz4"):
            raise ConfigError("compression", self.compression, "must be zstd, lz4 or none")
        if self.budget_policy not in ("keep", "drop-oldest"):
            raise ConfigError("budget_policy", self.budget_policy, "must be keep or drop-oldest")
        if not NICE_MIN <= self.nice <= NICE_MAX:
            raise ConfigError("nice", self.nice, f"must be in {NICE_MIN}..{NICE_MAX}")
        for name in ("batch_bytes", "in_flight", "rejected_max_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, getattr(self, name), "must be positive")
        for name in ("batch_delay_s", "poll_s", "heartbeat_s", "metrics_interval_s",
                     "control_poll_s", "max_backoff_s", "request_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(name, getattr(self, name), "must be positive")

    @property
    def outbox_dir(self) -> Path:
        """Spool-format segments written by the agent itself (metrics, heartbeats, logs)."""
        assert self.state_dir is not None
        return self.state_dir / "outbox"

    @property
    def offsets_path(self) -> Path:
        assert self.state_dir is not None
        return self.state_dir / "offsets.json"


def node_name() -> str:
    """Pod/node name from the usual environment variables ('' if none is set)."""
    for var in ("FLEETSCOPE_NODE", "NODE_NAME", "K8S_NODE_NAME", "KUBERNETES_NODE_NAME",
                "POD_NAME", "SLURMD_NODENAME"):
        if os.environ.get(var):
            return os.environ[var]
    return ""


TOKEN_ENV = env.TOKEN.name
TOKEN_FILE_ENV = env.TOKEN_FILE.name


def read_token(token_file: str | os.PathLike | None = None, argv_token: str | None = None) -> str | None:
    """The agent's bearer token, kept out of ``argv`` where possible.

    Order: ``token_file`` (``--token-file``), then ``$FLEETSCOPE_TOKEN_FILE``, then
    ``argv_token`` (``--token``, discouraged: visible in ``ps``), then
    ``$FLEETSCOPE_TOKEN``. The file holds the token on its first line.

    Raises:
        ValueError: the file cannot be read or is empty (naming the file).
    """
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"token file {str(path)!r}: cannot read it ({type(e).__name__})") from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not token:
            raise ValueError(f"token file {str(path)!r} is empty")
        return token
    return argv_token or os.environ.get(TOKEN_ENV) or None
