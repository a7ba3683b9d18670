"""GPU, host, NIC, RDMA and agent metrics as OpenTelemetry observable instruments.

Every metric is an observable gauge or counter on one SDK ``MeterProvider``. Two
readers may collect it: a periodic reader with :class:`OutboxMetricExporter`, which
turns each data point into a ``metrics`` record and appends it to the agent's outbox
(shipped to the fleetscope server like spool data), and, when configured, a periodic
reader with the OTLP/HTTP exporter for a third-party backend.

Samplers are read once per collection (a short-lived snapshot shared by all of their
instruments), whichever reader asks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fleetscope.agent.config import AGENT_VERSION
from fleetscope.agent.outbox import Outbox
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

log = logging.getLogger("fleetscope.agent")

SOURCES = ("gpu", "host", "nic", "rdma", "agent")
RDMA_COUNTER_INSTRUMENT = "rdma.port_counter"
"""RDMA counter names depend on the hardware: one instrument, the name in attribute ``counter``."""

Reading = tuple[str, dict[str, Any], float]
"""(metric name, attributes: device/rank/job, value)."""


class Snapshot:
    """Caches one sampler call for ``ttl_s`` so all instruments of a collection share it."""

    def __init__(self, fn: Callable[[], list[Reading]], ttl_s: float):
        self.fn = fn
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._at = -1e18
        self._by_name: dict[str, list[Reading]] = {}

    def get(self, name: str) -> list[Reading]:
        with self._lock:
            now = time.monotonic()
            if now - self._at > self.ttl_s:
                self._at = now
                by: dict[str, list[Reading]] = {}
                try:
                    for r in self.fn():
                        by.setdefault(r[0], []).append(r)
                except Exception as e:  # a sampler must never stop the others
                    log.warning("metric sampler failed: %s", e)
                self._by_name = by
            return self._by_name.get(name, [])


class OutboxMetricExporter(MetricExporter):
    """OpenTelemetry metric exporter writing ``metrics`` records to the agent outbox."""

    def __init__(self, outbox: Outbox, host: str):
        super().__init__()
        self.outbox = outbox
        self.host = host
        self.num_exported = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        rows = list(metric_rows(metrics_data, self.host))
        if rows:
            self.outbox.write("metrics", rows)
            self.num_exported += len(rows)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def metric_rows(metrics_data: MetricsData, host: str) -> Iterable[dict[str, Any]]:
    """``metrics`` rows (schema ``fleetscope.schema.METRICS``) from OTel data points."""
    for rm in metrics_data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in getattr(m.data, "data_points", ()):
                    value = getattr(p, "value", None)
                    if value is None:
                        continue
                    attrs = dict(p.attributes or {})
                    name = m.name
                    if name == RDMA_COUNTER_INSTRUMENT:
                        name = f"rdma.{attrs.get('counter', 'unknown')}"
                    source = name.split(".", 1)[0]
                    yield {
                        "ts_ns": int(p.time_unix_nano), "job": str(attrs.get("job", "")),
                        "host": host, "rank": int(attrs.get("rank", -1)),
                        "source": source if source in SOURCES else "agent",
                        "device": str(attrs.get("device", "")), "name": name,
                        "value": float(value),
                    }


class AgentMeters:
    """The MeterProvider, its readers and the instruments of every sampler."""

    def __init__(self, host: str, interval_s: float, outbox: Outbox | None = None,
                 otlp_endpoint: str | None = None, otlp_headers: dict[str, str] | None = None):
        self.host = host
        self.interval_s = interval_s
        self.exporter = OutboxMetricExporter(outbox, host) if outbox is not None else None
        readers = []
        ms = max(100, int(interval_s * 1000))
        if self.exporter is not None:
            readers.append(PeriodicExportingMetricReader(self.exporter, export_interval_millis=ms))
        if otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            readers.append(PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=otlp_endpoint, headers=otlp_headers),
                export_interval_millis=ms))
            log.info("also exporting metrics over OTLP/HTTP to %s", otlp_endpoint)
        self.provider = MeterProvider(
            metric_readers=readers,
            resource=Resource.create({"service.name": "fleetscope-agent", "host.name": host,
                                      "service.version": AGENT_VERSION}))
        self.meter = self.provider.get_meter("fleetscope.agent", AGENT_VERSION)
        self._instruments: list[Any] = []

    def add(self, catalog: dict[str, tuple[str, str, str]], sample: Callable[[], list[Reading]],
            extra_names: Sequence[str] = ()) -> None:
        """Register one observable instrument per catalog entry, all fed by ``sample``."""
        snap = Snapshot(sample, ttl_s=min(1.0, self.interval_s / 2))
        for name, (kind, unit, desc) in catalog.items():
            self._register(name, kind, unit, desc, snap)
        for name in extra_names:
            self._register(name, "counter", "1", "RDMA port counter (counters/, hw_counters/)", snap)

    def _register(self, name: str, kind: str, unit: str, desc: str, snap: Snapshot) -> None:
        def callback(options: CallbackOptions, name: str = name) -> Iterable[Observation]:
            return [Observation(v, attrs) for _, attrs, v in snap.get(name)]

        create = (self.meter.create_observable_counter if kind == "counter"
                  else self.meter.create_observable_gauge)
        self._instruments.append(create(name, callbacks=[callback], unit=unit, description=desc))

    def flush(self) -> None:
        self.provider.force_flush()

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception as e:
            log.debug("meter provider shutdown: %s", e)
