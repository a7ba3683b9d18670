"""In-process configuration of the reference trainer (plain dataclasses, checked numbers)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the small GPT."""

    vocab_size: int = 256
    """Tokens in the vocabulary (divisible by tp: the LM head is column-parallel)."""
    seq_len: int = 32
    """Tokens per sample."""
    hidden: int = 64
    """Width of the residual stream."""
    num_layers: int = 4
    """Transformer blocks (divisible by pp)."""
    num_heads: int = 4
    """Attention heads (divisible by tp: heads are split across tensor-parallel ranks)."""
    ffn_mult: int = 4
    """MLP width as a multiple of ``hidden``."""

    def check(self, tp: int, pp: int) -> None:
        """Raise ``ValueError`` naming the value that does not fit the parallel layout."""
        for name in ("vocab_size", "seq_len", "hidden", "num_layers", "num_heads", "ffn_mult"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.hidden % self.num_heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by num_heads={self.num_heads}")
        if self.num_heads % tp:
            raise ValueError(f"num_heads={self.num_heads} is not divisible by tp={tp}")
        if self.vocab_size % tp:
            raise ValueError(f"vocab_size={self.vocab_size} is not divisible by tp={tp}")
        if self.num_layers % pp:
            raise ValueError(f"num_layers={self.num_layers} is not divisible by pp={pp}")


@dataclass(frozen=True)
class TrainConfig:
    """One run of the reference job."""

    dp: int = 1
    """Data-parallel size."""
    tp: int = 1
    """Tensor-parallel size."""
    pp: int = 1
    """Pipeline-parallel size."""
    steps: int = 10
    """Training steps."""
    global_batch: int = 8
    """Samples per step over all data-parallel replicas."""
    num_microbatches: int = 2
    """Micro-batches per step and replica (pipeline depth of the 1F1B schedule)."""
    lr: float = 3e-3
    """AdamW learning rate."""
    seed: int = 0
    """Seed of the weights and of the synthetic data."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Model shape."""
    data: str = "synthetic"
    """``synthetic`` (generated in the training loop) or ``loader`` (a torch DataLoader)."""
    load_cost_ms: float = 0.0
    """Extra time the data-loader path spends producing each batch."""
    loader_workers: int = 0
    """DataLoader worker processes for ``data='loader'``."""
    job: str = "train"
    """Job id (spool directory name, record field)."""
    spool: str = "./.fleetscope/spool"
    """Spool directory of the hooks' files and the rank logs."""
    hooks: bool = True
    """Record telemetry with fleetscope.trainer_hooks."""
    injections: tuple[str, ...] = ()
    """Fault specs (see fleetscope.trainer.faults)."""
    device: str = "auto"
    """``auto`` (CUDA if available), ``cpu`` or ``cuda``."""
    threads: int = 0
    """Torch intra-op threads per rank; 0 = CPUs / ranks."""
    pin_cpus: bool = False
    """Pin rank ``r`` to the ``r % n``-th of the ``n`` CPUs the launcher may use (each rank
    on a core of its own when there are as many cores as ranks: no rank takes another's
    CPU, as no GPU takes another's)."""
    order: str = "tp-dp-pp"
    """Rank order of the axes, fastest first (fleetscope.topology)."""
    command: str = ""
    """Command line, recorded in the job metadata."""
    results_dir: str = ""
    """If set, each rank writes ``rank-XXXXX.json`` (losses, step times, hook counters) here."""
    preflight: bool = False
    """Run the quick self-check (fleetscope.kernels.preflight) on every rank before step 0."""

    def check(self) -> None:
        """Raise ``ValueError`` naming the first value that cannot work."""
        for name in ("dp", "tp", "pp", "global_batch", "num_microbatches"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.global_batch % (self.dp * self.num_microbatches):
            raise ValueError(
                f"global_batch={self.global_batch} is not divisible by "
                f"dp*num_microbatches={self.dp * self.num_microbatches}"
            )
        if self.data not in ("synthetic", "loader"):
            raise ValueError(f"data must be 'synthetic' or 'loader', got {self.data!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.load_cost_ms < 0:
            raise ValueError(f"load_cost_ms must be >= 0, got {self.load_cost_ms}")
        self.model.check(self.tp, self.pp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def microbatch_size(self) -> int:
        return self.global_batch // (self.dp * self.num_microbatches)
