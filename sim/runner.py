"""The simulation loop: play steps ahead of the clock, release rows on time, ship them.

Real time by default: record times are wall-clock times and every row leaves when
the real hooks would have written it. The loop wakes every ``batch_delay_s`` (the
agent's batching delay): it generates the steps about to start, takes what is due,
cuts one batch per host and hands it to that host's agent. ``fast`` mode plays the
same job with time-stamps in the recent past as fast as the machine allows.

The ground truth (faults, their onset times, culprits) goes to ``results_dir`` as
``ground_truth.json``, rewritten atomically as faults begin, and a run summary
``summary.json`` at the end; nothing of it enters the telemetry.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fleetscope.sim.faults import FaultPlan, parse_sim_fault
from fleetscope.sim.schedule import StepModel, Timing
from fleetscope.sim.stream import Fleet, Periods

from fleetscope.topology import Topology

log = logging.getLogger("fleetscope.sim")


@dataclass
class SimConfig:
    """One simulated job (``fleetscope simulate`` flags map one to one)."""

    server: str
    """Server base URL."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    num_microbatches: int = 4
    """Micro-batches per step and replica."""
    gpus_per_host: int = 8
    """Ranks per host: one simulated agent per host."""
    step_ms: float = 2000.0
    """Target step time."""
    steps: int = 30
    job: str = "sim"
    injections: tuple[str, ...] = ()
    seed: int = 0
    results_dir: str = ""
    tp_ops_per_microbatch: int = 4
    """TP collectives in each forward and each backward of a micro-batch (the reference
    trainer's default model: 2 blocks per stage x 2 all-reduces)."""
    token: str | None = None
    batch_delay_s: float = 0.5
    """How often each agent cuts a batch (the agent's ``batch_delay_s``)."""
    in_flight: int = 4
    """Requests per agent on the wire at once (the agent's ``in_flight``)."""
    senders: int = 0
    """Sender threads shared by all simulated agents; 0: one per two hosts, 16..256 (the
    server acknowledges after the store has the rows, so a request takes ~a second
    under load and throughput is concurrency / latency)."""
    compression: str | None = None
    """Arrow IPC compression of the bodies: None, 'lz4' or 'zstd'."""
    coalesce: bool = True
    """A host's batches queued behind its busy sends leave as one bounded request (as the
    agent's); False: one request per batch (``--no-coalesce``, the bench's baseline)."""
    fast: bool = False
    """Do not wait for real time (time-stamps end at the start time)."""
    drain_timeout_s: float = 60.0
    failure_grace_s: float = 3.0
    """After a crash, seconds before the launcher stops the other ranks (as ``train``)."""
    host_prefix: str = ""
    """Host names are ``<prefix><index>``; default ``<job>-h``."""
    progress: bool = True
    periods: Periods = field(default_factory=Periods)

    @property
    def topology(self) -> Topology:
        return Topology(dp=self.dp, tp=self.tp, pp=self.pp)

    @property
    def num_hosts(self) -> int:
        return -(-self.dp * self.tp * self.pp // self.gpus_per_host)

    def check(self) -> list:
        """Validate; returns the parsed faults. ``ValueError`` names the bad value."""
        topo = self.topology
        if not isinstance(self.senders, int) or self.senders < 0:
            raise ValueError(f"senders must be >= 0, got {self.senders!r}")
        for name in ("num_microbatches", "gpus_per_host", "steps", "in_flight"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {v!r}")
        if self.tp_ops_per_microbatch < 0:
            raise ValueError(f"tp-ops-per-microbatch must be >= 0, got {self.tp_ops_per_microbatch}")
        if not 10 <= self.step_ms <= 600_000:
            raise ValueError(f"step-ms must be in [10, 600000], got {self.step_ms}")
        if not 0.05 <= self.batch_delay_s <= 60:
            raise ValueError(f"batch-delay-s must be in [0.05, 60], got {self.batch_delay_s}")
        if self.compression not in (None, "lz4", "zstd"):
            raise ValueError(f"compression must be none, lz4 or zstd, got {self.compression!r}")
        if not self.job or len(self.job) > 200:
            raise ValueError(f"job must be 1..200 characters, got {self.job!r}")
        return [parse_sim_fault(s, topo.world_size, self.num_hosts) for s in self.injections]


class GroundTruth:
    """What was injected and when it began (written to the results dir, never shipped)."""

    def __init__(self, cfg: SimConfig, plan: FaultPlan, hosts: list[str], t0_ns: int) -> None:
        self.cfg, self.hosts, self.t0_ns = cfg, hosts, t0_ns
        self.dir = Path(cfg.results_dir) if cfg.results_dir else None
        self.faults: list[dict[str, Any]] = []
        for d in plan.describe():
            kind = d["kind"]
            entry = {**d, "onset_ns": None, "onset_step": None}
            if kind == "host_down":
                h = d["host"]
                lo = h * cfg.gpus_per_host
                entry.update(host_name=hosts[h], culprit_ranks=list(range(lo, min(lo + cfg.gpus_per_host,
                                                                                    cfg.topology.world_size))))
            else:
                entry.update(culprit_ranks=[d["rank"]], host_name=hosts[d["rank"] // cfg.gpus_per_host])
            if kind in ("slowlink", "gc"):
                entry.update(onset_ns=t0_ns, onset_step=0)
            self.faults.append(entry)
        self.write()

    def onset(self, i: int, rel_ns: float, step: int) -> None:
        if self.faults[i]["onset_ns"] is None:
            self.faults[i].update(onset_ns=int(self.t0_ns + rel_ns), onset_step=int(step))
            self.write()

    def write(self, summary: dict[str, Any] | None = None) -> None:
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        topo = self.cfg.topology
        doc = {"job": self.cfg.job, "dp": topo.dp, "tp": topo.tp, "pp": topo.pp,
               "world_size": topo.world_size, "num_hosts": len(self.hosts),
               "gpus_per_host": self.cfg.gpus_per_host, "t0_ns": self.t0_ns,
               "step_ms": self.cfg.step_ms, "steps": self.cfg.steps, "faults": self.faults}
        _atomic_json(self.dir / "ground_truth.json", doc)
        if summary is not None:
            _atomic_json(self.dir / "summary.json", summary)


def _atomic_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


class Progress:
    """One status line on stderr (rewritten in place on a terminal)."""

    def __init__(self, enabled: bool, total_steps: int, world: int) -> None:
        self.enabled, self.total, self.world = enabled, total_steps, world
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def update(self, step: int, gen_rate: float, ack_rate: float, lag_s: float, backlog: int,
               backlog_age_s: float, throttled: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < (1.0 if self.tty else 10.0)):
            return
        self.last = now
        width = 24
        filled = int(width * min(step, self.total) / max(1, self.total))
        bar = "#" * filled + "-" * (width - filled)
        line = (f"[{bar}] step {min(step, self.total)}/{self.total} {self.world} ranks | "
                f"gen {gen_rate:,.0f} rec/s | acked {ack_rate:,.0f} rec/s | lag {lag_s:.2f}s | "
                f"unacked {backlog} ({backlog_age_s:.1f}s) | 429s {throttled}")
        if self.tty:
            sys.stderr.write("\r" + line[:200].ljust(120) + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def run(cfg: SimConfig, stop: threading.Event | None = None) -> dict[str, Any]:
    """Run one simulated job to its end (or ``stop``); returns the summary."""
    from fleetscope.agent.coalesce import NO_COALESCING, CoalesceLimits
    from fleetscope.sim.agents import SimAgents

    faults = cfg.check()
    stop = stop or threading.Event()
    topo = cfg.topology
    plan = FaultPlan(faults, topo.world_size, cfg.gpus_per_host)
    timing = Timing(step_ms=cfg.step_ms)
    model = StepModel(topo, cfg.num_microbatches, cfg.tp_ops_per_microbatch, timing, plan, seed=cfg.seed,
                      inflight_interval_ns=cfg.periods.inflight_s * 1e9)
    prefix = cfg.host_prefix or f"{cfg.job}-h"
    hosts = [f"{prefix}{h:04d}" for h in range(cfg.num_hosts)]
    step_ns = cfg.step_ms * 1e6
    planned_ns = cfg.steps * step_ns
    wall0 = time.time_ns()
    t0_ns = wall0 - int(planned_ns) - int(2e9) if cfg.fast else wall0
    fleet = Fleet(model.layout, cfg.job, t0_ns, cfg.gpus_per_host, hosts, cfg.num_microbatches,
                  tokens_per_step=4096 * 8 * cfg.num_microbatches, periods=cfg.periods, seed=cfg.seed)
    fleet.set_phase(model.phase)
    truth = GroundTruth(cfg, plan, hosts, t0_ns)
    agents = SimAgents(cfg.server, hosts, run_id=f"{cfg.job}/{cfg.seed}/{wall0}", token=cfg.token,
                       in_flight=cfg.in_flight, senders=cfg.senders or min(256, max(16, len(hosts) // 2)),
                       compression=cfg.compression,
                       coalescing=CoalesceLimits() if cfg.coalesce else NO_COALESCING,
                       world_size=topo.world_size)
    fleet.acked_through = agents.acked_through
    peak = 989e12
    fleet.add_job_row(0.0, name=cfg.job, dp=topo.dp, tp=topo.tp, pp=topo.pp, order=topo.order,
                      num_microbatches=cfg.num_microbatches,
                      model_flops_per_step=0.45 * peak * topo.world_size * cfg.step_ms / 1e3,
                      device_name="NVIDIA H800 (simulated)", device_peak_flops=peak, status="running",
                      command=" ".join(sys.argv), versions=json.dumps({"fleetscope.sim": "1"}))
    progress = Progress(cfg.progress, cfg.steps, topo.world_size)
    clock = np.zeros(model.layout.shape)
    ro = model.layout.rank_of
    gen_step, steps_done = 0, 0
    gen_s = 0.0
    kills: list[tuple[float, str, Any]] = []  # (rel time, what, arg)
    job_end_rel: float | None = None
    status = "running"
    generated = 0
    tick = cfg.batch_delay_s * 1e9
    now_rel = 0.0
    t_start = time.monotonic()
    max_lag = 0.0
    lags: list[float] = []
    ship_lags: list[tuple[float, float]] = []
    """(time, age of the oldest unacknowledged batch): how far the store is behind."""
    ack0, t_rate = 0, time.monotonic()
    gen_rate = ack_rate = 0.0
    gen0 = 0
    try:
        while not stop.is_set():
            now_rel = (time.time_ns() - t0_ns) if not cfg.fast else now_rel + tick
            # 1. play the steps about to start (one step of look-ahead)
            while gen_step < cfg.steps and job_end_rel is None:
                finite = clock[np.isfinite(clock)]
                if finite.size == 0 or finite.min() > now_rel + step_ns:
                    break
                _before_step(cfg, plan, gen_step, clock, ro, kills, truth, fleet)
                t = time.perf_counter()
                out = model.play(gen_step, clock)
                gen_s += time.perf_counter() - t
                fleet.add_step(out)
                _onsets(cfg, plan, truth, gen_step, clock, out)
                generated += sum(v["rank"].size for v in (out.sections, out.collectives, out.steps, out.inflight))
                clock = out.end
                gen_step += 1
                if np.isfinite(out.end).any() and gen_step == cfg.steps:
                    status = "finished"
                    job_end_rel = float(np.nanmax(np.where(np.isfinite(out.end), out.end, np.nan)))
            # 2. faults that take processes away, when their time comes
            for item in [k for k in kills if k[0] <= now_rel]:
                kills.remove(item)
                _, what, arg = item
                if what == "host":
                    fleet.kill_host(arg)
                elif what == "ranks":
                    fleet.kill_ranks(arg)
                elif what == "job_failed":
                    fleet.kill_ranks(np.arange(topo.world_size))
                    fleet.add_job_row(now_rel, **_job_end_row(cfg, topo, "failed"))
                    status = "failed"
                    job_end_rel = now_rel
            # 3. what is due goes to the agents
            if job_end_rel is not None and now_rel >= job_end_rel and status == "finished":
                fleet.add_job_row(job_end_rel, **_job_end_row(cfg, topo, "finished"))
            data = fleet.take(now_rel)
            agents.ship(data)
            steps_done = int(fleet.last_step.max()) + 1
            lag = (time.time_ns() - t0_ns - now_rel) / 1e9 if not cfg.fast else 0.0
            lags.append(lag)
            max_lag = max(max_lag, lag)
            t = time.monotonic()
            if t - t_rate >= 2.0:
                gen_rate = (fleet.records_out - gen0) / (t - t_rate)
                ack_rate = (agents.stats.rows_acked - ack0) / (t - t_rate)
                gen0, ack0, t_rate = fleet.records_out, agents.stats.rows_acked, t
            n_unacked, age = agents.backlog()
            ship_lags.append((now_rel, age))
            progress.update(steps_done, gen_rate, ack_rate, lag, n_unacked, age, agents.throttled)
            if job_end_rel is not None and now_rel >= job_end_rel:
                break
            if gen_step >= cfg.steps or not np.isfinite(clock).any():
                # nothing more to play: a hung job lingers for the planned duration
                if job_end_rel is None and now_rel >= planned_ns + 10 * tick:
                    break
            if cfg.fast:
                if n_unacked > 4 * cfg.in_flight * len(hosts):
                    agents.drain(5.0)
                continue
            next_rel = (np.floor(now_rel / tick) + 1) * tick
            stop.wait(max(0.0, (t0_ns + next_rel - time.time_ns()) / 1e9))
    finally:
        drained = agents.drain(cfg.drain_timeout_s)
        wall_s = time.monotonic() - t_start
        st = agents.stats
        post = np.array(st.post_s) if st.post_s else np.zeros(1)
        lag_arr = np.array(lags) if lags else np.zeros(1)
        # steady state: after the first 5 steps
        steady = np.array([a for t, a in ship_lags if t >= 5 * step_ns] or [a for _, a in ship_lags] or [0.0])
        summary = {
            "job": cfg.job, "world_size": topo.world_size, "num_hosts": len(hosts),
            "status": status, "steps_played": gen_step, "steps_completed": steps_done,
            "records_generated": fleet.records_out, "records_acked": st.rows_acked,
            "batches_acked": st.batches, "requests_acked": st.requests,
            "coalesce_splits_413": st.splits_413, "bytes_sent": st.bytes_sent, "rejected_batches": st.rejected,
            "rejected_detail": st.rejected_detail, "duplicates": st.duplicates,
            "throttled_429": agents.throttled, "retries": agents.retries, "drained": drained,
            "wall_s": wall_s, "generation_cpu_s": gen_s,
            "generation_s_per_step": gen_s / max(1, gen_step),
            "rank_steps_per_generation_s": topo.world_size * gen_step / max(gen_s, 1e-9),
            "records_per_s_generated": fleet.records_out / max(wall_s, 1e-9),
            "records_per_s_acked": st.rows_acked / max(wall_s, 1e-9),
            "lag_s_p50": float(np.percentile(lag_arr, 50)), "lag_s_max": float(lag_arr.max()),
            "ingest_lag_s_p50": float(np.percentile(steady, 50)),
            "ingest_lag_s_p95": float(np.percentile(steady, 95)),
            "ingest_lag_s_max": float(steady.max()),
            "post_s_p50": float(np.percentile(post, 50)), "post_s_p99": float(np.percentile(post, 99)),
            "clock_offset_ns": agents.clock.estimate.offset_ns,
        }
        n_unacked, age = agents.backlog()
        progress.update(steps_done, gen_rate, ack_rate, float(lag_arr[-1]), n_unacked, age,
                        agents.throttled, final=True)
        agents.close()
        truth.write(summary)
    return summary


def _job_end_row(cfg: SimConfig, topo: Topology, status: str) -> dict[str, Any]:
    peak = 989e12
    return dict(name=cfg.job, dp=topo.dp, tp=topo.tp, pp=topo.pp, order=topo.order,
                num_microbatches=cfg.num_microbatches,
                model_flops_per_step=0.45 * peak * topo.world_size * cfg.step_ms / 1e3,
                device_name="NVIDIA H800 (simulated)", device_peak_flops=peak, status=status,
                command=" ".join(sys.argv), versions=json.dumps({"fleetscope.sim": "1"}))


def _before_step(cfg, plan, step, clock, ro, kills, truth, fleet) -> None:
    """Processes that go away at the start of ``step``: schedule their end."""
    for i, f in enumerate(plan.faults):
        if f.kind == "host_down" and f.get("step") == step:
            h = f.get("host")
            lo, hi = h * cfg.gpus_per_host, min((h + 1) * cfg.gpus_per_host, ro.size)
            starts = _rank_clock(clock, ro)[lo:hi]
            t = float(np.min(starts[np.isfinite(starts)])) if np.isfinite(starts).any() else 0.0
            kills.append((t, "host", h))
            truth.onset(i, t, step)
        elif f.kind == "crash" and f.get("step") == step:
            t = float(_rank_clock(clock, ro)[f.rank])
            if np.isfinite(t):
                kills.append((t, "ranks", np.array([f.rank])))
                kills.append((t + cfg.failure_grace_s * 1e9, "job_failed", None))
                truth.onset(i, t, step)


def _rank_clock(clock: np.ndarray, ro: np.ndarray) -> np.ndarray:
    out = np.empty(ro.size)
    out[ro.ravel()] = clock.ravel()
    return out


def _onsets(cfg, plan, truth, step, clock_before, out) -> None:
    """Onset times of hangs (the culprit stops progressing) and stragglers (from_step)."""
    for i, f in enumerate(plan.faults):
        if f.kind == "straggler" and f.get("from_step") == step:
            starts = clock_before[np.isfinite(clock_before)]
            if starts.size:
                truth.onset(i, float(starts.min()), step)
        elif f.kind == "hang" and truth.faults[i]["onset_ns"] is None:
            b = out.blocked
            hit = np.nonzero(b["rank"] == f.rank)[0]
            if hit.size:
                since = float(b["since"][hit[0]])
                r = f.rank
                ends = np.concatenate([out.sections["end"][out.sections["rank"] == r],
                                       out.collectives["done"][out.collectives["rank"] == r]])
                ends = ends[np.isfinite(ends)]
                last = float(ends.max()) if ends.size else since
                onset = max(last, since) if np.isfinite(since) else last
                truth.onset(i, onset, step)


def install_signal_stop(stop: threading.Event) -> None:
    """SIGTERM/SIGINT end the run cleanly (what is queued is drained, results written)."""
    def handler(signum, frame):  # noqa: ARG001
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
