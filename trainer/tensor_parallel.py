"""Megatron-style tensor parallelism: the f/g communication operators and parallel linears.

``ColumnParallelLinear`` splits the output features across the tensor-parallel group
(each rank holds a slice of the weight's rows); ``RowParallelLinear`` splits the input
features (a slice of the columns) and all-reduces the partial outputs. An attention
block or MLP is a column-parallel layer followed by a row-parallel one, so activations
between them stay sharded and each block costs one all-reduce forward and one backward.
Communication goes through ``torch.distributed.<op>`` at call time so tracing wrappers
installed later see every call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dim forward; keep this rank's slice backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.rank, ctx.size = rank, size
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None


class TPContext:
    """The tensor-parallel group of one rank (``group=None`` means no tensor parallelism)."""

    def __init__(self, group: Any = None, rank: int = 0, size: int = 1) -> None:
        self.group, self.rank, self.size = group, rank, size

    @property
    def active(self) -> bool:
        return self.size > 1


def shard(full: torch.Tensor, tp: TPContext, dim: int, blocks: int = 1) -> torch.Tensor:
    """This rank's slice of ``full`` along ``dim``; ``blocks`` equal sub-blocks (e.g. q,k,v)
    are each split so every rank gets matching pieces of all of them."""
    parts = full.chunk(blocks, dim=dim)
    return torch.cat([p.chunk(tp.size, dim=dim)[tp.rank] for p in parts], dim=dim).clone()


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with W's output rows split over the group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPContext,
                 gather_output: bool = False, blocks: int = 1) -> None:
        super().__init__()
        self.tp, self.gather_output = tp, gather_output
        self.weight = nn.Parameter(shard(weight, tp, 0, blocks))
        self.bias = nn.Parameter(shard(bias, tp, 0, blocks)) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.active:
            x = _CopyToTP.apply(x, self.tp.group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp.active:
            y = _GatherFromTP.apply(y, self.tp.group)
        return y


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with W's input columns split; partial sums are all-reduced."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPContext) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(shard(weight, tp, 1))
        self.bias = nn.Parameter(bias.clone()) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp.active:
            y = _ReduceFromTP.apply(y, self.tp.group)
        return y + self.bias if self.bias is not None else y
