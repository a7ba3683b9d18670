"""A multi-rank spool writer for the agent tests and benchmark (real processes).

``python tests/agent_writer.py --spool DIR --job J --ranks 8 --steps 40`` starts one
process per rank; each writes ``rank.json`` and frames of ``steps``, ``sections``,
``collectives`` and ``inflight`` records into rotating segments exactly as the hooks'
spool sink does (``fleetscope.spool`` frames of uncompressed Arrow IPC), and at the end
writes ``<spool>/<job>/expected-rank-NNNNN.json``: per record type, the row count and
checksums computed in the writer, the ground truth the tests compare the store with.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import time

from fleetscope import codec, spool
from fleetscope.schema import record_type


def checksum_rows(record: str, rows: list[dict]) -> dict[str, int]:
    """count, sum of the time column, sum of rank*1000003 + step (exact ints)."""
    rt = record_type(record)
    return {
        "count": len(rows),
        "sum_time": sum(r[rt.time_column] for r in rows),
        "sum_key": sum(r["rank"] * 1_000_003 + r.get("step", 0) for r in rows),
    }


class SegmentWriter:
    def __init__(self, directory, segment_bytes: int):
        self.directory = directory
        self.segment_bytes = segment_bytes
        existing = spool.list_segments(directory)
        self.index = spool.segment_index(existing[-1]) + 1 if existing else 0
        self.f = None
        self.size = 0

    def write(self, record: str, rows: list[dict]) -> None:
        table = codec.rows_to_table(record_type(record), rows)
        frame = spool.encode_frame(codec.table_to_ipc(table, compression=None))
        if self.f is None or self.size >= self.segment_bytes:
            if self.f is not None:
                self.f.close()
            self.f = open(self.directory / spool.segment_name(self.index), "ab", buffering=0)
            self.index += 1
            self.size = 0
        self.f.write(frame)
        self.size += len(frame)


def run_rank(a: argparse.Namespace, rank: int) -> None:
    d = spool.rank_dir(a.spool, a.job, rank)
    d.mkdir(parents=True, exist_ok=True)
    spool.write_rank_info(d, {"pid": os.getpid(), "host": socket.gethostname(),
                              "local_rank": rank % 8, "job": a.job, "rank": rank,
                              "started_ns": time.time_ns()})
    w = SegmentWriter(d, a.segment_bytes)
    for record in ("steps", "sections", "collectives", "inflight"):  # warm up lazy imports
        codec.table_to_ipc(codec.rows_to_table(record_type(record), []), compression=None)
    sums: dict[str, dict[str, int]] = {}
    write_times: list[float] = []
    next_at = time.monotonic()
    base = {"job": a.job, "rank": rank, "host": ""}
    for step in range(a.steps):
        t = time.time_ns()
        steps = [{**base, "step": step, "start_ns": t, "end_ns": t + 1000, "duration_ns": 1000,
                  "num_microbatches": a.rows}]
        sections = [{**base, "step": step, "microbatch": m, "name": n, "kind": "compute",
                     "start_ns": t + m * 10 + i, "end_ns": t + m * 10 + i + 5, "duration_ns": 5}
                    for m in range(a.rows) for i, n in enumerate(("forward", "backward"))]
        colls = [{**base, "step": step, "microbatch": m, "group_id": "dp.pp0.tp0", "axis": "dp",
                  "seq": step * a.rows + m + 1, "op": "all_reduce", "bytes": 4096,
                  "enqueued_ns": t + m, "started_ns": t + m, "completed_ns": t + m + 3,
                  "duration_ns": 3} for m in range(a.rows)]
        inflight = [{**base, "ts_ns": t, "step": step, "kind": "collective", "op": "all_reduce",
                     "group_id": "dp.pp0.tp0", "axis": "dp", "seq": step * a.rows + 1,
                     "since_ns": t}]
        for record, rows in (("steps", steps), ("sections", sections),
                             ("collectives", colls), ("inflight", inflight)):
            t0 = time.perf_counter()
            w.write(record, rows)
            write_times.append(time.perf_counter() - t0)
            s = checksum_rows(record, rows)
            acc = sums.setdefault(record, {"count": 0, "sum_time": 0, "sum_key": 0})
            for k, v in s.items():
                acc[k] += v
        if a.interval > 0:
            next_at += a.interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    write_times.sort()
    out = {"records": sums, "max_write_s": write_times[-1] if write_times else 0.0,
           "p99_write_s": write_times[int(0.99 * (len(write_times) - 1))] if write_times else 0.0}
    tmp = d.parent / f".expected-rank-{rank:05d}.json"
    tmp.write_text(json.dumps(out))
    os.replace(tmp, d.parent / f"expected-rank-{rank:05d}.json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--spool", required=True)
    p.add_argument("--job", default="job")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rows", type=int, default=4, help="micro-batches (rows per frame) per step")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between steps")
    p.add_argument("--segment-bytes", type=int, default=64 << 10)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(a, r)) for r in range(a.ranks)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    raise SystemExit(max(pr.exitcode or 0 for pr in procs))


def expected(spool_dir, job: str) -> dict[str, dict[str, int]]:
    """Sum of the writers' expected-rank-*.json files: per record type count and checksums."""
    from pathlib import Path

    total: dict[str, dict[str, int]] = {}
    for f in sorted((Path(spool_dir) / job).glob("expected-rank-*.json")):
        for rec, s in json.loads(f.read_text())["records"].items():
            acc = total.setdefault(rec, {"count": 0, "sum_time": 0, "sum_key": 0})
            for k, v in s.items():
                acc[k] += v
    return total


if __name__ == "__main__":
    main()
