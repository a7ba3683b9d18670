"""Schemathesis over every operation of ``/openapi.json`` against a real server, with and
without the bearer token: no 5xx, and every answer matches its documented schema and
content type. The quick profile; ``bench/fuzz.py`` runs the long one. Plus the 5xx the
fuzzer found, pinned as regressions."""

from __future__ import annotations

import httpx
import pytest

from fleetscope import codec
from tests.helpers.data import sample_batch
from tests.helpers.fuzzing import fuzz_api
from tests.helpers.server import running_server

TOKEN = "fuzz-token-0123456789abcdef"
QUICK_EXAMPLES = 8
"""Cases per operation and auth variant: about 600 cases, ~20 s on an idle machine."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # webhook_allow: the loopback receiver below passes the webhook SSRF guard (issue 13)
    with running_server(tmp_path_factory.mktemp("fuzz"), token=TOKEN, diagnosis_enabled=False,
                        webhook_allow="127.0.0.0/8") as url:  # fmt: skip
        seeded = httpx.post(f"{url.api}/ingest", content=codec.encode_batch(sample_batch(4, job="fuzz")),
                            headers={"Content-Type": codec.ARROW_CONTENT_TYPE, **url.auth_headers}, timeout=60)  # fmt: skip
        assert seeded.status_code == 200, seeded.text
        yield url


def test_schemathesis_every_route_no_5xx_and_schemas_match(server):
    rep = fuzz_api(server, TOKEN, QUICK_EXAMPLES, seed=13, budget_s=60)
    print(rep.summary())
    assert rep.operations >= 30 and rep.cases >= rep.operations * 2, rep.summary()
    assert not rep.server_errors, "\n".join(rep.server_errors[:10])
    assert not rep.schema_mismatches, "\n".join(rep.schema_mismatches[:10])
    assert rep.by_status[401] > 0 and rep.by_status[200] > 0  # both auth variants ran


def test_5xx_found_by_fuzzing_are_422(server):
    with httpx.Client(base_url=server.api, headers=server.auth_headers, timeout=30) as c:
        huge = 2**70  # past SQLite's 64-bit INTEGER
        for r in (c.patch(f"/alerts/rules/{huge}", json={}), c.post(f"/incidents/{huge}/resolve", json={})):
            assert r.status_code == 422 and "64 bits" in r.json()["detail"], r.text
        hook = c.post("/alerts/webhooks", json={"name": "fuzz-hook", "url": "http://127.0.0.1:9/x"})
        assert hook.status_code == 201, hook.text
        r = c.patch(f"/alerts/webhooks/{hook.json()['id']}", json={"min_severity": "x"})
        assert r.status_code == 422 and "min_severity" in r.json()["detail"], r.text
