"""A fake ``pynvml`` module with the real call signatures, for hosts without a GPU.

Only what ``fleetscope.agent.nvml`` calls is implemented, with nvidia-ml-py's names,
argument order, constants and error class (``NVMLError`` with ``.value``). Tests set
per-GPU state and queue XID events. The real path runs in ``bench/gpu_check.py`` on a
GPU machine.
"""

from __future__ import annotations

import queue
import threading
import types
from dataclasses import dataclass, field

import pynvml as _real  # constants and the error hierarchy come from the real module


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util: int = 50
    mem_util: int = 20
    mem_used: int = 10 << 30
    mem_total: int = 80 << 30
    temp: int = 60
    power_mw: int = 350_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    throttle: int = 0
    ecc: dict = field(default_factory=lambda: {(0, 0): 1, (1, 0): 0, (0, 1): 5, (1, 1): 0})
    retired: dict = field(default_factory=lambda: {0: [], 1: []})
    remapped: tuple = (0, 0, 0, 0)
    pcie_replay: int = 0
    nvlinks: int = 4
    nvlink_errors: dict = field(default_factory=dict)
    pids: list = field(default_factory=list)
    unsupported: set = field(default_factory=set)


class _Handle:
    def __init__(self, index: int):
        self.index = index


class _Proc:
    def __init__(self, pid: int):
        self.pid = pid
        self.usedGpuMemory = 1 << 30


def make_fake_pynvml(gpus: list[FakeGpu], driver: bool = True) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    for k in dir(_real):
        if k.startswith("NVML_") or k.startswith("nvmlEventType"):
            setattr(m, k, getattr(_real, k))
    m.NVMLError = _real.NVMLError
    handles = [_Handle(i) for i in range(len(gpus))]
    events: queue.Queue = queue.Queue()
    m.fake_gpus, m.fake_events, m.calls = gpus, events, []
    lock = threading.Lock()

    def err(code):
        return _real.NVMLError(code)

    def gpu(h, what):
        g = gpus[h.index]
        with lock:
            m.calls.append(what)
        if what in g.unsupported:
            raise err(_real.NVML_ERROR_NOT_SUPPORTED)
        return g

    def nvmlInit():
        if not driver:
            raise err(_real.NVML_ERROR_LIBRARY_NOT_FOUND)

    m.nvmlInit = nvmlInit
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpus)

    def nvmlDeviceGetHandleByIndex(index):
        if not 0 <= index < len(gpus):
            raise err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return handles[index]

    m.nvmlDeviceGetHandleByIndex = nvmlDeviceGetHandleByIndex
    m.nvmlDeviceGetName = lambda handle: gpu(handle, "name").name
    m.nvmlDeviceGetUUID = lambda handle: gpu(handle, "uuid").uuid
    m.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(
        gpu=gpu(handle, "util").util, memory=gpus[handle.index].mem_util)

    def nvmlDeviceGetMemoryInfo(handle, version=None):
        g = gpu(handle, "mem")
        return types.SimpleNamespace(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    m.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo

    def nvmlDeviceGetTemperature(handle, sensor):
        assert sensor == _real.NVML_TEMPERATURE_GPU
        return gpu(handle, "temp").temp

    m.nvmlDeviceGetTemperature = nvmlDeviceGetTemperature
    m.nvmlDeviceGetPowerUsage = lambda handle: gpu(handle, "power").power_mw

    def nvmlDeviceGetClockInfo(handle, type):
        g = gpu(handle, "clock")
        return {_real.NVML_CLOCK_SM: g.sm_clock, _real.NVML_CLOCK_MEM: g.mem_clock}[type]

    m.nvmlDeviceGetClockInfo = nvmlDeviceGetClockInfo
    m.nvmlDeviceGetCurrentClocksThrottleReasons = lambda handle: gpu(handle, "throttle").throttle
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda handle: gpu(handle, "throttle").throttle

    def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
        return gpu(handle, "ecc").ecc[(errorType, counterType)]

    m.nvmlDeviceGetTotalEccErrors = nvmlDeviceGetTotalEccErrors

    def nvmlDeviceGetRetiredPages(device, sourceFilter):
        return list(gpu(device, "retired").retired[sourceFilter])

    m.nvmlDeviceGetRetiredPages = nvmlDeviceGetRetiredPages
    m.nvmlDeviceGetRemappedRows = lambda device: gpu(device, "remap").remapped
    m.nvmlDeviceGetPcieReplayCounter = lambda handle: gpu(handle, "pcie").pcie_replay

    def nvmlDeviceGetNvLinkState(device, link):
        g = gpu(device, "nvlink")
        if link >= g.nvlinks:
            raise err(_real.NVML_ERROR_INVALID_ARGUMENT)
        return _real.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(device, link, counter):
        return gpu(device, "nvlink").nvlink_errors.get((link, counter), 0)

    m.nvmlDeviceGetNvLinkState = nvmlDeviceGetNvLinkState
    m.nvmlDeviceGetNvLinkErrorCounter = nvmlDeviceGetNvLinkErrorCounter
    m.nvmlDeviceGetComputeRunningProcesses = lambda handle: [
        _Proc(p) for p in gpu(handle, "procs").pids]

    registered: dict[int, int] = {}

    def nvmlEventSetCreate():
        return object()

    def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
        registered[handle.index] = eventTypes

    def nvmlEventSetWait_v2(eventSet, timeoutms):
        try:
            index, xid = events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise err(_real.NVML_ERROR_TIMEOUT) from None
        return types.SimpleNamespace(device=handles[index], eventType=_real.nvmlEventTypeXidCriticalError,
                                     eventData=xid, gpuInstanceId=0, computeInstanceId=0)

    m.nvmlEventSetCreate = nvmlEventSetCreate
    m.nvmlDeviceRegisterEvents = nvmlDeviceRegisterEvents
    m.nvmlEventSetWait_v2 = nvmlEventSetWait_v2
    m.nvmlEventSetWait = nvmlEventSetWait_v2
    m.nvmlEventSetFree = lambda eventSet: None
    return m
