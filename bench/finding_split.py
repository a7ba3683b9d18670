"""Where a straggler finding's time goes: onset -> finding split into evidence, ingest and
serving, from a work directory kept by ``bench/diagnosis.py --keep``.

Per faulty straggler run (a scenario that injects a culprit and expects a straggler kind),
with its onset as the suite measures it (end of step ``onset - 1`` on the injected rank, from
the spool):

* **evidence**: onset -> the end (last rank) of step ``e``, the first step from which the
  straggler detector, replayed on the run's spool step by step, names an injected rank
  with the expected kind. The live loop judges a step once a later one exists, so this is
  what the detector itself needs, on the data it would have had;
* **ingest**: the end of step ``e`` -> the second in which the store held it and the first
  row of step ``e + 1`` (``ingest_batches.written_at`` of the batches holding those rows,
  whole seconds): the hooks' spool writes, the agent's batching and requests, the server's
  insert;
* **serve**: -> the first incident of the expected kind opened (``incidents-*.json``): pass
  scheduling, the pass itself, and any later pass the live detector needed (a negative
  value: the live passes named it from fewer steps than the replay).

The three add up to the suite's "find s" column. Runs the replay never names are listed
without a split. Medians are printed over the runs the suite's onset -> finding target
counts (injected factor >= 1.2).

The store is the server's embedded chDB directory, so the server must have stopped (the
suite stops it before it exits). It is copied first, so the kept directory stays as it was.

    .venv/bin/python bench/diagnosis.py --keep --only compute-stage1,recover-1.4x   # prints its work dir
    .venv/bin/python bench/finding_split.py /tmp/fleetscope-bench-diag-XXXXXXXX
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import diagnosis as suite  # noqa: E402  (a sibling: bench/ is on sys.path)

ARRIVALS_SQL = """
SELECT x.job AS job, x.step AS step,
       toUnixTimestamp(max(b.written_at)) AS last_s, toUnixTimestamp(min(b.written_at)) AS first_s
FROM steps AS x
INNER JOIN (SELECT batch, min(written_at) AS written_at FROM ingest_batches GROUP BY batch) AS b
    ON b.batch = x._batch
WHERE x.job IN {jobs:Array(String)}
GROUP BY x.job, x.step
"""
"""Per (job, step): the first and the last second in which the store took one of the
step's ``steps`` rows (each batch's registry row is written in the same insert)."""


@dataclass
class Split:
    tag: str
    factor: float
    steps: int | None = None
    """Steps after onset the replayed detector needed (e - onset + 1)."""
    evidence_s: float | None = None
    ingest_s: float | None = None
    serve_s: float | None = None
    total_s: float | None = None
    """Onset -> first incident of the expected kind (None: never opened)."""


def step_arrivals(store, jobs: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(job, step) -> (last, first) second in which the store took the step's rows."""
    if not jobs:
        return {}
    df = store.query_df(ARRIVALS_SQL, {"jobs": jobs})
    return {(str(j), int(s)): (int(a), int(b)) for j, s, a, b in zip(df["job"], df["step"], df["last_s"], df["first_s"])}


def evidence_step(names_at: Callable[[int], bool], onset: int, last_step: int) -> int | None:
    """The first step ``e >= onset`` from which the detector names the culprit:
    ``names_at(n)`` runs it on steps ``< n`` (as the live loop, which judges a step once a
    later one exists); ``e = n - 1``."""
    for n in range(onset + 1, last_step + 2):
        if names_at(n):
            return n - 1
    return None


def split(onset_s: float, evidence_end_s: float | None, arrived_s: float | None,
          opened_s: float | None) -> tuple[float | None, float | None, float | None, float | None]:
    """(evidence, ingest, serve, total) seconds; None where a time is missing."""
    total = None if opened_s is None else opened_s - onset_s
    if evidence_end_s is None or arrived_s is None:
        return None, None, None, total
    return (evidence_end_s - onset_s, arrived_s - evidence_end_s,
            None if opened_s is None else opened_s - arrived_s, total)


