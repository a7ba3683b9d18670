"""Schemathesis over every operation of a running server's ``/openapi.json``.

Used by ``tests/test_api_fuzz.py`` (a quick profile in the normal run) and
``bench/fuzz.py`` (the long one). Failures are recorded, not raised, so every
operation gets its share of cases and the report counts them all:

* ``server_errors``: any 5xx answer;
* ``schema_mismatches``: a documented answer whose body does not match its schema
  (``response_schema_conformance``) or whose content type is undocumented.

Cases run with and without the bearer token; webhooks are never delivered because the
fuzzed server runs with ``diagnosis_enabled=false`` (no dispatcher), and the only URLs
called are the server's own loopback ones.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

REAL_PATH_VALUES: dict[str, Any] = {"job": "fuzz", "host": "host-0", "rule_id": 1, "hook_id": 1, "incident_id": 1}
"""Path values that exist on the seeded server (job ``fuzz`` of
``tests.helpers.data.sample_batch``, the built-in rule 1), so cases get past 404."""


@dataclass
class FuzzReport:
    cases: int = 0
    operations: int = 0
    by_status: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    schema_mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"{self.cases} cases over {self.operations} operations in {self.seconds:.1f}s; "
            f"5xx: {len(self.server_errors)}; schema mismatches: {len(self.schema_mismatches)}; "
            f"statuses: {dict(sorted(self.by_status.items()))}"
        )


def fuzz_api(base_url: str, token: str | None, max_examples: int, seed: int = 0,
             budget_s: float | None = None, report: FuzzReport | None = None) -> FuzzReport:
    """Fuzz every operation ``max_examples`` times with the token and without it."""
    import schemathesis

    rep = report or FuzzReport()
    t_start = time.monotonic()
    spec = httpx.get(f"{base_url}/openapi.json", timeout=60)
    spec.raise_for_status()
    schema = schemathesis.openapi.from_dict(spec.json())
    ops = [r.ok() for r in schema.get_all_operations()]
    rep.operations = len(ops)
    auth_variants = [{"Authorization": f"Bearer {token}"}, {}] if token else [{}]
    # operation by operation, both auth variants of each: a time budget that runs out
    # under load still leaves both variants run (and the operations fuzzed so far whole)
    for op in ops:
        if budget_s is not None and time.monotonic() - t_start > budget_s:
            break
        for headers in auth_variants:
            _fuzz_operation(op, f"{op.method.upper()} {op.path} ({'token' if headers else 'no token'})",
                            base_url, headers, max_examples, seed, rep)  # fmt: skip
    rep.seconds += time.monotonic() - t_start
    return rep


def _fuzz_operation(op: Any, label: str, base_url: str, headers: dict, max_examples: int, seed: int,
                    rep: FuzzReport) -> None:  # fmt: skip
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from schemathesis.checks import content_type_conformance, response_schema_conformance
    from schemathesis.core.failures import FailureGroup

    @hseed(seed)
    @given(case=op.as_strategy(), real=st.integers(0, 2))
    @settings(max_examples=max_examples, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
              report_multiple_bugs=False)  # fmt: skip
    def run(case: Any, real: int) -> None:
        if real and case.path_parameters:  # 2 in 3 cases aim at things that exist
            for name, value in REAL_PATH_VALUES.items():
                if name in case.path_parameters:
                    case.path_parameters[name] = value
        resp = case.call(base_url=base_url, headers=headers, timeout=60)
        rep.cases += 1
        rep.by_status[resp.status_code] += 1
        if resp.status_code >= 500:
            rep.server_errors.append(f"{label}: {resp.status_code} {resp.text[:300]!r} <- {_show(case)}")
            return
        try:
            case.validate_response(resp, checks=[response_schema_conformance, content_type_conformance])
        except (FailureGroup, Exception) as e:  # record, keep going
            rep.schema_mismatches.append(f"{label}: {resp.status_code} {str(e)[:400]} <- {_show(case)}")

    run()


def _show(case: Any) -> str:
    parts = [f"path={case.path_parameters}", f"query={case.query}"]
    if case.body is not None and not isinstance(case.body, (bytes, bytearray)):
        parts.append(f"body={str(case.body)[:200]}")
    elif case.body is not None:
        parts.append(f"body=<{len(case.body)} bytes>")
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    if headers:
        parts.append(f"headers={headers}")
    return " ".join(parts)
