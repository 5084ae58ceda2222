"""Mixed masking ratios inside every batch, with one MLM head per ratio or one shared head.

The dual-LM-head method (docs/concepts/phases.md, "Phase 1"): `MaskingConfig.mixed_ratios`,
e.g. ((0.05, 4), (0.5, 1)), masks 5% of the tokens of four sequences for every sequence
masked at 50%. Each row gets one ratio (`assign_ratios`), is masked at it (`mask_mixed`) and
is predicted by its ratio's head (`head_per_ratio=True`, the dual-head arm) or by the one
shared head (`head_per_ratio=False`, the control arm). Both arms use the same ratio
assignment and masking, so they differ only in the heads.

Loss rule, the same as `objectives.mlm`:

    L = sum_h sum_{i in S_h} -log p_h(x_i | x~)  /  sum_h |S_h|

S_h = selected positions of the rows routed to head h. Every selected token weighs the
same whichever head predicts it, so microbatches and workers still reduce one
(sum, count) pair. The recipe leaves the weighting open; with this rule the 50% rows carry
most of the loss (at 4:1, 0.5 / (4 * 0.05 + 0.5) = 71% of the selected tokens), which is
why per-head and per-ratio mean losses and selected counts are reported next to L.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction

import torch

from embedlab.core.config import MaskingConfig
from embedlab.objectives.masking import MaskedBatch, mask_tokens
from embedlab.objectives.mlm import combine, mlm_loss_sum

SHARED_HEAD = "mlm"

LossSums = Mapping[str, tuple[float, int]]


def ratio_names(mixed_ratios: Sequence[tuple[float, float]]) -> tuple[str, ...]:
    """One name per ratio, the percentage: ((0.05, 4), (0.5, 1)) -> ("mask5", "mask50").

    The names serve as head names (module names, hence "_" for a decimal point) and as
    metric keys.
    """
    names = tuple(f"mask{ratio * 100:g}".replace(".", "_") for ratio, _ in mixed_ratios)
    if len(set(names)) != len(names):
        raise ValueError(f"masking.mixed_ratios: ratios must differ, got {list(mixed_ratios)}")
    return names


def head_names(config: MaskingConfig) -> tuple[str, ...]:
    """The heads a model needs: one per ratio if `head_per_ratio`, else the shared "mlm"."""
    return ratio_names(config.mixed_ratios) if config.head_per_ratio else (SHARED_HEAD,)


def route_heads(config: MaskingConfig, ratio_index: torch.Tensor) -> torch.Tensor:
    """(B,) ratio per row -> (B,) head per row: the ratio's own head, or head 0 when shared."""
    return ratio_index if config.head_per_ratio else torch.zeros_like(ratio_index)


def next_ratios(counts: Sequence[int], weights: Sequence[float], rows: int) -> list[int]:
    """The ratio index of each of the next `rows` rows of a run that has given `counts[k]`
    rows to ratio k so far: each row goes to the ratio furthest below its share of all rows up
    to and including it, (n + 1) * w_k / sum(w) - count_k, ties to the ratio listed first.

    Exact (rational) arithmetic. Every ratio stays within one row of its share over every
    prefix of the run, so the proportion is exact whenever the rows so far are a multiple of
    the weights' total (4:1: every 5 rows), whatever the batch size: 8-row batches give
    [32, 8] over five of them, where a per-batch rounding would give [30, 10] (3:1)."""
    exact = [Fraction(str(weight)) for weight in weights]
    total, counts = sum(exact), list(counts)
    done = sum(counts)
    out = []
    for n in range(done, done + rows):
        deficits = [(n + 1) * weight / total - count for weight, count in zip(exact, counts)]
        k = max(range(len(exact)), key=lambda i: (deficits[i], -i))
        counts[k] += 1
        out.append(k)
    return out


def assign_ratios(
    batch_rows: int, mixed_ratios: Sequence[tuple[float, float]], generator: torch.Generator,
    counts: Sequence[int] | None = None,
) -> torch.Tensor:
    """(B,) long (CPU): the index into `mixed_ratios` of each row's masking ratio, for a batch
    that follows `counts` rows per ratio earlier in the run (None: the run's first batch).

    How many rows each ratio gets follows `next_ratios`, so the proportion holds over the run
    and never drifts by more than a row. Which rows get which ratio is a permutation drawn from
    `generator` (one `randperm`): rows arrive in packing order, and a fixed row-to-ratio map
    would tie a ratio to whatever the packer puts in a given row (e.g. the short leftover
    documents).
    """
    counts = [0] * len(mixed_ratios) if counts is None else counts
    ordered = torch.tensor(next_ratios(counts, [weight for _, weight in mixed_ratios], batch_rows), dtype=torch.long)
    return ordered[torch.randperm(batch_rows, generator=generator)]


