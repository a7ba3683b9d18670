"""One rank of the reference job: set up groups, model and hooks, run the 1F1B steps."""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from fleetscope.trainer import data as data_mod
from fleetscope.trainer.config import TrainConfig
from fleetscope.trainer.data_parallel import allreduce_gradients
from fleetscope.trainer.faults import FaultInjector, parse_fault
from fleetscope.trainer.flops import device_peak_flops, model_flops_per_step
from fleetscope.trainer.model import GPTStage
from fleetscope.trainer.pipeline_parallel import PipeContext, run_1f1b
from fleetscope.trainer.process_groups import build_groups
from fleetscope.trainer.tensor_parallel import TPContext
from fleetscope.trainer_hooks import state as hook_state

from fleetscope import components
from fleetscope import trainer_hooks as hooks
from fleetscope.topology import Topology


@dataclass
class RankResult:
    """What one rank saw: per-step loss on last-stage ranks (NaN elsewhere)."""

    rank: int
    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    step_cpu_s: list[float] = field(default_factory=list)
    """CPU time of the whole rank process (all threads) per step."""
    hook_stats: dict[str, Any] = field(default_factory=dict)
    """The hooks' counters at shutdown (overhead, drops, sink errors); empty without hooks."""
    hook_worker_cpu_s: list[float] = field(default_factory=list)
    """CPU time the hooks' background thread had used by the end of each step (its
    steady-state cost per step, without start-up); empty without hooks."""


def pick_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


def run_rank(cfg: TrainConfig, rank: int, world_size: int, local_rank: int | None = None,
             sink: Any = None) -> RankResult:
    """Train on this rank; ``MASTER_ADDR``/``MASTER_PORT`` must be set for rendezvous.

    Args:
        cfg: The job configuration (identical on every rank).
        rank: Global rank.
        world_size: ``dp * tp * pp``.
        local_rank: Rank on this host (device index on GPU hosts).
        sink: Hook sink override (default: spool files under ``cfg.spool``).
    """
    local_rank = rank if local_rank is None else local_rank
    cfg.check()
    device = pick_device(cfg, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    threads = cfg.threads or max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(threads)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timedelta(minutes=30))
    topo = Topology(dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, order=cfg.order)
    groups = build_groups(topo, rank)
    faults = FaultInjector([parse_fault(s, world_size) for s in cfg.injections], rank,
                           groups.by_id(), device)
    faults.install_comm()  # below the tracing layer: hooks wrap what it patched
    rec = None
    if cfg.hooks:
        rec = hooks.init(job=cfg.job, rank=rank, topology=topo, sink=sink, spool=cfg.spool,
                   local_rank=local_rank, device=device)
        for axis in ("dp", "tp", "pp"):
            if groups.get(axis) is not None:
                hooks.register_group(groups.get(axis), axis)
    faults.install_entry_hangs()  # above the tracing layer: the rank never enters the op
    status = "failed"
    result = RankResult(rank)
    try:
        if rank == 0:
            _emit_job(cfg, device, "running")
        if cfg.preflight:  # self-check on every rank before step 0 (the kernels component)
            check_before_training = components.resolve(components.PREFLIGHT)
            check_before_training(job=cfg.job, device=str(device),
                                  emit=lambda rec: hooks.emit("probes", **rec))
        _train(cfg, rank, topo, groups, faults, device, result)
        status = "finished"
        return result
    finally:
        if rank == 0:
            _emit_job(cfg, device, status)
        hooks.shutdown()
        if rec is not None:
            result.hook_stats = rec.stats()
        faults.uninstall_comm()
        if cfg.results_dir:
            _write_results(cfg.results_dir, result, status)
        if status == "finished":
            dist.destroy_process_group()


