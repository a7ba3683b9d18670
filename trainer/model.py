"""A small GPT split into pipeline stages, with tensor-parallel attention heads and MLP.

Every rank draws the *full* weights from the same seeded generators and keeps its own
slice, so any (dp, tp, pp) layout starts from exactly the weights of a single-process
run (that is what the loss-equality test relies on).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from fleetscope.trainer.config import ModelConfig
from fleetscope.trainer.tensor_parallel import ColumnParallelLinear, RowParallelLinear, TPContext
from torch import nn

INIT_STD = 0.02


def _normal(gen: torch.Generator, *shape: int, std: float = INIT_STD) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


class Block(nn.Module):
    """Pre-LN transformer block; heads and MLP columns split over the TP group."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, gen: torch.Generator) -> None:
        super().__init__()
        h, f = cfg.hidden, cfg.hidden * cfg.ffn_mult
        self.num_local_heads = cfg.num_heads // tp.size
        self.head_dim = h // cfg.num_heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = ColumnParallelLinear(_normal(gen, 3 * h, h), torch.zeros(3 * h), tp, blocks=3)
        self.proj = RowParallelLinear(_normal(gen, h, h), torch.zeros(h), tp)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = ColumnParallelLinear(_normal(gen, f, h), torch.zeros(f), tp)
        self.fc2 = RowParallelLinear(_normal(gen, h, f), torch.zeros(h), tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        shape = (b, s, self.num_local_heads, self.head_dim)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTStage(nn.Module):
    """The layers of one pipeline stage (embeddings on the first, LM head on the last)."""

    def __init__(self, cfg: ModelConfig, tp: TPContext, stage: int, num_stages: int,
                 seed: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.first, self.last = stage == 0, stage == num_stages - 1
        per_stage = cfg.num_layers // num_stages
        first_layer = stage * per_stage
        if self.first:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + 7_777)
            self.tok_emb = nn.Parameter(_normal(gen, cfg.vocab_size, cfg.hidden))
            self.pos_emb = nn.Parameter(_normal(gen, cfg.seq_len, cfg.hidden))
        self.blocks = nn.ModuleList(
            Block(cfg, tp, torch.Generator().manual_seed(seed * 1_000_003 + layer))
            for layer in range(first_layer, first_layer + per_stage)
        )
        if self.last:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + 9_999)
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.head = ColumnParallelLinear(_normal(gen, cfg.vocab_size, cfg.hidden), None, tp,
                                             gather_output=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or activations -> activations or logits (last stage)."""
        if self.first:
            x = self.tok_emb[x] + self.pos_emb[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
