"""Time to name a straggler on the real reference trainer, replayed pass by pass.

Two halves, which can run on different machines (the trainer where the cores are quiet,
the replay anywhere):

* ``run``: the reference trainer (``fleetscope train``, 8 gloo ranks, the scenario suite's
  model from ``bench/diagnosis.py``) once per ``--case`` with its straggler injected and
  once without it (same layout, seed and steps; the two alternate, so both see the same
  machine), no server: each rank spools its records under ``OUT/spool``. The cases,
  their ground truth and the machine's load go to ``OUT/manifest.json`` (never into
  telemetry).
* ``replay``: reads every job's spool back, builds the per-rank-per-step breakdown the
  server builds (``rank_step_breakdown``) and runs the straggler detector once per step,
  over the steps complete by then, as the diagnosis loop does (``detect_stragglers``, the
  default ``StragglerConfig``). Per case it prints the per-step noise of the injected
  component (``spool_noise``: the robust sigma of its log ratio to the stage peers), the
  median job step, the steps from onset to the first pass that names the culprit and the
  seconds that took on the job's own clock (onset: the culprit's start of the onset
  step; named: the end of the last step that pass saw, on the slowest rank), the
  reported factor against the injected one, and every finding of the clean twin over
  all its passes (false findings).

* ``suite``: the same replay over every straggler run and clean twin that
  ``bench/diagnosis.py --keep`` left in its work directory, with the detector's default
  configuration and with each ``--compare`` setting (e.g. ``confirm_steps=0``, the
  detector before the short-run confirmation) side by side: per configuration, the clean
  twins with a straggler-kind finding on some pass (``host_contention``, the host's doing,
  counted apart as in the suite), false findings of faulty runs (a rank that is not a
  culprit), culprits never named, and the passes (steps) from onset to naming.

What it leaves out: the pipeline's own delay (agent shipping, ingest, the 2 s diagnosis
tick and the pass's own time), which ``bench/diagnosis.py`` measures through a real
server. This is the statistics' share of "named <= 15 s after onset" on real timings.

    .venv/bin/python bench/straggler_replay.py                         # run + replay, temp dir
    .venv/bin/python bench/straggler_replay.py run --out DIR --case 6:1.2:0 --case 1:1.2:1
    .venv/bin/python bench/straggler_replay.py replay DIR
    .venv/bin/python bench/straggler_replay.py suite /tmp/fleetscope-bench-diag-XXXX --compare confirm_steps=0

Exit 1 (replay) when a clean twin has a finding, or a case's culprit is never named; (suite)
when the default configuration has a false finding or never names a culprit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # siblings: diagnosis.py
import diagnosis as suite  # noqa: E402  (bench/diagnosis.py: model, layout, spool readers)

ONSET = 8
STEPS_TARGET_S = 15.0


@dataclass
class Case:
    rank: int
    factor: float
    seed: int
    layout: tuple[int, int, int] = (2, 2, 2)

    @property
    def name(self) -> str:
        dp, tp, pp = self.layout
        return f"{dp}x{tp}x{pp}-r{self.rank}-{self.factor:g}x-s{self.seed}"


def parse_case(text: str) -> Case:
    """``RANK:FACTOR:SEED[:DPxTPxPP]`` -> :class:`Case` (a usage error names a bad value)."""
    parts = text.split(":")
    try:
        if len(parts) not in (3, 4):
            raise ValueError("expected RANK:FACTOR:SEED[:DPxTPxPP]")
        layout = tuple(int(x) for x in parts[3].lower().split("x")) if len(parts) == 4 else (2, 2, 2)
        if len(layout) != 3 or min(layout) < 1:
            raise ValueError(f"layout {parts[3]!r} is not DPxTPxPP")
        case = Case(int(parts[0]), float(parts[1]), int(parts[2]), layout)  # type: ignore[arg-type]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--case {text!r}: {e}") from None
    world = layout[0] * layout[1] * layout[2]
    if not 0 <= case.rank < world:
        raise argparse.ArgumentTypeError(f"--case {text!r}: rank {case.rank} is not in 0..{world - 1}")
    if case.factor <= 1.0:
        raise argparse.ArgumentTypeError(f"--case {text!r}: factor {case.factor} must be > 1")
    return case


DEFAULT_CASES = ["6:1.2:0", "1:1.2:1", "3:1.2:2:2x1x4"]


def run(out: Path, cases: list[Case], steps: int, extra: list[str], timeout_s: float) -> int:
    """Each case faulty and clean, alternating which goes first; spools under ``out``."""
    spool_dir = out / "spool"
    spool_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"onset_step": ONSET, "steps": steps, "extra": extra, "cpus": os.cpu_count(),
                      "load_before": os.getloadavg(), "runs": []}
    failed = 0
    for i, case in enumerate(cases):
        for clean in ((False, True) if i % 2 == 0 else (True, False)):
            job = f"replay-{case.name}{'-clean' if clean else ''}"
            # gloo on the CPU cores even where a GPU is present (8 ranks cannot share one)
            cmd = [sys.executable, "-m", "fleetscope.cli", "train", "--device", "cpu",
                   *suite.layout_args(case.layout), *extra,
                   "--steps", str(steps), "--job", job, "--seed", str(case.seed), "--spool", str(spool_dir),
                   "--timeout-s", str(int(timeout_s))]
            if not clean:
                cmd += ["--inject", suite._s(case.rank, case.factor, ONSET)]
            t0 = time.time()
            with open(out / f"{job}.log", "wb") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
            wall = time.time() - t0
            failed += rc != 0
            print(f"{job}: exit {rc}, {wall:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
            manifest["runs"].append({"job": job, "clean": clean, "rc": rc, "wall_s": round(wall, 1),
                                     **asdict(case)})
    manifest["load_after"] = os.getloadavg()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 1 if failed else 0


def _step_ends(frames: dict) -> dict[int, int]:
    """step -> the latest end_ns of that step over all ranks (when a pass could see it)."""
    st = frames["steps"]
    return {int(k): int(v) for k, v in st.groupby("step")["end_ns"].max().items()}


def replay_job(spool_dir: Path, job: str, layout: tuple[int, int, int], culprit: int | None,
               onset: int) -> dict:
    """One job's passes: when the culprit is first named, and every other finding."""
    from fleetscope.server.diagnosis.breakdown import rank_step_breakdown
    from fleetscope.server.diagnosis.stragglers import StragglerConfig, detect_stragglers

    from fleetscope.topology import Topology

    dp, tp, pp = layout
    topo = Topology(dp=dp, tp=tp, pp=pp)
    f = suite.spool_frames(spool_dir, job, topo.world_size)
    if f["steps"].empty:
        return {"error": "no step records in the spool"}
    bd, arr = rank_step_breakdown(f["sections"], f["collectives"], f["steps"])
    ends = _step_ends(f)
    last = max(ends)
    cfg = StragglerConfig()
    named_at = None
    factor = component = None
    false: list[str] = []
    passes = 0
    for n in range(cfg.min_steps, last + 1):  # the pass that sees the complete steps < n
        found = detect_stragglers(job, topo, bd[bd["step"] < n], arr[arr["step"] < n], config=cfg)
        passes += 1
        for x in found:
            if culprit is not None and culprit in x.ranks and n > onset:
                if named_at is None:
                    named_at, factor, component = n, x.factor, x.component
                others = set(x.ranks) - {culprit}
                if others:
                    false.append(f"step<{n} {x.kind.value} also {sorted(others)}")
            else:
                false.append(f"step<{n} {x.kind.value} {list(x.ranks)} {x.component}".rstrip())
    out: dict = {"passes": passes, "false": false, "step_s": suite.job_step_s(spool_dir, job, topo.world_size, 2)}
    if culprit is not None:
        onset_ns = suite.onset_ns(spool_dir, job, culprit, onset)
        out["named_steps"] = None if named_at is None else named_at - onset
        out["named_s"] = (None if named_at is None or onset_ns is None
                          else (ends[named_at - 1] - onset_ns) / 1e9)
        out["factor"], out["component"] = factor, component
        out["noise"] = suite.spool_noise(spool_dir, job, layout, culprit, onset, "compute")
    return out


