"""GPU metrics through NVML (``nvidia-ml-py``, module ``pynvml``) and XID events.

:class:`GpuSampler` reads per GPU: utilisation, memory, temperature, power, SM and
memory clocks, clock throttle (event) reasons, ECC error counts, retired pages and
remapped rows, the PCIe replay counter and NVLink error counters (summed over active
links). A query the GPU does not support is skipped for that GPU from then on.
:class:`XidWatcher` waits on an NVML event set on its own thread and reports every
XID as a ``log_events`` row and a counter.

GPUs are mapped to the local ranks that use them: first through NVML's list of
compute processes (pid -> GPU), else through ``CUDA_VISIBLE_DEVICES`` (from
``rank.json``, the rank's environment, or the agent's) indexed by the rank's local
rank. On a host without an NVIDIA driver :func:`open_nvml` returns ``None`` and says so
once.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from fleetscope.agent.ranks import RankRegistry, RankState

log = logging.getLogger("fleetscope.agent")

GPU_METRICS: dict[str, tuple[str, str, str]] = {
    "gpu.utilization_pct": ("gauge", "%", "SM busy (nvmlDeviceGetUtilizationRates.gpu)"),
    "gpu.memory_utilization_pct": ("gauge", "%", "memory controller busy"),
    "gpu.memory_used_bytes": ("gauge", "By", "framebuffer memory used"),
    "gpu.memory_total_bytes": ("gauge", "By", "framebuffer memory total"),
    "gpu.temperature_c": ("gauge", "Cel", "GPU core temperature"),
    "gpu.power_w": ("gauge", "W", "power draw"),
    "gpu.sm_clock_mhz": ("gauge", "MHz", "SM clock"),
    "gpu.mem_clock_mhz": ("gauge", "MHz", "memory clock"),
    "gpu.throttle_reasons": ("gauge", "1", "bitmask of current clock throttle (event) reasons"),
    "gpu.ecc_corrected_volatile": ("gauge", "1", "corrected ECC errors since driver load"),
    "gpu.ecc_uncorrected_volatile": ("gauge", "1", "uncorrected ECC errors since driver load"),
    "gpu.ecc_corrected_aggregate": ("gauge", "1", "corrected ECC errors, lifetime"),
    "gpu.ecc_uncorrected_aggregate": ("gauge", "1", "uncorrected ECC errors, lifetime"),
    "gpu.retired_pages_sbe": ("gauge", "1", "pages retired for multiple single-bit errors"),
    "gpu.retired_pages_dbe": ("gauge", "1", "pages retired for double-bit errors"),
    "gpu.remapped_rows_correctable": ("gauge", "1", "rows remapped for correctable errors"),
    "gpu.remapped_rows_uncorrectable": ("gauge", "1", "rows remapped for uncorrectable errors"),
    "gpu.remapped_rows_pending": ("gauge", "1", "1 if a remap is pending (reset needed)"),
    "gpu.remapped_rows_failure": ("gauge", "1", "1 if a remap failed"),
    "gpu.pcie_replay_count": ("gauge", "1", "PCIe replay counter"),
    "gpu.nvlink_replay_errors": ("gauge", "1", "NVLink DL replay errors, all active links"),
    "gpu.nvlink_recovery_errors": ("gauge", "1", "NVLink DL recovery errors, all active links"),
    "gpu.nvlink_crc_flit_errors": ("gauge", "1", "NVLink CRC FLIT errors, all active links"),
    "gpu.nvlink_crc_data_errors": ("gauge", "1", "NVLink CRC data errors, all active links"),
    "gpu.xid_events": ("counter", "1", "XID events seen by the agent"),
    "gpu.last_xid": ("gauge", "1", "code of the last XID event, 0 if none"),
}


def open_nvml(module: ModuleType | None = None) -> ModuleType | None:
    """Import and initialise NVML; ``None`` (logged once, by the caller's only call) without a driver."""
    try:
        nv = module
        if nv is None:
            import pynvml as nv  # type: ignore[no-redef]
        assert nv is not None
        nv.nvmlInit()
        return nv
    except ImportError as e:
        log.warning("GPU metrics disabled: the pynvml module (nvidia-ml-py) is not installed (%s)", e)
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.warning("no NVIDIA driver/NVML on this host (%s): running without GPU metrics", e)
    return None


class GpuSampler:
    """Reads NVML for every GPU; mapping to ranks through the rank registry."""

    def __init__(self, nv: ModuleType, ranks: RankRegistry | None = None):
        self.nv = nv
        self.ranks = ranks
        self._unsupported: set[tuple[int, str]] = set()
        n = nv.nvmlDeviceGetCount()
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        self.uuids = [_text(self._try(i, "uuid", nv.nvmlDeviceGetUUID, h)) for i, h in enumerate(self.handles)]
        self.names = [_text(self._try(i, "name", nv.nvmlDeviceGetName, h)) for i, h in enumerate(self.handles)]
        self.xid_counts = [0] * n
        self.last_xid = [0] * n

    @property
    def num_gpus(self) -> int:
        return len(self.handles)

    def _try(self, i: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML; ``None`` if unsupported (remembered) or failing."""
        if (i, what) in self._unsupported:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            if getattr(e, "value", None) in (self.nv.NVML_ERROR_NOT_SUPPORTED,
                                             getattr(self.nv, "NVML_ERROR_FUNCTION_NOT_FOUND", -1)):
                self._unsupported.add((i, what))
            else:
                log.debug("NVML %s on gpu%d failed: %s", what, i, e)
            return None

    def gpu_ranks(self) -> dict[int, RankState]:
        """GPU index -> the local rank using it."""
        out: dict[int, RankState] = {}
        if self.ranks is None:
            return out
        ranks = self.ranks.all()
        by_pid = {r.pid: r for r in ranks if r.pid > 0}
        for i, h in enumerate(self.handles):
            procs = self._try(i, "procs", self.nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            for p in procs:
                r = by_pid.get(getattr(p, "pid", -1))
                if r is not None:
                    out.setdefault(i, r)
        for r in ranks:
            if r in out.values() or not self.ranks.writer_alive(r):
                continue
            gpu = physical_gpu(r, self.uuids)
            if gpu is not None and gpu not in out:
                out[gpu] = r
        return out

    def sample(self) -> list[tuple[str, int, float]]:
        """``(name, gpu index, value)`` for every supported reading of every GPU."""
        nv, out = self.nv, []
        for i, h in enumerate(self.handles):
            def add(name: str, value: Any, i: int = i) -> None:
                if value is not None:
                    out.append((name, i, float(value)))

            u = self._try(i, "util", nv.nvmlDeviceGetUtilizationRates, h)
            if u is not None:
                add("gpu.utilization_pct", u.gpu)
                add("gpu.memory_utilization_pct", u.memory)
            m = self._try(i, "mem", nv.nvmlDeviceGetMemoryInfo, h)
            if m is not None:
                add("gpu.memory_used_bytes", m.used)
                add("gpu.memory_total_bytes", m.total)
            add("gpu.temperature_c", self._try(i, "temp", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU))
            p = self._try(i, "power", nv.nvmlDeviceGetPowerUsage, h)
            add("gpu.power_w", None if p is None else p / 1000.0)
            add("gpu.sm_clock_mhz", self._try(i, "smclk", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM))
            add("gpu.mem_clock_mhz", self._try(i, "memclk", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM))
            reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                nv.nvmlDeviceGetCurrentClocksThrottleReasons
            add("gpu.throttle_reasons", self._try(i, "throttle", reasons, h))
            for err, etxt in ((nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
                              (nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected")):
                for cnt, ctxt in ((nv.NVML_VOLATILE_ECC, "volatile"), (nv.NVML_AGGREGATE_ECC, "aggregate")):
                    add(f"gpu.ecc_{etxt}_{ctxt}",
                        self._try(i, f"ecc{err}{cnt}", nv.nvmlDeviceGetTotalEccErrors, h, err, cnt))
            for cause, ctxt in ((nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "sbe"),
                                (nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "dbe")):
                pages = self._try(i, f"retired{cause}", nv.nvmlDeviceGetRetiredPages, h, cause)
                add(f"gpu.retired_pages_{ctxt}", None if pages is None else len(pages))
            rows = self._try(i, "remap", nv.nvmlDeviceGetRemappedRows, h)
            if rows is not None:
                for name, v in zip(("correctable", "uncorrectable", "pending", "failure"), rows):
                    add(f"gpu.remapped_rows_{name}", v)
            add("gpu.pcie_replay_count", self._try(i, "pcie", nv.nvmlDeviceGetPcieReplayCounter, h))
            for name, v in self._nvlink(i, h).items():
                add(name, v)
            add("gpu.xid_events", self.xid_counts[i])
            add("gpu.last_xid", self.last_xid[i])
        return out

    def _nvlink(self, i: int, h: Any) -> dict[str, int]:
        nv = self.nv
        if (i, "nvlink") in self._unsupported:
            return {}
        counters = (("gpu.nvlink_replay_errors", nv.NVML_NVLINK_ERROR_DL_REPLAY),
                    ("gpu.nvlink_recovery_errors", nv.NVML_NVLINK_ERROR_DL_RECOVERY),
                    ("gpu.nvlink_crc_flit_errors", nv.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    ("gpu.nvlink_crc_data_errors", nv.NVML_NVLINK_ERROR_DL_CRC_DATA))
        totals = {name: 0 for name, _ in counters}
        active = 0
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != getattr(nv, "NVML_FEATURE_ENABLED", 1):
                    continue
            except nv.NVMLError:
                continue  # link absent (or no NVLink at all)
            active += 1
            for name, c in counters:
                try:
                    totals[name] += nv.nvmlDeviceGetNvLinkErrorCounter(h, link, c)
                except nv.NVMLError:
                    pass
        if not active:
            self._unsupported.add((i, "nvlink"))
            return {}
        return totals


def physical_gpu(r: RankState, uuids: list[str]) -> int | None:
    """The physical GPU index a rank uses, from CUDA_VISIBLE_DEVICES and its local rank."""
    visible = r.cuda_visible_devices
    if visible is None and r.pid > 0:
        visible = _proc_env(r.pid).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return r.local_rank if r.local_rank >= 0 else None
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries:
        return None
    if len(entries) == 1:
        entry = entries[0]
    elif 0 <= r.local_rank < len(entries):
        entry = entries[r.local_rank]
    else:
        return None
    if entry.isdigit():
        return int(entry)
    for i, u in enumerate(uuids):
        if u and (u == entry or u.startswith(entry)):
            return i
    return None


def _proc_env(pid: int) -> dict[str, str]:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v.decode() if isinstance(v, bytes) else str(v)


def _handle_id(h: Any) -> Any:
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return h


class XidWatcher(threading.Thread):
    """Waits on an NVML event set for XID critical errors; calls ``on_xid(gpu, xid)``."""

    def __init__(self, sampler: GpuSampler, on_xid: Callable[[int, int], None],
                 stop: threading.Event, timeout_ms: int = 1000):
        super().__init__(name="fleetscope-xid", daemon=True)
        self.sampler = sampler
        self.on_xid = on_xid
        self.stop_event = stop
        self.timeout_ms = timeout_ms
        self.num_events = 0

    def run(self) -> None:
        nv = self.sampler.nv
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("XID events unavailable: %s", e)
            return
        ids = {}
        for i, h in enumerate(self.sampler.handles):
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
                ids[_handle_id(h)] = i
            except nv.NVMLError as e:
                log.info("gpu%d: XID events not supported (%s)", i, e)
        try:
            while ids and not self.stop_event.is_set():
                try:
                    data = nv.nvmlEventSetWait_v2(es, self.timeout_ms)
                except nv.NVMLError as e:
                    if getattr(e, "value", None) != nv.NVML_ERROR_TIMEOUT:
                        log.warning("NVML event wait failed: %s", e)
                        self.stop_event.wait(1.0)
                    continue
                if data.eventType & nv.nvmlEventTypeXidCriticalError:
                    gpu = ids.get(_handle_id(data.device), -1)
                    self.num_events += 1
                    if gpu >= 0:
                        self.sampler.xid_counts[gpu] += 1
                        self.sampler.last_xid[gpu] = int(data.eventData)
                    self.on_xid(gpu, int(data.eventData))
        finally:
            try:
                nv.nvmlEventSetFree(es)
            except nv.NVMLError:
                pass

