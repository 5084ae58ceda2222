"""Cross-device candidates: every worker's rows, gathered with (or without) autograd.

Gradient contract. Each rank computes the loss of its *local* queries against the
*global* candidate set  gather_with_grad(local_candidates)  and backpropagates

    loss_r = local_sum_r / global_valid,   global_valid = all-reduce SUM of the valid counts

(the count is all-reduced before backward, as in `embedlab.train.mlm_step`). The backward
of the all-gather is a reduce-scatter with SUM (an all-to-all and a sum on gloo): the
gradient that rank r's loss puts on rank s's candidate rows is sent back to rank s and
added to what the other ranks put there. So after backward, rank s's parameter gradients
are  d(sum_r loss_r)/d(theta)  through rank s's own embeddings, and *summing* the
parameter gradients over ranks (all-reduce SUM, which is what embedlab's trainer does)
gives exactly the one-process gradient of the global mean  sum_r local_sum_r / global_valid.
DDP's *average* would be this divided by the world size. The backward is a collective:
every rank must run it, including a rank with no valid anchor (its `loss_sum` is a
differentiable zero connected to the gathered candidates, so it does).

Gradient accumulation does NOT enlarge the contrastive denominator: each microbatch sees
only the candidates gathered in that microbatch, so k microbatches of B rows on W workers
train with W*B candidates per anchor, not k*W*B (recipe, Phase 2). Only a larger gathered
batch, GradCache (`embedlab.objectives.gradcache`) or a memory bank enlarges it. The size
actually used is recorded from the loss: `ContrastiveLoss.mean_candidates`.

Unequal batch sizes per rank are allowed (the last batch of an epoch, filtered pairs):
the row counts are all-gathered first, every rank pads to the largest, gathers, and strips
the padding, so the result is exactly the concatenation of the real rows in rank order and
padding never becomes a candidate. That costs one small extra collective per call.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn


def world_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in the group, 1 when no process group is initialised."""
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def gather_with_grad(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """(n_r, ...) on each rank -> (sum_r n_r, ...) in rank order, differentiable (module docstring).

    Identity (the same tensor) without a process group or with one rank.
    """
    if world_size(group) == 1:
        return x
    sizes = _row_counts(x, group)
    with warnings.catch_warnings():
        # Deprecated in favour of a private functional-collectives API; this public one has
        # exactly the autograd contract documented above (reduce-scatter SUM in backward).
        warnings.simplefilter("ignore", FutureWarning)
        parts = dist_fn.all_gather(
            _pad_rows(x, max(sizes)), group=group if group is not None else dist.group.WORLD
        )
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


def gather_no_grad(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """(n_r, ...) on each rank -> (sum_r n_r, ...) in rank order, without autograd (ids, groups).

    Identity without a process group or with one rank.
    """
    if world_size(group) == 1:
        return x
    sizes = _row_counts(x, group)
    padded = _pad_rows(x.detach(), max(sizes))
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])


def _row_counts(x: torch.Tensor, group: dist.ProcessGroup | None) -> list[int]:
    local = torch.tensor([x.shape[0]], dtype=torch.long, device=x.device)
    counts = [torch.empty_like(local) for _ in range(world_size(group))]
    dist.all_gather(counts, local, group=group)
    return [int(c) for c in counts]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """Zero rows appended up to `rows` (all-gather needs one shape on every rank)."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])