def replay(out: Path) -> int:
    manifest = json.loads((out / "manifest.json").read_text())
    onset = int(manifest["onset_step"])
    spool_dir = out / "spool"
    print(f"runs made on {manifest['cpus']} CPUs, load {manifest['load_before'][0]:.1f} -> "
          f"{manifest['load_after'][0]:.1f}; {manifest['steps']} steps, onset at step {onset}; "
          f"replayed at load {os.getloadavg()[0]:.1f}")
    print(f"{'case':<22}{'noise σ':>8}{'step s':>8}{'ratio':>7}{'named after':>20}"
          f"{'factor':>8}{'clean twin':>12}  false findings")
    bad = 0
    delays: list[float] = []
    by_case: dict[str, dict] = {}
    for r in manifest["runs"]:  # a case's faulty run and its clean twin share its fields
        name = Case(int(r["rank"]), float(r["factor"]), int(r["seed"]), tuple(r["layout"])).name  # type: ignore[arg-type]
        by_case.setdefault(name, {})["clean" if r["clean"] else "fault"] = r
    for name, pair in by_case.items():
        fr, cr = pair.get("fault"), pair.get("clean")
        layout = tuple((fr or cr)["layout"])
        res = replay_job(spool_dir, fr["job"], layout, fr["rank"], onset) if fr else {}
        twin = replay_job(spool_dir, cr["job"], layout, None, onset) if cr else {}
        if "error" in res or "error" in twin:
            print(f"{name:<22} {res.get('error') or twin.get('error')}")
            bad += 1
            continue
        noise = res.get("noise", {})
        if res.get("named_steps") is None:
            named = "never"
            bad += 1
        else:
            named = f"{res['named_steps']} steps, {res['named_s']:.1f} s"
            delays.append(res["named_s"])
        twin_false = len(twin.get("false", []))
        bad += twin_false > 0
        fac = f"{res['factor']:.2f}" if res.get("factor") else "-"
        twin_cell = f"{twin_false}/{twin.get('passes', 0)}"
        print(f"{name:<22}{noise.get('sigma', math.nan):>8.3f}{(res.get('step_s') or math.nan):>8.2f}"
              f"{noise.get('ratio', math.nan):>7.2f}{named:>20}{fac:>8}"
              f"{twin_cell:>12}  "
              f"{'; '.join((res.get('false') or []) + (twin.get('false') or []))[:200]}")
    if delays:
        delays.sort()
        med = delays[len(delays) // 2] if len(delays) % 2 else sum(delays[len(delays) // 2 - 1: len(delays) // 2 + 1]) / 2
        print(f"median onset -> named: {med:.1f} s over {len(delays)} cases (target <= {STEPS_TARGET_S:.0f} s, "
              f"statistics only: no shipping, ingest or tick delay)")
    return 1 if bad else 0


def _suite_job(run_dir: Path, sc: Any, clean: bool, configs: dict[str, Any]) -> dict[str, dict]:
    """Every pass of one kept suite run, per configuration: the steps at which each
    culprit is first named and every other finding (rank, kind)."""
    import pandas as pd  # noqa: F401  (the breakdown's frames)
    from fleetscope.server.diagnosis.breakdown import rank_step_breakdown
    from fleetscope.server.diagnosis.findings import FindingKind
    from fleetscope.server.diagnosis.stragglers import detect_stragglers

    from fleetscope.topology import Topology

    dp, tp, pp = sc.layout
    topo = Topology(dp=dp, tp=tp, pp=pp)
    job = next(p.name for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("bench-"))
    f = suite.spool_frames(run_dir, job, topo.world_size)
    bd, arr = rank_step_breakdown(f["sections"], f["collectives"], f["steps"])
    culprits = set() if clean else set(sc.culprits)
    out: dict[str, dict] = {}
    for label, cfg in configs.items():
        named: dict[int, int] = {}
        false: list[tuple[int, str, int]] = []
        for n in range(cfg.min_steps, int(bd["step"].max()) + 2):
            for x in detect_stragglers(job, topo, bd[bd["step"] < n], arr[arr["step"] < n], config=cfg):
                if x.kind == FindingKind.SLOW_LINK and not clean:  # a group: names its culprit among its ranks
                    for r in culprits & set(x.ranks) if n > sc.onset_step else ():
                        named.setdefault(r, n - sc.onset_step)
                    continue
                r = x.ranks[0]
                if r in culprits and n > sc.onset_step:
                    named.setdefault(r, n - sc.onset_step)
                else:
                    false.append((n, x.kind.value, r))
        out[label] = {"named": named, "false": false, "missed": sorted(culprits - set(named))}
    return out


def replay_suite(work: Path, compare: list[str]) -> int:
    """:func:`replay_job`'s pass-by-pass replay over a kept ``bench/diagnosis.py`` work dir."""
    import dataclasses

    from fleetscope.server.diagnosis.stragglers import StragglerConfig

    configs: dict[str, Any] = {"default": StragglerConfig()}
    for spec in compare:
        key, _, value = spec.partition("=")
        field = {f.name: f for f in dataclasses.fields(StragglerConfig)}.get(key)
        if field is None or not value:
            raise SystemExit(f"--compare {spec!r}: expected FIELD=VALUE with FIELD a StragglerConfig field")
        configs[spec] = dataclasses.replace(StragglerConfig(), **{key: type(getattr(StragglerConfig(), key))(value)})
    runs = sorted(p for p in (work / "spool").iterdir() if p.is_dir()) if (work / "spool").is_dir() else []
    if not runs:
        raise SystemExit(f"{work}: no spool/ of a kept bench/diagnosis.py run (run it with --keep)")
    by_name = {s.name: s for s in suite.SCENARIOS}
    tally = {label: {"clean": 0, "clean_hc": 0, "clean_runs": 0, "false_faulty": 0, "missed": [], "delays": []}
             for label in configs}
    print(f"replaying {len(runs)} kept runs pass by pass (a pass after every step); load {os.getloadavg()[0]:.1f}",
          flush=True)
    for run_dir in runs:
        base = run_dir.name.rsplit("-s", 1)[0]
        clean = base.endswith("-clean")
        sc = by_name.get(base[:-len("-clean")] if clean else base)
        if sc is not None and not sc.inject:  # the suite's fault-free scenario
            clean = True
        if sc is None or not (clean or sc.expect_kinds & suite.STRAGGLER):
            continue
        res = _suite_job(run_dir, sc, clean, configs)
        cells = []
        for label, r in res.items():
            t = tally[label]
            kinds = {k for _, k, _ in r["false"]}
            if clean:
                t["clean_runs"] += 1
                t["clean"] += bool(kinds - {"host_contention"})
                t["clean_hc"] += kinds == {"host_contention"}
            else:
                t["false_faulty"] += bool(r["false"])
                t["missed"] += [f"{run_dir.name}:{c}" for c in r["missed"]]
                t["delays"] += list(r["named"].values())
            first = sorted({(k, rank) for _, k, rank in r["false"]})
            cells.append(f"{label}: named {dict(sorted(r['named'].items()))} false {len(r['false'])} "
                         f"{first[:3]}")
        print(f"{run_dir.name:<34} " + " | ".join(cells), flush=True)
    for label, t in tally.items():
        d = sorted(t["delays"])
        med = d[len(d) // 2] if d else math.nan
        print(f"{label}: clean twins with a straggler finding on some pass {t['clean']}/{t['clean_runs']} "
              f"(host_contention only: {t['clean_hc']}); faulty runs with a finding on a non-culprit "
              f"{t['false_faulty']}; culprits never named {len(t['missed'])} {t['missed']}; onset -> named "
              f"median {med} steps, mean {sum(d) / max(len(d), 1):.2f} over {len(d)}")
    t = tally["default"]
    return 1 if t["clean"] or t["false_faulty"] or t["missed"] else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="run the trainer cases (no server) into --out")
    p = sub.add_parser("replay", help="replay the detector over a run's spools")
    p.add_argument("dir", type=Path, help="the --out of a run")
    q = sub.add_parser("suite", help="replay the detector over a kept bench/diagnosis.py work dir")
    q.add_argument("work", type=Path, help="the work directory bench/diagnosis.py --keep left")
    q.add_argument("--compare", action="append", default=[], metavar="FIELD=VALUE",
                   help="also replay with this StragglerConfig field changed (repeatable), "
                        "e.g. confirm_steps=0")
    for q in (ap, r):
        q.add_argument("--case", action="append", type=parse_case, default=None,
                       help="RANK:FACTOR:SEED[:DPxTPxPP], repeatable (default "
                            + " ".join(DEFAULT_CASES) + ")")
        q.add_argument("--steps", type=int, default=48, help="steps per run (default 48)")
        q.add_argument("--model", default="", help="extra trainer arguments, e.g. '--hidden 512 --seq-len 128' "
                                                   "(default: the scenario suite's model)")
        q.add_argument("--timeout-s", type=float, default=300.0, help="per run (default 300)")
    r.add_argument("--out", type=Path, required=True, help="directory for the spools and manifest.json")
    a = ap.parse_args(argv)
    if a.cmd == "replay":
        return replay(a.dir)
    if a.cmd == "suite":
        return replay_suite(a.work, a.compare)
    cases = a.case or [parse_case(c) for c in DEFAULT_CASES]
    if a.steps < ONSET + 12:
        ap.error(f"--steps {a.steps}: needs at least {ONSET + 12} (onset at step {ONSET})")
    extra = a.model.split()
    if a.cmd == "run":
        return run(a.out, cases, a.steps, extra, a.timeout_s)
    with tempfile.TemporaryDirectory(prefix="straggler-replay-") as d:
        rc = run(Path(d), cases, a.steps, extra, a.timeout_s)
        return max(rc, replay(Path(d)))


if __name__ == "__main__":
    sys.exit(main())
