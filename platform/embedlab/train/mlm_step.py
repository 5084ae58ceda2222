"""One phase-1 optimisation step over microbatches, exact across workers.

The step's loss is  (sum of selected-token NLL over all microbatches on all workers)
                  / (selected-token count over all microbatches on all workers).
The global count is all-reduced *before* any backward pass, so each microbatch's
backward uses  sum_mb / global_count  and the gradients summed over microbatches and then
over workers are exactly the gradient of the global loss: no mean of means anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from embedlab.model.encoder import MLMModel
from embedlab.model.heads import select_by_head
from embedlab.objectives.dual_mlm import combined_loss_sum, per_head_loss_sums, per_ratio_loss_sums
from embedlab.objectives.masking import MaskedBatch
from embedlab.objectives.mlm import mlm_loss_sum
from embedlab.train.nonfinite import finite_update
from embedlab.train.precision import forward_precision

AllReduce = Callable[[torch.Tensor], torch.Tensor]


def no_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """The one-process all-reduce."""
    return tensor


def sum_all_reduce(device: torch.device):
    """An all-reduce (sum) over the process group that accepts tensors on any device."""

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        on_device = tensor.to(device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.to(tensor.device)

    return reduce


@dataclass(frozen=True)
class Microbatch:
    masked: MaskedBatch
    segment_ids: torch.Tensor  # (B, T), 0 = PAD
    # Mixed masking ratios (dual-LM-head method): each row's ratio and the head it goes to.
    ratio_index: torch.Tensor | None = None  # (B,) long
    head_index: torch.Tensor | None = None  # (B,) long
    # Per-source loss (single-head MLM): each token's source index into `source_names`, the
    # same list on every worker (the groups are all-reduced by key).
    source_index: torch.Tensor | None = None  # (B, T) long
    source_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepResult:
    """Global (all workers) figures for one step."""

    loss_sum: float
    selected: int
    tokens: int
    grad_norm: float
    skipped: bool  # no selected token anywhere: no update
    # With mixed ratios: {"head/<name>" or "ratio/<name>": (loss sum, selected count)}, global.
    groups: dict[str, tuple[float, int]] = field(default_factory=dict)
    rejected: bool = False  # non-finite loss or gradient: no update (embedlab.train.nonfinite)
    flops: float = 0.0  # the training FLOPs the step ran, all workers (0 when skipped)


def accumulate_gradients(
    model: MLMModel,
    microbatches: list[Microbatch],
    all_reduce: AllReduce = no_reduce,
    mixed_ratios: tuple[tuple[float, float], ...] = (),
    precision: str = "fp32",
    flops: float = 0.0,
) -> StepResult:
    """Forward/backward every microbatch; gradients end up equal to d(global loss)/d(theta)
    on every worker. Returns the global loss sum, selected count and token count.
    `precision` "bf16" runs the forward passes under bf16 autocast (`embedlab.train.precision`).
    `flops` is what this worker's passes cost (`embedlab.train.flops`), summed over workers in
    the same collective as the counts; a skipped step runs no pass and reports 0."""
    local = torch.tensor(
        [
            sum(int(mb.masked.selected.sum()) for mb in microbatches),
            sum(int((mb.segment_ids > 0).sum()) for mb in microbatches),
            flops,
        ],
        dtype=torch.float64,
    )
    reduced_counts = all_reduce(local.clone())
    selected, tokens, global_flops = int(reduced_counts[0]), int(reduced_counts[1]), float(reduced_counts[2])
    if selected == 0:
        # Documented policy (objectives.mlm): no target anywhere -> no update, step skipped.
        return StepResult(0.0, 0, tokens, 0.0, skipped=True)
    loss_sum = 0.0
    groups: dict[str, list[float]] = {}
    for mb in microbatches:
        part_sum, parts = _microbatch_loss(model, mb, mixed_ratios, precision)
        (part_sum / selected).backward()
        loss_sum += float(part_sum.detach())
        for key, (group_sum, count) in parts.items():
            totals = groups.setdefault(key, [0.0, 0.0])
            totals[0] += group_sum
            totals[1] += count
    all_reduce_gradients(model, all_reduce)
    keys = sorted(groups)
    reduced = all_reduce(torch.tensor([loss_sum] + [v for k in keys for v in groups[k]], dtype=torch.float64))
    global_groups = {k: (float(reduced[1 + 2 * i]), int(reduced[2 + 2 * i])) for i, k in enumerate(keys)}
    return StepResult(float(reduced[0]), selected, tokens, 0.0, skipped=False, groups=global_groups,
                      flops=global_flops)


def _microbatch_loss(
    model, mb: Microbatch, mixed_ratios, precision: str = "fp32"
) -> tuple[torch.Tensor, dict[str, tuple[float, int]]]:
    """The microbatch's NLL sum (graph kept) and its report groups: per source, and with mixed
    ratios per head and per ratio. The forward runs under the precision policy; every loss
    sum is fp32 or wider (`mlm_loss_sum` upcasts bf16 logits)."""
    masked = mb.masked
    device = masked.inputs.device
    if mb.head_index is None:
        with forward_precision(precision, device):
            logits = model(masked.inputs, mb.segment_ids, masked.selected)
        targets = masked.targets[masked.selected]
        part_sum, _ = mlm_loss_sum(logits, targets)
        sources = None if mb.source_index is None else mb.source_index.to(device)[masked.selected]
        return part_sum, _per_source({"mlm": logits}, {"mlm": targets}, {"mlm": sources}, mb.source_names)
    with forward_precision(precision, device):
        logits = model(masked.inputs, mb.segment_ids, masked.selected, mb.head_index)
    targets = select_by_head(masked.targets, masked.selected, mb.head_index, model.head_names)
    by_head = per_head_loss_sums(logits, targets)
    part_sum, _ = combined_loss_sum(by_head)
    by_ratio = per_ratio_loss_sums(
        logits, targets, ratio_index=mb.ratio_index, selected=masked.selected, head_index=mb.head_index,
        mixed_ratios=mixed_ratios,
    )
    parts = {f"head/{name}": (float(s.detach()), c) for name, (s, c) in by_head.items()}
    parts.update({f"ratio/{name}": value for name, value in by_ratio.items()})
    if mb.source_index is not None:
        sources = select_by_head(mb.source_index.to(device), masked.selected, mb.head_index, model.head_names)
        parts.update(_per_source(logits, targets, sources, mb.source_names))
    return part_sum, parts


def _per_source(
    logits_by_head: dict[str, torch.Tensor],
    targets_by_head: dict[str, torch.Tensor],
    sources_by_head: dict[str, torch.Tensor | None],
    source_names: tuple[str, ...],
) -> dict[str, tuple[float, int]]:
    """Selected-token NLL sums and counts per source, over every head, every source present
    (zeros included) so every worker all-reduces the same keys. Measured without a graph:
    reporting only."""
    if not source_names or any(v is None for v in sources_by_head.values()):
        return {}
    width = len(source_names)
    sums = torch.zeros(width, dtype=torch.float64)
    counts = torch.zeros(width, dtype=torch.long)
    with torch.no_grad():
        for name, logits in logits_by_head.items():
            nll = torch.nn.functional.cross_entropy(logits.float(), targets_by_head[name], reduction="none")
            source = sources_by_head[name]
            sums += torch.bincount(source, weights=nll.double(), minlength=width).cpu()
            counts += torch.bincount(source, minlength=width).cpu()
    return {f"source/{name}": (float(sums[i]), int(counts[i])) for i, name in enumerate(source_names)}


def all_reduce_gradients(model: nn.Module, all_reduce: AllReduce) -> None:
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
    """Clip by global norm (the pre-clip norm is returned), step, zero gradients.

    The update is rejected (no step; `rejected` set) when the global loss or the norm of the
    all-reduced gradients is not finite: the same figures on every worker, so all agree.
    """
    if result.skipped:
        optimizer.zero_grad(set_to_none=True)
        return result
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    rejected = not finite_update(result.loss_sum, norm)
    if not rejected:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return replace(result, grad_norm=norm, rejected=rejected)
