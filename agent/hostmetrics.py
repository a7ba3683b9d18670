"""Host metrics from procfs: CPU, memory, load.

Readers take the procfs root as a parameter so tests can point them at a fixture
tree; in production it is ``/proc``. Each ``sample()`` returns ``(name, device, value)``
tuples; names are declared in :data:`HOST_METRICS` (kind, unit, description) so the
OpenTelemetry instruments can be created up front.
"""

from __future__ import annotations

from pathlib import Path

Sample = tuple[str, str, float]
"""(metric name, device, value)."""

HOST_METRICS: dict[str, tuple[str, str, str]] = {
    "host.cpu_util_pct": ("gauge", "%", "CPU busy time since the previous sample (all CPUs)"),
    "host.cpu_iowait_pct": ("gauge", "%", "CPU time waiting for I/O since the previous sample"),
    "host.cpu_steal_pct": ("gauge", "%", "CPU time stolen by the hypervisor since the previous sample"),
    "host.num_cpus": ("gauge", "1", "CPUs listed in /proc/stat"),
    "host.mem_total_bytes": ("gauge", "By", "MemTotal"),
    "host.mem_available_bytes": ("gauge", "By", "MemAvailable"),
    "host.mem_used_bytes": ("gauge", "By", "MemTotal - MemAvailable"),
    "host.swap_used_bytes": ("gauge", "By", "SwapTotal - SwapFree"),
    "host.load1": ("gauge", "1", "1-minute load average"),
    "host.load5": ("gauge", "1", "5-minute load average"),
    "host.load15": ("gauge", "1", "15-minute load average"),
    "host.procs_running": ("gauge", "1", "runnable tasks (/proc/loadavg)"),
}


def read_cpu_times(proc_root: Path) -> tuple[list[int], int]:
    """The aggregate ``cpu`` line of /proc/stat (jiffies per state) and the CPU count."""
    total: list[int] = []
    num_cpus = 0
    with open(proc_root / "stat") as f:
        for line in f:
            if line.startswith("cpu "):
                total = [int(x) for x in line.split()[1:]]
            elif line.startswith("cpu"):
                num_cpus += 1
    return total, num_cpus


def cpu_percentages(prev: list[int], cur: list[int]) -> dict[str, float]:
    """busy/iowait/steal % between two /proc/stat ``cpu`` readings."""
    d = [max(0, c - p) for p, c in zip(prev, cur)]
    d += [0] * (8 - len(d))
    total = sum(d[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    if total <= 0:
        return {"busy": 0.0, "iowait": 0.0, "steal": 0.0}
    idle = d[3] + d[4]
    return {"busy": 100.0 * (total - idle) / total, "iowait": 100.0 * d[4] / total,
            "steal": 100.0 * d[7] / total}


def read_meminfo(proc_root: Path) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    with open(proc_root / "meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if not parts:
                continue
            n = int(parts[0])
            out[key] = n * 1024 if len(parts) > 1 and parts[1] == "kB" else n
    return out


def read_loadavg(proc_root: Path) -> tuple[float, float, float, int]:
    parts = (proc_root / "loadavg").read_text().split()
    running = int(parts[3].split("/")[0]) if len(parts) > 3 else 0
    return float(parts[0]), float(parts[1]), float(parts[2]), running


class HostSampler:
    """CPU, memory and load of the host."""

    def __init__(self, proc_root: Path = Path("/proc")):
        self.proc_root = Path(proc_root)
        self._prev_cpu: list[int] | None = None

    def sample(self) -> list[Sample]:
        out: list[Sample] = []
        cur, num_cpus = read_cpu_times(self.proc_root)
        prev = self._prev_cpu or [0] * len(cur)
        pct = cpu_percentages(prev, cur)
        self._prev_cpu = cur
        out += [("host.cpu_util_pct", "", pct["busy"]), ("host.cpu_iowait_pct", "", pct["iowait"]),
                ("host.cpu_steal_pct", "", pct["steal"]), ("host.num_cpus", "", float(num_cpus))]
        mem = read_meminfo(self.proc_root)
        total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", mem.get("MemFree", 0))
        out += [("host.mem_total_bytes", "", float(total)),
                ("host.mem_available_bytes", "", float(avail)),
                ("host.mem_used_bytes", "", float(total - avail)),
                ("host.swap_used_bytes", "", float(mem.get("SwapTotal", 0) - mem.get("SwapFree", 0)))]
        l1, l5, l15, running = read_loadavg(self.proc_root)
        out += [("host.load1", "", l1), ("host.load5", "", l5), ("host.load15", "", l15),
                ("host.procs_running", "", float(running))]
        return out
