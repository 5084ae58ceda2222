"""One phase-1 optimisation step over microbatches, exact across workers.

The step's loss is  (sum of selected-token NLL over all microbatches on all workers)
                  / (selected-token count over all microbatches on all workers).
The global count is all-reduced *before* any backward pass, so each microbatch's
backward uses  sum_mb / global_count  and the gradients summed over microbatches and then
over workers are exactly the gradient of the global loss: no mean of means anywhere.

Host and device. Masking, head routing, every count and the attention layout are taken on
the host from the batch's CPU tensors (`prepare_microbatch`), and the batch goes to the device
without waiting on it; the loss sums stay on the device until the step reads them once,
together with the gradient norm, to decide whether the update is finite
(`optimizer_step`). On a GPU any other read (a count, a mask's gather, a layout, a norm)
would make the host wait for everything queued, leaving the GPU idle while it catches up.
Counts summed over workers go over a gloo group where the trainer's is NCCL
(`sum_all_reduce`). tests/test_device_reads.py runs the step on the meta device, where any
read raises; `embedlab model check-cuda` runs it under CUDA's sync debug mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from embedlab.model.encoder import SegmentLayout, segment_layout, selected_positions, to_device
from embedlab.model.heads import MultiHeadMLMModel, route_positions
from embedlab.objectives.dual_mlm import SHARED_HEAD, combined_loss_sum, per_head_loss_sums, ratio_names
from embedlab.objectives.masking import MaskedBatch
from embedlab.objectives.mlm import grouped_loss_sums
from embedlab.train.nonfinite import finite_update
from embedlab.train.precision import forward_precision

AllReduce = Callable[[torch.Tensor], torch.Tensor]


def no_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """The one-process all-reduce."""
    return tensor


def sum_all_reduce(device: torch.device):
    """An all-reduce (sum) over the process group that accepts tensors on the host or on
    `device`. Where the group's backend is not gloo (NCCL on GPUs), host tensors (counts,
    report figures) go over a gloo group: sent through the GPU, their sum would have to be
    read back once the GPU's queue had run. That group is made at the first host reduce,
    which every worker reaches at the same collective call, as `new_group` requires."""
    host_group: list = []

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu" and dist.get_backend() != "gloo":
            if not host_group:
                host_group.append(dist.new_group(backend="gloo"))
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=host_group[0])
            return tensor
        on_device = tensor.to(device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.to(tensor.device)

    return reduce


@dataclass(frozen=True)
class HeadBatch:
    """One head's part of a microbatch, on the step's device: where the selected tokens of the
    rows routed to it are, what they must predict, and what they are reported under."""

    positions: torch.Tensor  # (N_h,) long: flat row-major positions in the (B, T) batch
    targets: torch.Tensor  # (N_h,) long: the clean ids there
    ratio_index: torch.Tensor | None = None  # (N_h,) long: each token's row's ratio (mixed ratios)
    source_index: torch.Tensor | None = None  # (N_h,) long: each token's source (per-source loss)


@dataclass(frozen=True)
class Microbatch:
    """One microbatch as the step consumes it, built on the host by `prepare_microbatch`: the
    model's inputs on the step's device, already routed to the heads, and every count the step
    needs, taken from the host tensors. The step therefore never reads the device back before
    its one read (`AccumulatedStep.result`): on a GPU a count, a mask's gather or a layout
    taken there would wait for all queued work."""

    inputs: torch.Tensor  # (B, T) corrupted ids
    segment_ids: torch.Tensor  # (B, T), 0 = PAD
    heads: dict[str, HeadBatch]  # per head, in the model's order ("mlm" alone for an MLMModel)
    layout: SegmentLayout | None  # the variable-length layout, when the encoder takes that path
    selected: int  # selected tokens, all heads
    tokens: int  # non-padding tokens
    # Report groups, "head/<name>", "ratio/<name>" (mixed ratios) and "source/<name>"
    # (per-source loss): each group's selected count. Every worker has the same keys.
    counts: dict[str, int] = field(default_factory=dict)


def prepare_microbatch(
    masked: MaskedBatch,
    segment_ids: torch.Tensor,
    *,
    device: torch.device,
    head_names: Sequence[str] = (SHARED_HEAD,),
    head_index: torch.Tensor | None = None,
    ratio_index: torch.Tensor | None = None,
    mixed_ratios: Sequence[tuple[float, float]] = (),
    source_index: torch.Tensor | None = None,
    source_names: Sequence[str] = (),
    varlen: bool = False,
) -> Microbatch:
    """A masked (B, T) batch of host tensors -> the `Microbatch` the step runs on `device`.

    Mixed ratios (the dual-LM-head method): (B,) `head_index`, each row's head among
    `head_names`, and (B,) `ratio_index`, each row's ratio among `mixed_ratios`; the step
    then reports per head and per ratio. Per-source loss: (B, T) `source_index` into
    `source_names` (the same list on every worker). `varlen`: the encoder will take the
    variable-length attention path (`embedlab.model.encoder.varlen_rule`), so its layout is
    computed here and sent along.
    """
    head_names = tuple(head_names)
    if (head_index is None) != (ratio_index is None):
        raise ValueError("head_index and ratio_index come together: mixed ratios route each row by its ratio")
    if head_index is None:
        if len(head_names) != 1:
            raise ValueError(f"head_index is needed to route rows to the heads {list(head_names)}")
        positions = {head_names[0]: selected_positions(masked.selected)}
    else:
        positions = route_positions(masked.selected, head_index, head_names)
    length = masked.selected.shape[1]
    flat_targets = masked.targets.reshape(-1)
    flat_sources = None if source_index is None or not source_names else source_index.reshape(-1)
    # Each head's selected tokens' row ratio and source, on the host.
    ratios = {name: None if ratio_index is None else ratio_index[where // length] for name, where in positions.items()}
    sources = {name: None if flat_sources is None else flat_sources[where] for name, where in positions.items()}
    counts = {}
    if head_index is not None:
        counts.update({f"head/{name}": len(where) for name, where in positions.items()})
        counts.update(_group_counts("ratio", ratio_names(mixed_ratios), torch.cat(list(ratios.values()))))
    if flat_sources is not None:
        counts.update(_group_counts("source", source_names, torch.cat(list(sources.values()))))
    optional = lambda tensor: None if tensor is None else to_device(tensor, device)  # noqa: E731
    heads = {name: HeadBatch(positions=to_device(where, device), targets=to_device(flat_targets[where], device),
                             ratio_index=optional(ratios[name]), source_index=optional(sources[name]))
             for name, where in positions.items()}
    return Microbatch(
        inputs=to_device(masked.inputs, device),
        segment_ids=to_device(segment_ids, device),
        heads=heads,
        layout=segment_layout(segment_ids).to(device) if varlen else None,
        selected=sum(len(where) for where in positions.values()),
        tokens=int((segment_ids > 0).sum()),
        counts=counts,
    )


def _group_counts(kind: str, names: Sequence[str], index: torch.Tensor) -> dict[str, int]:
    """{"<kind>/<name>": how many of the (N,) host `index` values are that name's}, zeros included."""
    counts = torch.bincount(index.long(), minlength=len(names)).tolist()
    return {f"{kind}/{name}": int(count) for name, count in zip(names, counts)}


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


@dataclass(frozen=True)
class AccumulatedStep:
    """A step whose gradients are in place: its counts global on the host, its loss sums global
    but still on the device until `result` reads them."""

    selected: int
    tokens: int
    flops: float
    counts: dict[str, int]  # per report group, global
    # (1 + len(counts),) float64 on the device: the loss sum, then each group's in `counts`
    # order, summed over workers; None when the step is skipped.
    sums: torch.Tensor | None = None

    @property
    def skipped(self) -> bool:
        return self.selected == 0

    def result(self, grad_norm: torch.Tensor | None = None) -> StepResult:
        """The step's figures on the host: the step's one read of the device, its loss sums and
        (given) its gradient norm together."""
        if self.sums is None:
            return StepResult(0.0, 0, self.tokens, 0.0, skipped=True)
        values = self.sums if grad_norm is None else torch.cat([self.sums, grad_norm.double().reshape(1)])
        loss_sum, *rest = values.tolist()
        sums = rest[: len(self.counts)]
        groups = {key: (value, self.counts[key]) for key, value in zip(self.counts, sums)}
        return StepResult(loss_sum, self.selected, self.tokens, rest[-1] if grad_norm is not None else 0.0,
                          skipped=False, groups=groups, flops=self.flops)


def accumulate_gradients(
    model: nn.Module,
    microbatches: list[Microbatch],
    all_reduce: AllReduce = no_reduce,
    precision: str = "fp32",
    flops: float = 0.0,
) -> AccumulatedStep:
    """Forward/backward every microbatch; gradients end up equal to d(global loss)/d(theta)
    on every worker. The counts (selected, tokens, per group) were taken on the host and are
    summed over workers before any backward; the loss sums stay on the device, summed over
    workers there, until the caller reads them (`AccumulatedStep.result`).
    `precision` "bf16" runs the forward passes under bf16 autocast (`embedlab.train.precision`).
    `flops` is what this worker's passes cost (`embedlab.model.flops`), summed over workers in
    the same collective as the counts; a skipped step runs no pass and reports 0."""
    keys = sorted({key for mb in microbatches for key in mb.counts})
    local = torch.tensor(
        [sum(mb.selected for mb in microbatches), sum(mb.tokens for mb in microbatches), flops]
        + [sum(mb.counts.get(key, 0) for mb in microbatches) for key in keys],
        dtype=torch.float64,
    )
    reduced = all_reduce(local.clone()).tolist()
    selected, tokens, global_flops = int(reduced[0]), int(reduced[1]), float(reduced[2])
    counts = {key: int(count) for key, count in zip(keys, reduced[3:])}
    if selected == 0:
        # Documented policy (objectives.mlm): no target anywhere -> no update, step skipped.
        return AccumulatedStep(0, tokens, 0.0, {})
    # Summed in microbatch order in float64, as the host summed them before.
    sums = torch.zeros(1 + len(keys), dtype=torch.float64, device=microbatches[0].inputs.device)
    for mb in microbatches:
        part_sum, parts = _microbatch_loss(model, mb, keys, precision)
        (part_sum / selected).backward()
        sums += torch.cat([part_sum.detach().double().reshape(1), parts])
    all_reduce_gradients(model, all_reduce)
    return AccumulatedStep(selected, tokens, global_flops, counts, all_reduce(sums))


def _microbatch_loss(model: nn.Module, mb: Microbatch, keys: list[str],
                     precision: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """The microbatch's NLL sum (graph kept) and its report groups' NLL sums, (len(keys),)
    float64 without a graph: per source, and with mixed ratios per head and per ratio. The
    forward runs under the precision policy; every loss sum is fp32 or wider (`mlm_loss_sum`
    upcasts bf16 logits)."""
    device, positions = mb.inputs.device, {name: head.positions for name, head in mb.heads.items()}
    multi_head = isinstance(model, MultiHeadMLMModel)
    with forward_precision(precision, device):
        if multi_head:
            logits = model(mb.inputs, mb.segment_ids, positions, layout=mb.layout)
        else:
            logits = {name: model(mb.inputs, mb.segment_ids, where, layout=mb.layout)
                      for name, where in positions.items()}
    targets = {name: head.targets for name, head in mb.heads.items()}
    by_head = per_head_loss_sums(logits, targets)
    # One head: its own sum, as `mlm_loss_sum` gives it; several: their sum (`combined_loss_sum`).
    part_sum = combined_loss_sum(by_head)[0] if multi_head else next(iter(by_head.values()))[0]
    groups = {f"head/{name}": loss.detach().double().reshape(1) for name, (loss, _) in by_head.items()}
    for kind, attribute in (("ratio", "ratio_index"), ("source", "source_index")):
        names = [key.removeprefix(f"{kind}/") for key in keys if key.startswith(f"{kind}/")]
        if names:
            sums = grouped_loss_sums(logits, targets, {n: getattr(h, attribute) for n, h in mb.heads.items()},
                                     len(names))
            groups.update({f"{kind}/{n}": sums[i : i + 1] for i, n in enumerate(names)})
    parts = [groups[key] for key in keys] if keys else []
    return part_sum, torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=device)


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
    model: nn.Module, optimizer: torch.optim.Optimizer, step: AccumulatedStep, max_grad_norm: float
) -> StepResult:
    """Clip by global norm (the pre-clip norm is returned), step, zero gradients.

    The step's figures are read from the device here, once, with the norm: the update is
    rejected (no step; `rejected` set) when the global loss or the norm of the all-reduced
    gradients is not finite: the same figures on every worker, so all agree.
    """
    if step.skipped:
        optimizer.zero_grad(set_to_none=True)
        return step.result()
    result = step.result(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    rejected = not finite_update(result.loss_sum, result.grad_norm)
    if not rejected:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return replace(result, rejected=rejected)
