"""Cost of the noisy what-if next to the noise-free one, per world size, in one run.

A what-if answers "how much faster would the step be with these ranks at their peers'
median" (:func:`fleetscope.server.diagnosis.whatif.whatif`). With the profile's op noise
set it plays ``NOISE_DRAWS`` noisy steps with and without the fix in one event loop
(lanes: draws x DP replicas); its cost grows with ranks x micro-batches x draws for the
draws and with pipeline stages x micro-batches for the loop. Both variants run on the
same profile (DP x TP 8 x PP 8, 8 micro-batches, 5% noise, a 1.3x straggler); the ratio
is printed, and the exit status is 1 when the noisy what-if at the largest size takes
more than 0.5 s (a straggler pass asks a few of them).

    .venv/bin/python bench/whatif_scale.py                 # 512 .. 12,288 ranks
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import numpy as np
from _cli import int_list
from fleetscope.server.diagnosis.whatif import NOISE_DRAWS, StepProfile, whatif

from fleetscope.topology import Topology

LIMIT_S = 0.5


def best_of(fn, n: int = 5) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def measure(world: int, num_mb: int = 8) -> float:
    """Time both what-ifs at ``world`` ranks; returns the noisy one's seconds."""
    topo = Topology(dp=world // 64, tp=8, pp=8)
    n = topo.world_size
    rng = np.random.default_rng(0)
    fwd = rng.uniform(9, 11, (n, num_mb)) * 1e6
    bwd = rng.uniform(18, 22, (n, num_mb)) * 1e6
    slow = n // 3
    fwd[slow] *= 1.3
    bwd[slow] *= 1.3
    noisy = StepProfile(topo, num_mb, fwd, bwd, np.full(n, 5e6), np.full(n, 4e6), {}, "1f1b", 0.0, 0.05)
    quiet = replace(noisy, noise=0.0)
    t_noisy = best_of(lambda: whatif(noisy, ranks=[slow], suspects=[slow]))
    t_quiet = best_of(lambda: whatif(quiet, ranks=[slow], suspects=[slow]))
    w_noisy = whatif(noisy, ranks=[slow], suspects=[slow]).slowdown
    w_quiet = whatif(quiet, ranks=[slow], suspects=[slow]).slowdown
    print(f"{n:6d} ranks: noisy what-if {t_noisy * 1e3:7.1f} ms vs noise-free {t_quiet * 1e3:6.1f} ms "
          f"(x{t_noisy / t_quiet:.1f}); est. slowdown {w_noisy:.3f} vs {w_quiet:.3f}")
    return t_noisy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int_list, default="512,2048,12288", help="world sizes, multiples of 64 (default 512,2048,12288)")
    a = ap.parse_args(argv)
    sizes = a.sizes
    bad = [s for s in sizes if s < 64 or s % 64]
    if bad:
        ap.error(f"--sizes: {bad} are not multiples of 64 (TP 8 x PP 8)")
    print(f"{NOISE_DRAWS} noisy draws per what-if; load average {os.getloadavg()}")
    times = [measure(w) for w in sizes]
    ok = times[-1] <= LIMIT_S
    print(f"{'PASS' if ok else 'FAIL'}: noisy what-if at {sizes[-1]:,} ranks {times[-1]:.3f} s (limit {LIMIT_S} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
