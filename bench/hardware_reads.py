"""The diagnosis pass's hardware reads at fleet scale, with and without the job-start bound.

``loader.hardware_params`` bounds :data:`LOG_EVENTS` and :data:`HW_METRICS_IN` at the
job's start (a host's hardware history from before the job is not the job's finding).
This builds an embedded store holding 10 minutes of GPU metrics of ``--hosts`` hosts x 8
GPUs (one row per GPU, metric name and 10 s; half of them hardware names the query
keeps) and a log event per host, a job that started ``--started-ago`` seconds before
now, and times both reads interleaved: the lookback alone (the previous parameters)
and the bounded one. Prints p50/max of each, their ratio and the rows each returned;
exits 1 if the bounded read returned a row from before the job's start.

    .venv/bin/python bench/hardware_reads.py                 # 1,536 hosts (12,288 ranks)
    .venv/bin/python bench/hardware_reads.py --hosts 128     # 1,024 ranks
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
from fleetscope.server.diagnosis.loader import HW_METRICS_IN, LOG_EVENTS, hardware_params
from fleetscope.server.store.client import Store

NAMES = ["gpu.throttle_reasons", "gpu.ecc_errors", "gpu.util", "gpu.mem_used"]


def build(store: Store, hosts: list[str], now_ns: int, lookback_s: int) -> int:
    ts = np.arange(now_ns - lookback_s * 10**9, now_ns, 10 * 10**9, dtype=np.int64)
    n_dev = 8
    h = np.repeat(np.arange(len(hosts)), n_dev * len(NAMES) * len(ts))
    d = np.tile(np.repeat(np.arange(n_dev), len(NAMES) * len(ts)), len(hosts))
    k = np.tile(np.repeat(np.arange(len(NAMES)), len(ts)), len(hosts) * n_dev)
    t = np.tile(ts, len(hosts) * n_dev * len(NAMES))
    host_arr = np.array(hosts, dtype=object)[h]
    table = pa.table({
        "ts_ns": pa.array(t), "job": pa.array([""] * len(t)), "host": pa.array(host_arr),
        "rank": pa.array(np.full(len(t), -1, dtype=np.int32)), "source": pa.array(["agent"] * len(t)),
        "device": pa.array([f"gpu{i}" for i in d]), "name": pa.array(np.array(NAMES, dtype=object)[k]),
        "value": pa.array(np.zeros(len(t)))})
    store.insert_arrow("metrics", table)
    logs = pa.table({"ts_ns": pa.array(np.full(len(hosts), now_ns - (lookback_s - 5) * 10**9)),
                     "host": pa.array(hosts), "job": pa.array([""] * len(hosts)),
                     "rank": pa.array(np.full(len(hosts), -1, dtype=np.int32)),
                     "kind": pa.array(["xid"] * len(hosts)), "severity": pa.array(["error"] * len(hosts)),
                     "message": pa.array(["NVRM: Xid 79"] * len(hosts))})
    store.insert_arrow("log_events", logs)
    return len(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1536, help="hosts of 8 GPUs (default 1536: 12,288 ranks)")
    ap.add_argument("--lookback", type=int, default=600, help="the pass's lookback, s (default 600)")
    ap.add_argument("--started-ago", type=int, default=300, help="the job started this long ago, s (default 300)")
    ap.add_argument("--repeat", type=int, default=15, help="timed reads of each kind (default 15)")
    a = ap.parse_args(argv)
    for flag, v in (("--hosts", a.hosts), ("--lookback", a.lookback), ("--repeat", a.repeat)):
        if v < 1:
            ap.error(f"{flag} must be >= 1, got {v}")
    if not 0 <= a.started_ago <= a.lookback:
        ap.error(f"--started-ago must be within 0..--lookback ({a.lookback}), got {a.started_ago}")
    work = tempfile.mkdtemp(prefix="fleetscope-hw-reads-")
    store = Store.open(f"chdb://{work}/store", ttl_days=0)
    now = time.time_ns()
    hosts = [f"host-{i:05d}" for i in range(a.hosts)]
    rows = build(store, hosts, now, a.lookback)
    started = now - a.started_ago * 10**9
    p = {"job": "j", "attempt": 0, "since_ns": now - a.lookback * 10**9, "hosts": hosts}
    variants = {"lookback only": p, "bounded at the job's start": hardware_params(p, started)}
    print(f"{a.hosts} hosts, {rows:,} metric rows over {a.lookback} s, job started {a.started_ago} s ago; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    times: dict[str, list[float]] = {k: [] for k in variants}
    got: dict[str, tuple[int, int]] = {}
    bad = 0
    for _ in range(a.repeat):
        for name, params in variants.items():
            t0 = time.perf_counter()
            m = store.query_rows(HW_METRICS_IN, params)
            ev = store.query_rows(LOG_EVENTS, params)
            times[name].append(time.perf_counter() - t0)
            got[name] = (len(m), len(ev))
            if name.startswith("bounded"):
                bad += sum(r["ts_ns"] < started for r in m + ev)
    for name, ts in times.items():
        print(f"  {name:<28} p50 {1e3 * statistics.median(ts):7.1f} ms, max {1e3 * max(ts):7.1f} ms; "
              f"rows returned: metrics {got[name][0]}, log events {got[name][1]}")
    ratio = statistics.median(times["bounded at the job's start"]) / statistics.median(times["lookback only"])
    print(f"  bounded / lookback only: {ratio:.2f}; load average {os.getloadavg()[0]:.2f}")
    store.close()
    if bad:
        print(f"FAIL: the bounded reads returned {bad} rows from before the job started")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
