"""A small, realistic 3D-parallel job as telemetry rows, for the dashboard/view tests.

Played step by step like the reference trainer: per step a data-loading section, the
1F1B pipeline schedule of forward/backward micro-batches (p2p send/recv between stages,
a TP all-reduce nested in every forward/backward that waits for the slowest TP peer),
a DP all-reduce of gradients, then the optimizer. Optional faults: a straggler rank
(compute slowed by a factor from a step on) and a hang (a rank stuck in forward at a
step: no more steps, in-flight records show who waits on whom).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from fleetscope.topology import Topology

MS = 1_000_000


def one_f_one_b(stage: int, num_stages: int, num_mb: int) -> list[tuple[str, int]]:
    """The 1F1B op order of one pipeline stage: (``F``|``B``, micro-batch)."""
    warm = min(num_stages - stage - 1, num_mb)
    ops = [("F", m) for m in range(warm)]
    f, b = warm, 0
    while f < num_mb:
        ops += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    ops += [("B", m) for m in range(b, num_mb)]
    return ops


@dataclass
class SynthJob:
    job: str = "synth-job"
    topo: Topology = Topology(dp=2, tp=2, pp=2)
    num_steps: int = 30
    num_mb: int = 4
    t0_ns: int = 0
    fwd_ms: float = 4.0
    bwd_ms: float = 8.0
    straggler_rank: int = -1
    straggler_factor: float = 1.0
    straggler_from_step: int = 0
    hang_rank: int = -1
    hang_step: int = -1
    host_of_rank: int = 4
    """Ranks per host (host names ``node-0``, ``node-1``...)."""

    def host(self, rank: int) -> str:
        return f"node-{rank // self.host_of_rank}"

    def build(self) -> dict[str, list[dict]]:
        topo = self.topo
        out: dict[str, list[dict]] = defaultdict(list)
        clock = {r: self.t0_ns for r in topo.ranks()}
        seq: dict[tuple[str, int], int] = defaultdict(int)
        out["jobs"].append(self._jobs_row("running"))

        def base(r: int) -> dict:
            return {"job": self.job, "rank": r, "host": self.host(r)}

        def coll(r, step, mb, axis, op, enq, done, peer=-1, state="completed"):
            gid = topo.group_id(axis, r)
            seq[(gid, r)] += 1
            out["collectives"].append({
                **base(r), "step": step, "microbatch": mb, "group_id": gid, "axis": axis,
                "group_rank": topo.group_ranks(axis, r).index(r), "group_size": topo.size(axis),
                "seq": seq[(gid, r)], "op": op, "bytes": 1 << 20, "dtype": "float32", "peer": peer,
                "state": state, "enqueued_ns": int(enq), "started_ns": int(enq),
                "completed_ns": int(done) if state == "completed" else -1,
                "duration_ns": int(done - enq) if state == "completed" else -1,
            })

        def section(r, step, mb, name, kind, start, end):
            out["sections"].append({
                **base(r), "step": step, "microbatch": mb, "name": name, "kind": kind,
                "start_ns": int(start), "end_ns": int(end), "duration_ns": int(end - start),
            })

        for step in range(self.num_steps):
            hanging = step == self.hang_step
            step_start = dict(clock)
            for r in topo.ranks():
                dl = 1.0 * MS * (1 + 0.01 * ((r * 7 + step) % 5))
                section(r, step, -1, "dataloader", "dataloader", clock[r], clock[r] + dl)
                clock[r] += dl
            ready: dict[tuple[str, int, int, int, int], float] = {}  # (F|B, mb, stage, dp, tp) -> done
            schedules = {s: one_f_one_b(s, topo.pp, self.num_mb) for s in range(topo.pp)}
            pos = {r: 0 for r in topo.ranks()}
            stuck: set[int] = set()
            progress = True
            while progress:
                progress = False
                for stage in range(topo.pp):
                    for d in range(topo.dp):
                        group = [topo.rank(dp=d, pp=stage, tp=t) for t in range(topo.tp)]
                        i = pos[group[0]]
                        if i >= len(schedules[stage]) or any(r in stuck for r in group):
                            continue
                        kind, mb = schedules[stage][i]
                        src = stage - 1 if kind == "F" else stage + 1
                        need = 0 <= src < topo.pp
                        if need and (kind, mb, src, d, 0) not in ready:
                            continue
                        progress = True
                        for r in group:
                            pos[r] += 1
                        name = "forward" if kind == "F" else "backward"
                        arrive = {}
                        for r in group:
                            t = clock[r]
                            if need:
                                peer = topo.rank(dp=d, pp=src, tp=topo.coords(r).tp)
                                done = max(t, ready[(kind, mb, src, d, 0)]) + 0.2 * MS
                                coll(r, step, mb, "pp", "recv", t, done, peer=peer)
                                t = done
                            dur = (self.fwd_ms if kind == "F" else self.bwd_ms) * MS
                            dur *= 1 + 0.01 * ((r * 13 + step * 3 + mb) % 4)
                            if r == self.straggler_rank and step >= self.straggler_from_step:
                                dur *= self.straggler_factor
                            arrive[r] = (t, t + dur)
                        if hanging and self.hang_rank in group and kind == "F" and mb == 0:
                            self._hang(out, group, arrive, step, coll, section, stuck, clock, seq)
                            continue
                        sync = max(e for _, e in arrive.values()) + 0.1 * MS
                        for r in group:
                            s, e = arrive[r]
                            coll(r, step, mb, "tp", "all_reduce", e, sync)
                            section(r, step, mb, name, "compute", s, sync)
                            clock[r] = sync
                            dst = stage + 1 if kind == "F" else stage - 1
                            if 0 <= dst < topo.pp:
                                peer = topo.rank(dp=d, pp=dst, tp=topo.coords(r).tp)
                                coll(r, step, mb, "pp", "send", sync, sync + 0.2 * MS, peer=peer)
                                clock[r] = sync + 0.2 * MS
                        ready[(kind, mb, stage, d, 0)] = clock[group[0]]
            if hanging:
                self._waiters(out, stuck, pos, schedules, clock, step, seq)
                break
            for stage in range(topo.pp):  # DP all-reduce of gradients, then optimizer
                for t in range(topo.tp):
                    group = topo.group_ranks("dp", topo.rank(pp=stage, tp=t))
                    sync = max(clock[r] for r in group) + 1.0 * MS
                    for r in group:
                        coll(r, step, -1, "dp", "all_reduce", clock[r], sync)
                        section(r, step, -1, "optimizer", "optimizer", sync, sync + 1.5 * MS)
                        clock[r] = sync + 1.5 * MS
            for r in topo.ranks():
                out["steps"].append({
                    **base(r), "step": step, "start_ns": int(step_start[r]), "end_ns": int(clock[r]),
                    "duration_ns": int(clock[r] - step_start[r]), "num_microbatches": self.num_mb,
                    "tokens": 4096,
                })
        end = max(clock.values())
        beat = time.time_ns()
        for r in topo.ranks():
            out["heartbeats"].append({
                "ts_ns": beat, "job": self.job, "host": self.host(r), "rank": r,
                "local_rank": r % self.host_of_rank, "pid": 1000 + r, "alive": True,
                "last_record_ns": int(end), "last_step": self.num_steps - 1,
            })
            for i in range(3):
                out["metrics"].append({
                    "ts_ns": int(self.t0_ns + i * (end - self.t0_ns) / 2), "job": self.job,
                    "host": self.host(r), "rank": r, "source": "gpu", "device": f"gpu{r % 4}",
                    "name": "gpu.temperature_c", "value": 60.0 + r + 3 * i,
                })
        if self.hang_step < 0:
            out["jobs"].append({**self._jobs_row("finished"), "ts_ns": int(end)})
        return dict(out)

    def _hang(self, out, group, arrive, step, coll, section, stuck, clock, seq):
        """The hang rank never leaves forward mb 0; its TP peers wait in all_reduce."""
        topo = self.topo
        for r in group:
            s, e = arrive[r]
            stuck.add(r)
            if r == self.hang_rank:
                out["inflight"].append({
                    "job": self.job, "rank": r, "host": self.host(r), "ts_ns": int(s + 60_000 * MS),
                    "step": step, "kind": "section", "op": "forward", "since_ns": int(s),
                })
            else:
                gid = topo.group_id("tp", r)
                coll(r, step, 0, "tp", "all_reduce", e, e, state="started")
                out["inflight"].append({
                    "job": self.job, "rank": r, "host": self.host(r), "ts_ns": int(e + 60_000 * MS),
                    "step": step, "kind": "collective", "op": "all_reduce", "group_id": gid, "axis": "tp",
                    "seq": seq[(gid, r)], "since_ns": int(e),
                })
            clock[r] = s

    def _waiters(self, out, stuck, pos, schedules, clock, step, seq):
        """Every other rank blocks in the recv it needs next (or the DP all-reduce)."""
        topo = self.topo
        for r in topo.ranks():
            if r in stuck:
                continue
            c = topo.coords(r)
            i = pos[r]
            if i < len(schedules[c.pp]):
                kind, mb = schedules[c.pp][i]
                src = c.pp - 1 if kind == "F" else c.pp + 1
                peer = topo.rank(dp=c.dp, pp=src, tp=c.tp)
                gid = topo.group_id("pp", r)
                seq[(gid, r)] += 1
                out["collectives"].append({
                    "job": self.job, "rank": r, "host": self.host(r), "step": step, "microbatch": mb,
                    "group_id": gid, "axis": "pp", "group_rank": c.pp, "group_size": topo.pp,
                    "seq": seq[(gid, r)], "op": "recv", "peer": peer, "state": "started",
                    "enqueued_ns": int(clock[r]), "started_ns": int(clock[r]),
                })
                rec = {"kind": "p2p", "op": "recv", "group_id": gid, "axis": "pp", "seq": seq[(gid, r)], "peer": peer}
            else:
                gid = topo.group_id("dp", r)
                rec = {"kind": "collective", "op": "all_reduce", "group_id": gid, "axis": "dp", "seq": seq[(gid, r)] + 1}
            out["inflight"].append({
                "job": self.job, "rank": r, "host": self.host(r), "ts_ns": int(clock[r] + 60_000 * MS),
                "step": step, "since_ns": int(clock[r]), **rec,
            })

    def _jobs_row(self, status: str) -> dict:
        return {
            "ts_ns": self.t0_ns, "job": self.job, "name": "synthetic 1F1B job", "dp": self.topo.dp,
            "tp": self.topo.tp, "pp": self.topo.pp, "order": self.topo.order, "num_microbatches": self.num_mb,
            "model_flops_per_step": 4.0e12, "device_name": "cpu", "device_peak_flops": 1.0e14,
            "status": status, "host": self.host(0),
        }


def span_rows(rec: dict, step: int) -> list[dict]:
    """The timeline route's span rows (sections, then collectives and p2p) of one step
    of a :meth:`SynthJob.build` record set, for building a ``pandas.DataFrame``."""
    sections = [
        {"rank": s["rank"], "step": s["step"], "mb": s["microbatch"], "name": s["name"], "kind": s["kind"],
         "cat": "section", "start_ns": s["start_ns"], "end_ns": s["end_ns"], "op": "", "group_id": "", "seq": -1,
         "peer": -1, "state": ""} for s in rec["sections"] if s["step"] == step
    ]  # fmt: skip
    comms = [
        {"rank": c["rank"], "step": c["step"], "mb": c["microbatch"], "name": c["op"], "kind": c["axis"],
         "cat": "p2p" if c["peer"] >= 0 else "collective", "start_ns": c["enqueued_ns"],
         "end_ns": c["completed_ns"], "op": c["op"], "group_id": c["group_id"], "seq": c["seq"],
         "peer": c["peer"], "state": c["state"]} for c in rec["collectives"] if c["step"] == step
    ]  # fmt: skip
    return sections + comms
