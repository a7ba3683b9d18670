"""Model FLOPs per step (for MFU) and nominal peak FLOP/s of known devices."""

from __future__ import annotations

from fleetscope.trainer.config import ModelConfig

# Dense BF16 tensor-core peak FLOP/s (vendor datasheets, no sparsity).
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "A10": 125e12,
    "V100": 125e12,
}


def model_flops_per_step(cfg: ModelConfig, global_batch: int) -> float:
    """Training FLOPs of one step for the whole job: ``6 N T + 12 L H S T``.

    ``N`` counts the transformer and LM-head weights (embedding lookups cost no FLOPs),
    ``T`` the tokens of the global batch; the second term is causal attention
    (PaLM appendix B; forward + backward).
    """
    h, L, s, v = cfg.hidden, cfg.num_layers, cfg.seq_len, cfg.vocab_size
    f = h * cfg.ffn_mult
    params = L * (3 * h * h + h * h + 2 * h * f) + v * h
    tokens = global_batch * s
    return float(6 * params * tokens + 12 * L * h * s * tokens)


def device_peak_flops(device_name: str) -> float:
    """Nominal peak FLOP/s of one device, 0.0 when unknown (e.g. CPUs)."""
    for key, value in PEAK_FLOPS.items():
        if key in device_name.upper():
            return value
    return 0.0
