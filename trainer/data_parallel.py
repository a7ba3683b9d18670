"""Data parallelism: average gradients over the replicas with one bucketed all-reduce."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def allreduce_gradients(params: list[torch.nn.Parameter], group: Any, dp_size: int,
                        bucket_bytes: int = 32 << 20) -> None:
    """Sum gradients over the DP group (in buckets of ``bucket_bytes``) and divide by its size."""
    if dp_size <= 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads:
        bucket.append(g)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes:
            _reduce(bucket, group, dp_size)
            bucket, size = [], 0
    if bucket:
        _reduce(bucket, group, dp_size)


def _reduce(bucket: list[torch.Tensor], group: Any, dp_size: int) -> None:
    flat = _flatten_dense_tensors(bucket)
    dist.all_reduce(flat, group=group)
    flat.div_(dp_size)
    for g, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
        g.copy_(reduced)
