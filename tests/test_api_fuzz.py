"""Schemathesis over every operation of ``/openapi.json`` against a real server, with and
without the bearer token: no 5xx, and every answer matches its documented schema and
content type. The quick profile; ``bench/fuzz.py`` runs the long one."""

from __future__ import annotations

from fleetscope import codec
from tests.helpers.data import sample_batch
from tests.helpers.fuzzing import fuzz_api
from tests.helpers.server import running_server

TOKEN = "fuzz-token-0123456789abcdef"
QUICK_EXAMPLES = 8
"""Cases per operation and auth variant: about 600 cases, ~20 s on an idle machine."""


def test_schemathesis_every_route_no_5xx_and_schemas_match(tmp_path):
    import httpx

    with running_server(tmp_path, token=TOKEN, diagnosis_enabled=False) as url:
        seeded = httpx.post(f"{url.api}/ingest", content=codec.encode_batch(sample_batch(4, job="fuzz")),
                            headers={"Content-Type": codec.ARROW_CONTENT_TYPE, **url.auth_headers}, timeout=60)  # fmt: skip
        assert seeded.status_code == 200, seeded.text
        rep = fuzz_api(url, TOKEN, QUICK_EXAMPLES, seed=13, budget_s=60)
    print(rep.summary())
    assert rep.operations >= 30 and rep.cases >= rep.operations * 2, rep.summary()
    assert not rep.server_errors, "\n".join(rep.server_errors[:10])
    assert not rep.schema_mismatches, "\n".join(rep.schema_mismatches[:10])
    assert rep.by_status[401] > 0 and rep.by_status[200] > 0  # both auth variants ran
