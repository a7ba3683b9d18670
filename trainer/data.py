"""Training data: seeded synthetic token sequences, in-loop or through a DataLoader.

Each sample is an arithmetic sequence ``x[t+1] = (x[t] + d) mod V`` with a random start
and stride ``d`` in 1..MAX_STRIDE (1: a rule the small model learns within a few steps,
so the loss visibly falls); the global batch of a step is a pure function of (seed, step).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

MAX_STRIDE = 1
"""Largest stride of the synthetic sequences (larger: a harder task)."""


def global_batch(seed: int, step: int, batch: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Token ids of shape ``(batch, seq_len + 1)`` for one step (inputs + shifted targets)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, MAX_STRIDE + 1, (batch, 1), generator=gen)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


class StepDataset(Dataset):
    """Item ``i`` is this replica's slice of step ``i``'s global batch, with a load cost."""

    def __init__(self, seed: int, steps: int, batch: int, seq_len: int, vocab: int,
                 dp_rank: int, dp_size: int, load_cost_ms: float = 0.0) -> None:
        self.seed, self.steps, self.batch = seed, steps, batch
        self.seq_len, self.vocab = seq_len, vocab
        self.dp_rank, self.dp_size, self.load_cost_s = dp_rank, dp_size, load_cost_ms / 1e3

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> torch.Tensor:
        if self.load_cost_s:
            time.sleep(self.load_cost_s)  # stands in for reading/decoding/tokenising
        tokens = global_batch(self.seed, step, self.batch, self.seq_len, self.vocab)
        per = self.batch // self.dp_size
        return tokens[self.dp_rank * per : (self.dp_rank + 1) * per]


def batches(ds: StepDataset, use_loader: bool, workers: int = 0) -> Iterator[torch.Tensor]:
    """This replica's batches step by step, in the loop or via a ``DataLoader``."""
    if not use_loader:
        return (ds[i] for i in range(len(ds)))
    loader = DataLoader(ds, batch_size=None, shuffle=False, num_workers=workers,
                        persistent_workers=False)
    return iter(loader)
