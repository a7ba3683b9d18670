"""Diagnosis scenario suite: the real reference trainer through the real server.

For each scenario it runs ``fleetscope train`` (8 ranks, dp=2 tp=2 pp=2, gloo on CPU)
with an injected fault, a real host agent shipping the spool to a real server
(default settings: hang_min_s=30, hang_k=5, hang_op_min_s=20, 2 s diagnosis tick) and a real webhook
receiver on loopback. Per scenario it prints the detected kinds, culprit ranks vs the
injected ones, and the time from fault onset (read from the rank's own step records in
the spool) to the first matching incident and to the webhook delivery; for a hang, the
rule that fired and where the time went (onset -> last op completion, threshold,
data lag + pass scheduling, pass duration, dispatch, delivery). At the end:
straggler precision/recall, culprit accuracy on hang/crash scenarios, findings on the
clean run, and hang -> webhook latency against the 30 s target.

    .venv/bin/python bench/diagnosis.py                 # the whole suite (~15 min on 2 CPUs)
    .venv/bin/python bench/diagnosis.py --only clean,hang-compute
    .venv/bin/python bench/diagnosis.py --sweep          # detection floor vs timing noise (synthetic)

Exit status 1 when a target is missed.
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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from fleetscope import codec, spool

PY = sys.executable
STRAGGLER = {"slow_compute", "slow_dataloader", "late_arrival", "slow_link", "gc_pause"}
HANGS = {"hang"}
HANG_WEBHOOK_TARGET_S = 30.0
COMMON = ["--dp", "2", "--tp", "2", "--pp", "2", "--hidden", "128", "--seq-len", "64",
          "--global-batch", "8", "--microbatches", "4", "--load-cost-ms", "5"]


@dataclass
class Scenario:
    name: str
    inject: list[str]
    expect_kinds: set[str]
    culprits: set[int]
    onset_step: int
    steps: int = 48
    timeout_s: float = 240.0
    group_axis: str = ""
    """slow link: findings name the group of this axis that holds the injected rank."""


SCENARIOS = [
    Scenario("clean", [], set(), set(), 0),
    Scenario("compute-stage0", ["straggler:rank=1:factor=1.5:from_step=8"], {"slow_compute"}, {1}, 8),
    Scenario("compute-stage1", ["straggler:rank=6:factor=1.5:from_step=8"], {"slow_compute"}, {6}, 8),
    Scenario("compute-stage1-1.2x", ["straggler:rank=5:factor=1.2:from_step=8"], {"slow_compute"}, {5}, 8),
    Scenario("compute-stage0-1.1x", ["straggler:rank=3:factor=1.1:from_step=8"], {"slow_compute"}, {3}, 8),
    Scenario("dataloader", ["straggler:rank=2:factor=40:from_step=8:section=dataloader"],
             {"slow_dataloader"}, {2}, 8),
    Scenario("slow-tp-link", ["slowlink:group=tp:rank=3:delay_ms=15"], {"slow_link"}, {3}, 1, group_axis="tp"),
    Scenario("slow-dp-link", ["slowlink:group=dp:rank=4:delay_ms=150"], {"slow_link"}, {4}, 1, group_axis="dp"),
    Scenario("gc-pauses", ["gc:rank=7:every=3:pause_ms=400"], {"gc_pause"}, {7}, 3),
    Scenario("two-stragglers", ["straggler:rank=0:factor=1.5:from_step=8",
                                "straggler:rank=6:factor=1.5:from_step=8"], {"slow_compute"}, {0, 6}, 8),
    Scenario("hang-compute", ["hang:rank=5:step=6:where=compute"], HANGS, {5}, 6, steps=60),
    Scenario("hang-tp-collective", ["hang:rank=2:step=6:where=collective"], HANGS, {2}, 6, steps=60),
    Scenario("hang-pp-p2p", ["hang:rank=1:step=6:where=p2p"], HANGS, {1}, 6, steps=60),
    # a link/NCCL fault: both members of the TP group are inside the op, neither completes
    Scenario("link-fault-in-tp-collective", ["hang:rank=2:step=6:where=in_collective"], HANGS, {2, 3}, 6,
             steps=60),
    Scenario("crash", ["crash:rank=3:step=6"], HANGS, {3}, 6, steps=60),
]


class Receiver:
    """Webhook receiver on loopback; records (arrival time, payload)."""

    def __init__(self) -> None:
        self.got: list[tuple[float, dict]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((time.time(), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/alerts"

    def first_for(self, job: str, alertnames: set[str]) -> float | None:
        return self.first_alert(job, alertnames)[0]

    def first_alert(self, job: str, alertnames: set[str]) -> tuple[float | None, dict]:
        """Arrival time and alert object of the first firing alert of ``job``."""
        for t, p in self.got:
            for a in p["alerts"]:
                if a["labels"].get("job") == job and a["labels"]["alertname"] in alertnames and a["status"] == "firing":
                    return t, a
        return None, {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env["FLEETSCOPE_UI"] = "false"
    env["FLEETSCOPE_WEBHOOK_ALLOW"] = "127.0.0.1"  # the bench's receiver is on loopback
    proc = subprocess.Popen(
        [PY, "-m", "fleetscope.cli", "server", "--store", f"chdb://{work / 'store'}",
         "--db", f"sqlite:///{work / 'control.db'}", "--host", "127.0.0.1", "--port", str(port)],
        stdout=open(work / "server.log", "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not start; see " + str(work / "server.log"))


def onset_ns(spool_dir: Path, job: str, rank: int, step: int) -> int | None:
    """End of step ``step - 1`` on ``rank`` (= start of ``step``) from its spool records."""
    best = None
    d = spool.rank_dir(spool_dir, job, rank)
    for seg in spool.list_segments(d):
        for fr in spool.read_frames(seg):
            if fr.corrupt:
                continue
            t = codec.ipc_to_table(fr.payload)
            if t.schema.metadata.get(b"fleetscope.record") != b"steps":
                continue
            for s, start, end in zip(t["step"].to_pylist(), t["start_ns"].to_pylist(), t["end_ns"].to_pylist()):
                if s == step - 1:
                    best = end
                elif s == step and best is None:
                    best = start
    return best


def job_onset_ns(spool_dir: Path, job: str, ranks: set[int], step: int) -> int | None:
    """Onset on the injected rank; if its records died with it (crash), the earliest
    end of step ``step - 1`` on any rank."""
    t = onset_ns(spool_dir, job, min(ranks), step)
    if t is not None:
        return t
    found = [onset_ns(spool_dir, job, r, step) for r in range(8)]
    found = [x for x in found if x is not None]
    return min(found) if found else None


@dataclass
class Result:
    name: str
    kinds: list[str] = field(default_factory=list)
    culprits: list[int] = field(default_factory=list)
    injected: list[int] = field(default_factory=list)
    to_finding_s: float | None = None
    to_webhook_s: float | None = None
    straggler_findings: list[tuple[str, list[int], str]] = field(default_factory=list)
    hang_class: str = ""
    threshold_s: float | None = None
    detected_by: str = ""
    load_1m: float | None = None
    paged_culprits: list[int] = field(default_factory=list)
    """Culprit ranks in the first firing alert (the table shows the incident's latest)."""
    stages: dict[str, float] = field(default_factory=dict)
    """hang latency split (s): onset -> quiet (ops still completing after onset), stall
    threshold, crossing -> diagnosis pass (data lag + pass scheduling), pass -> outbox row
    (pass duration), outbox -> delivered, delivered -> receiver."""
    ok: bool = False


def run_scenario(sc: Scenario, api: str, rx: Receiver, work: Path, http: httpx.Client) -> Result:
    job = f"bench-{sc.name}-{int(time.time())}"
    spool_dir = work / "spool" / sc.name
    agent = subprocess.Popen([PY, "-m", "fleetscope.cli", "agent", "--server", api.rsplit("/api/v1", 1)[0],
                              "--spool", str(spool_dir), "--job", job, "--retain-acked", "--no-gpu"],
                             stdout=open(work / f"agent-{sc.name}.log", "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    cmd = [PY, "-m", "fleetscope.cli", "train", *COMMON, "--steps", str(sc.steps), "--job", job,
           "--spool", str(spool_dir), "--timeout-s", str(int(sc.timeout_s))]
    for spec in sc.inject:
        cmd += ["--inject", spec]
    t_start = time.time()
    trainer = subprocess.Popen(cmd, stdout=open(work / f"train-{sc.name}.log", "ab"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    first_seen: dict[str, float] = {}
    res = Result(sc.name, injected=sorted(sc.culprits))
    deadline = t_start + sc.timeout_s + 60
    finished_at = None
    while time.time() < deadline:
        try:
            items = http.get(f"{api}/incidents", params={"job": job, "limit": 100}).json()["items"]
        except httpx.HTTPError:
            items = []
        for i in items:
            first_seen.setdefault(i["kind"], i["opened_ns"] / 1e9)
        if sc.expect_kinds & HANGS and trainer.poll() is None and rx.first_for(job, {"FleetscopeHang"}):
            time.sleep(3)  # paged: stop the hung job as an operator would
            os.killpg(trainer.pid, signal.SIGTERM)
        if trainer.poll() is not None and finished_at is None:
            finished_at = time.time()
        if finished_at is not None:
            row = http.get(f"{api}/jobs/{job}").json() if finished_at else {}
            caught_up = row.get("status") in ("finished", "failed")
            hang_done = not sc.expect_kinds & HANGS or rx.first_for(job, {"FleetscopeHang"})
            if (caught_up and hang_done and time.time() - finished_at > 8) or time.time() - finished_at > 45:
                break
        time.sleep(1.0)
    if trainer.poll() is None:
        os.killpg(trainer.pid, signal.SIGKILL)
    items = http.get(f"{api}/incidents", params={"job": job, "limit": 100}).json()["items"]
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
    res.kinds = sorted({i["kind"] for i in items})
    res.straggler_findings = [(i["kind"], i["ranks"], i["group_id"]) for i in items if i["kind"] in STRAGGLER]
    onset = None
    if sc.culprits:
        onset = job_onset_ns(spool_dir, job, sc.culprits, sc.onset_step)
    match = [i for i in items if i["kind"] in sc.expect_kinds]
    if match:
        first = min(match, key=lambda i: i["opened_ns"])
        res.culprits = first["ranks"]
        # the evidence as it was when the alert fired (the incident's is from the last pass,
        # after the hung job was stopped)
        t_alert, alert = rx.first_alert(job, {"FleetscopeHang"} if sc.expect_kinds & HANGS else set())
        try:
            fired = {**first, "evidence": json.loads(alert["annotations"]["evidence"])} if alert else first
        except (KeyError, ValueError):
            fired = first
        res.detected_by = fired["evidence"].get("detected_by", "")
        res.hang_class = fired["evidence"].get("hang_class", "")
        res.threshold_s = fired["evidence"].get("threshold_s")
        res.load_1m = round(os.getloadavg()[0], 1)
        if alert:
            res.paged_culprits = json.loads(alert["annotations"].get("culprit_ranks", "[]"))
        if onset:
            res.to_finding_s = round(first["opened_ns"] / 1e9 - onset / 1e9, 1)
            names = {"FleetscopeHang"} if sc.expect_kinds & HANGS else {"FleetscopeStraggler"}
            t_hook = rx.first_for(job, names)
            if t_hook is not None:
                res.to_webhook_s = round(t_hook - onset / 1e9, 1)
            if sc.expect_kinds & HANGS:
                res.stages = hang_stages(fired, onset, t_hook, http.get(f"{api}/alerts/outbox",
                                                                       params={"limit": 1000}).json())
    res.ok = judge(sc, res)
    return res


def hang_stages(inc: dict, onset: int, t_hook: float | None, outbox: list[dict]) -> dict[str, float]:
    """Where the onset -> webhook time goes for one hang incident (seconds)."""
    ev = inc["evidence"]
    since, thr = ev.get("stalled_since_ns"), ev.get("threshold_s")
    if not since or thr is None:
        return {}
    out = {"onset->quiet": (since - onset) / 1e9, "threshold": float(thr),
           "crossing->pass": (inc["opened_ns"] - since) / 1e9 - float(thr)}
    rows = sorted((r for r in outbox if r["incident_id"] == inc["id"] and r["alert_status"] == "firing"),
                  key=lambda r: r["created_ns"])
    if rows:
        out["pass->outbox"] = (rows[0]["created_ns"] - inc["opened_ns"]) / 1e9
        if rows[0].get("delivered_ns"):
            out["outbox->delivered"] = (rows[0]["delivered_ns"] - rows[0]["created_ns"]) / 1e9
            if t_hook is not None:
                out["delivered->receiver"] = t_hook - rows[0]["delivered_ns"] / 1e9
    return {k: round(v, 2) for k, v in out.items()}


def judge(sc: Scenario, res: Result) -> bool:
    if not sc.expect_kinds:
        return not res.kinds
    if sc.expect_kinds & HANGS:
        return bool(res.culprits) and set(res.culprits) & sc.culprits == sc.culprits and len(res.culprits) <= 2
    found = {r for k, ranks, _ in res.straggler_findings if k in sc.expect_kinds for r in ranks}
    return sc.culprits <= found


def straggler_pr(scs: list[Scenario], results: list[Result]) -> tuple[float, float]:
    """Per (scenario, culprit): TP when a straggler finding of the right kind names it; FP for
    each straggler finding naming no injected rank (links: no member injected)."""
    tp = fp = fn = 0
    for sc, r in zip(scs, results):
        if sc.expect_kinds & HANGS:
            continue
        found = {x for k, ranks, _ in r.straggler_findings if k in sc.expect_kinds for x in ranks}
        tp += len(sc.culprits & found)
        fn += len(sc.culprits - found)
        fp += sum(1 for _, ranks, _ in r.straggler_findings if not set(ranks) & sc.culprits)
    return tp / max(tp + fp, 1), tp / max(tp + fn, 1)


def sweep(seeds: int = 5) -> int:
    """Detection floor of the straggler detector vs per-op timing noise, on synthetic jobs
    (same detector, no I/O): recall per compute slowdown factor and false findings on clean
    runs, for a rank in each stage."""
    from fleetscope.server.diagnosis.breakdown import rank_step_breakdown
    from fleetscope.server.diagnosis.stragglers import detect_stragglers
    from fleetscope.server.diagnosis.synthetic import SynthJob

    factors = (1.05, 1.1, 1.2, 1.3)
    print(f"{'noise':>6} " + " ".join(f"{'x' + str(f):>7}" for f in factors) + "  false findings (clean)")
    for noise in (0.02, 0.05, 0.1, 0.2):
        hits = {f: 0 for f in factors}
        false = 0
        for seed in range(seeds):
            culprit = (1, 6)[seed % 2]
            for f in (1.0, *factors):
                job = SynthJob(seed=seed, noise=noise, num_steps=24,
                               compute_factor=lambda r, s, f=f, c=culprit: f if r == c and s >= 8 else 1.0)
                fr = job.build()
                bd, arr = rank_step_breakdown(fr["sections"], fr["collectives"], fr["steps"])
                found = detect_stragglers("sweep", job.topo, bd, arr)
                named = {r for x in found for r in x.ranks}
                if f == 1.0:
                    false += len(found)
                else:
                    hits[f] += culprit in named
                    false += len(named - {culprit})
        print(f"{noise:>6} " + " ".join(f"{hits[f] / seeds:>7.2f}" for f in factors) + f"  {false}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--sweep", action="store_true", help="only the synthetic detection-floor sweep")
    args = ap.parse_args(argv)
    if args.sweep:
        return sweep()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in {s.name for s in SCENARIOS}]
    if unknown:
        ap.error(f"unknown scenario {unknown[0]!r}; choose from {[s.name for s in SCENARIOS]}")
    scs = [s for s in SCENARIOS if not names or s.name in names]
    work = Path(tempfile.mkdtemp(prefix="fleetscope-bench-diag-"))
    rx = Receiver()
    server, url = start_server(work)
    api = f"{url}/api/v1"
    http = httpx.Client(timeout=60)
    results: list[Result] = []
    try:
        http.post(f"{api}/alerts/webhooks", json={"name": "bench", "url": rx.url, "secret": "bench-secret-0123456789"}).raise_for_status()
        print(f"{'scenario':<22}{'injected':<10}{'detected kinds':<34}{'culprits':<12}{'class':<20}"
              f"{'onset->finding s':>17}{'onset->webhook s':>17}  ok", flush=True)
        for sc in scs:
            r = run_scenario(sc, api, rx, work, http)
            results.append(r)
            print(f"{sc.name:<22}{str(r.injected):<10}{','.join(r.kinds) or '-':<34}{str(r.culprits or '-'):<12}"
                  f"{r.hang_class or '-':<20}{str(r.to_finding_s or '-'):>17}{str(r.to_webhook_s or '-'):>17}  "
                  f"{'yes' if r.ok else 'NO'}", flush=True)
            if r.stages:
                print(f"    {r.detected_by or 'hang'}: " + ", ".join(f"{k} {v}" for k, v in r.stages.items())
                      + f"; paged culprits {r.paged_culprits}; load average (1 min) {r.load_1m}", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        rx.httpd.shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    precision, recall = straggler_pr(scs, results)
    hang_res = [(s, r) for s, r in zip(scs, results) if s.expect_kinds & HANGS]
    hang_ok = sum(r.ok for _, r in hang_res)
    hook = [r.to_webhook_s for s, r in hang_res if r.to_webhook_s is not None]
    clean = [r for s, r in zip(scs, results) if not s.expect_kinds]
    print(f"\nload average (1, 5, 15 min) at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"straggler precision {precision:.2f} recall {recall:.2f} (target >= 0.95 each)")
    print(f"hang/crash culprit correct {hang_ok}/{len(hang_res)}")
    if hook:
        lag = [r.to_webhook_s - (r.threshold_s or 0) for s, r in hang_res if r.to_webhook_s is not None]
        print(f"hang onset -> webhook: max {max(hook):.1f} s, median {sorted(hook)[len(hook) // 2]:.1f} s; "
              f"beyond the stall threshold (webhook - threshold): max {max(lag):.1f} s")
    if clean:
        print(f"clean run findings: {clean[0].kinds or 'none'}")
    late = [r.name for _, r in hang_res if r.to_webhook_s is None or r.to_webhook_s > HANG_WEBHOOK_TARGET_S]
    if late:
        print(f"hang -> webhook over {HANG_WEBHOOK_TARGET_S:.0f} s (or no webhook): {late}")
    failed = [r.name for r in results if not r.ok] + [n for n in late if n not in {r.name for r in results if not r.ok}]
    print("all scenarios OK" if not failed else f"scenarios missed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
