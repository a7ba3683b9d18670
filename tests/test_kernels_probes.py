"""CPU paths of the self-check probes: shapes, sanity of the figures, fault injection."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from fleetscope.kernels import devices
from fleetscope.kernels.collectives import bus_bandwidth_gbps, p2p_pairs
from fleetscope.kernels.matmul import matmul_probe
from fleetscope.kernels.membw import membw_probe
from fleetscope.kernels.numerics import BitFlip, mark_minority, numerics_probe
from fleetscope.kernels.result import ProbeResult, format_table
from fleetscope.kernels.timing import time_kernel

from fleetscope import codec
from fleetscope.schema import PROBES

CPU = devices.cpu_info(num_threads=1)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One BLAS thread: on a shared machine, OpenMP threads spin against other processes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cpu_device_info_has_a_derived_or_configured_peak(monkeypatch):
    assert CPU.device == "cpu" and CPU.model
    assert CPU.peak_source in ("derived", "unknown")
    if CPU.peak_source == "derived":  # cores x GHz x FLOPs/cycle: between 1 GFLOP/s and 1 PFLOP/s
        assert 1e-3 < CPU.peak("fp32") < 1e3
    monkeypatch.setenv(devices.ENV_PEAK_TFLOPS, "2.5")
    monkeypatch.setenv(devices.ENV_PEAK_MEM_GBPS, "200")
    conf = devices.cpu_info()
    assert conf.peak("fp32") == 2.5 and conf.peak_source == "configured"
    assert conf.mem_gbps == 200 and conf.mem_source == "configured"
    monkeypatch.setenv(devices.ENV_PEAK_TFLOPS, "fast")
    with pytest.raises(ValueError, match="FLEETSCOPE_PEAK_TFLOPS='fast'"):
        devices.cpu_info()


@pytest.mark.parametrize(
    "name, bf16, mem",
    [
        ("NVIDIA H200", 989.0, 4800.0),
        ("NVIDIA H100 80GB HBM3", 989.0, 3350.0),
        ("NVIDIA H100 PCIe", 756.0, 2000.0),
        ("NVIDIA A100-SXM4-80GB", 312.0, 2039.0),
        ("NVIDIA A100-SXM4-40GB", 312.0, 1555.0),
        ("NVIDIA GH200 480GB", 989.0, 4000.0),
    ],
)
def test_gpu_datasheet_table_matches_device_names(name, bf16, mem):
    spec = devices.gpu_spec(name)
    assert spec is not None and spec.bf16_tflops == bf16 and spec.mem_gbps == mem


def test_unknown_gpu_has_no_peak_and_bad_device_is_named():
    assert devices.gpu_spec("Imaginary Accelerator 9000") is None
    with pytest.raises(ValueError, match="'tpu:0'"):
        devices.local_devices("tpu:0")


def test_cpu_flops_per_cycle_follows_the_vector_width():
    assert devices.cpu_fp32_flops_per_cycle({"avx512f", "avx2", "fma"}) == 64
    assert devices.cpu_fp32_flops_per_cycle({"avx2", "fma"}) == 32
    assert devices.cpu_fp32_flops_per_cycle(set()) == 8


def test_matmul_probe_cpu_reports_sane_tflops_and_checks_the_product():
    r = matmul_probe(CPU, n=128, dtype="fp32", budget_s=0.2)
    assert r.probe == "matmul" and r.unit == "TFLOP/s" and r.variant == "fp32 n=128"
    assert r.passed, r.detail
    assert 1e-5 < r.value < 100  # a CPU does between 10 MFLOP/s and 100 TFLOP/s
    assert r.detail["rel_error"] < 1e-4 and r.detail["reps"] >= 3
    assert r.detail["median_tflops"] <= r.value * 1.0001  # best >= median
    if not math.isnan(CPU.peak("fp32")):
        assert 0 < r.peak_fraction < 1.5


def test_membw_probe_cpu_copy_and_triad():
    for kernel, factor in (("copy", 2), ("triad", 3)):
        r = membw_probe(CPU, kernel=kernel, nbytes=4 * 2**20, budget_s=0.15)
        assert r.probe == "membw" and r.unit == "GB/s" and r.variant == f"{kernel} 4MiB"
        assert r.passed, r.detail
        assert r.detail["bytes_moved_per_call"] == factor * 4 * 2**20
        assert 0.1 < r.value < 10_000
        assert math.isnan(r.peak_fraction)  # CPU memory bandwidth is unknown unless configured


def test_slowdown_injection_makes_timings_slower():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no OpenMP spinning against other processes
    try:
        x = torch.randn(64, 64)
        fast, slow = [], []
        for _ in range(3):  # interleaved, so load from other processes hits both alike
            fast.append(time_kernel(lambda: x @ x, "cpu", 0.03).best_s)
            slow.append(time_kernel(lambda: x @ x, "cpu", 0.03, slowdown=4.0).best_s)
    finally:
        torch.set_num_threads(threads)
    assert min(slow) > 2.5 * min(fast)
    with pytest.raises(ValueError, match="slowdown 0.5"):
        time_kernel(lambda: None, "cpu", 0.01, slowdown=0.5)


def test_numerics_is_deterministic_and_flags_an_injected_bit_flip():
    good = numerics_probe(CPU, n=48, depth=3, repeats=3)
    again = numerics_probe(CPU, n=48, depth=3, repeats=2)
    assert good.passed and good.value == 0 and len(good.detail["hash"]) == 16
    assert again.detail["hash"] == good.detail["hash"]  # same bits every time

    # a transient flip in one repeat: the repeats disagree
    transient = numerics_probe(CPU, n=48, depth=3, repeats=3, flip=BitFlip(5, 0, repeat=1))
    assert not transient.passed and transient.value == 1
    assert "repeat" in transient.detail["reason"]

    # a persistent flip (the lowest mantissa bit!): repeats agree, the reference does not
    persistent = numerics_probe(CPU, n=48, depth=3, repeats=2, flip=BitFlip(0, 0),
                                reference=good.detail["hash"])
    assert persistent.detail["hash"] != good.detail["hash"]
    assert not persistent.passed and "reference" in persistent.detail["reason"]

    # across local devices: the minority device fails, the others pass
    sign = numerics_probe(CPU, n=48, depth=3, repeats=1, flip=BitFlip(7, 31))
    dev = [good, again, sign]
    marked = mark_minority([
        ProbeResult(**{**r.__dict__, "device": f"cuda:{i}"}) for i, r in enumerate(dev)
    ])
    assert [r.passed for r in marked] == [True, True, False]
    assert "local majority" in marked[2].detail["reason"]


def test_bitflip_parse_names_bad_specs():
    assert BitFlip.parse("3:31:1") == BitFlip(3, 31, 1)
    with pytest.raises(ValueError, match="'x:1'"):
        BitFlip.parse("x:1")
    with pytest.raises(ValueError, match="bit=40"):
        BitFlip.parse("0:40")


def test_bus_bandwidth_follows_nccl_tests():
    # 1 GB per rank in 10 ms on 8 ranks: algbw 100 GB/s
    assert bus_bandwidth_gbps("allreduce", 10**9, 0.01, 8) == pytest.approx(175.0)
    assert bus_bandwidth_gbps("alltoall", 10**9, 0.01, 8) == pytest.approx(87.5)
    assert bus_bandwidth_gbps("allreduce", 10**9, 0.01, 1) == 0.0
    with pytest.raises(ValueError, match="'gather'"):
        bus_bandwidth_gbps("gather", 1, 1.0, 2)


def test_p2p_pairs_ring_and_all():
    assert p2p_pairs(4, "ring") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert p2p_pairs(2, "ring") == [(0, 1), (1, 0)]
    assert len(p2p_pairs(8, "all")) == 56 and (7, 0) in p2p_pairs(8, "all")
    with pytest.raises(ValueError, match="'star'"):
        p2p_pairs(4, "star")


def test_results_become_valid_probes_records():
    r = matmul_probe(CPU, n=64, dtype="fp32", budget_s=0.05)
    rec = r.to_record(host="h1", job="maint-1", ts_ns=time.time_ns())
    table = codec.rows_to_table(PROBES, [rec])  # validates against the schema
    assert table.num_rows == 1 and table.column("probe")[0].as_py() == "matmul"
    assert json.loads(rec["detail"])["variant"] == "fp32 n=64"
    failed = numerics_probe(CPU, n=16, depth=1, repeats=2, flip=BitFlip(0, 1, repeat=0))
    rec = failed.to_record(host="h1")
    assert rec["passed"] is False and math.isnan(rec["peak_fraction"])
    assert "FAIL" in format_table([r, failed])
