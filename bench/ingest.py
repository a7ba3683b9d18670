"""Ingest benchmark: raw clickhouse-connect ``insert_arrow`` vs the fleetscope server.

The same generated telemetry (default ≈2.3M rows: a 1,024-rank job, dp=16 tp=8 pp=8,
128 hosts, 4 micro-batches, sections + collectives + step markers + GPU metrics) is
stored twice, in one run:

(a) baseline: one ``insert_arrow`` per record type into a fresh embedded (chDB) store
    created by the same migrations (same tables, same materialized views);
(b) fleetscope: per-host batches in the agent wire format (Arrow IPC, zstd; ~50k rows,
    about the 4 MiB an agent ships at once) POSTed to ``/api/v1/ingest`` of a real
    ``fleetscope server`` on loopback by N concurrent clients (default 16, each one
    agent with one request in flight); timed from the first request to the last
    acknowledgement (an ack means the rows are in the store).

Afterwards the server's store is reopened and every table's row count is checked.
Prints events/s of both and the ratio; exits 1 if rows are missing or a target
(ratio >= 0.7, >= 500k events/s through the server) is missed.

    .venv/bin/python bench/ingest.py [--steps 70] [--clients 16] [--batch-rows 50000]

Both paths pay ClickHouse's fixed cost per INSERT (~40 ms CPU here with the rollup and
registry views); the server keeps it low by coalescing the batches of concurrent
agents into one insert per table, so it needs several agents in flight to do so.
Besides wall-clock rates it prints the CPU seconds of each path, which stay
meaningful when the machine is shared.
"""

from __future__ import annotations

import argparse
import http.client
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
from pathlib import Path

import numpy as np
import pyarrow as pa

from fleetscope import codec
from fleetscope.schema import RECORD_TYPES
from fleetscope.topology import Topology

TARGET_RATIO = 0.7
TARGET_EVENTS_PER_S = 500_000


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------
def _dict(values: list[str], idx: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), pa.array(values))


