"""Agent throughput: records/s shipped spool -> real server, vs. the server's direct ingest rate.

One run, one real server (``fleetscope server``, chdb store, loopback):

1. *direct*: a client POSTs pre-encoded batches (the same records, the same batch size,
   zstd, one record batch per request like the agent's bodies, and as many requests in
   flight as the agent's ``--in-flight``) to ``/api/v1/ingest`` -> the server's ingest
   rate on this machine;
2. *agent*: a real ``fleetscope agent`` process ships a pre-written spool of the same
   records (N ranks, frames of ``--rows-per-frame`` rows) -> the agent's rate, and its
   CPU time (utime + stime from /proc) over the shipping interval.

Prints both rates, the ratio agent/direct (target >= 0.8) and the agent's CPU cost
per 100k records/s (CPU cores busy at 100k records/s), with the load average (the
machine may be shared: compare ratios, not absolute rates). Exit status 1 if the ratio
is below ``--min-ratio``.

    .venv/bin/python bench/agent_throughput.py --records 400000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa

from fleetscope import codec, spool
from fleetscope.schema import record_type

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def section_table(job: str, rank: int, first: int, n: int) -> pa.Table:
    """``n`` sections rows (canonical schema), built column-wise."""
    i = np.arange(first, first + n, dtype=np.int64)
    start = 1_790_000_000_000_000_000 + i * 1000
    cols = {"job": pa.array([job] * n), "rank": pa.array(np.full(n, rank, np.int32)),
            "host": pa.array(["bench"] * n), "step": pa.array(i // 64),
            "microbatch": pa.array((i % 8).astype(np.int32)),
            "name": pa.array(np.where(i % 2 == 0, "forward", "backward").tolist()),
            "kind": pa.array(["compute"] * n), "start_ns": pa.array(start),
            "end_ns": pa.array(start + 700), "duration_ns": pa.array(np.full(n, 700, np.int64))}
    return codec.conform(record_type("sections"), pa.table(cols))


def tables(job: str, num_ranks: int, records: int, rows_per_frame: int):
    """(rank, table) frames, round-robin over ranks, ``records`` rows in all."""
    out, done, i = [], 0, 0
    while done < records:
        n = min(rows_per_frame, records - done)
        rank = i % num_ranks
        out.append((rank, section_table(job, rank, done, n)))
        done, i = done + n, i + 1
    return out


def write_spool(spool_dir: Path, job: str, frames, segment_bytes: int) -> int:
    files: dict[int, tuple] = {}
    total = 0
    for rank, t in frames:
        d = spool.rank_dir(spool_dir, job, rank)
        if rank not in files:
            d.mkdir(parents=True, exist_ok=True)
            spool.write_rank_info(d, {"pid": -1, "host": "bench", "local_rank": rank, "job": job,
                                      "rank": rank})
            files[rank] = [None, 0, 0]
        f, idx, size = files[rank]
        if f is None or size >= segment_bytes:
            if f is not None:
                f.close()
            f = open(d / spool.segment_name(idx), "ab")
            idx, size = idx + 1, 0
        data = spool.encode_frame(codec.table_to_ipc(t, compression=None))
        f.write(data)
        files[rank] = [f, idx, size + len(data)]
        total += len(data)
    for f, _, _ in files.values():
        f.close()
    return total


def start_server(workdir: Path, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["FLEETSCOPE_UI"] = "false"
    log = open(workdir / "server.log", "ab")
    p = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "server", "--store",
                          f"chdb://{workdir / 'store'}", "--db", f"sqlite:///{workdir / 'control.db'}",
                          "--port", str(port), "--no-ui"], cwd=workdir, env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"server exited: {(workdir / 'server.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("server not ready in 120 s")


def direct(url: str, frames, rows_per_batch: int, in_flight: int, name: str) -> tuple[float, int]:
    """Rows/s for pre-encoded batches POSTed with ``in_flight`` requests at a time.

    Keys are unique per run (``name``): a key the server already has is answered as a
    duplicate without an insert, which would inflate the direct rate.
    """
    def body(ts: list[pa.Table]) -> bytes:  # as the agent encodes: one record batch
        return codec.encode_batch({"sections": pa.concat_tables(ts).combine_chunks()})

    bodies, cur, n = [], [], 0
    for _, t in frames:
        cur.append(t)
        n += t.num_rows
        if n >= rows_per_batch:
            bodies.append((body(cur), n))
            cur, n = [], 0
    if cur:
        bodies.append((body(cur), n))
    todo = iter(enumerate(bodies))
    lock = threading.Lock()

    def post_all(c: httpx.Client) -> int:
        rows = 0
        while True:
            with lock:
                item = next(todo, None)
            if item is None:
                return rows
            i, (data, k) = item
            r = c.post(f"{url}/api/v1/ingest", content=data, headers={
                "Content-Type": codec.ARROW_CONTENT_TYPE, "Idempotency-Key": f"bench-{name}-{i}"})
            r.raise_for_status()
            if r.json().get("duplicate"):
                raise SystemExit(f"direct batch {i} was answered as a duplicate (not inserted)")
            rows += k

    with httpx.Client(timeout=120) as c, ThreadPoolExecutor(in_flight) as pool:
        t0 = time.perf_counter()
        rows = sum(pool.map(post_all, [c] * in_flight))
        dt = time.perf_counter() - t0
    return rows / dt, rows


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def acked_all(spool_dir: Path, job: str) -> bool:
    """Every segment of ``job`` acknowledged (offsets only move after an ack)."""
    try:
        st = json.loads((spool_dir / ".fleetscope-agent" / "offsets.json").read_text())
    except (OSError, ValueError):
        return False
    for seg in spool_dir.glob(f"{job}/rank-*/seg-*.fsp"):
        e = st["files"].get(str(seg.relative_to(spool_dir)))
        if e is None or e["offset"] < seg.stat().st_size:
            return False
    return True


def agent_run(url: str, spool_dir: Path, job: str, records: int, batch: str,
              compression: str, in_flight: int) -> tuple[float, float, float]:
    """(rows/s, agent CPU seconds, wall seconds) from the first request to the last ack."""
    log = open(spool_dir.parent / "agent.log", "ab")
    p = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "agent", "--server", url,
                          "--spool", str(spool_dir), "--job", job, "--no-clock-sync",
                          "--batch-bytes", batch, "--compression", compression,
                          "--in-flight", str(in_flight),
                          "--metrics-interval", "600", "--heartbeat", "600", "--log-level", os.environ.get("BENCH_AGENT_LOG", "WARNING")],
                         cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    state = spool_dir / ".fleetscope-agent" / "offsets.json"
    try:
        while not state.exists():  # written just before the first POST
            if p.poll() is not None:
                raise SystemExit("agent exited early; see agent.log")
            time.sleep(0.005)
        t0, cpu0 = time.perf_counter(), proc_cpu_s(p.pid)
        while not acked_all(spool_dir, job):
            time.sleep(0.02)
        dt, cpu = time.perf_counter() - t0, proc_cpu_s(p.pid) - cpu0
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
    return records / dt, cpu, dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=400_000, help="records per side (default 400k)")
    ap.add_argument("--ranks", type=int, default=8, help="spool ranks (default 8)")
    ap.add_argument("--rows-per-frame", type=int, default=500, help="rows per spool frame (default 500)")
    ap.add_argument("--batch-bytes", default="4M", help="agent --batch-bytes (default 4M)")
    ap.add_argument("--compression", default="zstd", choices=["zstd", "lz4", "none"])
    ap.add_argument("--in-flight", type=int, default=4,
                    help="agent --in-flight, and the direct client's concurrent requests (default 4)")
    ap.add_argument("--min-ratio", type=float, default=0.8, help="exit 1 below this ratio (default 0.8)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternate direct and agent runs this many times (default 2; evens out "
                         "load changes on a shared machine)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleetscope-bench-agent-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(work, port)
    direct_s = agent_s = cpu_s = 0.0
    try:
        for r in range(a.rounds):
            spool_dir = work / f"spool{r}"
            frames = tables(f"bench-agent{r}", a.ranks, a.records, a.rows_per_frame)
            nbytes = write_spool(spool_dir, f"bench-agent{r}", frames, 8 << 20)
            rows_per_batch = int(a.records * _parse_size(a.batch_bytes) / nbytes) or 1
            rate, _ = direct(url, tables(f"bench-direct{r}", a.ranks, a.records, a.rows_per_frame),
                             rows_per_batch, a.in_flight, f"direct{r}")
            direct_s += a.records / rate
            rate, cpu, wall = agent_run(url, spool_dir, f"bench-agent{r}", a.records,
                                        a.batch_bytes, a.compression, a.in_flight)
            agent_s += wall
            cpu_s += cpu
            print(f"round {r}: direct {a.records * (r + 1) / direct_s:,.0f} records/s so far, "
                  f"agent {rate:,.0f} records/s", file=sys.stderr)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    total = a.records * a.rounds
    direct_rate, agent_rate, wall_s = total / direct_s, total / agent_s, agent_s
    ratio = agent_rate / direct_rate
    cores_per_100k = (cpu_s / wall_s) / (agent_rate / 100_000)
    print(f"records per side          {total} in {a.rounds} alternating rounds ({a.ranks} ranks, "
          f"{a.rows_per_frame} rows/frame, spool {nbytes / 2**20:.1f} MiB per round, "
          f"batch {a.batch_bytes} ~{rows_per_batch} rows, {a.compression}, "
          f"{a.in_flight} in flight)")
    print(f"server direct ingest      {direct_rate:12,.0f} records/s  ({direct_s:.2f} s)")
    print(f"agent spool -> server     {agent_rate:12,.0f} records/s  ({wall_s:.2f} s)")
    print(f"ratio agent/direct        {ratio:12.2f}   (target >= {a.min_ratio})")
    print(f"agent CPU                 {cpu_s:12.2f} s = {cpu_s / wall_s:.2f} cores; "
          f"{cores_per_100k:.2f} cores per 100k records/s")
    print(f"load average              {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} CPUs")
    return 0 if ratio >= a.min_ratio else 1


def _parse_size(text: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("b").rstrip("i")
    return int(float(t[:-1]) * mult[t[-1]]) if t[-1] in mult else int(t)


if __name__ == "__main__":
    sys.exit(main())