def worker_ratios(global_ratios: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Worker `rank`'s rows of a global batch's (world * B,) ratio assignment, in the order
    `embedlab.streams.packed.worker_rows` deals rows: rank, rank + world, ..."""
    return global_ratios[rank::world]


def mask_mixed(
    input_ids: torch.Tensor,
    eligible: torch.Tensor,
    masking_config: MaskingConfig,
    ratio_index: torch.Tensor,
    *,
    mask_id: int,
    random_token_range: tuple[int, int] | torch.Tensor,
    generator: torch.Generator,
    word_start: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
) -> MaskedBatch:
    """Mask each row of (B, T) `input_ids` at its own ratio, `mixed_ratios[ratio_index[b]][0]`.

    Rows of one ratio go through `mask_tokens` together, with `masking_config` changed only
    in the ratio (strategy and the 80/10/10 replacement split are shared by all ratios).
    Ratios are processed in `mixed_ratios` order and a ratio with no row draws nothing, so
    the result is a function of the generator state and `ratio_index`. `word_start` (B, T)
    bool, for word-level strategies, and `segment_ids` (B, T), for spans, are sliced to the
    same rows and passed on; None passes nothing. Targets are the clean ids everywhere; `selected` is False outside the draws.
    """
    inputs = input_ids.clone()
    selected = torch.zeros_like(eligible, dtype=torch.bool)
    for index, (ratio, _) in enumerate(masking_config.mixed_ratios):
        rows = (ratio_index == index).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        single = dataclasses.replace(masking_config, ratio=ratio, mixed_ratios=(), head_per_ratio=False)
        words = {} if word_start is None else {"word_start": word_start[rows]}
        if segment_ids is not None:
            words["segment_ids"] = segment_ids[rows]
        part = mask_tokens(
            input_ids[rows], eligible[rows], single,
            mask_id=mask_id, random_token_range=random_token_range, generator=generator, **words,
        )
        inputs[rows] = part.inputs
        selected[rows] = part.selected
    return MaskedBatch(inputs=inputs, targets=input_ids, selected=selected)


def per_head_loss_sums(
    logits_by_head: Mapping[str, torch.Tensor], targets_by_head: Mapping[str, torch.Tensor]
) -> dict[str, tuple[torch.Tensor, int]]:
    """{name: (N_h, V) logits}, {name: (N_h,) clean targets} -> {name: (NLL sum, N_h)}.

    `mlm_loss_sum` per head: fp32-or-wider sums that keep the graph; an empty head gives
    (0, 0) still attached to its logits. Gather targets with `select_by_head(masked.targets,
    masked.selected, head_index, names)` so they follow the model's order.
    """
    return {name: mlm_loss_sum(logits, targets_by_head[name]) for name, logits in logits_by_head.items()}


def combined_loss_sum(sums_by_head: Mapping[str, tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, int]:
    """(sum over heads of the NLL sums, sum over heads of the counts): the same (sum, count)
    contract as `mlm_loss_sum`, so the step divides by the global selected count."""
    parts = list(sums_by_head.values())
    return torch.stack([loss for loss, _ in parts]).sum(), sum(count for _, count in parts)


def loss_metrics(head_sums: LossSums, ratio_sums: LossSums) -> dict[str, float]:
    """Report keys from (sum, count) pairs already reduced over microbatches and workers.

    `train/loss` is the token-weighted loss over all heads; `train/loss/head/<name>` and
    `train/loss/ratio/<name>` are mean selected-token losses (nan when nothing was
    selected) and `train/selected/...` their counts.
    """
    metrics = {"train/loss": combine(list(head_sums.values()))}
    for group, sums in (("head", head_sums), ("ratio", ratio_sums)):
        for name, (loss_sum, count) in sums.items():
            metrics[f"train/loss/{group}/{name}"] = combine([(loss_sum, count)])
            metrics[f"train/selected/{group}/{name}"] = float(count)
    return metrics
