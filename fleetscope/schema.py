"""The telemetry record schema: every record type and its columns, declared once.

Everything that stores, encodes or serves telemetry is derived from this module:
the ClickHouse DDL (``fleetscope.server.store``), the Arrow wire/spool codec
(``fleetscope.codec``) and the API models. ``tests/test_schema_agreement.py`` proves
that they agree.

Conventions:
* times are integer nanoseconds since the Unix epoch (``*_ns``); durations ``*_ns``;
* "not applicable" integers are ``-1`` (micro-batch outside a pipeline, peer of a
  collective, device time when not measured); strings default to ``""``;
* ``rank`` is the global rank; ``-1`` means host-level (agent) data.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Any, Final

SCHEMA_VERSION: Final = 1


class ColType(str, enum.Enum):
    """Logical column types; each maps to one Arrow, ClickHouse and Python type."""

    STRING = "string"
    """Free text (ClickHouse ``String``)."""
    SYMBOL = "symbol"
    """Short, low-cardinality text: names, ops, axes (``LowCardinality(String)``)."""
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"
    FLOAT64 = "float64"


CLICKHOUSE_TYPES: Final[dict[ColType, str]] = {
    ColType.STRING: "String",
    ColType.SYMBOL: "LowCardinality(String)",
    ColType.INT64: "Int64",
    ColType.INT32: "Int32",
    ColType.BOOL: "UInt8",
    ColType.FLOAT64: "Float64",
}

PYTHON_TYPES: Final[dict[ColType, type]] = {
    ColType.STRING: str,
    ColType.SYMBOL: str,
    ColType.INT64: int,
    ColType.INT32: int,
    ColType.BOOL: bool,
    ColType.FLOAT64: float,
}


@functools.cache
def arrow_type(t: ColType) -> Any:
    """The Arrow type of a logical column type (imported lazily: pyarrow is heavy)."""
    import pyarrow as pa

    return {
        ColType.STRING: pa.string(),
        ColType.SYMBOL: pa.string(),
        ColType.INT64: pa.int64(),
        ColType.INT32: pa.int32(),
        ColType.BOOL: pa.uint8(),
        ColType.FLOAT64: pa.float64(),
    }[t]


@dataclass(frozen=True)
class Column:
    name: str
    type: ColType
    doc: str = ""
    default: Any = None
    """Value used when a JSON client omits the column; ``None`` means required."""
    since: int = 1
    """Store schema version that added the column (:mod:`fleetscope.server.store.migrations`):
    the tables of an earlier version lack it, and a writer of an earlier version omits it
    (its ``default`` fills in)."""

    @property
    def required(self) -> bool:
        return self.default is None


@dataclass(frozen=True)
class RecordType:
    name: str
    """Record type name; also the ClickHouse table name."""
    columns: tuple[Column, ...]
    time_column: str
    """Column (ns since epoch) used for partitioning, TTL and clock alignment."""
    order_by: tuple[str, ...]
    doc: str = ""
    time_columns: tuple[str, ...] = field(default=())
    """All absolute-time columns (shifted together when clocks are aligned)."""

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"record type {self.name!r} has no column {name!r}")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def arrow_schema(self) -> Any:
        """The canonical Arrow schema, built once per record type and kept on it (codec hot
        paths call this per table; a cache keyed by the record type would hash every column
        on every call)."""
        cached = self.__dict__.get("_arrow_schema")
        if cached is None:
            cached = self._build_arrow_schema()
            object.__setattr__(self, "_arrow_schema", cached)
        return cached

    def _build_arrow_schema(self) -> Any:
        import pyarrow as pa

        return pa.schema(
            [pa.field(c.name, arrow_type(c.type), nullable=False) for c in self.columns],
            metadata={
                b"fleetscope.record": self.name.encode(),
                b"fleetscope.schema_version": str(SCHEMA_VERSION).encode(),
            },
        )


def _c(name: str, t: ColType, doc: str = "", default: Any = None, since: int = 1) -> Column:
    return Column(name, t, doc, default, since)


S, Y, I64, I32, B, F = (
    ColType.STRING,
    ColType.SYMBOL,
    ColType.INT64,
    ColType.INT32,
    ColType.BOOL,
    ColType.FLOAT64,
)

_JOB_RANK = (
    _c("job", Y, "job id"),
    _c("attempt", I32, "restart attempt of the job (0 first)", 0),
    _c("rank", I32, "global rank; -1 for host-level data"),
    _c("host", Y, "host name", ""),
)

SECTIONS = RecordType(
    name="sections",
    doc="A timed code section on one rank (forward, backward, optimizer, dataloader...).",
    columns=_JOB_RANK
    + (
        _c("step", I64, "training step"),
        _c("microbatch", I32, "micro-batch index, -1 if not per micro-batch", -1),
        _c("name", Y, "section name, e.g. forward, backward, optimizer, dataloader"),
        _c("kind", Y, "compute | dataloader | optimizer | other", "compute"),
        _c("start_ns", I64, "CPU start time"),
        _c("end_ns", I64, "CPU end time"),
        _c("duration_ns", I64, "best duration: device time when measured, else end-start"),
        _c("device_ns", I64, "device (CUDA event) duration, -1 if not measured", -1),
        _c("cpu_ns", I64, "CPU time the thread that ran the section spent on a CPU during it "
           "(measured where the device is the CPU, which has no event clock; -1 if not measured)",
           -1, since=7),
    ),
    time_column="start_ns",
    time_columns=("start_ns", "end_ns"),
    order_by=("job", "step", "rank", "start_ns"),
)

COLLECTIVES = RecordType(
    name="collectives",
    doc="One collective or p2p op on one rank, with Flight-Recorder-like states.",
    columns=_JOB_RANK
    + (
        _c("step", I64, "training step the op belongs to"),
        _c("microbatch", I32, "micro-batch index, -1 if none", -1),
        _c("group_id", Y, "process group id, e.g. tp.pp0.dp1 (see fleetscope.topology)"),
        _c("axis", Y, "dp | tp | pp | world"),
        _c("group_rank", I32, "rank within the group", -1),
        _c("group_size", I32, "number of ranks in the group", -1),
        _c("seq", I64, "per-group sequence number on this rank (1-based)"),
        _c("op", Y, "all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier..."),
        _c("bytes", I64, "payload bytes", 0),
        _c("dtype", Y, "tensor dtype", ""),
        _c("peer", I32, "global rank of the peer for p2p, -1 for collectives", -1),
        _c("state", Y, "enqueued | started | completed | failed", "completed"),
        _c("enqueued_ns", I64, "CPU call time"),
        _c("started_ns", I64, "device start (CPU: same as enqueued), -1 if unknown", -1),
        _c("completed_ns", I64, "completion time, -1 if not completed", -1),
        _c("duration_ns", I64, "completed - started (device time when measured)", -1),
    ),
    time_column="enqueued_ns",
    time_columns=("enqueued_ns", "started_ns", "completed_ns"),
    order_by=("job", "step", "rank", "group_id", "seq"),
)

STEPS = RecordType(
    name="steps",
    doc="Step marker: one training step on one rank.",
    columns=_JOB_RANK
    + (
        _c("step", I64, "training step"),
        _c("start_ns", I64, "step start"),
        _c("end_ns", I64, "step end"),
        _c("duration_ns", I64, "end - start"),
        _c("num_microbatches", I32, "micro-batches in the step", 0),
        _c("tokens", I64, "tokens processed by this rank's replica", 0),
        _c("loss", F, "loss if known on this rank, NaN otherwise", float("nan")),
    ),
    time_column="start_ns",
    time_columns=("start_ns", "end_ns"),
    order_by=("job", "step", "rank"),
)

INFLIGHT = RecordType(
    name="inflight",
    doc="Liveness: what a rank's training thread is blocked in right now (written periodically).",
    columns=_JOB_RANK
    + (
        _c("ts_ns", I64, "time this record was written"),
        _c("step", I64, "current step"),
        _c("kind", Y, "collective | p2p | section | idle"),
        _c("op", Y, "op or section name", ""),
        _c("group_id", Y, "process group id, '' if none", ""),
        _c("axis", Y, "dp | tp | pp | world | ''", ""),
        _c("seq", I64, "per-group sequence number of the op, -1 if none", -1),
        _c("peer", I32, "p2p peer global rank, -1 if none", -1),
        _c("since_ns", I64, "when the rank entered this op/section"),
    ),
    time_column="ts_ns",
    time_columns=("ts_ns", "since_ns"),
    order_by=("job", "rank", "ts_ns"),
)

HEARTBEATS = RecordType(
    name="heartbeats",
    doc="Agent heartbeat, one row per local rank (rank -1: the host itself).",
    columns=(
        _c("ts_ns", I64, "time of the heartbeat"),
        _c("job", Y, "job id, '' if the host runs none", ""),
        _c("host", Y, "host name"),
        _c("rank", I32, "global rank, -1 for the host row", -1),
        _c("local_rank", I32, "local rank, -1 for the host row", -1),
        _c("ip", Y, "host IP", ""),
        _c("node", Y, "pod/node name from the environment", ""),
        _c("agent_version", Y, "agent version", ""),
        _c("num_gpus", I32, "GPUs seen by the agent", 0),
        _c("pid", I32, "rank process id, -1 if unknown", -1),
        _c("alive", B, "rank process alive", True),
        _c("last_record_ns", I64, "time of the last spool record of the rank", -1),
        _c("last_step", I64, "last completed step of the rank", -1),
        _c("inflight_op", S, "current in-flight op, '' if none", ""),
        _c("acked_through_ns", I64, "time of the rank's newest in-flight record such that it and "
           "every record of the rank before it are acknowledged by the server (0: none yet; -1: "
           "not reported, an older agent)", -1, since=4),
    ),
    time_column="ts_ns",
    time_columns=("ts_ns", "last_record_ns", "acked_through_ns"),
    order_by=("host", "ts_ns"),
)

METRICS = RecordType(
    name="metrics",
    doc="Numeric samples in long form: GPU (NVML), host, NIC, RDMA, hook and agent metrics.",
    columns=(
        _c("ts_ns", I64, "sample time"),
        _c("job", Y, "job id, '' if none", ""),
        _c("host", Y, "host name"),
        _c("rank", I32, "global rank the device serves, -1 if none", -1),
        _c("source", Y, "gpu | host | nic | rdma | hooks | agent"),
        _c("device", Y, "e.g. gpu0, eth0, mlx5_0/1; '' for host-wide", ""),
        _c("name", Y, "metric name, e.g. gpu.temperature_c, nic.rx_bytes"),
        _c("value", F, "value"),
    ),
    time_column="ts_ns",
    time_columns=("ts_ns",),
    order_by=("host", "source", "name", "ts_ns"),
)

LOG_EVENTS = RecordType(
    name="log_events",
    doc="A matched line from a trainer log (NCCL WARN, CUDA error, Xid, OOM, traceback...).",
    columns=(
        _c("ts_ns", I64, "time the line was seen"),
        _c("job", Y, "job id", ""),
        _c("host", Y, "host name"),
        _c("rank", I32, "rank of the log, -1 if unknown", -1),
        _c("source", S, "log file", ""),
        _c("kind", Y, "pattern kind: nccl_warn, nccl_timeout, cuda_error, xid, ecc, oom, segfault, traceback..."),
        _c("severity", Y, "info | warning | error | critical", "error"),
        _c("message", S, "the matched line"),
        _c("context", S, "surrounding lines", ""),
    ),
    time_column="ts_ns",
    time_columns=("ts_ns",),
    order_by=("job", "host", "ts_ns"),
)

JOBS = RecordType(
    name="jobs",
    doc="Job metadata written by rank 0 at start (and at the end with the final status).",
    columns=(
        _c("ts_ns", I64, "time of the record"),
        _c("job", Y, "job id"),
        _c("attempt", I32, "restart attempt", 0),
        _c("name", S, "human name", ""),
        _c("dp", I32, "data-parallel size"),
        _c("tp", I32, "tensor-parallel size"),
        _c("pp", I32, "pipeline-parallel size"),
        _c("order", Y, "rank order of the axes, fastest first (see topology)", "tp-dp-pp"),
        _c("num_microbatches", I32, "micro-batches per step", 1),
        _c("model_flops_per_step", F, "model FLOPs of one step for the whole job", 0.0),
        _c("device_name", Y, "accelerator name", ""),
        _c("device_peak_flops", F, "peak FLOP/s of one device, 0 if unknown", 0.0),
        _c("status", Y, "running | finished | failed", "running"),
        _c("command", S, "command line", ""),
        _c("versions", S, "JSON object of library versions", "{}"),
        _c("host", Y, "host of the writer", ""),
    ),
    time_column="ts_ns",
    time_columns=("ts_ns",),
    order_by=("job", "ts_ns"),
)

PROBES = RecordType(
    name="probes",
    doc="Self-check probe result for one device of one host.",
    columns=(
        _c("ts_ns", I64, "time of the result"),
        _c("job", Y, "job or maintenance window id", ""),
        _c("host", Y, "host name"),
        _c("device", Y, "device, e.g. cuda:0 or cpu"),
        _c("device_model", Y, "device model, e.g. NVIDIA H200 or the CPU model", ""),
        _c("probe", Y, "matmul | membw | numerics | allreduce | alltoall | p2p"),
        _c("value", F, "measured value"),
        _c("unit", Y, "unit of value, e.g. TFLOP/s, GB/s", ""),
        _c("peak_fraction", F, "value / nominal peak, NaN if unknown", float("nan")),
        _c("passed", B, "probe passed its own checks", True),
        _c("detail", S, "JSON details", "{}"),
    ),
    time_column="ts_ns",
    time_columns=("ts_ns",),
    order_by=("host", "probe", "ts_ns"),
)

RECORD_TYPES: Final[dict[str, RecordType]] = {
    r.name: r
    for r in (SECTIONS, COLLECTIVES, STEPS, INFLIGHT, HEARTBEATS, METRICS, LOG_EVENTS, JOBS, PROBES)
}


def record_type(name: str) -> RecordType:
    """Look up a record type by name, with an error that lists the valid ones."""
    try:
        return RECORD_TYPES[name]
    except KeyError:
        raise KeyError(
            f"unknown record type {name!r}; expected one of {sorted(RECORD_TYPES)}"
        ) from None
