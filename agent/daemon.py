"""The agent process: wires tailer, shipper, metrics, heartbeats, log scanning, clock.

Threads: the shipper's builder runs in the caller's thread (:meth:`Agent.run`), its
sender, the heartbeats, the log scanner, the clock estimator, the OpenTelemetry
periodic readers and (with a GPU) the XID watcher run beside it. :meth:`Agent.stop`
ends them all; anything not yet acknowledged stays in the spool for the next start.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from types import ModuleType
from typing import Any

from fleetscope.agent.clock import ClockSync
from fleetscope.agent.config import AgentConfig
from fleetscope.agent.control import ControlPoller
from fleetscope.agent.heartbeats import Heartbeats
from fleetscope.agent.hostmetrics import HOST_METRICS, HostSampler
from fleetscope.agent.logscan import LogScanner, LogScanThread
from fleetscope.agent.netmetrics import NET_METRICS, NetSampler
from fleetscope.agent.nvml import GPU_METRICS, GpuSampler, XidWatcher, open_nvml
from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.otel import RDMA_COUNTER_INSTRUMENT, AgentMeters, Reading
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.ranks import RankRegistry
from fleetscope.agent.retention import Retention
from fleetscope.agent.shipper import Shipper
from fleetscope.agent.tailer import Segment, SpoolTailer
from fleetscope.agent.transport import Transport

log = logging.getLogger("fleetscope.agent")

AGENT_METRICS: dict[str, tuple[str, str, str]] = {
    "agent.records_shipped": ("counter", "1", "records acknowledged by the server"),
    "agent.batches_shipped": ("counter", "1", "batches acknowledged"),
    "agent.bytes_shipped": ("counter", "By", "request bytes acknowledged"),
    "agent.duplicate_batches": ("counter", "1", "batches the server had already (re-sends)"),
    "agent.retries": ("counter", "1", "POST retries (errors, 5xx, 429)"),
    "agent.throttled": ("counter", "1", "429 answers"),
    "agent.corrupt_frames": ("counter", "1", "corrupt/invalid spool frames skipped (lifetime)"),
    "agent.corrupt_bytes": ("counter", "By", "bytes of corrupt spool frames skipped (lifetime)"),
    "agent.rejected_frames": ("counter", "1", "frames the server rejected, saved and skipped"),
    "agent.dropped_unacked_bytes": ("counter", "By", "unacked bytes deleted by the disk budget"),
    "agent.backlog_bytes": ("gauge", "By", "spool bytes not yet acknowledged"),
    "agent.spool_bytes": ("gauge", "By", "spool bytes on disk"),
    "agent.clock_offset_ns": ("gauge", "ns", "estimated offset: server clock - host clock"),
    "agent.clock_uncertainty_ns": ("gauge", "ns", "half the round trip of the best exchange"),
    "agent.cpu_seconds": ("counter", "s", "CPU time used by the agent process"),
    "agent.max_rss_bytes": ("gauge", "By", "peak resident memory of the agent"),
    "agent.log_events": ("counter", "1", "log events found by the log scanner"),
}


class Agent:
    def __init__(self, cfg: AgentConfig, nvml_module: ModuleType | None = None):
        self.cfg = cfg
        assert cfg.state_dir is not None
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.stop_event = threading.Event()
        self.offsets = OffsetStore(cfg.offsets_path)
        self.ranks = RankRegistry(cfg.host)
        self.outbox = Outbox(cfg.outbox_dir)
        self.tailer = SpoolTailer(cfg.spool, cfg.outbox_dir, self.offsets, self.ranks, cfg.job,
                                  cfg.dead_writer_grace_s)
        self.transport = Transport(cfg.server, cfg.host, cfg.request_timeout_s, cfg.max_backoff_s,
                                   token=cfg.token)
        self.clock = ClockSync(self.transport.client, enabled=cfg.clock_sync)
        self.retention = Retention(self.offsets, cfg.disk_budget_bytes, cfg.budget_policy,
                                   cfg.retain_acked, on_drop=self._on_drop)
        self.shipper = Shipper(
            host=cfg.host, tailer=self.tailer, offsets=self.offsets, transport=self.transport,
            clock=self.clock, retention=self.retention, ranks=self.ranks, outbox=self.outbox,
            state_dir=cfg.state_dir, batch_bytes=cfg.batch_bytes, batch_delay_s=cfg.batch_delay_s,
            poll_s=cfg.poll_s, compression=cfg.compression, in_flight=cfg.in_flight,
            coalesce=cfg.coalesce, stop_event=self.stop_event, rejected_max_bytes=cfg.rejected_max_bytes)
        self.gpu: GpuSampler | None = None
        if cfg.gpu:
            nv = open_nvml(nvml_module)
            if nv is not None:
                self.gpu = GpuSampler(nv, self.ranks)
                log.info("NVML: %d GPU(s): %s", self.gpu.num_gpus, ", ".join(self.gpu.names))
        self.host_sampler = HostSampler(cfg.proc_root)
        self.net_sampler = NetSampler(cfg.proc_root, cfg.sys_root)
        self.meters = AgentMeters(cfg.host, cfg.metrics_interval_s, self.outbox, cfg.otlp_endpoint)
        self.meters.add(HOST_METRICS, self._host_readings)
        self.meters.add(NET_METRICS, self._net_readings, extra_names=[RDMA_COUNTER_INSTRUMENT])
        self.meters.add(AGENT_METRICS, self._agent_readings)
        if self.gpu is not None:
            self.meters.add(GPU_METRICS, self._gpu_readings)
        self.scanner = LogScanner(self.outbox, self.offsets, cfg.host, cfg.spool, cfg.logs, cfg.job)
        self.heartbeats = Heartbeats(self.outbox, cfg.host, cfg.server, self.ranks,
                                     lambda: self.gpu.num_gpus if self.gpu else 0,
                                     self.stop_event, cfg.heartbeat_s)
        self.threads: list[threading.Thread] = [
            self.heartbeats,
            LogScanThread(self.scanner, self.stop_event),
            threading.Thread(target=self._clock_loop, name="fleetscope-clock", daemon=True),
            ControlPoller(self.transport.client, cfg.spool, self.stop_event, cfg.control_poll_s,
                          cfg.job),
        ]
        if self.gpu is not None:
            self.threads.append(XidWatcher(self.gpu, self._on_xid, self.stop_event))
        self._clock_ready = threading.Event()
        self._draining = False

    # -- run/stop ----------------------------------------------------------------------
    def run(self) -> None:
        """Run until :meth:`stop` (or a signal handler calling it)."""
        log.info("fleetscope agent: host %s, spool %s, server %s", self.cfg.host, self.cfg.spool,
                 self.cfg.server)
        for t in self.threads:
            t.start()
        if self.cfg.clock_sync:
            self._clock_ready.wait(3.0)
        try:
            self.shipper.run()
        finally:
            self.stop_event.set()
            self.meters.shutdown()
            for t in self.threads:
                t.join(timeout=5)
            self.outbox.close()
            self.transport.close()

    def stop(self) -> None:
        """Stop now; unshipped data stays in the spool for the next start."""
        self.stop_event.set()

    def drain_and_stop(self, timeout_s: float = 5.0) -> None:
        """Write a last heartbeat and metrics, ship everything on disk, then stop.

        Returns at once; :meth:`run` returns when done (at the latest after ``timeout_s``).
        A second call stops at once.
        """
        if self._draining:
            self.stop()
            return
        self._draining = True

        def _final() -> None:
            try:
                self.meters.flush()
                self.heartbeats.beat()
            except Exception as e:
                log.debug("final metrics/heartbeat: %s", e)
            self.shipper.drain(timeout_s)

        threading.Thread(target=_final, name="fleetscope-drain", daemon=True).start()

    # -- threads -------------------------------------------------------------------------
    def _clock_loop(self) -> None:
        while not self.stop_event.is_set():
            est = self.clock.measure()
            if est is not None:
                self._clock_ready.set()
            wait = self.cfg.clock_interval_s if est is not None else 5.0
            if not self.cfg.clock_sync:
                self._clock_ready.set()
                return
            self.stop_event.wait(wait)

    def _on_xid(self, gpu: int, xid: int) -> None:
        rank, job = -1, ""
        if self.gpu is not None and gpu >= 0:
            r = self.gpu.gpu_ranks().get(gpu)
            if r is not None:
                rank, job = r.rank, r.job
        msg = f"NVML XID {xid} on gpu{gpu}" + (f" (rank {rank})" if rank >= 0 else "")
        log.error("%s", msg)
        self.outbox.write("log_events", [{
            "ts_ns": time.time_ns(), "job": job, "host": self.cfg.host, "rank": rank,
            "source": f"nvml:gpu{gpu}", "kind": "xid", "severity": "critical", "message": msg}])

    def _on_drop(self, seg: Segment, lost: int) -> None:
        self.outbox.write("log_events", [{
            "ts_ns": time.time_ns(), "job": seg.job, "host": self.cfg.host, "rank": seg.rank,
            "source": seg.key, "kind": "spool_dropped", "severity": "critical",
            "message": f"disk budget: deleted unacknowledged spool segment {seg.key} "
                       f"({lost} bytes never shipped)"}])

    # -- metric readings -----------------------------------------------------------------
    def _host_readings(self) -> list[Reading]:
        return [(n, {"device": d} if d else {}, v) for n, d, v in self.host_sampler.sample()]

    def _net_readings(self) -> list[Reading]:
        out: list[Reading] = []
        for n, d, v in self.net_sampler.sample():
            if n.startswith("rdma.") and n not in NET_METRICS:
                out.append((RDMA_COUNTER_INSTRUMENT, {"device": d, "counter": n[5:]}, v))
            else:
                out.append((n, {"device": d}, v))
        return out

    def _gpu_readings(self) -> list[Reading]:
        assert self.gpu is not None
        mapping = self.gpu.gpu_ranks()
        out: list[Reading] = []
        for n, i, v in self.gpu.sample():
            attrs: dict[str, Any] = {"device": f"gpu{i}"}
            r = mapping.get(i)
            if r is not None:
                attrs.update(rank=r.rank, job=r.job)
            out.append((n, attrs, v))
        return out

    def _agent_readings(self) -> list[Reading]:
        s, c = self.shipper.stats, self.offsets.snapshot_counters()
        est = self.clock.estimate
        ru = resource.getrusage(resource.RUSAGE_SELF)
        vals = {
            "agent.records_shipped": s.num_records, "agent.batches_shipped": s.num_batches,
            "agent.bytes_shipped": s.num_bytes, "agent.duplicate_batches": s.num_duplicates,
            "agent.retries": self.transport.num_retries, "agent.throttled": self.transport.num_throttled,
            "agent.corrupt_frames": c.get("corrupt_frames", 0),
            "agent.corrupt_bytes": c.get("corrupt_bytes", 0),
            "agent.rejected_frames": c.get("rejected_frames", 0),
            "agent.dropped_unacked_bytes": c.get("dropped_unacked_bytes", 0),
            "agent.backlog_bytes": self.retention.stats.unacked_bytes,
            "agent.spool_bytes": self.retention.stats.spool_bytes,
            "agent.clock_offset_ns": est.offset_ns, "agent.clock_uncertainty_ns": est.uncertainty_ns,
            "agent.cpu_seconds": ru.ru_utime + ru.ru_stime,
            "agent.max_rss_bytes": ru.ru_maxrss * 1024,
            "agent.log_events": self.scanner.num_events,
        }
        return [(n, {}, float(v)) for n, v in vals.items()]
