"""Long schemathesis run over every route of a real fleetscope server.

    python bench/fuzz.py                 # full: 200 cases per operation and auth variant
    python bench/fuzz.py --examples 20   # quick

Starts a server (uvicorn subprocess, chDB, SQLite; loopback only, diagnosis and webhook
delivery off), seeds one job, then fuzzes each operation of ``/openapi.json`` with the
bearer token and without it. Prints the cases run, the 5xx found and the answers that
do not match their documented schema; exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TOKEN = "bench-fuzz-token-0123456789"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=200, help="cases per operation and auth variant (default 200)")
    p.add_argument("--seed", type=int, default=1, help="hypothesis seed (default 1)")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting operations after this long")
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = p.parse_args(argv)

    import httpx

    from fleetscope import codec
    from tests.helpers.data import sample_batch
    from tests.helpers.fuzzing import fuzz_api
    from tests.helpers.server import running_server

    with tempfile.TemporaryDirectory(prefix="fleetscope-fuzz-") as tmp:
        with running_server(Path(tmp), token=TOKEN, diagnosis_enabled=False) as url:
            httpx.post(f"{url.api}/ingest", content=codec.encode_batch(sample_batch(8, job="fuzz")),
                       headers={"Content-Type": codec.ARROW_CONTENT_TYPE, **url.auth_headers}, timeout=60)  # fmt: skip
            print(f"fuzzing {url} ({args.examples} cases per operation and auth variant)...", flush=True)
            rep = fuzz_api(url, TOKEN, args.examples, seed=args.seed, budget_s=args.budget_s)
    print(rep.summary())
    for line in rep.server_errors[:50]:
        print("5xx:", line)
    for line in rep.schema_mismatches[:50]:
        print("schema:", line)
    print(f"cases run: {rep.cases}; 5xx found: {len(rep.server_errors)}; schema mismatches: {len(rep.schema_mismatches)}")
    if args.json:
        args.json.write_text(json.dumps({
            "cases": rep.cases, "operations": rep.operations, "seconds": rep.seconds,
            "by_status": dict(rep.by_status), "server_errors": rep.server_errors,
            "schema_mismatches": rep.schema_mismatches}, indent=1))  # fmt: skip
    return 1 if rep.server_errors or rep.schema_mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
