"""Fault tests of the write path with real processes.

* ``kill -9`` of the server while clients send batches (retrying like an agent: same
  key and body until a 200): after the restart every acknowledged batch is in the store
  exactly once. The test prints the fault table (acknowledged batches lost/duplicated).
* an unwritable store directory at start: one clear error line, exit status 2.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx

from fleetscope import codec
from tests.helpers.data import sample_rows
from tests.helpers.server import ServerProcess

ROWS = 200
BATCHES = 48
SENDERS = 4
ARROW = codec.ARROW_CONTENT_TYPE


def _batch(i: int) -> bytes:
    return codec.encode_batch({"metrics": sample_rows("metrics", ROWS, name=f"fault-batch-{i}", host="client-1")})


def test_kill9_during_ingest_acknowledged_batches_present_exactly_once(tmp_path):
    proc = ServerProcess(tmp_path, diagnosis_enabled=False)
    proc.start()
    url = f"{proc.base_url}/api/v1/ingest"
    acked: dict[int, float] = {}
    retries = [0]
    lock = threading.Lock()
    kills: list[float] = []

    def sender(share: list[int]) -> None:
        with httpx.Client(timeout=30) as c:
            for i in share:
                body = _batch(i)
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline:
                    try:
                        r = c.post(url, content=body, headers={"Content-Type": ARROW, "Idempotency-Key": f"fault-{i}",
                                                               "X-Fleetscope-Host": "client-1"})  # fmt: skip
                        if r.status_code == 200:
                            with lock:
                                acked[i] = time.monotonic()
                            break
                        assert r.status_code in (429, 503), r.text  # never a 4xx for good data
                    except httpx.HTTPError:
                        pass
                    with lock:
                        retries[0] += 1
                    time.sleep(0.2)

    threads = [threading.Thread(target=sender, args=(list(range(k, BATCHES, SENDERS)),)) for k in range(SENDERS)]
    for t in threads:
        t.start()
    try:
        for at in (BATCHES // 3, 2 * BATCHES // 3):  # two crashes, each with requests in flight
            while len(acked) < at and any(t.is_alive() for t in threads):
                time.sleep(0.01)
            proc.kill()  # SIGKILL: no shutdown, no drain
            kills.append(time.monotonic())
            proc.start()
        for t in threads:
            t.join(240)
    finally:
        proc.stop()
    assert len(acked) == BATCHES, f"only {len(acked)} of {BATCHES} batches acknowledged:\n{proc.log()[-3000:]}"

    from fleetscope.server.store import Store

    store = Store.open(f"chdb://{tmp_path / 'store'}", migrate_schema=False)
    try:
        rows = store.query_rows("SELECT name, count() AS n FROM metrics GROUP BY name", {})
    finally:
        store.close()
    count = {r["name"]: int(r["n"]) for r in rows}
    before_kill = [i for i in acked if acked[i] < kills[0]]
    lost = [i for i in acked if count.get(f"fault-batch-{i}", 0) < ROWS]
    dup = [i for i in acked if count.get(f"fault-batch-{i}", 0) > ROWS]
    print(f"\nfault: kill -9 of the server during ingest (x{len(kills)}): {len(acked)} batches "
          f"({len(acked) * ROWS} rows) acknowledged, {len(before_kill)} before the first kill, "
          f"{retries[0]} retries; lost {len(lost)} batches, duplicated {len(dup)} batches")  # fmt: skip
    assert not lost and not dup, (lost, dup, {i: count.get(f"fault-batch-{i}") for i in lost + dup})
    assert set(count) == {f"fault-batch-{i}" for i in range(BATCHES)}
    assert retries[0] > 0  # the kills did interrupt requests


def test_unwritable_store_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for store in (f"chdb://{blocker}/store", "chdb:///proc/fleetscope-store"):
        t0 = time.monotonic()
        r = subprocess.run(
            [sys.executable, "-m", "fleetscope.cli", "server", "--store", store, "--db", f"sqlite:///{tmp_path}/c.db",
             "--port", "0", "--no-ui"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        out = (r.stdout + r.stderr).strip()
        assert r.returncode == 2, (r.returncode, out[-2000:])
        assert "is not writable" in out and store.removeprefix("chdb://") in out, out[-2000:]
        assert "Traceback" not in out and len(out.splitlines()) <= 3, out[-2000:]
        assert time.monotonic() - t0 < 60
