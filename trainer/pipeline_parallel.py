"""Pipeline parallelism: the non-interleaved 1F1B schedule over p2p send/recv.

As in Megatron-LM's ``forward_backward_pipelining_without_interleaving``: stage ``s``
of ``P`` runs ``P - s - 1`` warm-up forwards, then alternates one forward and one
backward, then drains the remaining backwards. Paired transfers in the steady state
(send activations while receiving gradients, and the reverse) go through
``batch_isend_irecv`` so neighbouring stages never wait on each other's sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


class PipeContext:
    """Where this rank sits in its pipeline chain."""

    def __init__(self, group: Any, prev_rank: int | None, next_rank: int | None,
                 act_shape: tuple[int, ...], device: torch.device) -> None:
        self.group, self.prev_rank, self.next_rank = group, prev_rank, next_rank
        self.act_shape, self.device = act_shape, device

    @property
    def first(self) -> bool:
        return self.prev_rank is None

    @property
    def last(self) -> bool:
        return self.next_rank is None

    def _buf(self) -> torch.Tensor:
        return torch.empty(self.act_shape, device=self.device)

    def recv_forward(self) -> torch.Tensor | None:
        if self.first:
            return None
        buf = self._buf()
        dist.recv(buf, src=self.prev_rank, group=self.group)
        return buf.requires_grad_()

    def send_forward(self, y: torch.Tensor) -> None:
        if not self.last:
            dist.send(y.detach().contiguous(), dst=self.next_rank, group=self.group)

    def recv_backward(self) -> torch.Tensor | None:
        if self.last:
            return None
        buf = self._buf()
        dist.recv(buf, src=self.next_rank, group=self.group)
        return buf

    def send_backward(self, grad: torch.Tensor | None) -> None:
        if not self.first and grad is not None:
            dist.send(grad.contiguous(), dst=self.prev_rank, group=self.group)

    def send_forward_recv_backward(self, y: torch.Tensor) -> torch.Tensor | None:
        peer = self.next_rank
        if peer is None:  # the last stage
            return None
        buf = self._buf()
        self._exchange(y.detach().contiguous(), buf, peer)
        return buf

    def send_backward_recv_forward(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        peer = self.prev_rank
        if peer is None:  # the first stage
            return None
        # a later stage's input is received with requires_grad, so its backward yields a grad
        assert grad is not None, "send_backward_recv_forward: no input grad on a later stage"
        buf = self._buf()
        self._exchange(grad.contiguous(), buf, peer)
        return buf.requires_grad_()

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor, peer: int) -> None:
        ops = [dist.P2POp(dist.isend, send, peer, self.group),
               dist.P2POp(dist.irecv, recv, peer, self.group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def run_1f1b(pipe: PipeContext, num_microbatches: int, stage: int, num_stages: int,
             forward: Callable[[int, torch.Tensor | None], torch.Tensor],
             backward: Callable[[int, torch.Tensor | None, torch.Tensor, torch.Tensor | None],
                                torch.Tensor | None]) -> None:
    """Run one step's forwards and backwards in 1F1B order.

    Args:
        pipe: The rank's pipeline neighbours.
        num_microbatches: Micro-batches in the step.
        stage, num_stages: This rank's stage and the pipeline depth.
        forward: ``forward(mb, input_or_None) -> output`` (the loss on the last stage).
        backward: ``backward(mb, input_or_None, output, output_grad_or_None) -> input grad``.
    """
    warmup = min(num_stages - stage - 1, num_microbatches)
    remaining = num_microbatches - warmup
    inputs: list[tuple[int, torch.Tensor | None, torch.Tensor]] = []
    fwd_mb = bwd_mb = 0
    for _ in range(warmup):
        x = pipe.recv_forward()
        y = forward(fwd_mb, x)
        pipe.send_forward(y)
        inputs.append((fwd_mb, x, y))
        fwd_mb += 1
    x = pipe.recv_forward() if remaining > 0 else None
    for i in range(remaining):
        y = forward(fwd_mb, x)
        grad_y = pipe.send_forward_recv_backward(y)
        inputs.append((fwd_mb, x, y))
        fwd_mb += 1
        mb, x0, y0 = inputs.pop(0)
        grad_x = backward(mb, x0, y0, grad_y)
        bwd_mb += 1
        if i == remaining - 1:
            x = None
            pipe.send_backward(grad_x)
        else:
            x = pipe.send_backward_recv_forward(grad_x)
    for _ in range(warmup):
        mb, x0, y0 = inputs.pop(0)
        grad_y = pipe.recv_backward()
        grad_x = backward(mb, x0, y0, grad_y)
        pipe.send_backward(grad_x)
        bwd_mb += 1

