"""Matryoshka representation learning: one contrastive loss at several nested embedding widths.

Kusupati et al. 2022 ("Matryoshka Representation Learning", arXiv:2205.13147). With unit
embeddings q_i, c_j of width d and nested widths d_1 < ... < d_K <= d with weights w_k, the
objective is

    L = sum_k w_k * L_InfoNCE( trunc(q, d_k), trunc(c, d_k) ),   trunc(x, m) = x[:, :m] / ||x[:, :m]||

so that the first d_k coordinates of an embedding, re-normalised, are an embedding of their
own. Truncation comes after pooling and before the score matrix; re-normalising matters
because cosine scores of a truncated unit vector are not cosines. The widths are exactly the
ones listed: a study trains "one quarter-width dimension" by listing only d/4, and the full
width is a term only when it is listed (or when nothing is: plain training, width d alone).

As a (sum, count) pair: every width scores the same anchors under the same masks, so the
terms share `valid` and `candidate_sum`, and the weighted loss sums add. The step's objective
sum_k w_k S_k / V_step is then the weighted sum of the per-width means, and it combines
across microbatches and workers exactly as one InfoNCE term does
(`embedlab.objectives.contrastive.pooled`). Because the terms are computed from the full
embeddings inside the loss, GradCache's cached dL/de holds every width's gradient: the
re-encode pass needs nothing Matryoshka-specific.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from embedlab.model.pooling import l2_normalise
from embedlab.objectives.contrastive import ContrastiveLoss


def truncate(embeddings: torch.Tensor, width: int) -> torch.Tensor:
    """(N, d) embeddings -> (N, width) unit rows: the first `width` coordinates, re-normalised
    (a zero row stays zero). `width` must be in 1..d."""
    if not 1 <= width <= embeddings.shape[-1]:
        raise ValueError(f"truncation width must be in 1..{embeddings.shape[-1]}, got {width}")
    return l2_normalise(embeddings[..., :width])


def weighted_terms(terms: Sequence[ContrastiveLoss], weights: Sequence[float]) -> ContrastiveLoss:
    """sum_k w_k * terms[k] as one term: weighted loss sums, the shared counts.

    Every term must count the same anchors (one batch at several widths); a ValueError
    otherwise, since a weighted sum over different anchors would not be a mean of anything.
    """
    if not terms or len(terms) != len(weights):
        raise ValueError(f"{len(terms)} terms but {len(weights)} weights")
    first = terms[0]
    for term in terms[1:]:
        if term.anchors != first.anchors:
            raise ValueError(f"terms over different anchors: {term.anchors} and {first.anchors}")
    loss_sum = torch.stack([weight * term.loss_sum for term, weight in zip(terms, weights)]).sum()
    return ContrastiveLoss(loss_sum=loss_sum, valid=first.valid, anchors=first.anchors,
                           candidate_sum=first.candidate_sum)


def matryoshka_loss(
    term: Callable[[torch.Tensor, torch.Tensor], ContrastiveLoss],
    queries: torch.Tensor,
    candidates: torch.Tensor,
    widths: Sequence[int],
    weights: Sequence[float],
) -> ContrastiveLoss:
    """sum_k w_k * term(trunc(queries, d_k), trunc(candidates, d_k)) (module docstring).

    queries (N, d), candidates (M, d): unit embeddings. `term` scores truncated ones (an
    InfoNCE with its masks and temperature bound, gathering across workers if it does).
    Reduction: as `term`'s, a loss sum over valid anchors, weighted per width; the counts are
    the first width's (all widths share them).
    """
    return weighted_terms([term(truncate(queries, width), truncate(candidates, width)) for width in widths],
                          weights)
