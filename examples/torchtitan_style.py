"""A torchtitan-style trainer (DTensor tensor parallelism + FSDP2) instrumented with the
two-line ``trainer_hooks`` init.

The model is a stack of MLP blocks. Like torchtitan's ``parallelize.py`` it is
parallelised in two steps on a 2-D device mesh ``(dp, tp)``:

* tensor parallelism (``parallelize_module``: the first linear of each block
  column-wise, the second row-wise), whose collectives are DTensor redistributions
  (functional collectives);
* FSDP2 (``fully_shard``) over ``dp``, whose collectives are all-gathers of the
  parameters and reduce-scatters of the gradients.

Nothing in the model or the loop knows about fleetscope except the two lines marked
``# fleetscope``; every collective is traced anyway. Run it on CPU with gloo::

    python examples/torchtitan_style.py --dp 2 --tp 2 --steps 5 --spool /tmp/spool

It starts one process per rank (``torch.multiprocessing``) and writes each rank's
spool under ``--spool`` (ship it with ``fleetscope agent --spool ...``).
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from fleetscope.topology import Topology


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


class Model(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim, hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def parallelize(model: Model, mesh) -> Model:
    """TP inside each block, then FSDP2 over dp (torchtitan's order)."""
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def train(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))

    from fleetscope import trainer_hooks as hooks  # fleetscope
    hooks.init(job=args.job, rank=rank, spool=args.spool, topology=Topology(dp=args.dp, tp=args.tp))  # fleetscope

    torch.manual_seed(0)
    model = parallelize(Model(), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + mesh.get_coordinate()[0])
    for step in range(args.steps):
        with hooks.step(step):
            x = torch.randn(8, 32, generator=gen)
            with hooks.section("forward"):
                loss = model(x).pow(2).mean()
            with hooks.section("backward"):
                loss.backward()
            with hooks.section("optimizer"):
                opt.step()
                opt.zero_grad()
    hooks.shutdown()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dp", type=int, default=2, help="FSDP2 (data-parallel) degree")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--job", default="titan-example")
    parser.add_argument("--spool", default="./.fleetscope/spool")
    args = parser.parse_args(argv)
    world = args.dp * args.tp
    mp.spawn(train, args=(world, free_port(), args), nprocs=world)


if __name__ == "__main__":
    main()
