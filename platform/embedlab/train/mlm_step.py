"""One phase-1 optimisation step over microbatches, exact across workers.

The step's loss is  (sum of selected-token NLL over all microbatches on all workers)
                  / (selected-token count over all microbatches on all workers).
The global count is all-reduced *before* any backward pass, so each microbatch's
backward uses  sum_mb / global_count  and the gradients summed over microbatches and then
over workers are exactly the gradient of the global loss: no mean of means anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from embedlab.model.encoder import MLMModel
from embedlab.objectives.masking import MaskedBatch
from embedlab.objectives.mlm import mlm_loss_sum

AllReduce = Callable[[torch.Tensor], torch.Tensor]


def no_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """The one-process all-reduce."""
    return tensor


@dataclass(frozen=True)
class Microbatch:
    masked: MaskedBatch
    segment_ids: torch.Tensor  # (B, T), 0 = PAD


@dataclass(frozen=True)
class StepResult:
    """Global (all workers) figures for one step."""

    loss_sum: float
    selected: int
    tokens: int
    grad_norm: float
    skipped: bool


def accumulate_gradients(
    model: MLMModel, microbatches: list[Microbatch], all_reduce: AllReduce = no_reduce
) -> StepResult:
    """Forward/backward every microbatch; gradients end up equal to d(global loss)/d(theta)
    on every worker. Returns the global loss sum, selected count and token count."""
    local = torch.tensor(
        [
            sum(int(mb.masked.selected.sum()) for mb in microbatches),
            sum(int((mb.segment_ids > 0).sum()) for mb in microbatches),
        ],
        dtype=torch.float64,
    )
    selected, tokens = (int(v) for v in all_reduce(local.clone()))
    if selected == 0:
        # Documented policy (objectives.mlm): no target anywhere -> no update, step skipped.
        return StepResult(0.0, 0, tokens, 0.0, skipped=True)
    loss_sum = 0.0
    for mb in microbatches:
        logits = model(mb.masked.inputs, mb.segment_ids, mb.masked.selected)
        part_sum, _ = mlm_loss_sum(logits, mb.masked.targets[mb.masked.selected])
        (part_sum / selected).backward()
        loss_sum += float(part_sum.detach())
    _all_reduce_gradients(model, all_reduce)
    global_loss_sum = float(all_reduce(torch.tensor([loss_sum], dtype=torch.float64)).item())
    return StepResult(global_loss_sum, selected, tokens, 0.0, skipped=False)


def _all_reduce_gradients(model: nn.Module, all_reduce: AllReduce) -> None:
    """Sum gradients over workers in one flat buffer (one collective per step)."""
    if all_reduce is no_reduce:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, result: StepResult, max_grad_norm: float
) -> StepResult:
    """Clip by global norm (the pre-clip norm is returned), step, zero gradients."""
    if result.skipped:
        optimizer.zero_grad(set_to_none=True)
        return result
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(result.loss_sum, result.selected, result.tokens, norm, skipped=False)


def build_optimizer(model: nn.Module, learning_rate: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW; biases and LayerNorm parameters are excluded from weight decay (recorded as
    `NO_DECAY_RULE` in every checkpoint manifest)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=learning_rate,
        betas=(0.9, 0.98),
        eps=1e-6,
    )


NO_DECAY_RULE = "parameters with fewer than 2 dims (biases, LayerNorm weights and biases) get no weight decay"


def learning_rate_at(consumed: int, budget: int, peak: float, warmup_fraction: float) -> float:
    """Linear warmup then linear decay to 0, both measured in consumed tokens (not steps)."""
    warmup = warmup_fraction * budget
    if warmup > 0 and consumed < warmup:
        return peak * (consumed + 1) / warmup
    return peak * max(0.0, (budget - consumed) / max(budget - warmup, 1.0))
