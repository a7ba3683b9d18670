"""Self-check suite on CUDA: achieved vs. nominal peak for every probe.

Runs the quick suite (timed: it must finish within 30 s per host) and then the full
suite on every local GPU, and prints, per probe, the achieved figure, the datasheet
figure and their ratio. Targets on a GPU in the datasheet table (e.g. an H200: bf16
dense 989 TFLOP/s, HBM3e 4.8 TB/s): matmul >= 70% and memory bandwidth >= 80% of
nominal. Exit status 1 when a target or a probe fails, 0 otherwise; without CUDA it
prints SKIP and exits 0.

    python bench/selfcheck_gpu.py [--quick-only] [--device cuda:0]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

TARGETS = {"matmul": 0.70, "membw": 0.80}
QUICK_LIMIT_S = 30.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (all GPUs) or cuda:N")
    parser.add_argument("--quick-only", action="store_true", help="skip the full suite")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (torch.cuda.is_available() is False)")
        return 0

    from fleetscope.kernels.devices import local_devices
    from fleetscope.kernels.result import format_table
    from fleetscope.kernels.suite import run_suite

    devs = local_devices(args.device)
    print(f"devices: {', '.join(f'{d.device} {d.model}' for d in devs)}; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    for d in devs[:1]:
        print(f"nominal: bf16 {d.peak('bf16'):g} TFLOP/s, memory {d.mem_gbps:g} GB/s "
              f"({d.peak_source})")
    ok = True

    t0 = time.perf_counter()
    quick = run_suite(mode="quick", device=args.device)
    quick_s = time.perf_counter() - t0
    print("\n== quick suite ==")
    print(format_table(quick))
    within = quick_s <= QUICK_LIMIT_S
    print(f"quick suite took {quick_s:.1f} s (limit {QUICK_LIMIT_S:.0f} s): "
          f"{'ok' if within else 'TOO SLOW'}")
    ok &= within

    results = quick
    if not args.quick_only:
        t0 = time.perf_counter()
        results = run_suite(mode="full", device=args.device)
        print(f"\n== full suite ({time.perf_counter() - t0:.1f} s) ==")
        print(format_table(results))

    print("\n== achieved vs. nominal (baseline = datasheet peak) ==")
    print(f"{'probe':<10} {'device':<14} {'variant':<22} {'achieved':>12} {'nominal':>10} "
          f"{'ratio':>7} {'target':>7}  verdict")
    for r in results:
        frac = r.peak_fraction
        target = TARGETS.get(r.probe)
        verdict = "ok" if r.passed else "FAIL"
        if target is not None and not math.isnan(frac) and frac < target:
            verdict = "BELOW TARGET"
        ok &= verdict == "ok"
        print(f"{r.probe:<10} {r.device:<14} {r.variant:<22} {r.value:>9.4g} {r.unit:<3}"
              f"{'' if math.isnan(r.peak) else f'{r.peak:>10g}':>10} "
              f"{'-' if math.isnan(frac) else f'{frac:.1%}':>7} "
              f"{'-' if target is None else f'{target:.0%}':>7}  {verdict}")
    if len(devs) < 2:
        print("collective and p2p probes need 2 or more GPUs: not measured on this host")
    print("RESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
