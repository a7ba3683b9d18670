"""``bench/cpu_clock_cost.py`` on a small job: its "before" form of the reduction is the
current one without the sections' CPU column (it fails loudly when the reduction changes
under it), both forms return the same rows apart from that column, and the detector
part names nobody on its clean frames with or without the CPU stream."""

from __future__ import annotations

from tests.helpers.bench_module import BENCH, load_bench


def test_cpu_clock_cost_bench_runs_and_its_before_form_matches(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    bench = load_bench("cpu_clock_cost", "bench_cpu_clock_cost")
    prev = bench.previous_sql()
    assert "cpu_ns" not in prev and "compute_cpu_ns" not in prev and "optimizer_cpu_ns" not in prev
    assert bench.main(["--world", "64", "--steps", "4", "--marks", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "same rows: yes" in out and "findings 0 / 0" in out
