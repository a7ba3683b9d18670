"""The ingest and jobs API against a real server (uvicorn subprocess, chDB, SQLite)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import time

import httpx
import pyarrow as pa
import pytest

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.data import now_ns, sample_batch, sample_rows
from tests.helpers.server import running_server
from tests.test_store import EXPECTED, MS, hand_dataset

TOKEN = "test-token-0123456789abcdef"
ARROW = {"Content-Type": codec.ARROW_CONTENT_TYPE}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("srv"), token=TOKEN, max_request_bytes=1024 * 1024) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.api, headers=server.auth_headers, timeout=60) as c:
        yield c


def stored(client) -> dict[str, int]:
    r = client.get("/store/stats")
    assert r.status_code == 200, r.text
    return r.json()["rows"]


def post(client, body, key=None, headers=ARROW, **extra):
    h = dict(headers)
    if key:
        h["Idempotency-Key"] = key
    h.update(extra)
    return client.post("/ingest", content=body, headers=h)


def test_token_required(server):
    r = httpx.get(f"{server.api}/jobs")
    assert r.status_code == 401 and "bearer token" in r.json()["detail"]
    r = httpx.get(f"{server.api}/jobs", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})
    assert r.status_code == 401
    assert httpx.get(f"{server}/healthz").status_code == 200  # health stays public


def test_dedup_same_key_twice_stored_once(client):
    before = stored(client)
    body = codec.encode_batch({"steps": sample_rows("steps", 7, job="dd"), "metrics": sample_rows("metrics", 3)})
    r1, r2 = post(client, body, "dd-1"), post(client, body, "dd-1")
    assert r1.status_code == r2.status_code == 200
    assert (r1.json()["duplicate"], r2.json()["duplicate"]) == (False, True)
    assert r2.json()["rows"] == {"steps": 7, "metrics": 3}
    after = stored(client)
    assert after["steps"] - before["steps"] == 7 and after["metrics"] - before["metrics"] == 3


def test_concurrent_clients(server, client):
    before = stored(client)
    bodies = [codec.encode_batch({"sections": sample_rows("sections", 50, job=f"cc-{i}")}) for i in range(16)]

    def send(i):
        with httpx.Client(base_url=server.api, headers=server.auth_headers, timeout=60) as c:
            # every batch twice (an agent retry), under distinct keys per batch
            return [post(c, bodies[i], f"cc-{i}").json()["duplicate"] for _ in range(2)]

    with cf.ThreadPoolExecutor(8) as ex:
        dups = list(ex.map(send, range(16)))
    assert all(d == [False, True] for d in dups)
    assert stored(client)["sections"] - before["sections"] == 16 * 50


BAD = [
    ("invalid json", b"{nope", {"Content-Type": "application/json"}, 400, "invalid JSON"),
    ("bad frame", b"XXXX\x00\x00\x00\x00", ARROW, 400, "bad frame header"),
    ("truncated", codec.FRAME_MAGIC + b"\xff\x00\x00\x00abc", ARROW, 400, "truncated"),
    ("content type", b"a,b", {"Content-Type": "text/csv"}, 415, "text/csv"),
    ("unknown type", json.dumps({"records": {"nope": [{}]}}).encode(), {"Content-Type": "application/json"}, 422, "nope"),
    (
        "missing field",
        json.dumps({"records": {"steps": [{"job": "x", "rank": 0, "step": 1}]}}).encode(),
        {"Content-Type": "application/json"},
        422,
        "steps[0]: missing required field 'start_ns'",
    ),
    (
        "wrong type",
        json.dumps({"records": {"steps": [dict(sample_rows("steps", 1)[0], rank="zero")]}}).encode(),
        {"Content-Type": "application/json"},
        422,
        "steps[0].rank",
    ),
    (
        "empty job",
        codec.encode_batch({"steps": sample_rows("steps", 3, job="")}),
        ARROW,
        422,
        "steps[0].job: must not be empty",
    ),
    (
        "time in 1970",
        codec.encode_batch({"steps": sample_rows("steps", 2, t0_ns=5)}),
        ARROW,
        422,
        "steps[0].start_ns",
    ),
    (
        "schema version",
        json.dumps({"schema_version": 99, "records": {}}).encode(),
        {"Content-Type": "application/json"},
        422,
        "schema_version 99",
    ),
]


@pytest.mark.parametrize("name,body,headers,status,message", BAD, ids=[b[0] for b in BAD])
def test_bad_payloads_rejected_with_message(client, name, body, headers, status, message):
    before = stored(client)
    r = post(client, body, "bad-" + name.replace(" ", "-"), headers)
    assert r.status_code == status, r.text
    assert message in r.json()["detail"]
    assert stored(client) == before


def test_wrong_schema_arrow_column_and_partial_batch(client):
    before = stored(client)
    good = codec.table_to_ipc(codec.rows_to_table(RECORD_TYPES["metrics"], sample_rows("metrics", 4)))
    bad_table = pa.table({"job": ["j"], "rank": pa.array(["r0"])}).replace_schema_metadata(
        {b"fleetscope.record": b"steps"}
    )
    bad = codec.table_to_ipc(bad_table)
    body = b"".join(codec.FRAME_MAGIC + len(p).to_bytes(4, "little") + p for p in (good, bad))
    r = post(client, body, "partial-bad")
    assert r.status_code == 422 and "steps.rank" in r.json()["detail"]
    assert stored(client) == before  # the valid metrics frame was not written either


def test_oversized_and_bad_headers(client):
    r = post(client, b"x" * (1024 * 1024 + 1), "big")
    assert r.status_code == 413 and "max_request_bytes" in r.json()["detail"]
    body = codec.encode_batch({"metrics": sample_rows("metrics", 1)})
    r = post(client, body, "off", **{"X-Fleetscope-Clock-Offset-Ns": "12.5"})
    assert r.status_code == 400 and "12.5" in r.json()["detail"]
    r = post(client, body, "bad key with spaces")
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["detail"]


def test_clock_offset_recorded_per_host(client):
    body = codec.encode_batch({"heartbeats": sample_rows("heartbeats", 2, host="")})
    r = post(client, body, "hb-off", **{"X-Fleetscope-Host": "node-3", "X-Fleetscope-Clock-Offset-Ns": "-2500"})
    assert r.status_code == 200
    assert client.get("/store/stats").json()["clock_offsets"]["node-3"]["offset_ns"] == -2500


def test_jobs_and_hand_checked_steps(client):
    t0 = now_ns()
    job = dict(ts_ns=t0, job="hand", dp=1, tp=1, pp=2, model_flops_per_step=4e12, device_peak_flops=1e13)
    b1, b2 = hand_dataset(t0)
    b2["jobs"] = [job]
    b2["steps"] = [  # two more steps of rank 0 so the step rate is defined: 3 steps in 1 s
        dict(job="hand", rank=0, step=s, start_ns=t0 + (s - 1) * 500 * MS, end_ns=t0 + (s - 1) * 500 * MS + 120 * MS,
             duration_ns=120 * MS) for s in (2, 3)
    ]  # fmt: skip
    assert post(client, codec.encode_batch(b1), "hand-1").status_code == 200
    assert post(client, codec.encode_json(b2), "hand-2", {"Content-Type": "application/json"}).status_code == 200

    jobs = client.get("/jobs").json()
    assert "hand" in [j["id"] for j in jobs]
    detail = client.get("/jobs/hand").json()
    assert detail["topology"] == {"dp": 1, "tp": 1, "pp": 2, "order": "tp-dp-pp", "world_size": 2}
    assert detail["status"] == "running" and detail["last_step"] == 3
    # step ends: t0+120ms (step 1), t0+620ms, t0+1120ms -> 2 steps in 1.0 s
    assert detail["steps_per_s"] == pytest.approx(2.0)
    assert detail["mfu"] == pytest.approx(4e12 * 2.0 / (2 * 1e13))
    assert client.get("/jobs/nope").status_code == 404

    rows = client.get("/jobs/hand/steps", params={"from_step": 1, "to_step": 2}).json()["rows"]
    from fleetscope.server.api.models import StepRow

    assert all(set(r) == set(StepRow.model_fields) for r in rows)  # the documented model
    got = {(r["step"], r["rank"]): r for r in rows}
    for (step, rank), e in EXPECTED.items():
        r = got[(step, rank)]
        want_total = e["total_ns"] if (step, rank) != (2, 0) else 120  # step 2 now has a marker
        assert r["total_ns"] == want_total * MS
        assert r["compute_ns"] == (e["compute_ns"] + e["optimizer_ns"]) * MS
        assert r["communication_ns"] == e["comm_ns"] * MS
        assert r["data_loading_ns"] == e["dataloader_ns"] * MS
        want_idle = e["idle_ns"] if (step, rank) != (2, 0) else 120 - 35
        assert r["idle_ns"] == want_idle * MS
    r = client.get("/jobs/hand/steps", params={"ranks": "1"}).json()["rows"]
    assert {x["rank"] for x in r} == {1}
    r = client.get("/jobs/hand/steps", params={"ranks": "0-x"})
    assert r.status_code == 422 and "0-x" in r.json()["detail"]


@pytest.mark.slow
def test_round_trip_every_type_arrow_and_json_survives_restart(tmp_path):
    """Every record type, both wire formats, values back exactly, 429 + Retry-After on a
    full queue, and the data still there after a restart (SIGTERM, then a new process
    on the same directories)."""
    from fleetscope.server.store import Store

    t0 = now_ns()
    arrow_batch, json_batch = sample_batch(4, job="rt-arrow", t0_ns=t0), sample_batch(3, job="rt-json", t0_ns=t0)
    # a small queue and a long linger make backpressure deterministic (checked below)
    with running_server(tmp_path, max_queue_rows=1000, min_insert_rows=1000, coalesce_linger_ms=3000) as url:
        with cf.ThreadPoolExecutor(2) as ex:  # both batches in one (lingering) group
            r1 = ex.submit(httpx.post, f"{url.api}/ingest", content=codec.encode_batch(arrow_batch), headers=ARROW, timeout=60)
            r2 = ex.submit(httpx.post, f"{url.api}/ingest", content=codec.encode_json(json_batch),
                           headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
            r1, r2 = r1.result(), r2.result()
        assert r1.status_code == 200 and r1.json()["rows"] == {n: 4 for n in RECORD_TYPES}
        assert r2.status_code == 200 and r2.json()["rows"] == {n: 3 for n in RECORD_TYPES}

        big = codec.encode_batch({"metrics": sample_rows("metrics", 800, job="bp")})
        with cf.ThreadPoolExecutor(2) as ex:
            first = ex.submit(httpx.post, f"{url.api}/ingest", content=big, headers=ARROW, timeout=60)
            while httpx.get(f"{url.api}/store/stats").json()["queued_rows"] < 800:
                time.sleep(0.02)  # until the first batch is queued (lingering)
            second = httpx.post(f"{url.api}/ingest", content=big, headers=ARROW, timeout=30)
            assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
            assert "queue full" in second.json()["detail"]
            assert first.result().status_code == 200
        url.process.stop()
        store = Store.open(f"chdb://{tmp_path / 'store'}", migrate_schema=False)
        try:
            for batch, job in ((arrow_batch, "rt-arrow"), (json_batch, "rt-json")):
                for name, sent in batch.items():
                    rt = RECORD_TYPES[name]
                    cols = ", ".join(f"`{c}`" for c in rt.column_names)
                    where = "job = {job:String}"
                    got = store.query_arrow(f"SELECT {cols} FROM `{name}` WHERE {where} ORDER BY {rt.time_column}", {"job": job})
                    want = codec.rows_to_table(rt, sent)
                    assert got.num_rows == want.num_rows, name
                    for c in rt.column_names:
                        g, w = got[c].to_pylist(), want[c].to_pylist()
                        if rt.column(c).type.value == "float64":
                            assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(g, w)), (name, c)
                        else:
                            assert g == w, (name, c)
        finally:
            store.close()
        url.process.start()
        jobs = {j["id"] for j in httpx.get(f"{url.api}/jobs").json()}
        assert {"rt-arrow", "rt-json"} <= jobs
        stats = httpx.get(f"{url.api}/store/stats").json()["rows"]
        assert all(stats[n] == (807 if n == "metrics" else 7) for n in RECORD_TYPES)
