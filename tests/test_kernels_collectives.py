"""Collective and p2p probes on a real 2-rank gloo group of separate processes."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from fleetscope.kernels.launch import run_local_group
from fleetscope.kernels.plan import KiB, plan_for
from fleetscope.kernels.suite import SuiteOptions, run_suite

TINY = replace(
    plan_for("quick", cuda=False),
    collective_sizes=(16 * KiB, 128 * KiB),
    collective_budget_s=0.4,
    p2p_bytes=64 * KiB,
    p2p_budget_s=0.3,
    p2p_pattern="all",
    group_timeout_s=60.0,
)


@pytest.mark.integration  # run_suite starts the ranks as processes (kernels.launch)
def test_allreduce_alltoall_p2p_on_a_two_process_gloo_group():
    lines: list[str] = []
    results = run_suite(plan=TINY, nprocs=2, probes=("allreduce", "alltoall", "p2p"),
                        progress=lines.append)
    by = {(r.probe, r.device): r for r in results}
    assert sorted(by) == [
        ("allreduce", "gloo:2"), ("alltoall", "gloo:2"),
        ("p2p", "cpu#0->cpu#1"), ("p2p", "cpu#1->cpu#0"),
    ], [(r.probe, r.device, r.detail) for r in results]
    for r in results:
        assert r.passed, r.detail
        assert r.unit == "GB/s" and 1e-5 < r.value < 1000
    ar = by[("allreduce", "gloo:2")]
    assert ar.detail["world_size"] == 2 and ar.detail["backend"] == "gloo"
    assert [s["bytes"] for s in ar.detail["sweep"]] == [16 * KiB, 128 * KiB]
    for s in ar.detail["sweep"]:  # busbw = algbw x 2(n-1)/n = algbw for n = 2
        assert abs(s["busbw_gbps"] - s["algbw_gbps"]) < 1e-9
    a2a = by[("alltoall", "gloo:2")]
    for s in a2a.detail["sweep"]:  # (n-1)/n = 1/2
        assert abs(s["busbw_gbps"] - s["algbw_gbps"] / 2) < 1e-9
    assert ar.variant == "gloo ranks=2 max=128KiB"
    assert by[("p2p", "cpu#1->cpu#0")].detail["src_rank"] == 1
    assert any("starting a 2-rank gloo group" in m for m in lines)


def test_a_rank_that_cannot_start_fails_the_group_probes_instead_of_hanging():
    # rank 1 asks for a GPU this machine lacks: it dies at start-up; rank 0 gives up
    # waiting at the rendezvous after the group timeout. Both report; nothing hangs.
    opts = SuiteOptions(replace(TINY, group_timeout_s=4.0), probes=("allreduce", "p2p"))
    lines: list[str] = []
    t0 = time.monotonic()
    results = run_local_group(2, opts, ["cpu", "cuda:7"], with_device_probes=False,
                              progress=lines.append)
    assert time.monotonic() - t0 < 60
    assert sorted(r.probe for r in results) == ["allreduce", "p2p"]
    assert all(not r.passed and r.value == 0.0 for r in results)
    assert "rank 1" in results[0].detail["error"]
    assert any("local group FAILED" in m for m in lines)
