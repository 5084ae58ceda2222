"""The masked-language-modelling loss as a sum and a count.

    L_MLM = - sum_{b,t} m_bt log p(x_bt | x~_b)  /  sum_{b,t} m_bt

Microbatches and workers each contribute a (loss sum, selected count) pair; the loss of
the whole step is total sum / total count. Averaging per-microbatch means instead would
weight a microbatch with 3 selected tokens like one with 300.

Empty-selection policy: a microbatch with no selected token contributes (0, 0). If a
whole step (all microbatches on all workers) selects nothing, the trainer skips the
update and counts the skip; it never divides by zero.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F


def mlm_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(N, V) logits at the N selected positions, (N,) clean targets -> (sum of NLL, N).

    The sum is computed in at least fp32 (bf16/fp16 logits are upcast first).
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if targets.numel() == 0:
        return logits.sum() * 0.0, 0
    loss = F.cross_entropy(logits, targets, reduction="sum")
    return loss, int(targets.numel())


def combine(sums_and_counts: list[tuple[float, int]]) -> float:
    """Mean selected-token loss over parts: sum of sums / sum of counts (nan if no token)."""
    total = sum(s for s, _ in sums_and_counts)
    count = sum(c for _, c in sums_and_counts)
    return total / count if count else float("nan")


@torch.no_grad()
def grouped_loss_sums(
    logits_by_head: Mapping[str, torch.Tensor],
    targets_by_head: Mapping[str, torch.Tensor],
    group_by_head: Mapping[str, torch.Tensor],
    groups: int,
) -> torch.Tensor:
    """Selected-token NLL sums by group, over every head, for reports.

    {name: (N_h, V) logits}, {name: (N_h,) clean targets}, {name: (N_h,) long group of each
    token in [0, groups)} -> (groups,) float64 NLL sums on the logits' device: each head's
    sums, summed in head order. Detached; no count, as counts come from host tensors, and no
    read back to the host (a report group is a masking ratio or a data source).
    """
    first = next(iter(logits_by_head.values()))
    sums = torch.zeros(groups, dtype=torch.float64, device=first.device)
    for name, logits in logits_by_head.items():
        nll = F.cross_entropy(logits.float(), targets_by_head[name], reduction="none")  # (N_h,)
        sums += torch.zeros_like(sums).index_add_(0, group_by_head[name], nll.double())
    return sums
