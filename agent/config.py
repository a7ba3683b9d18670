"""Agent configuration: one dataclass, filled from the command line (``agent/cli.py``)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

AGENT_VERSION = "0.1.0"
STATE_DIR_NAME = ".fleetscope-agent"
"""Default state directory, inside the spool (names starting with '.' are not jobs)."""


@dataclass
class AgentConfig:
    """Everything one agent process needs; defaults keep end-to-end latency under 2 s."""

    server: str
    """Base URL of the fleetscope server, e.g. ``http://ctl:8000``."""
    spool: Path
    """Spool directory written by the trainer hooks (``<spool>/<job>/rank-*/seg-*.fsp``)."""
    token: str | None = None
    """Bearer token for a server that requires one (``--token-file``, ``FLEETSCOPE_TOKEN_FILE``
    or ``FLEETSCOPE_TOKEN``; see :func:`read_token`)."""
    job: str | None = None
    """Ship only this job's directory; ``None`` ships every job found."""
    state_dir: Path | None = None
    """Offsets, the agent's own outbox and rejected frames; default ``<spool>/.fleetscope-agent``."""
    host: str = field(default_factory=socket.gethostname)
    """Host name sent as ``X-Fleetscope-Host`` and written into host-level records."""
    batch_bytes: int = 4 << 20
    """Ship as soon as this many spool payload bytes are pending."""
    batch_delay_s: float = 0.5
    """...or once the oldest pending frame has waited this long."""
    in_flight: int = 4
    """Batches posted concurrently (acks may come back in any order; offsets still move
    only over each file's contiguous acknowledged prefix)."""
    poll_s: float = 0.1
    """How often the spool is scanned for new bytes when idle."""
    compression: str | None = "zstd"
    """Arrow IPC compression on the wire: 'zstd', 'lz4' or None."""
    request_timeout_s: float = 30.0
    """Timeout of one POST."""
    max_backoff_s: float = 5.0
    """Cap of the exponential retry backoff (with full jitter)."""
    clock_sync: bool = True
    """Estimate the clock offset to the server; off: offset 0 is sent."""
    clock_interval_s: float = 60.0
    """How often the clock offset is re-estimated."""
    heartbeat_s: float = 2.0
    """Heartbeat period."""
    metrics_interval_s: float = 10.0
    """Period of GPU, host and NIC metric collection."""
    gpu: bool = True
    """Collect NVML GPU metrics when a driver is present."""
    proc_root: Path = Path("/proc")
    """Root of procfs (a fixture tree in tests)."""
    sys_root: Path = Path("/sys")
    """Root of sysfs (a fixture tree in tests)."""
    otlp_endpoint: str | None = None
    """Also export metrics over OTLP/HTTP to this endpoint (e.g. http://otel:4318/v1/metrics)."""
    logs: list[Path] = field(default_factory=list)
    """Extra trainer log files to scan (``<spool>/<job>/rank-*/*.log`` are found by convention)."""
    disk_budget_bytes: int | None = None
    """Spool disk budget; ``None`` = unlimited. See ``agent/retention.py`` for the policy."""
    budget_policy: str = "keep"
    """At the budget with only unacked data left: 'keep' (warn, delete nothing) or 'drop-oldest'."""
    retain_acked: bool = False
    """Keep fully acked sealed segments until the budget needs the space (oldest first)."""
    rejected_max_bytes: int = 64 << 20
    """Cap on ``<state>/rejected/`` (frames the server refused); oldest deleted beyond it."""
    dead_writer_grace_s: float = 5.0
    """A segment whose writer process is gone and that has not changed this long is sealed."""
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
            raise ValueError(f"compression must be zstd, lz4 or none, got {self.compression!r}")
        if self.budget_policy not in ("keep", "drop-oldest"):
            raise ValueError(f"budget policy must be keep or drop-oldest, got {self.budget_policy!r}")
        for name in ("batch_bytes", "in_flight", "rejected_max_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("batch_delay_s", "poll_s", "heartbeat_s", "metrics_interval_s",
                     "control_poll_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

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


TOKEN_ENV = "FLEETSCOPE_TOKEN"
TOKEN_FILE_ENV = "FLEETSCOPE_TOKEN_FILE"


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