def _train(cfg: TrainConfig, rank: int, topo: Topology, groups: Any, faults: FaultInjector,
           device: torch.device, result: RankResult) -> None:
    c = topo.coords(rank)
    m = cfg.model
    tp = TPContext(groups.tp, c.tp, cfg.tp)
    model = GPTStage(m, tp, c.pp, cfg.pp, cfg.seed).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    mbs, num_mb = cfg.microbatch_size, cfg.num_microbatches
    pipe = PipeContext(groups.pp, topo.prev_stage_rank(rank), topo.next_stage_rank(rank),
                       (mbs, m.seq_len, m.hidden), device)
    ds = data_mod.StepDataset(cfg.seed, cfg.steps, cfg.global_batch, m.seq_len, m.vocab_size,
                              c.dp, cfg.dp, cfg.load_cost_ms)
    stream = data_mod.batches(ds, cfg.data == "loader", cfg.loader_workers)
    tokens_per_step = cfg.global_batch // cfg.dp * m.seq_len
    for step in range(cfg.steps):
        t_step, cpu_step = time.perf_counter(), time.process_time()
        with hooks.step(step, num_microbatches=num_mb, tokens=tokens_per_step):
            loss = _step(cfg, step, model, params, opt, pipe, stream, groups, faults, device)
            hooks.step_info(loss=loss)
        result.losses.append(loss)
        result.step_times_s.append(time.perf_counter() - t_step)
        result.step_cpu_s.append(time.process_time() - cpu_step)
        rec = hook_state.recorder
        if rec is not None:
            result.hook_worker_cpu_s.append(rec.worker_cpu_ns / 1e9)
        if model.last and c.tp == 0:
            print(f"step {step} rank {rank} dp{c.dp} loss {loss:.5f}", flush=True)


def _step(cfg: TrainConfig, step: int, model: GPTStage, params: list, opt: Any,
          pipe: PipeContext, stream: Any, groups: Any, faults: FaultInjector,
          device: torch.device) -> float:
    """One training step: data, 1F1B forwards/backwards, DP gradient sync, optimizer."""
    mbs, num_mb = cfg.microbatch_size, cfg.num_microbatches
    faults.step_start(step)
    with hooks.section("dataloader"):
        t0 = time.perf_counter()
        batch = next(stream).to(device)
        faults.stretch(step, "dataloader", t0)
    inputs, targets = batch[:, :-1], batch[:, 1:]
    losses: list[torch.Tensor] = []

    def forward(mb: int, x: torch.Tensor | None) -> torch.Tensor:
        with hooks.section("forward", microbatch=mb):
            t0, c0 = time.perf_counter(), time.thread_time()
            faults.in_forward(step, mb, num_mb)
            sl = slice(mb * mbs, (mb + 1) * mbs)
            y = model(inputs[sl] if model.first else x)
            if model.last:
                loss = model.loss(y, targets[sl])
                losses.append(loss.detach())
                y = loss / num_mb
            faults.stretch(step, "compute", t0, c0)
        return y

    def backward(mb: int, x: torch.Tensor | None, y: torch.Tensor,
                 grad_y: torch.Tensor | None) -> torch.Tensor | None:
        with hooks.section("backward", microbatch=mb):
            t0, c0 = time.perf_counter(), time.thread_time()
            torch.autograd.backward(y, grad_tensors=grad_y)
            faults.stretch(step, "compute", t0, c0)
        return x.grad if x is not None else None

    run_1f1b(pipe, num_mb, groups.topology.stage(groups.rank), cfg.pp, forward, backward)
    with hooks.section("grad_sync", kind="other"):
        allreduce_gradients(params, groups.dp, cfg.dp)
    with hooks.section("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(torch.stack(losses).mean()) if losses else float("nan")


def _write_results(directory: str, result: RankResult, status: str) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank-{result.rank:05d}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": result.rank, "status": status, "losses": result.losses,
                   "step_times_s": result.step_times_s, "step_cpu_s": result.step_cpu_s,
                   "hook_stats": result.hook_stats, "hook_worker_cpu_s": result.hook_worker_cpu_s}, f)
    os.replace(path + ".tmp", path)


def _emit_job(cfg: TrainConfig, device: torch.device, status: str) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    versions = {"fleetscope": _version(), "torch": torch.__version__, "python": sys.version.split()[0]}
    hooks.emit("jobs", job=cfg.job, name=cfg.job, dp=cfg.dp, tp=cfg.tp, pp=cfg.pp, order=cfg.order,
               num_microbatches=cfg.num_microbatches,
               model_flops_per_step=model_flops_per_step(cfg.model, cfg.global_batch),
               device_name=name, device_peak_flops=device_peak_flops(name), status=status,
               command=cfg.command, versions=json.dumps(versions), host=socket.gethostname())


def _version() -> str:
    from fleetscope import __version__

    return __version__
