"""NIC and RDMA metrics: /proc/net/dev, /sys/class/net, /sys/class/infiniband.

Per interface (loopback excluded): bytes, packets, errors, drops in both directions,
link state (``operstate`` up = 1) and ``carrier_changes`` — a rising count is a
flapping link, one of MegaScale's case studies. Per RDMA port
(``/sys/class/infiniband/<dev>/ports/<port>/``): every file in ``counters/`` and
``hw_counters/`` as ``rdma.<counter>`` and the port state (``4: ACTIVE`` = 1).
"""

from __future__ import annotations

from pathlib import Path

from fleetscope.agent.hostmetrics import Sample

NET_DEV_FIELDS = ("rx_bytes", "rx_packets", "rx_errors", "rx_drops", None, None, None, None,
                  "tx_bytes", "tx_packets", "tx_errors", "tx_drops")
"""Columns of /proc/net/dev we keep (None: fifo, frame, compressed, multicast...)."""

NET_METRICS: dict[str, tuple[str, str, str]] = {
    **{f"nic.{f}": ("counter", "By" if f.endswith("bytes") else "1", f"{f} from /proc/net/dev")
       for f in NET_DEV_FIELDS if f},
    "nic.up": ("gauge", "1", "1 if operstate is up"),
    "nic.carrier": ("gauge", "1", "1 if the link has carrier"),
    "nic.carrier_changes": ("counter", "1", "link up/down transitions (flapping if rising)"),
    "nic.speed_mbps": ("gauge", "Mbit/s", "link speed, -1 if unknown"),
    "rdma.port_active": ("gauge", "1", "1 if the RDMA port state is ACTIVE"),
}
RDMA_COUNTER_DIRS = ("counters", "hw_counters")


def read_net_dev(proc_root: Path) -> dict[str, dict[str, int]]:
    """Counters per interface from /proc/net/dev."""
    out: dict[str, dict[str, int]] = {}
    with open(proc_root / "net" / "dev") as f:
        for line in f.readlines()[2:]:
            name, _, rest = line.partition(":")
            vals = rest.split()
            out[name.strip()] = {k: int(v) for k, v in zip(NET_DEV_FIELDS, vals) if k}
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # some sysfs attributes fail to read while the link is down
        return None


def _int(text: str | None, default: int = -1) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


class NetSampler:
    """NIC counters and link state; RDMA port counters when present."""

    def __init__(self, proc_root: Path = Path("/proc"), sys_root: Path = Path("/sys"),
                 include_loopback: bool = False):
        self.proc_root = Path(proc_root)
        self.sys_root = Path(sys_root)
        self.include_loopback = include_loopback

    def sample(self) -> list[Sample]:
        return self.sample_nics() + self.sample_rdma()

    def sample_nics(self) -> list[Sample]:
        out: list[Sample] = []
        try:
            dev = read_net_dev(self.proc_root)
        except OSError:
            dev = {}
        net = self.sys_root / "class" / "net"
        names = set(dev)
        if net.is_dir():
            names |= {p.name for p in net.iterdir()}
        for name in sorted(names):
            if name == "lo" and not self.include_loopback:
                continue
            for k, v in dev.get(name, {}).items():
                out.append((f"nic.{k}", name, float(v)))
            d = net / name
            if not d.is_dir():
                continue
            oper = _read(d / "operstate")
            if oper is not None:
                out.append(("nic.up", name, 1.0 if oper == "up" else 0.0))
            carrier = _read(d / "carrier")
            if carrier is not None:
                out.append(("nic.carrier", name, float(_int(carrier, 0))))
            changes = _read(d / "carrier_changes")
            if changes is not None:
                out.append(("nic.carrier_changes", name, float(_int(changes, 0))))
            speed = _read(d / "speed")
            if speed is not None:
                out.append(("nic.speed_mbps", name, float(_int(speed))))
        return out

    def sample_rdma(self) -> list[Sample]:
        """``rdma.port_active`` plus ``("rdma.<counter>", "dev/port", value)`` per counter file."""
        out: list[Sample] = []
        ib = self.sys_root / "class" / "infiniband"
        if not ib.is_dir():
            return out
        for dev in sorted(ib.iterdir()):
            ports = dev / "ports"
            if not ports.is_dir():
                continue
            for port in sorted(ports.iterdir(), key=lambda p: p.name):
                device = f"{dev.name}/{port.name}"
                state = _read(port / "state")
                if state is not None:
                    out.append(("rdma.port_active", device, 1.0 if "ACTIVE" in state else 0.0))
                for sub in RDMA_COUNTER_DIRS:
                    cdir = port / sub
                    if not cdir.is_dir():
                        continue
                    for c in sorted(cdir.iterdir()):
                        v = _read(c)
                        if v is not None and v.lstrip("-").isdigit():
                            out.append((f"rdma.{c.name}", device, float(int(v))))
        return out
