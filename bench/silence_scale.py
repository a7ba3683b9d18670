"""Cost of the host-silence rules at fleet size, next to the absolute rule they replaced.

Per host count (8 GPUs each): ``detect_heartbeat_loss`` on one heartbeat row per rank and
``detect_silence`` on the job's last arrivals, with every host's last sign of life 0-70 s
old (ingest running behind) and one host dead. The baseline is the old absolute rule
(``age > floor``) on the same arrays; the ratio is printed. The new rule costs
O(hosts log hosts) (a median of the others per host); above 64 hosts the fleet's MAD is
used, below it the others' exactly (O(hosts^2), at most 64^2).

    .venv/bin/python bench/silence_scale.py                # 8 .. 1,536 hosts

Exit status 1 unless exactly the dead host is found lost at every size.
"""

from __future__ import annotations

import argparse
import os
import time
from types import SimpleNamespace

import numpy as np
import pandas as pd
from _cli import int_list
from fleetscope.server.diagnosis.health import (
    detect_heartbeat_loss,
    detect_silence,
    silent_beyond_others,
)

S = 1_000_000_000
NOW = 1_800_000_000 * S


def best_of(fn, n: int = 5) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def measure(h: int, rng: np.random.Generator) -> bool:
    """One host count: time the rule, the absolute rule and both whole passes; True when
    exactly the dead host is found lost."""
    ages = rng.uniform(0, 70, h)
    ages[h // 2] = 400.0
    ranks = np.arange(h * 8)
    host_of = np.array([f"node-{r // 8:05d}" for r in ranks])
    hb = pd.DataFrame({"host": host_of, "rank": ranks, "ts_ns": NOW - (ages[ranks // 8] * S).astype("int64"),
                       "alive": 1, "pid": ranks})
    seen = {f"node-{i:05d}": NOW - int(x * S) for i, x in enumerate(ages)}
    frames = SimpleNamespace(hosts={int(r): str(x) for r, x in zip(ranks, host_of)},
                             last_seen={int(r): NOW - 300 * S for r in ranks}, heartbeats=None,
                             host_last_ns={}, steps=pd.DataFrame(), job_seen_ns=NOW - S, last_step=40)
    t_rule = best_of(lambda: silent_beyond_others(ages, 15.0))
    t_old = best_of(lambda: ages > 15.0)
    t_hb = best_of(lambda: detect_heartbeat_loss("j", hb, NOW, stale_s=15.0), 3)
    t_sil = best_of(lambda: detect_silence("j", frames, NOW, 20.0, seen), 3)
    lost = [f.hosts for f in detect_heartbeat_loss("j", hb, NOW, stale_s=15.0)]
    print(f"{h:5d} hosts ({h * 8:6d} ranks): rule {t_rule * 1e3:7.3f} ms vs absolute {t_old * 1e3:6.3f} ms "
          f"(x{t_rule / max(t_old, 1e-9):,.0f}); whole heartbeat pass {t_hb * 1e3:7.1f} ms "
          f"(rule {t_rule / t_hb:.1%} of it); silence pass {t_sil * 1e3:7.1f} ms; "
          f"lost {lost} (absolute rule: {int((ages > 15).sum())})")
    return lost == [(f"node-{h // 2:05d}",)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int_list, default="8,64,256,1536", help="host counts, 8 ranks each (default 8,64,256,1536)")
    a = ap.parse_args(argv)
    sizes = a.hosts
    print(f"load average {os.getloadavg()}")
    rng = np.random.default_rng(0)
    ok = [measure(h, rng) for h in sizes]
    print("PASS: only the dead host is lost at every size" if all(ok) else "FAIL: a wrong set of hosts is lost")
    return 0 if all(ok) else 1


if __name__ == "__main__":
    raise SystemExit(main())
