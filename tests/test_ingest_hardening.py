"""Issue 13, the write path and the API surface: every bad input gets a clear 4xx that
names the field and the limit, never a 500, and nothing good is lost with it.

Real server (uvicorn subprocess, chDB, SQLite). Each test names the issue item it proves.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import socket
import struct
import time

import httpx
import pyarrow as pa
import pytest

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from tests.helpers.data import now_ns, sample_rows
from tests.helpers.server import running_server

TOKEN = "hardening-token-0123456789"
ARROW = {"Content-Type": codec.ARROW_CONTENT_TYPE}
JSON = {"Content-Type": codec.JSON_CONTENT_TYPE}
DAY_NS = 86_400 * 10**9
INFLIGHT = 4 * 1024 * 1024
MAX_ROWS = 5000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("hard"), token=TOKEN, max_inflight_bytes=INFLIGHT,
                        max_request_rows=MAX_ROWS, diagnosis_enabled=False) as url:  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.api, headers=server.auth_headers, timeout=120) as c:
        yield c


def post(client, body, headers=ARROW, key=None, **extra):
    h = dict(headers)
    if key:
        h["Idempotency-Key"] = key
    h.update(extra)
    return client.post("/ingest", content=body, headers=h)


def frame(table: pa.Table, compression: str | None = "zstd") -> bytes:
    payload = codec.table_to_ipc(table, compression)
    return codec.FRAME_MAGIC + struct.pack("<I", len(payload)) + payload


LOOSE = (codec.Limits(max_decoded_bytes=1 << 40, max_rows=10**9, max_string_bytes=1 << 30, max_symbol_bytes=1 << 30),
         ) if hasattr(codec, "Limits") else ()  # fmt: skip


def encode_loose(record: str, rows: list[dict]) -> bytes:
    """The Arrow wire format without the client-side limits (to send what a server must refuse)."""
    return frame(codec.rows_to_table(RECORD_TYPES[record], rows, *LOOSE))


def log_table(message: pa.Array | str, n: int = 1) -> pa.Table:
    """A canonical log_events table whose ``message`` column is ``message``."""
    rt = RECORD_TYPES["log_events"]
    base = codec.rows_to_table(rt, sample_rows("log_events", n))
    col = message if isinstance(message, pa.Array) else pa.array([message] * n)
    idx = base.schema.get_field_index("message")
    return base.set_column(idx, pa.field("message", col.type, nullable=False), col)


def peak_rss_mb(server) -> float:
    with open(f"/proc/{server.process.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def assert_4xx(r, status: int, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:500])
    detail = r.json()["detail"]
    for w in words:
        assert w in detail, (w, detail)


# ---- OpenAPI and offline docs -----------------------------------------------------------
def test_openapi_json_and_local_docs(server):
    r = httpx.get(f"{server}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text[:300]
    spec = r.json()
    assert "/api/v1/ingest" in spec["paths"] and "StepsRecord" in spec["components"]["schemas"]
    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{server}{page}", timeout=30).text
        assert "cdn." not in html and "https://" not in html and "fonts.googleapis" not in html, page
        srcs = [part.split('"')[1] for part in html.split("src=")[1:]] + [
            part.split('"')[1] for part in html.split("href=")[1:] if part.startswith('"/')
        ]
        assert srcs, page
        for src in srcs:  # every asset the page loads comes from this server
            a = httpx.get(f"{server}{src}", timeout=30)
            assert a.status_code == 200 and len(a.content) > 1000, (page, src, a.status_code)


# ---- item 8: Content-Type required ------------------------------------------------------
@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_missing_or_wrong_content_type_is_415(client, ctype):
    body = codec.encode_json({"metrics": sample_rows("metrics", 2)})
    headers = {} if ctype is None else {"Content-Type": ctype}
    r = client.post("/ingest", content=body, headers=headers)
    assert_4xx(r, 415, codec.JSON_CONTENT_TYPE)
    assert r.headers["X-Fleetscope-Retry"] == "no"


# ---- item 3: decoded bytes, rows, string lengths, dictionary expansion -------------------
def test_300mb_message_in_small_arrow_batch_is_413_and_rss_stays_sane(server, client):
    before = peak_rss_mb(server)
    body = frame(log_table("x" * (300 << 20)))
    assert len(body) < 64 * 1024  # ~11 KB on the wire
    r = post(client, body)
    assert_4xx(r, 413, "max_decoded_bytes=268435456")
    grew = peak_rss_mb(server) - before
    print(f"\n300 MB message in a {len(body)} byte batch: {r.status_code}; server peak RSS {before:.0f} -> {before + grew:.0f} MB")
    assert grew < 100, f"server peak RSS grew by {grew:.0f} MB for a rejected batch"


def test_dictionary_expansion_is_charged_before_casting(server, client):
    before = peak_rss_mb(server)
    big = "y" * 900_000
    msg = pa.DictionaryArray.from_arrays(pa.array([0] * 400, pa.int32()), pa.array([big]))
    r = post(client, frame(log_table(msg, 400)))
    assert_4xx(r, 413, "max_decoded_bytes=268435456", "dictionary")
    grew = peak_rss_mb(server) - before
    print(f"\ndictionary of 360 MB expanded: {r.status_code}; server peak RSS grew {grew:.0f} MB")
    assert grew < 100


def test_long_strings_rows_and_ids_name_their_limit(client):
    r = post(client, frame(log_table("z" * (2 << 20))))
    assert_4xx(r, 422, "log_events[0].message", "max_string_bytes=1048576")
    r = post(client, codec.encode_json({"log_events": sample_rows("log_events", 1, message="z" * (2 << 20))}), JSON)
    assert_4xx(r, 422, "max_string_bytes=1048576")
    long_job = "j" * 300  # the SQL jobs.id column holds 200 (PostgreSQL enforces it)
    for body, ct in ((encode_loose("steps", sample_rows("steps", 2, job=long_job)), ARROW),
                     (codec.encode_json({"jobs": sample_rows("jobs", 1, job=long_job)}), JSON)):  # fmt: skip
        assert_4xx(post(client, body, ct), 422, ".job", "max_symbol_bytes=200")
    r = post(client, codec.encode_batch({"metrics": sample_rows("metrics", MAX_ROWS + 1)}))
    assert_4xx(r, 413, f"max_request_rows={MAX_ROWS}")
    r = post(client, codec.encode_json({"metrics": sample_rows("metrics", MAX_ROWS + 1)}), JSON)
    assert_4xx(r, 413, f"max_request_rows={MAX_ROWS}")


# ---- item 4: decode errors are 4xx, never 500 -------------------------------------------
def _arrow_variants() -> dict[str, bytes]:
    base = codec.rows_to_table(RECORD_TYPES["metrics"], sample_rows("metrics", 3))
    bad_meta = base.replace_schema_metadata({b"fleetscope.record": b"\xff\xfemetrics"})
    dup = pa.Table.from_arrays([base["job"], base["job"], *base.columns[2:]],
                               names=["job", "job", *base.column_names[2:]])  # fmt: skip
    dup = dup.replace_schema_metadata(base.schema.metadata)
    bad_utf8 = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(struct.pack("<4i", 0, 2, 4, 6)),
                                                       pa.py_buffer(b"\xff\xfe\xc3\x28ok")])  # fmt: skip
    idx = base.schema.get_field_index("name")
    bad_str = base.set_column(idx, base.schema.field(idx), bad_utf8)
    t = now_ns()
    span = codec.rows_to_table(RECORD_TYPES["metrics"], [
        *sample_rows("metrics", 1, t0_ns=t), *sample_rows("metrics", 1, t0_ns=t - 1100 * DAY_NS)])  # fmt: skip
    return {
        "non-UTF-8 schema metadata": frame(bad_meta),
        "duplicate column names": frame(dup),
        "invalid UTF-8 string": frame(bad_str),
        "timestamps spanning 1100 days": frame(span),
    }


@pytest.mark.parametrize("name", sorted(_arrow_variants()))
def test_arrow_decode_errors_are_4xx(client, name):
    words = {
        "non-UTF-8 schema metadata": ["metadata", "UTF-8"],
        "duplicate column names": ["duplicate column", "'job'"],
        "invalid UTF-8 string": ["Invalid UTF8"],
        "timestamps spanning 1100 days": ["max_batch_span_days=900"],
    }[name]
    r = post(client, _arrow_variants()[name])
    assert r.status_code in (400, 422), (name, r.status_code, r.text[:300])
    assert_4xx(r, r.status_code, *words)
    assert r.headers["X-Fleetscope-Retry"] == "no"


def _metric_json(value_literal: str) -> bytes:
    row = sample_rows("metrics", 1)[0]
    text = json.dumps({"schema_version": 1, "records": {"metrics": [row]}})
    return text.replace(f'"value": {row["value"]}', f'"value": {value_literal}').encode()


@pytest.mark.parametrize("name,body,status,words", [
    ("deep JSON", b'{"records": {"metrics": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}}", 400, ["nested too deeply"]),
    ("deep value", b'{"records": {"metrics": [{"job": ' + b"[" * 900 + b"]" * 900 + b"}]}}", 422, ["metrics[0]"]),
    ("huge int for a float", _metric_json("1" + "0" * 400), 422, ["out of range for float64"]),
    ("integer past 4300 digits", _metric_json("9" * 5000), 400, ["invalid JSON"]),
    ("lone surrogate", json.dumps({"records": {"log_events": sample_rows("log_events", 1, message="\ud800")}}).encode(), 422, ["UTF-8"]),
    ("non-UTF-8 body", b'{"records": {"metrics": []}, "x": "\xff"}', 400, ["invalid JSON"]),
])  # fmt: skip
def test_json_decode_errors_are_4xx(client, name, body, status, words):
    assert_4xx(post(client, body, JSON), status, *words)


def test_infinite_floats_are_stored_as_nan_not_rejected():
    """A diverged loss (inf) must not cost the batch: the value is kept as NaN."""
    rows = sample_rows("steps", 2)
    rows[0]["loss"] = float("inf")
    rows[1]["loss"] = float("-inf")
    got = codec.decode_batch(codec.encode_batch({"steps": rows}))["steps"]["loss"].to_pylist()
    assert all(math.isnan(v) for v in got)
    table = codec.decode_json(_metric_json("1e999"))["metrics"]
    assert math.isnan(table["value"][0].as_py())


# ---- item 2: topology bounded ------------------------------------------------------------
@pytest.mark.parametrize("fields,words", [
    ({"dp": 0}, ["jobs[0].dp", "at least 1"]),
    ({"tp": -3}, ["jobs[0].tp"]),
    ({"num_microbatches": 0}, ["jobs[0].num_microbatches"]),
    ({"dp": 2147483647}, ["jobs[0].dp", "max_world_size=1048576"]),
    ({"dp": 1024, "tp": 1024, "pp": 2}, ["world size", "max_world_size=1048576"]),
    ({"order": "dp-dp-tp"}, ["jobs[0].order"]),
    ({"status": "s" * 30}, ["jobs[0].status", "20 characters"]),
])  # fmt: skip
def test_job_topology_is_bounded(client, fields, words):
    for ct, enc in ((ARROW, codec.encode_batch), (JSON, codec.encode_json)):
        r = post(client, enc({"jobs": sample_rows("jobs", 1, job="topo", **fields)}), ct)
        assert_4xx(r, 422, *words)


def test_rank_is_bounded(client):
    r = post(client, codec.encode_batch({"steps": sample_rows("steps", 1, rank=2**20)}))
    assert_4xx(r, 422, "steps[0].rank", "max_world_size=1048576")


def test_views_answer_4xx_for_a_stored_bad_topology(server, client):
    """A jobs row from before the bound (dp=0, or 2**31-1) gives 422 naming the field on
    the views, not a 500 or a world-size allocation."""
    import sqlalchemy as sa

    ok = post(client, codec.encode_json({"jobs": sample_rows("jobs", 1, job="legacy")}), JSON)
    assert ok.status_code == 200, ok.text
    engine = sa.create_engine(f"sqlite:///{server.process.workdir / 'control.db'}")
    for dp, words in ((0, ["dp=0"]), (2147483647, ["dp=2147483647", "max_world_size"])):
        with engine.begin() as c:
            c.execute(sa.text("UPDATE jobs SET dp = :dp WHERE id = 'legacy'"), {"dp": dp})
        for view in ("grid", "heatmap", "timeline", "trend", "trace.json"):
            r = client.get(f"/jobs/legacy/{view}")
            assert_4xx(r, 422, *words)
    engine.dispose()


# ---- item 9: idempotency keys scoped to the host and bound to content --------------------
def test_idempotency_key_scoped_to_host_and_content(client):
    a = codec.encode_batch({"metrics": sample_rows("metrics", 3)})
    b = codec.encode_batch({"metrics": sample_rows("metrics", 4)})
    r = post(client, a, key="shared-key-1", **{"X-Fleetscope-Host": "node-a"})
    assert r.status_code == 200 and not r.json()["duplicate"], r.text
    r = post(client, a, key="shared-key-1", **{"X-Fleetscope-Host": "node-a"})
    assert r.status_code == 200 and r.json()["duplicate"]  # a true retry
    r = post(client, b, key="shared-key-1", **{"X-Fleetscope-Host": "node-a"})
    assert_4xx(r, 409, "'shared-key-1'", "node-a", "different content")
    assert r.headers["X-Fleetscope-Retry"] == "no"
    r = post(client, b, key="shared-key-1", **{"X-Fleetscope-Host": "node-b"})
    assert r.status_code == 200 and not r.json()["duplicate"] and r.json()["rows"] == {"metrics": 4}


def test_key_conflict_inside_one_coalesced_group(tmp_path):
    with running_server(tmp_path, coalesce_linger_ms=1500, min_insert_rows=100_000, diagnosis_enabled=False) as url:
        bodies = [codec.encode_batch({"metrics": sample_rows("metrics", n)}) for n in (2, 3)]
        h = {**ARROW, "Idempotency-Key": "same-in-group", "X-Fleetscope-Host": "h"}
        with cf.ThreadPoolExecutor(2) as ex:
            rs = list(ex.map(lambda b: httpx.post(f"{url.api}/ingest", content=b, headers=h, timeout=60), bodies))
        assert sorted(r.status_code for r in rs) == [200, 409], [r.text for r in rs]


# ---- item 10: liveness, future times, clock offsets -------------------------------------
def test_empty_request_is_not_host_liveness(client):
    r = post(client, codec.encode_json({"metrics": []}), JSON, **{"X-Fleetscope-Host": "ghost-host"})
    assert r.status_code == 200, r.text
    r = post(client, b"", ARROW, **{"X-Fleetscope-Host": "ghost-host", "X-Fleetscope-Clock-Offset-Ns": "5"})
    assert r.status_code == 200, r.text
    stats = client.get("/store/stats").json()
    assert "ghost-host" not in stats["hosts_seen_ns"] and "ghost-host" not in stats["clock_offsets"]
    r = post(client, codec.encode_json({"metrics": sample_rows("metrics", 1)}), JSON, **{"X-Fleetscope-Host": "real-host"})
    assert r.status_code == 200
    assert "real-host" in client.get("/store/stats").json()["hosts_seen_ns"]


def test_future_times_and_clock_offsets_are_bounded(client):
    future = now_ns() + 2 * 3600 * 10**9
    r = post(client, codec.encode_batch({"heartbeats": sample_rows("heartbeats", 1, t0_ns=future)}))
    assert_4xx(r, 422, "heartbeats[0].ts_ns", "max_future_s=3600")
    r = post(client, codec.encode_batch({"heartbeats": sample_rows("heartbeats", 1)}),
             **{"X-Fleetscope-Clock-Offset-Ns": str(2 * 3600 * 10**9)})  # fmt: skip
    assert_4xx(r, 422, "max_future_s=3600")  # the offset pushes it past now + 1 h
    r = post(client, codec.encode_batch({"heartbeats": sample_rows("heartbeats", 1)}),
             **{"X-Fleetscope-Clock-Offset-Ns": str(10**18)})  # fmt: skip
    assert_4xx(r, 400, "max_clock_offset_s=86400")
    # a sentinel-free time column near the int64 end: the shift must not wrap around
    row = sample_rows("collectives", 1, completed_ns=2**63 - 5)
    r = post(client, codec.encode_batch({"collectives": row}), **{"X-Fleetscope-Clock-Offset-Ns": str(10**12)})
    assert_4xx(r, 422, "collectives.completed_ns", "overflows")


# ---- item 11: ranks= capped before expansion ---------------------------------------------
def test_ranks_parameter_capped_before_expansion(client):
    ok = post(client, codec.encode_json({"jobs": sample_rows("jobs", 1, job="ranks-job")}), JSON)
    assert ok.status_code == 200
    spec = ",".join(["0-1000000"] * 50)  # 500 bytes of URL, 50 M ranks
    for route in ("/jobs/ranks-job/steps", "/jobs/ranks-job/timeline", "/jobs/ranks-job/trace.json"):
        t0 = time.perf_counter()
        r = client.get(route, params={"ranks": spec})
        assert_4xx(r, 422, "max_ranks_expanded=1048576")
        assert time.perf_counter() - t0 < 5, route


# ---- item 12: 429 before the body is read ------------------------------------------------
def _raw_headers(server, length: int, key: str) -> bytes:
    host = server.split("//")[1]
    return (f"POST /api/v1/ingest HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: {codec.ARROW_CONTENT_TYPE}\r\nContent-Length: {length}\r\n"
            f"Idempotency-Key: {key}\r\n\r\n").encode()  # fmt: skip


def _read_response(sock: socket.socket) -> str:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_429_from_headers_before_the_body_is_read(server):
    port = int(server.rsplit(":", 1)[1])
    size = 3 * 1024 * 1024  # two of these pass max_inflight_bytes (4 MiB)
    first = socket.create_connection(("127.0.0.1", port), timeout=10)
    second = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        first.sendall(_raw_headers(server, size, "inflight-1") + b"\0" * 1024)  # body trickles in
        time.sleep(0.5)
        second.sendall(_raw_headers(server, size, "inflight-2"))  # no body sent at all
        second.settimeout(5)
        answer = _read_response(second)
        assert answer.startswith("HTTP/1.1 429"), answer[:200]
        assert "retry-after" in answer.lower() and "max_inflight_bytes=4194304" in answer
    finally:
        first.close()
        second.close()


def test_429_on_full_queue_before_the_body_is_read(tmp_path):
    # the writer lingers 10 s (the most the setting allows) for more rows, so a loaded
    # machine still sees the first batch queued before it is written
    with running_server(tmp_path, max_queue_rows=1000, min_insert_rows=100_000, coalesce_linger_ms=10_000,
                        diagnosis_enabled=False) as url:  # fmt: skip
        fill = codec.encode_batch({"metrics": sample_rows("metrics", 1000)})
        with cf.ThreadPoolExecutor(1) as ex:  # queued, the writer lingers for more
            pending = ex.submit(httpx.post, f"{url.api}/ingest", content=fill, headers=ARROW, timeout=60)
            deadline = time.monotonic() + 9
            while httpx.get(f"{url.api}/store/stats", timeout=10).json()["queued_rows"] < 1000:
                assert time.monotonic() < deadline, "the first batch never queued"
                time.sleep(0.05)
            port = int(url.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(_raw_headers(url, 1 << 20, "queue-full").replace(
                    f"Authorization: Bearer {TOKEN}\r\n".encode(), b"X-Fleetscope-Host: node-behind\r\n"))
                s.settimeout(3)  # no body is ever sent
                answer = _read_response(s)
            assert answer.startswith("HTTP/1.1 429") and "queue full" in answer, answer[:300]
            # the refused batch still proves its agent alive: the host is not "down"
            seen = httpx.get(f"{url.api}/internal/diagnosis/host-seen", timeout=10).json()
            assert time.time_ns() - seen["node-behind"] < 60e9, seen
            assert pending.result().status_code == 200


# ---- item 4: poison isolation in a coalesced group ---------------------------------------
def test_poison_batch_rejected_alone_the_rest_of_its_group_stored(tmp_path):
    """Three batches coalesce into one insert group. Together they touch more than the
    1000 day partitions ClickHouse takes per insert; alone, two are fine and one (1100
    distinct days, the span check disabled) is refused by the store. The writer isolates:
    the two are stored (200), the poison one gets 422 + X-Fleetscope-Retry: no."""
    t = now_ns() - DAY_NS

    def days(first_day: int, n: int) -> bytes:
        rows = []
        for d in range(first_day, first_day + n):
            rows += sample_rows("metrics", 1, t0_ns=t - d * DAY_NS)
        return codec.encode_batch({"metrics": rows})

    good_a, good_b, poison = days(0, 600), days(600, 600), days(1200, 1100)
    with running_server(tmp_path, coalesce_linger_ms=2000, min_insert_rows=100_000, max_batch_span_days=100_000,
                        ttl_days=0, diagnosis_enabled=False) as url:  # fmt: skip
        def send(kb):
            key, body = kb
            return httpx.post(f"{url.api}/ingest", content=body, timeout=120,
                              headers={**ARROW, "Idempotency-Key": key, "X-Fleetscope-Host": "h1"})  # fmt: skip

        with cf.ThreadPoolExecutor(3) as ex:
            ra, rb, rp = ex.map(send, [("good-a", good_a), ("good-b", good_b), ("poison", poison)])
        assert ra.status_code == 200 and rb.status_code == 200, (ra.text, rb.text)
        assert rp.status_code == 422 and "do not retry" in rp.json()["detail"], rp.text
        assert rp.headers["X-Fleetscope-Retry"] == "no"
        stats = httpx.get(f"{url.api}/store/stats", timeout=30).json()
        assert stats["ingest"]["isolations"] >= 1 and stats["ingest"]["poison_422"] == 1
        assert stats["rows"]["metrics"] == 1200
        again = send(("good-a", good_a))
        assert again.status_code == 200 and again.json()["duplicate"]
        # the agent's transport takes the 422 (and a 409) as final: no retry loop
        import threading

        from fleetscope.agent.transport import Transport

        tr = Transport(url, host="h1", timeout_s=60)
        stop = threading.Event()
        timer = threading.Timer(60, stop.set)
        timer.start()
        try:
            res = tr.post_batch(poison, "poison", 0, 0, stop)
            assert (res.outcome, res.status, res.attempts) == ("rejected", 422, 1), res
            res = tr.post_batch(good_b, "good-a", 0, 0, stop)  # good-a's key, other content
            assert (res.outcome, res.status, res.attempts) == ("rejected", 409, 1), res
        finally:
            timer.cancel()
            tr.close()


def test_content_digest_ignores_row_order_not_content():
    """An agent re-sending a pending batch may concatenate its frames in another order:
    still the same batch. Other rows under the same key are not."""
    from fleetscope.collector import content_digest

    t = codec.rows_to_table(RECORD_TYPES["steps"], sample_rows("steps", 6))
    other = codec.rows_to_table(RECORD_TYPES["steps"], sample_rows("steps", 6, t0_ns=now_ns() + 1))
    assert content_digest({"steps": t}) == content_digest({"steps": t.take(pa.array([5, 4, 3, 2, 1, 0]))})
    assert content_digest({"steps": t}) == content_digest({"steps": pa.concat_tables([t.slice(3), t.slice(0, 3)])})
    assert content_digest({"steps": t}) != content_digest({"steps": other})
    assert content_digest({"steps": t}) != content_digest({"steps": t.slice(1)})


def test_limits_are_settings_with_bounds(monkeypatch):
    from fleetscope.server.settings import Settings
    from pydantic import ValidationError

    monkeypatch.setenv("FLEETSCOPE_MAX_DECODED_BYTES", "1048576")
    monkeypatch.setenv("FLEETSCOPE_MAX_RANKS_EXPANDED", "64")
    s = Settings()
    assert (s.max_decoded_bytes, s.max_ranks_expanded, s.max_world_size) == (1048576, 64, 2**20)
    for name, bad in (("max_world_size", 0), ("max_future_s", -1), ("max_inflight_bytes", 10), ("max_symbol_bytes", 1)):
        with pytest.raises(ValidationError, match=name):
            Settings(**{name: bad})
