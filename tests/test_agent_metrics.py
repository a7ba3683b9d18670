"""Agent metrics: real /proc and /sys, an RDMA fixture tree, OpenTelemetry export, NVML fake."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from fleetscope.agent.hostmetrics import HOST_METRICS, HostSampler, cpu_percentages
from fleetscope.agent.netmetrics import NET_METRICS, NetSampler
from fleetscope.agent.nvml import GPU_METRICS, GpuSampler, XidWatcher, open_nvml, physical_gpu
from fleetscope.agent.otel import AgentMeters
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.ranks import RankRegistry, RankState

from fleetscope import codec, spool
from tests.fake_nvml import FakeGpu, make_fake_pynvml


def outbox_rows(directory: Path, record: str) -> list[dict]:
    rows = []
    for seg in spool.list_segments(directory):
        for fr in spool.read_frames(seg):
            t = codec.ipc_to_table(fr.payload)
            if t.schema.metadata[b"fleetscope.record"].decode() == record:
                rows += t.to_pylist()
    return rows


def test_host_metrics_from_the_real_proc():
    s = HostSampler()
    s.sample()
    time.sleep(0.05)
    got = {n: v for n, _, v in s.sample()}
    assert set(got) == set(HOST_METRICS)
    assert got["host.mem_total_bytes"] > got["host.mem_available_bytes"] > 0
    assert got["host.mem_used_bytes"] == got["host.mem_total_bytes"] - got["host.mem_available_bytes"]
    assert 0.0 <= got["host.cpu_util_pct"] <= 100.0
    assert got["host.num_cpus"] == os.cpu_count()
    assert abs(got["host.load1"] - os.getloadavg()[0]) < 5


def test_cpu_percentages_arithmetic():
    prev = [100, 0, 100, 700, 100, 0, 0, 0]
    cur = [200, 0, 200, 1300, 200, 0, 0, 100]  # +100 user +100 sys +600 idle +100 iowait +100 steal
    p = cpu_percentages(prev, cur)
    assert p == {"busy": 30.0, "iowait": 10.0, "steal": 10.0}


def test_nic_metrics_from_the_real_proc_and_sys():
    nics = {p.name for p in Path("/sys/class/net").iterdir()} - {"lo"}
    got = NetSampler().sample_nics()
    devices = {d for _, d, _ in got}
    assert devices == nics and nics
    by = {(n, d): v for n, d, v in got}
    dev = next(iter(sorted(nics)))
    rx = int(Path(f"/sys/class/net/{dev}/statistics/rx_bytes").read_text())
    assert abs(by[("nic.rx_bytes", dev)] - rx) < 10_000_000  # same counter, read a moment apart
    assert by[("nic.carrier_changes", dev)] == int(Path(f"/sys/class/net/{dev}/carrier_changes").read_text())
    assert {n for n, _, _ in got} <= set(NET_METRICS)


def make_sys_fixture(root: Path) -> None:
    """A /sys tree with the real layout: one NIC (flapping) and one mlx5 RDMA port."""
    net = root / "class" / "net" / "ib0"
    net.mkdir(parents=True)
    (net / "operstate").write_text("down\n")
    (net / "carrier").write_text("0\n")
    (net / "carrier_changes").write_text("17\n")
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "hw_counters").mkdir()
    (port / "state").write_text("4: ACTIVE\n")
    (port / "counters" / "port_rcv_data").write_text("123456789\n")
    (port / "counters" / "symbol_error").write_text("3\n")
    (port / "counters" / "link_downed").write_text("2\n")
    (port / "hw_counters" / "out_of_sequence").write_text("9\n")
    (port / "hw_counters" / "lifespan").write_text("10\n")


def make_proc_fixture(root: Path) -> None:
    (root / "net").mkdir(parents=True)
    (root / "net" / "dev").write_text(
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
        "    lo:  100 1 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n"
        "   ib0: 5000 40 2 1 0 0 0 0 7000 50 3 4 0 0 0 0\n")


def test_nic_and_rdma_metrics_from_a_fixture_tree(tmp_path):
    make_sys_fixture(tmp_path / "sys")
    make_proc_fixture(tmp_path / "proc")
    got = {(n, d): v for n, d, v in NetSampler(tmp_path / "proc", tmp_path / "sys").sample()}
    assert got[("nic.rx_bytes", "ib0")] == 5000 and got[("nic.tx_drops", "ib0")] == 4
    assert got[("nic.rx_errors", "ib0")] == 2 and got[("nic.up", "ib0")] == 0
    assert got[("nic.carrier_changes", "ib0")] == 17
    assert not any(d == "lo" for _, d in got)
    assert got[("rdma.port_active", "mlx5_0/1")] == 1
    assert got[("rdma.port_rcv_data", "mlx5_0/1")] == 123456789
    assert got[("rdma.symbol_error", "mlx5_0/1")] == 3
    assert got[("rdma.out_of_sequence", "mlx5_0/1")] == 9


def test_opentelemetry_instruments_export_metrics_records(tmp_path):
    make_sys_fixture(tmp_path / "sys")
    make_proc_fixture(tmp_path / "proc")
    box = Outbox(tmp_path / "outbox")
    meters = AgentMeters("node1", interval_s=60, outbox=box)
    from fleetscope.agent.daemon import Agent  # the same adapters the agent uses

    net = NetSampler(tmp_path / "proc", tmp_path / "sys")
    adapter = Agent._net_readings.__get__(type("A", (), {"net_sampler": net})())
    meters.add(NET_METRICS, adapter, extra_names=["rdma.port_counter"])
    meters.add(HOST_METRICS, lambda: [(n, {}, v) for n, _, v in HostSampler().sample()])
    meters.flush()
    meters.shutdown()
    box.close()
    rows = outbox_rows(tmp_path / "outbox", "metrics")
    by = {(r["name"], r["device"]): r for r in rows}
    assert by[("rdma.link_downed", "mlx5_0/1")]["value"] == 2
    assert by[("rdma.link_downed", "mlx5_0/1")]["source"] == "rdma"
    assert by[("nic.carrier_changes", "ib0")]["source"] == "nic"
    assert by[("host.mem_total_bytes", "")]["value"] > 0
    assert all(r["host"] == "node1" and r["ts_ns"] > 1.6e18 for r in rows)


def test_nvml_metrics_map_gpus_to_ranks_and_report_xids(tmp_path):
    gpus = [FakeGpu(uuid=f"GPU-{i}aaa", temp=50 + i) for i in range(4)]
    gpus[1].pids = [os.getpid()]                    # NVML says rank 5's process is on GPU 1
    gpus[2].unsupported = {"remap", "pcie"}         # older GPU: not supported, skipped
    gpus[3].nvlink_errors = {(0, 0): 2, (3, 0): 5}  # DL replay errors on two links
    nv = make_fake_pynvml(gpus)
    assert open_nvml(nv) is nv
    ranks = RankRegistry()
    d5 = tmp_path / "j" / "rank-00005"
    spool.write_rank_info(d5, {"pid": os.getpid(), "local_rank": 0})
    ranks.get("j", 5, d5)
    d6 = tmp_path / "j" / "rank-00006"
    spool.write_rank_info(d6, {"pid": os.getppid(), "local_rank": 1,
                               "cuda_visible_devices": "GPU-3aaa,GPU-0aaa"})
    ranks.get("j", 6, d6)
    s = GpuSampler(nv, ranks)
    mapping = {i: r.rank for i, r in s.gpu_ranks().items()}
    assert mapping == {1: 5, 0: 6}  # NVML process list first; then CUDA_VISIBLE_DEVICES[local_rank]
    got = {(n, i): v for n, i, v in s.sample()}
    assert {n for n, _ in got} <= set(GPU_METRICS)
    assert got[("gpu.temperature_c", 2)] == 52 and got[("gpu.power_w", 0)] == 350.0
    assert got[("gpu.ecc_uncorrected_aggregate", 0)] == 0 and got[("gpu.ecc_corrected_aggregate", 0)] == 5
    assert ("gpu.remapped_rows_pending", 2) not in got and ("gpu.pcie_replay_count", 2) not in got
    assert got[("gpu.nvlink_replay_errors", 3)] == 7
    calls = len(nv.calls)
    s.sample()
    assert nv.calls[calls:].count("remap") == 3  # unsupported on gpu2: not asked again
    seen = []
    stop = threading.Event()
    w = XidWatcher(s, lambda g, x: seen.append((g, x)), stop, timeout_ms=50)
    w.start()
    nv.fake_events.put((2, 79))
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    w.join(2)
    assert seen == [(2, 79)] and s.xid_counts[2] == 1
    assert {(n, i): v for n, i, v in s.sample()}[("gpu.last_xid", 2)] == 79


def test_no_driver_means_no_gpu_metrics(caplog):
    assert open_nvml(make_fake_pynvml([], driver=False)) is None
    assert "running without GPU metrics" in caplog.text


def test_physical_gpu_from_cuda_visible_devices():
    def r(cvd, lr):
        return RankState("j", 0, Path("."), pid=-1, local_rank=lr, cuda_visible_devices=cvd)

    assert physical_gpu(r("4,5,6,7", 2), []) == 6
    assert physical_gpu(r("3", 5), []) == 3  # one visible device: the rank's own
    assert physical_gpu(r("GPU-b", 0), ["GPU-a", "GPU-bbbb"]) == 1
    assert physical_gpu(r("0,1", 7), []) is None
