"""Numerics check: the same deterministic computation must give the same bits.

Silent data corruption (a flaky ALU, tensor core or memory cell that computes a wrong
value without raising an error) is a real fleet failure mode. This probe runs a fixed
computation — inputs from a fixed seed, ``depth`` rounds of ``x = x + tanh(x @ W_i) / 2``
in bf16 on GPU (tensor cores) or fp32 on CPU — several times on a device and hashes the
result bits (SHA-256 of the float32 result). Three comparisons catch a bad device:

* the repeats on one device must agree (catches intermittent faults);
* all local devices of the same model must agree (:func:`mark_minority`);
* the fleet must agree: the server compares hashes of every host with the same device
  model and software versions (``fleetscope.server.diagnosis.selfcheck``).

Hashes are only comparable for the same device model, dtype, sizes and library versions
(kernel selection differs between cuBLAS versions); those go into the record's detail.

:class:`BitFlip` injects a fault for tests: it flips one bit of the result, in every
repeat (a persistent fault) or in one (a transient one).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from fleetscope.kernels.devices import DeviceInfo, software_versions
from fleetscope.kernels.result import ProbeResult, Progress, quiet

SEED = 20240229


@dataclass(frozen=True)
class BitFlip:
    """Test-only fault injection: flip ``bit`` of float32 result element ``element``."""

    element: int = 0
    bit: int = 0
    """0 (least significant mantissa bit) .. 31 (sign)."""
    repeat: int | None = None
    """Only in this repeat (a transient fault); None: in every repeat (persistent)."""

    def __post_init__(self) -> None:
        if not 0 <= self.bit <= 31:
            raise ValueError(f"bit flip bit={self.bit} must be in 0..31")
        if self.element < 0:
            raise ValueError(f"bit flip element={self.element} must be >= 0")

    @classmethod
    def parse(cls, spec: str) -> BitFlip:
        """Parse ``ELEMENT:BIT[:REPEAT]``, e.g. ``0:3`` or ``17:30:1``."""
        parts = spec.split(":")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            nums = []
        if len(nums) not in (2, 3):
            raise ValueError(f"bit flip {spec!r}; expected ELEMENT:BIT[:REPEAT], e.g. 0:3")
        return cls(nums[0], nums[1], nums[2] if len(nums) == 3 else None)


def fixed_inputs(n: int, depth: int) -> tuple[object, object]:
    """The computation's inputs (float32, on the CPU) from the fixed seed."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(SEED)
    x = torch.randn(n, n, generator=gen)
    weights = torch.randn(depth, n, n, generator=gen) / math.sqrt(n)
    return x, weights


def deterministic_result(device: str, inputs: tuple[object, object], *, dtype: str) -> object:
    """Run the fixed computation on ``device``; returns the float32 result on the CPU."""
    import torch

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    x = inputs[0].to(device, torch_dtype)  # type: ignore[attr-defined]
    weights = inputs[1].to(device, torch_dtype)  # type: ignore[attr-defined]
    threads = torch.get_num_threads()
    if device == "cpu":  # CPU BLAS blocking (and so summation order) depends on threads
        torch.set_num_threads(1)
    try:
        for i in range(weights.shape[0]):
            x = x + torch.tanh(x @ weights[i]) * 0.5
    finally:
        torch.set_num_threads(threads)
    return x.float().cpu().contiguous()


def result_hash(result: object) -> str:
    """SHA-256 (first 16 hex digits) of a float32 tensor's bytes."""
    return hashlib.sha256(result.numpy().tobytes()).hexdigest()[:16]  # type: ignore[attr-defined]


def _flip(result: object, flip: BitFlip) -> None:
    import torch

    bits = result.view(torch.int32).view(-1)  # type: ignore[attr-defined]
    i = flip.element % bits.numel()
    bits[i] ^= 1 << flip.bit if flip.bit < 31 else -(2**31)


def numerics_probe(
    dev: DeviceInfo,
    *,
    n: int,
    depth: int,
    repeats: int,
    flip: BitFlip | None = None,
    reference: str | None = None,
    progress: Progress = quiet,
) -> ProbeResult:
    """Run the deterministic computation ``repeats`` times and compare the result bits.

    Args:
        dev: the device.
        n: matrix size.
        depth: rounds of matmul + tanh.
        repeats: runs on this device (all must agree).
        flip: test-only fault injection.
        reference: expected hash (e.g. a known-good device's); None skips that check.
        progress: progress sink.

    Returns:
        ``value`` is the number of mismatches (repeats that differ from the first, plus
        one if the result differs from ``reference``); passed when it is 0. The hash is
        in ``detail['hash']``.
    """
    dtype = "bf16" if dev.is_cuda else "fp32"
    t0 = time.perf_counter()
    progress(f"numerics {dev.device} {dtype} n={n} depth={depth} x{repeats}")
    hashes = []
    inputs = fixed_inputs(n, depth)
    for rep in range(repeats):
        out = deterministic_result(dev.device, inputs, dtype=dtype)
        if flip is not None and flip.repeat in (None, rep):
            _flip(out, flip)
        hashes.append(result_hash(out))
    mismatches = sum(h != hashes[0] for h in hashes[1:])
    reason = ""
    if mismatches:
        reason = f"{mismatches} of {repeats - 1} repeat(s) differ from the first run"
    if reference is not None and hashes[0] != reference:
        mismatches += 1
        reason = (reason + "; " if reason else "") + f"hash {hashes[0]} != reference {reference}"
    progress(f"numerics {dev.device}: hash {hashes[0]}" + (f"  FAIL: {reason}" if reason else ""))
    return ProbeResult(
        probe="numerics",
        device=dev.device,
        device_model=dev.model,
        variant=f"{dtype} n={n} depth={depth}",
        value=float(mismatches),
        unit="mismatches",
        passed=not mismatches,
        detail={
            "hash": hashes[0],
            "repeat_hashes": sorted(set(hashes)),
            "dtype": dtype,
            "n": n,
            "depth": depth,
            "repeats": repeats,
            "versions": software_versions(),
            **({"reason": reason} if reason else {}),
        },
        duration_s=time.perf_counter() - t0,
    )


def mark_minority(results: list[ProbeResult]) -> list[ProbeResult]:
    """Fail devices whose hash differs from the majority of same-model, same-variant devices.

    With two devices that disagree there is no majority: both fail (the host is suspect
    either way). Results of other probes pass through unchanged.
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(results):
        if r.probe == "numerics" and "hash" in r.detail:
            groups.setdefault((r.device_model, r.variant), []).append(i)
    out = list(results)
    for idx in groups.values():
        counts = Counter(results[i].detail["hash"] for i in idx)
        if len(counts) < 2:
            continue
        (top, top_n), *rest = counts.most_common()
        majority = top if top_n > rest[0][1] else None
        for i in idx:
            r = results[i]
            if r.detail["hash"] == majority:
                continue
            why = f"hash {r.detail['hash']} differs from " + (
                f"the local majority {majority}" if majority else f"other local devices {dict(counts)}"
            )
            detail: Mapping[str, object] = {**r.detail, "reason": why}
            out[i] = replace(r, value=r.value + 1, passed=False, detail=detail)
    return out