def run_split(work: Path, tag: str, sc: suite.Scenario, arrivals: dict[tuple[str, int], tuple[int, int]],
              job: str) -> Split:
    from fleetscope.server.diagnosis.breakdown import rank_step_breakdown
    from fleetscope.server.diagnosis.stragglers import detect_stragglers

    from fleetscope.topology import Topology

    dp, tp, pp = sc.layout
    topo = Topology(dp=dp, tp=tp, pp=pp)
    spool_dir = work / "spool" / tag
    out = Split(tag, sc.factor)
    items = json.loads((work / f"incidents-{tag}.json").read_text())
    opened = [i["opened_ns"] / 1e9 for i in items if i["kind"] in sc.expect_kinds]
    onset_ns = suite.job_onset_ns(spool_dir, job, sc.culprits, sc.onset_step, topo.world_size)
    if onset_ns is None:
        return out
    onset = onset_ns / 1e9
    frames = suite.spool_frames(spool_dir, job, topo.world_size)
    bd, arr = rank_step_breakdown(frames["sections"], frames["collectives"], frames["steps"])

    def names_at(n: int) -> bool:
        found = detect_stragglers(job, topo, bd[bd["step"] < n], arr[arr["step"] < n])
        return any(f.kind.value in sc.expect_kinds and f.ranks[:1] and f.ranks[0] in sc.culprits for f in found)

    e = evidence_step(names_at, sc.onset_step, int(bd["step"].max()))
    ends = frames["steps"].groupby("step")["end_ns"].max() / 1e9
    end_s = float(ends[e]) if e is not None and e in ends.index else None
    arrived = None
    if e is not None and (job, e) in arrivals:
        arrived = float(max(arrivals[(job, e)][0], arrivals.get((job, e + 1), (0, 0))[1]))
    out.steps = None if e is None else e - sc.onset_step + 1
    out.evidence_s, out.ingest_s, out.serve_s, out.total_s = split(onset, end_s, arrived,
                                                                   min(opened) if opened else None)
    return out


def straggler_runs(work: Path) -> list[tuple[str, suite.Scenario, str]]:
    """(tag, scenario, job) of each kept faulty straggler run."""
    by = {s.name: s for s in suite.SCENARIOS}
    out = []
    for inc in sorted(work.glob("incidents-*.json")):
        tag = inc.name[len("incidents-"):-len(".json")]
        name = tag.rsplit("-s", 1)[0]
        sc = by.get(name)  # a clean twin's tag ends in -clean-sN: no scenario of that name
        if sc is None or not sc.culprits or not sc.expect_kinds & suite.STRAGGLER:
            continue
        spool_dir = work / "spool" / tag
        jobs = [p.name for p in spool_dir.iterdir() if p.is_dir() and p.name.startswith("bench-")] if spool_dir.is_dir() else []
        if jobs:
            out.append((tag, sc, jobs[0]))
    return out


def _f(x: float | None) -> str:
    return f"{x:7.1f}" if x is not None else f"{'-':>7}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path, help="a work directory kept by bench/diagnosis.py --keep")
    args = ap.parse_args(argv)
    work: Path = args.work
    if not (work / "store").is_dir() or not (work / "spool").is_dir():
        ap.error(f"{work}: not a kept bench/diagnosis.py work directory (no store/ and spool/ in it)")
    runs = straggler_runs(work)
    if not runs:
        ap.error(f"{work}: no straggler runs kept (incidents-<scenario>-s<seed>.json with a straggler scenario)")
    from fleetscope.server.store import Store

    copy = Path(tempfile.mkdtemp(prefix="fleetscope-split-")) / "store"
    shutil.copytree(work / "store", copy, symlinks=True)
    try:
        store = Store.open(f"chdb://{copy}", ttl_days=0, migrate_schema=False)
        try:
            arrivals = step_arrivals(store, [job for _, _, job in runs])
        finally:
            store.close()
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    print(f"{'run':<34}{'factor':>7}{'steps':>6}{'evid s':>8}{'ingest s':>9}{'serve s':>8}{'find s':>8}")
    rows = []
    for tag, sc, job in runs:
        r = run_split(work, tag, sc, arrivals, job)
        rows.append(r)
        print(f"{tag:<34}{r.factor:>7.2f}{(r.steps if r.steps is not None else '-'):>6}{_f(r.evidence_s)} "
              f"{_f(r.ingest_s)}{_f(r.serve_s)} {_f(r.total_s)}", flush=True)
    counted = [r for r in rows if r.factor >= 1.2 and r.evidence_s is not None and r.serve_s is not None]
    print(f"\n{len(counted)} runs with injected factor >= 1.2 split (of {sum(r.factor >= 1.2 for r in rows)}):")
    for name in ("evidence_s", "ingest_s", "serve_s", "total_s"):
        v = np.array([getattr(r, name) for r in counted], dtype=float)
        if len(v):
            print(f"  {name[:-2]:<9} median {np.median(v):5.1f} s   p90 {np.percentile(v, 90):5.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
