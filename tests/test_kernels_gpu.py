"""GPU paths of the self-check probes (skipped without CUDA; bench/selfcheck_gpu.py has the
full figures)."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def gpu():
    from fleetscope.kernels.devices import cuda_info

    return cuda_info(0)


def test_matmul_bf16_on_gpu(gpu):
    from fleetscope.kernels.matmul import matmul_probe

    r = matmul_probe(gpu, n=4096, dtype="bf16", budget_s=0.5)
    assert r.passed, r.detail
    assert r.detail["rel_error"] < 3e-2 and r.value > 1.0  # any datacenter GPU beats 1 TFLOP/s
    if gpu.peak_source == "table":
        assert 0.3 < r.peak_fraction < 1.05


def test_membw_on_gpu(gpu):
    from fleetscope.kernels.membw import membw_probe

    r = membw_probe(gpu, kernel="triad", nbytes=256 * 2**20, budget_s=0.5)
    assert r.passed, r.detail
    if not math.isnan(r.peak_fraction):
        assert 0.3 < r.peak_fraction < 1.05


def test_numerics_on_gpu_is_bit_exact_and_catches_a_flip(gpu):
    from fleetscope.kernels.numerics import BitFlip, numerics_probe

    good = numerics_probe(gpu, n=512, depth=4, repeats=3)
    assert good.passed and good.detail["dtype"] == "bf16"
    bad = numerics_probe(gpu, n=512, depth=4, repeats=3, flip=BitFlip(1, 9, repeat=2))
    assert not bad.passed


def test_suite_on_every_gpu():
    from dataclasses import replace

    from fleetscope.kernels.plan import plan_for
    from fleetscope.kernels.suite import run_suite

    plan = replace(plan_for("quick", cuda=True), matmul_n=2048, matmul_budget_s=0.3,
                   membw_bytes=256 * 2**20, membw_budget_s=0.2, collective_budget_s=0.5,
                   p2p_budget_s=0.5)
    results = run_suite(plan=plan, progress=lambda m: None)
    assert results and all(r.passed for r in results), [(r.probe, r.device, r.detail)
                                                         for r in results if not r.passed]
    n = torch.cuda.device_count()
    assert {r.device for r in results if r.probe == "matmul"} == {f"cuda:{i}" for i in range(n)}
    if n > 1:
        assert {r.probe for r in results} >= {"allreduce", "alltoall", "p2p"}
