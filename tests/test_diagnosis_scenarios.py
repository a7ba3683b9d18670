"""A fast subset of bench/diagnosis.py's scenario suite (issue 14): real trainer in layouts
other than 2x2x2, real agent, real server, real webhook receiver.

* a stalled data loader on one rank of a dp4 x pp2 job: one ``slow_dataloader`` incident
  naming it, with the factor of the data-loading time vs its stage peers, paged;
* a crash of the last rank of a dp4 x pp2 job: the hang incident and its page name it.
  (Rank 0's crash, which takes the rendezvous store and every rank down within ~0.1 s, is
  in the bench: when its last step record also made it out, no record tells it from the
  others - see the README.)

About 3-4 minutes on 2 cores. The full suite: ``python bench/diagnosis.py``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from dataclasses import replace

import httpx
import pytest

from tests.helpers.bench_module import load_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bench():
    return load_bench("diagnosis", "bench_diagnosis")


@pytest.fixture(scope="module")
def server(bench, tmp_path_factory):
    work = tmp_path_factory.mktemp("scenarios")
    rx = bench.Receiver()
    proc, url = bench.start_server(work)
    http = httpx.Client(timeout=60)
    api = f"{url}/api/v1"
    http.post(f"{api}/alerts/webhooks", json={"name": "t", "url": rx.url, "secret": "scenario-secret-0123"}).raise_for_status()
    try:
        yield api, rx, work, http
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        rx.httpd.shutdown()
        shutil.rmtree(work / "spool", ignore_errors=True)


def _scenario(bench, name: str, **kw):
    sc = next(s for s in bench.SCENARIOS if s.name == name)
    return replace(sc, **kw)


def test_stalled_data_loader_in_dp4_pp2_is_one_paged_incident_with_its_factor(bench, server):
    api, rx, work, http = server
    sc = _scenario(bench, "dataloader-stall", layout=(4, 1, 2), steps=28)
    r = bench.run_scenario(sc, api, rx, work, http, seed=0)
    assert r.straggler_findings, r
    kinds = {(k, tuple(ranks)) for k, ranks, _ in r.straggler_findings}
    assert ("slow_dataloader", (2,)) in kinds and len(kinds) == 1, kinds  # one fault, one story
    assert "mfu_drop" not in r.kinds and "gc_pause" not in r.kinds, r.kinds
    # 40x of a 5 ms load cost. On a loaded 2-core host the injected sleep itself overshoots
    # (67x was seen at load 13) or falls short (15.6x in one CI run, within 25% of the
    # spool's own ratio, which was therefore below 21x too), so the reported factor
    # is held to what the ranks' own spooled records measured after onset, and only
    # loosely to the nominal 40x: a stall reads as an order of magnitude, not as a 1.5x
    truth = r.noise.get("ratio")
    assert truth and truth == truth, f"the spool's own ratio was not measured: {r.noise}"
    assert abs(r.factors[2] / truth - 1) <= 0.25, (r.factors, r.noise)
    assert 10 <= r.factors[2] <= 120, (r.factors, r.noise)
    assert r.to_webhook_s is not None, "the straggler was found but never paged"


def test_crash_in_dp4_pp2_names_the_crashed_rank_in_the_incident_and_the_page(bench, server):
    api, rx, work, http = server
    sc = _scenario(bench, "crash-dp4xpp2-last", steps=30)
    r = bench.run_scenario(sc, api, rx, work, http, seed=1)
    assert r.culprits == [7], r
    assert r.paged_culprits == [7], r
    assert r.ok
