"""Fleet-relative scoring of probe results: pure numbers, then real probe runs."""

from __future__ import annotations

import json
import math

import pytest
import torch
from fleetscope.kernels import devices
from fleetscope.kernels.numerics import BitFlip, numerics_probe
from fleetscope.server.diagnosis.selfcheck import (
    ScoringConfig,
    SelfcheckKind,
    robust_z,
    score_probes,
)
from fleetscope.server.diagnosis.selfcheck_report import fleet_report_to_dict, report_to_dict

from tests.selfcheck_fleet import NOISY_MACHINE, measure_fleet

H200 = "NVIDIA H200"


def row(host, value, *, probe="matmul", device="cuda:0", ts=1_000, passed=True,
        variant="bf16 n=8192", model=H200, **detail):
    return {
        "ts_ns": ts, "job": "", "host": host, "device": device, "device_model": model,
        "probe": probe, "value": float(value), "unit": "TFLOP/s",
        "peak_fraction": float(value) / 989.0, "passed": passed,
        "detail": json.dumps({"variant": variant, **detail}),
    }


def kinds(report, host=None):
    return sorted((f.host, f.kind) for f in report.findings if host in (None, f.host))


def test_robust_z_handles_spread_and_identical_values():
    med, z = robust_z(50.0, [100.0, 101.0, 99.0, 100.5, 50.0])
    assert med == 100.0 and z < -30
    assert robust_z(100.0, [100.0] * 4) == (100.0, 0.0)
    assert robust_z(90.0, [100.0, 100.0, 100.0, 90.0]) == (100.0, -math.inf)


def test_slow_device_is_a_fleet_outlier_and_its_peers_are_not():
    vals = {"h0": 801.0, "h1": 795.0, "h2": 808.0, "h3": 799.0, "h4": 803.0, "h5": 540.0}
    report = score_probes([row(h, v) for h, v in vals.items()])
    assert kinds(report) == [("h5", SelfcheckKind.FLEET_OUTLIER)]
    (f,) = report.findings
    assert f.ratio == pytest.approx(540 / 800) and f.severity == "critical"
    assert f.score > 1 and "h5 cuda:0 matmul" in f.summary
    scores = {s.host: s for s in report.scores}
    assert scores["h5"].status == "outlier" and scores["h0"].status == "ok"
    assert scores["h0"].fleet_samples == 6 and scores["h0"].fleet_median == 800.0


def test_identical_hosts_and_small_differences_are_not_flagged():
    assert score_probes([row(f"h{i}", 800.0) for i in range(8)]).findings == ()
    # a tight fleet with one host 3% slower: significant, but not slow enough to matter
    tight = [row(f"h{i}", 800.0 + 0.1 * i) for i in range(6)] + [row("h9", 776.0)]
    assert score_probes(tight).findings == ()
    # a noisy fleet: 12% below the median but within the spread
    noisy = [row(f"h{i}", v) for i, v in enumerate([800, 700, 900, 650, 950, 704])]
    assert score_probes(noisy).findings == ()


def test_only_same_model_and_variant_are_compared():
    rows = [row(f"h{i}", 800.0) for i in range(4)]
    rows += [row("a100", 250.0, model="NVIDIA A100-SXM4-80GB")]  # other model: no peers
    rows += [row("small", 300.0, variant="bf16 n=2048")]  # other size: no peers
    report = score_probes(rows)
    assert report.findings == ()
    assert {s.host: s.fleet_samples for s in report.scores}["a100"] == 0


def test_history_regression_against_the_hosts_own_past():
    rows = [row("h0", v, ts=t) for t, v in ((1, 800.0), (2, 805.0), (3, 798.0), (4, 640.0))]
    report = score_probes(rows)
    assert kinds(report) == [("h0", SelfcheckKind.HISTORY_REGRESSION)]
    s = report.scores[0]
    assert s.value == 640.0 and s.history_runs == 3 and s.history_median == 800.0
    assert s.status == "regressed"
    steady = [row("h0", v, ts=t) for t, v in ((1, 800.0), (2, 805.0), (3, 790.0))]
    assert score_probes(steady).findings == ()


def test_failed_probe_and_numerics_minority_are_critical():
    rows = [row(f"h{i}", 0.0, probe="numerics", variant="bf16 n=2048 depth=8",
                hash="aaaa", versions={"torch": "2.13"}) for i in range(4)]
    rows.append(row("bad", 0.0, probe="numerics", variant="bf16 n=2048 depth=8",
                    hash="bbbb", versions={"torch": "2.13"}))
    rows.append(row("other-sw", 0.0, probe="numerics", variant="bf16 n=2048 depth=8",
                    hash="cccc", versions={"torch": "2.14"}))  # not comparable: no finding
    rows.append(row("broken", 0.0, passed=False, reason="wrong product"))
    report = score_probes(rows)
    assert kinds(report) == [("bad", SelfcheckKind.NUMERICS_MISMATCH),
                             ("broken", SelfcheckKind.PROBE_FAILED)]
    assert all(f.severity == "critical" for f in report.findings)
    doc = report_to_dict(report, "bad")
    assert doc["status"] == "mismatch" and doc["findings"][0]["evidence"]["majority"] == "aaaa"
    fleet = fleet_report_to_dict(report)
    assert [h["host"] for h in fleet["hosts"][:2]] == ["broken", "bad"]  # worst first
    json.dumps(fleet, allow_nan=False)  # NaN never reaches the JSON


def test_two_disagreeing_devices_flag_no_one_until_a_third_settles_it():
    def numerics(host: str, h: str) -> dict:
        return row(host, 0.0, probe="numerics", variant="fp32 n=32 depth=2", hash=h, versions={"torch": "2.13"})

    assert kinds(score_probes([numerics("h0", "aaaa"), numerics("bad", "bbbb")])) == []
    settled = score_probes([numerics("h0", "aaaa"), numerics("bad", "bbbb"), numerics("h1", "aaaa")])
    assert kinds(settled) == [("bad", SelfcheckKind.NUMERICS_MISMATCH)]


def test_config_refuses_nonsense_thresholds():
    with pytest.raises(ValueError, match="min_ratio"):
        ScoringConfig(min_ratio=1.5)


@pytest.mark.slow  # real probes for seconds: make test, not test-fast
def test_real_probes_find_the_slowed_host_and_not_the_identical_ones():
    hosts = {"node-a": 1.0, "node-b": 1.0, "node-c": 4.0, "node-d": 1.0, "node-e": 1.0}
    report = score_probes(measure_fleet(hosts), ScoringConfig(**NOISY_MACHINE))
    flagged = kinds(report)
    assert flagged == [("node-c", SelfcheckKind.FLEET_OUTLIER)] * 2, [
        (s.host, s.probe, s.value, s.ratio_to_median) for s in report.scores]
    assert all(f.ratio < 0.5 for f in report.findings)


@pytest.fixture()
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield devices.cpu_info(num_threads=1)
    torch.set_num_threads(before)


def test_real_numerics_flip_on_one_host_is_a_fleet_mismatch(one_thread):
    cpu = one_thread
    rows = []
    for host in ("n1", "n2", "n3", "n4"):
        flip = BitFlip(11, 2) if host == "n3" else None
        r = numerics_probe(cpu, n=32, depth=2, repeats=2, flip=flip)
        assert r.passed  # a persistent fault is consistent on its own device...
        rows.append(r.to_record(host=host))
    report = score_probes(rows)  # ...but not with the fleet
    assert kinds(report) == [("n3", SelfcheckKind.NUMERICS_MISMATCH)]