def generate(steps: int, topo: Topology, num_mb: int, ranks_per_host: int, t0_ns: int) -> dict[str, pa.Table]:
    """Vectorised synthetic telemetry with realistic cardinalities."""
    rng = np.random.default_rng(0)
    world = topo.world_size
    ranks = np.arange(world)
    hosts = [f"node-{h:04d}" for h in range(world // ranks_per_host)]
    step_ns = 2_000_000_000
    out: dict[str, pa.Table] = {}

    def base(n_per: int, rank_idx: np.ndarray, step_idx: np.ndarray) -> dict[str, pa.Array]:
        n = len(rank_idx)
        return {
            "job": _dict(["bench-job"], np.zeros(n, np.int32)),
            "attempt": pa.array(np.zeros(n, np.int32)),
            "rank": pa.array(rank_idx.astype(np.int32)),
            "host": _dict(hosts, rank_idx // ranks_per_host),
            "step": pa.array(step_idx.astype(np.int64)),
        }

    # sections: forward/backward per micro-batch, optimizer, dataloader
    names = ["dataloader"] + [f"{k}" for k in ("forward", "backward")] + ["optimizer"]
    per = 2 + 2 * num_mb
    s_rank = np.repeat(np.tile(ranks, steps), per)
    s_step = np.repeat(np.repeat(np.arange(steps), world), per)
    k = np.tile(np.arange(per), steps * world)
    name_idx = np.where(k == 0, 0, np.where(k == per - 1, 3, 1 + (k - 1) % 2))
    mb = np.where((k == 0) | (k == per - 1), -1, (k - 1) // 2).astype(np.int32)
    kind_idx = np.where(name_idx == 0, 1, np.where(name_idx == 3, 2, 0))
    dur = rng.integers(5_000_000, 60_000_000, len(k))
    start = t0_ns + s_step * step_ns + k * 70_000_000 + s_rank * 1000
    cols = base(per, s_rank, s_step)
    cols.update(
        microbatch=pa.array(mb),
        name=_dict(names, name_idx),
        kind=_dict(["compute", "dataloader", "optimizer"], kind_idx),
        start_ns=pa.array(start),
        end_ns=pa.array(start + dur),
        duration_ns=pa.array(dur),
        device_ns=pa.array(np.full(len(k), -1, np.int64)),
    )
    out["sections"] = codec.conform(RECORD_TYPES["sections"], pa.table(cols))

    # collectives: TP all_reduce x2 per micro-batch, PP send+recv per micro-batch, DP x2
    per = 2 * num_mb + 2 * num_mb + 2
    c_rank = np.repeat(np.tile(ranks, steps), per)
    c_step = np.repeat(np.repeat(np.arange(steps), world), per)
    k = np.tile(np.arange(per), steps * world)
    axis_idx = np.where(k < 2 * num_mb, 1, np.where(k < 4 * num_mb, 2, 0))  # dp, tp, pp
    op_idx = np.where(axis_idx == 1, 0, np.where(axis_idx == 2, 1 + k % 2, 3 + k % 2))
    tp_groups = [topo.group_id("tp", r) for r in range(world)]
    dp_groups = [topo.group_id("dp", r) for r in range(world)]
    pp_groups = [topo.group_id("pp", r) for r in range(world)]
    gvals = sorted(set(tp_groups + dp_groups + pp_groups))
    gindex = {g: i for i, g in enumerate(gvals)}
    g_of = np.array([[gindex[dp_groups[r]], gindex[tp_groups[r]], gindex[pp_groups[r]]] for r in range(world)])
    group_idx = g_of[c_rank, axis_idx]
    dur = rng.integers(100_000, 20_000_000, len(k))
    enq = t0_ns + c_step * step_ns + k * 30_000_000 + c_rank * 1000
    cols = base(per, c_rank, c_step)
    cols.update(
        microbatch=pa.array(np.where(axis_idx == 0, -1, (k % (2 * num_mb)) // 2).astype(np.int32)),
        group_id=_dict(gvals, group_idx),
        axis=_dict(["dp", "tp", "pp"], axis_idx),
        group_rank=pa.array(np.zeros(len(k), np.int32)),
        group_size=pa.array(np.where(axis_idx == 1, topo.tp, np.where(axis_idx == 2, topo.pp, topo.dp)).astype(np.int32)),
        seq=pa.array((c_step * per + k + 1).astype(np.int64)),
        op=_dict(["all_reduce", "send", "recv", "reduce_scatter", "all_gather"], op_idx),
        bytes=pa.array(rng.integers(1 << 20, 1 << 28, len(k))),
        dtype=_dict(["bfloat16"], np.zeros(len(k), np.int32)),
        peer=pa.array(np.where(axis_idx == 2, (c_rank + topo.tp * topo.dp) % world, -1).astype(np.int32)),
        state=_dict(["completed"], np.zeros(len(k), np.int32)),
        enqueued_ns=pa.array(enq),
        started_ns=pa.array(enq + 1000),
        completed_ns=pa.array(enq + 1000 + dur),
        duration_ns=pa.array(dur),
    )
    out["collectives"] = codec.conform(RECORD_TYPES["collectives"], pa.table(cols))

    # step markers
    st_rank = np.tile(ranks, steps)
    st_step = np.repeat(np.arange(steps), world)
    start = t0_ns + st_step * step_ns
    cols = base(1, st_rank, st_step)
    dur = rng.integers(1_800_000_000, 2_000_000_000, len(st_rank))
    cols.update(start_ns=pa.array(start), end_ns=pa.array(start + dur), duration_ns=pa.array(dur))
    out["steps"] = codec.conform(RECORD_TYPES["steps"], pa.table(cols))

    # GPU metrics: 10 metrics per GPU, one sample per step
    metric_names = [f"gpu.{m}" for m in ("util", "mem_used", "power_w", "temp_c", "sm_clock", "mem_clock", "pcie_rx", "pcie_tx", "ecc_sbe", "xid")]
    per = len(metric_names)
    m_rank = np.repeat(np.tile(ranks, steps), per)
    m_step = np.repeat(np.repeat(np.arange(steps), world), per)
    k = np.tile(np.arange(per), steps * world)
    out["metrics"] = codec.conform(
        RECORD_TYPES["metrics"],
        pa.table(
            {
                "ts_ns": pa.array(t0_ns + m_step * step_ns + 5_000_000),
                "job": _dict(["bench-job"], np.zeros(len(k), np.int32)),
                "host": _dict(hosts, m_rank // ranks_per_host),
                "rank": pa.array(m_rank.astype(np.int32)),
                "source": _dict(["gpu"], np.zeros(len(k), np.int32)),
                "device": _dict([f"gpu{i}" for i in range(ranks_per_host)], m_rank % ranks_per_host),
                "name": _dict(metric_names, k),
                "value": pa.array(rng.random(len(k)) * 100),
            }
        ),
    )
    return out


def split_by_host(tables: dict[str, pa.Table], num_hosts: int, batch_rows: int) -> list[bytes]:
    """Per-host-group batches in the wire format (what agents send)."""
    import pyarrow.compute as pc

    total = sum(t.num_rows for t in tables.values())
    hosts_per_batch = max(1, round(batch_rows / (total / num_hosts)))
    host_idx = {n: pc.cast(pc.divide(t["rank"], 8), pa.int32()) for n, t in tables.items()}
    bodies = []
    for h0 in range(0, num_hosts, hosts_per_batch):
        batch = {}
        for n, t in tables.items():
            idx = host_idx[n]
            mask = pc.and_(pc.greater_equal(idx, h0), pc.less(idx, h0 + hosts_per_batch))
            batch[n] = t.filter(mask)
        bodies.append(codec.encode_batch(batch, compression="zstd"))
    return bodies


# ---------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------
def _cpu_self() -> float:
    t = os.times()
    return t.user + t.system


def _cpu_pid(pid: int) -> float:
    """user + system CPU seconds of a process (and its threads) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_baseline(tables: dict[str, pa.Table], path: Path) -> tuple[float, float]:
    from fleetscope.server.store import Store

    store = Store.open(f"chdb://{path}")
    cpu0 = _cpu_self()
    t0 = time.perf_counter()
    for name, table in tables.items():
        # with a dedup token like the server's inserts (otherwise ClickHouse hashes
        # every block for deduplication, which would handicap the baseline)
        store.client.insert_arrow(name, table, settings={"insert_deduplication_token": f"raw-{name}"})
    elapsed = time.perf_counter() - t0
    cpu = _cpu_self() - cpu0
    store.close()
    return elapsed, cpu


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, FLEETSCOPE_LOG_LEVEL="warning", FLEETSCOPE_UI="false")
    cmd = [
        sys.executable, "-m", "fleetscope.cli", "server", "--no-ui",
        "--store", f"chdb://{workdir / 'store'}", "--db", f"sqlite:///{workdir / 'control.db'}",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(workdir / "server.log", "wb"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {(workdir / 'server.log').read_text()}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("server not ready")


def run_server(bodies: list[bytes], port: int, num_clients: int) -> float:
    work = list(enumerate(bodies))
    lock = threading.Lock()
    errors: list[str] = []
    start = threading.Barrier(num_clients + 1)

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        start.wait()
        while True:
            with lock:
                if not work:
                    return
                i, body = work.pop(0)
            headers = {
                "Content-Type": codec.ARROW_CONTENT_TYPE,
                "Idempotency-Key": f"bench-{i}",
                "X-Fleetscope-Host": f"agent-{i}",
            }
            while True:
                conn.request("POST", "/api/v1/ingest", body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.status == 429:
                    time.sleep(float(resp.getheader("Retry-After", "1")))
                    continue
                if resp.status != 200:
                    errors.append(f"batch {i}: {resp.status} {data[:300]!r}")
                break

    threads = [threading.Thread(target=client) for _ in range(num_clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise SystemExit("ingest errors:\n" + "\n".join(errors[:5]))
    return elapsed


def count_rows(path: Path) -> dict[str, int]:
    from fleetscope.server.store import Store

    store = Store.open(f"chdb://{path}", migrate_schema=False)
    try:
        return {n: int(store.command(f"SELECT count() FROM `{n}`")) for n in RECORD_TYPES}
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=70, help="training steps to generate (70 -> ~2.3M rows)")
    ap.add_argument(
        "--clients", type=int, default=16,
        help="concurrent HTTP clients, each standing for one agent (default 16; >= 4)",
    )  # fmt: skip
    ap.add_argument("--batch-rows", type=int, default=50_000, help="approximate rows per POSTed batch")
    ap.add_argument("--workdir", type=Path, default=None, help="keep stores here (default: a temp dir)")
    args = ap.parse_args()

    topo = Topology(dp=16, tp=8, pp=8)
    t0_ns = time.time_ns() - args.steps * 2_000_000_000
    tables = generate(args.steps, topo, num_mb=4, ranks_per_host=8, t0_ns=t0_ns)
    total = sum(t.num_rows for t in tables.values())
    bodies = split_by_host(tables, topo.world_size // 8, args.batch_rows)
    mb = sum(len(b) for b in bodies) / 2**20
    print(f"generated {total:,} rows ({', '.join(f'{n} {t.num_rows:,}' for n, t in tables.items())})")
    print(f"wire: {len(bodies)} batches, {mb:.1f} MiB zstd Arrow, {args.clients} clients")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fleetscope-bench-"))
    try:
        base_s, base_cpu = run_baseline(tables, workdir / "raw")
        base_rate = total / base_s
        print(f"(a) raw insert_arrow into chdb:      {base_rate:12,.0f} events/s  ({base_s:.2f} s, {base_cpu:.2f} CPU-s)")

        port = free_port()
        proc = start_server(workdir, port)
        try:
            srv_cpu0, cli_cpu0 = _cpu_pid(proc.pid), _cpu_self()
            srv_s = run_server(bodies, port, args.clients)
            srv_cpu, cli_cpu = _cpu_pid(proc.pid) - srv_cpu0, _cpu_self() - cli_cpu0
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/readyz")
            stats = json.loads(c.getresponse().read())["ingest"]
            print(
                f"    writer: {stats['groups']} groups, {stats['inserts']} inserts, busy {stats['write_s']:.2f} s "
                f"(registry lookups {stats['lookup_s']:.2f} s, inserts {stats['insert_s']:.2f} s)"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        srv_rate = total / srv_s
        print(
            f"(b) POST /api/v1/ingest (server):    {srv_rate:12,.0f} events/s  ({srv_s:.2f} s, "
            f"{srv_cpu:.2f} CPU-s server + {cli_cpu:.2f} CPU-s clients)"
        )
        print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (figures are wall-clock)")
        ratio = srv_rate / base_rate
        print(f"ratio server/raw: {ratio:.2f}  (targets: ratio >= {TARGET_RATIO}, server >= {TARGET_EVENTS_PER_S:,} events/s)")

        counts = count_rows(workdir / "store")
        missing = {n: (counts[n], t.num_rows) for n, t in tables.items() if counts[n] != t.num_rows}
        if missing:
            print(f"FAIL: stored row counts differ (stored, sent): {missing}")
            return 1
        print(f"all {total:,} rows stored exactly once")
        ok = ratio >= TARGET_RATIO and srv_rate >= TARGET_EVENTS_PER_S
        print("targets met" if ok else "FAIL: targets missed")
        return 0 if ok else 1
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
