"""Distillation from a frozen teacher's scores: KL over a query's own candidates and MarginMSE.

Phase 3 gives each query i its own candidates: its positive p_i and up to K hard negatives
n_ik (mined or given). A teacher scored every (query, candidate) once, offline
(`embedlab.teacher.labels`), into t_i0 = t(q_i, p_i) and t_ik = t(q_i, n_ik); the
student scores the same rows, s_i0 and s_ik, as cosines of its unit embeddings. A score the
teacher does not have (no label stored, an empty negative slot, a row below the minimum
confidence) is masked, never filled: `mask[i, k]` is False there.

KL distillation (Hinton et al. 2015; sentence-transformers' `DistillKLDivLoss`), per row

    KL_i = sum_k  p_ik (log p_ik - log q_ik),   p_i = softmax(t_i / tau_t),  q_i = softmax(s_i / tau_s)

over the row's unmasked candidates (the positive is column 0). The teacher and student
temperatures are separate: a teacher's cosines spread over a narrower range than a student
trained at tau = 0.05 needs, so one temperature for both would either flatten the target or
sharpen the student's distribution until it saturates. No tau^2 factor is applied: the
term's weight is the only scale, so a study's weight means what it says at any temperature.
A row with fewer than two unmasked candidates is a distribution over one point (KL 0, no
gradient) and is left out of the sum and of the count.

MarginMSE (Hofstaetter et al. 2020; sentence-transformers' `MarginMSELoss`), per unmasked
negative

    (  (s_i0 - s_ik) - (t_i0 - t_ik)  )^2

summed over every (i, k) whose positive and negative are both unmasked. Both sides are
cosines, so their margins live on the same [-2, 2] scale: the scale confusion of dot-product
teachers (a cross-encoder's logits against a bi-encoder's cosines) cannot arise.

Reduction. Each term is a (loss sum, count) pair, like `ContrastiveLoss`: microbatches and
workers add their sums and counts, and a step's objective divides the global sum by the
global count (known before the forward pass, from the masks alone), never a mean of means.
Every row's candidates are its own, on its own worker, so no gather is needed: the sum over
workers of local sums is the one-process sum exactly.

Embedding distillation (the student regressed onto the teacher's embeddings of any text)
is `embedding_mse` below: sum over rows of mean squared coordinate error, one count a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from embedlab.objectives.contrastive import ContrastiveLoss


@dataclass(frozen=True)
class TermSum:
    """A loss as figures that add across microbatches and workers.

    loss_sum: 0-dim, differentiable, at least fp32.  count: 0-dim long on the same device,
    the rows (or pairs) in the sum. The step's term is loss_sum / (global count).
    """

    loss_sum: torch.Tensor
    count: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.count, torch.Tensor):
            raise TypeError(f"TermSum.count must be a 0-dim tensor, got {type(self.count).__name__}")

    @property
    def mean(self) -> torch.Tensor:
        """loss_sum / count; with nothing counted, the differentiable zero `loss_sum` (never nan)."""
        return torch.where(self.count > 0, self.loss_sum / self.count.clamp(min=1), self.loss_sum)


def _check_scores(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> None:
    if student.ndim != 2 or teacher.shape != student.shape or mask.shape != student.shape:
        raise ValueError(f"student, teacher and mask must share one (N, K) shape, got {tuple(student.shape)}, "
                         f"{tuple(teacher.shape)} and {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")


def kl_rows(mask: torch.Tensor) -> torch.Tensor:
    """(N, K) bool -> (N,) bool: the rows KL distillation counts (two or more unmasked scores)."""
    return mask.sum(dim=1) >= 2


def kl_distillation(
    student_scores: torch.Tensor,
    teacher_scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    student_temperature: float | torch.Tensor,
    teacher_temperature: float,
) -> TermSum:
    """KL(teacher || student) over each row's unmasked candidates (module docstring).

    student_scores (N, K): the student's cosines, differentiable. teacher_scores (N, K): the
    teacher's, constants (masked entries may hold anything, nan included). mask (N, K) bool.
    Temperatures > 0; the student's may be a 0-dim tensor (a learnable temperature).

    Reduction: sum of KL_i over rows with at least two unmasked candidates; count = those rows.
    """
    _check_scores(student_scores, teacher_scores, mask)
    if not teacher_temperature > 0 or (not isinstance(student_temperature, torch.Tensor)
                                       and not student_temperature > 0):
        raise ValueError(f"temperatures must be > 0, got student {student_temperature}, teacher {teacher_temperature}")
    dtype = torch.promote_types(student_scores.dtype, torch.float32)
    rows = kl_rows(mask)
    # Rows that are not counted score over a dummy all-unmasked row: a row of all -inf would
    # give a nan backward even if masked out afterwards (as in the InfoNCE).
    # The teacher's masked entries may be nan: zeros in their place, so no nan meets a product
    # whose backward would carry it (0 * nan) even where the forward drops it.
    usable = mask & rows[:, None] | ~rows[:, None]
    teacher = torch.where(mask & rows[:, None], teacher_scores.to(dtype), 0.0).detach() / teacher_temperature
    if isinstance(student_temperature, torch.Tensor):
        student_temperature = student_temperature.to(dtype)
    student = student_scores.to(dtype) / student_temperature
    log_p = teacher.masked_fill(~usable, -math.inf).log_softmax(dim=1)
    log_q = student.masked_fill(~usable, -math.inf).log_softmax(dim=1)
    # p log p - p log q on the usable entries only: 0 * -inf would be nan.
    per_entry = torch.where(usable, log_p.exp() * (log_p - log_q), 0.0)
    per_row = torch.where(rows, per_entry.sum(dim=1), 0.0)
    return TermSum(loss_sum=per_row.sum(), count=rows.sum())


def margin_pairs(mask: torch.Tensor) -> torch.Tensor:
    """(N, 1 + K) bool -> (N, K) bool: the (query, negative) pairs MarginMSE counts (the positive
    and that negative both unmasked)."""
    return mask[:, :1] & mask[:, 1:]


def margin_mse(
    student_scores: torch.Tensor,
    teacher_scores: torch.Tensor,
    mask: torch.Tensor,
) -> TermSum:
    """MarginMSE over every unmasked (positive, negative) margin (module docstring).

    student_scores, teacher_scores, mask: (N, 1 + K), column 0 the positive, columns 1..K the
    negatives; the student's differentiable, the teacher's constants (masked entries ignored).

    Reduction: sum over counted (i, k) of the squared margin error; count = those pairs.
    """
    _check_scores(student_scores, teacher_scores, mask)
    if student_scores.shape[1] < 2:
        raise ValueError(f"MarginMSE needs a positive and at least one negative column, got {student_scores.shape[1]}")
    dtype = torch.promote_types(student_scores.dtype, torch.float32)
    pairs = margin_pairs(mask)
    student = student_scores.to(dtype)
    teacher = torch.where(mask, teacher_scores.to(dtype), 0.0).detach()
    student_margin = student[:, :1] - student[:, 1:]  # (N, K)
    teacher_margin = teacher[:, :1] - teacher[:, 1:]
    error = torch.where(pairs, (student_margin - teacher_margin) ** 2, 0.0)
    return TermSum(loss_sum=error.sum(), count=pairs.sum())


def embedding_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor | None = None) -> TermSum:
    """Embedding distillation: student (N, d) regressed onto teacher (N, d) (constants).

    A student of another width is projected to the teacher's by the caller. Per row the mean
    squared coordinate error (1/d) ||s_i - t_i||^2, so the term's size does not grow with d.
    mask (N,) bool: rows with a teacher embedding (default all).

    Reduction: sum over unmasked rows; count = those rows.
    """
    if student.ndim != 2 or teacher.shape != student.shape:
        raise ValueError(f"student and teacher must share one (N, d) shape, got {tuple(student.shape)} and "
                         f"{tuple(teacher.shape)}")
    mask = torch.ones(len(student), dtype=torch.bool, device=student.device) if mask is None else mask
    if mask.shape != (len(student),) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor of shape ({len(student)},), got {mask.dtype} {tuple(mask.shape)}")
    dtype = torch.promote_types(student.dtype, torch.float32)
    target = torch.where(mask[:, None], teacher.to(dtype), 0.0).detach()
    per_row = ((student.to(dtype) - target) ** 2).mean(dim=1)
    return TermSum(loss_sum=torch.where(mask, per_row, 0.0).sum(), count=mask.sum())


def own_candidate_scores(queries: torch.Tensor, candidates: torch.Tensor, negatives_per_row: int) -> torch.Tensor:
    """queries (N, d) and candidates (N + N*K, d) -> (N, 1 + K) cosines of each query with its own
    positive (candidates[i]) and negatives (candidates[N + i*K + k]), the layout a phase-3
    microbatch encodes them in. One batched matmul, which FlopCounterMode counts as
    2 * N * (1 + K) * d forward (`embedlab.model.flops.similarity_forward_flops(N, 1 + K, d)`)."""
    n, k = len(queries), negatives_per_row
    if candidates.shape != (n * (1 + k), queries.shape[1]):
        raise ValueError(f"expected {n * (1 + k)} candidates of width {queries.shape[1]} for {n} queries with "
                         f"{k} negatives each, got {tuple(candidates.shape)}")
    own = torch.cat([candidates[:n, None, :], candidates[n:].reshape(n, k, -1)], dim=1)  # (N, 1 + K, d)
    return torch.bmm(own, queries[:, :, None]).squeeze(2)


@dataclass(frozen=True)
class DistilledLoss(ContrastiveLoss):
    """A contrastive term with distillation terms folded into its `loss_sum`, so that every
    backward path (`ContrastiveLoss.objective(valid, scale)`, GradCache's included)
    differentiates

        scale * ( (1 - sum_j w_j) * S_nce / V  +  sum_j w_j * S_j / C_j )

    with V the step's global valid anchors and C_j each term's global count: `loss_sum` is
    (1 - sum_j w_j) * S_nce + sum_j w_j * S_j * V / C_j (a term with C_j = 0 is left out).
    `infonce_sum` keeps the InfoNCE's own sum and `terms` each distillation term's local
    (loss sum, count), for reporting."""

    infonce_sum: torch.Tensor | None = None
    terms: tuple[tuple[str, TermSum], ...] = ()


def with_distillation(infonce: ContrastiveLoss, terms: dict[str, tuple[TermSum, float, int]], valid: int
                      ) -> DistilledLoss:
    """Fold `terms` (name -> (local TermSum, weight, global count)) into `infonce`, whose global
    valid anchor count is `valid` (`DistilledLoss`)."""
    if valid <= 0:
        raise ValueError(f"valid must be > 0, got {valid}")
    rest = 1.0 - sum(weight for _, weight, _ in terms.values())
    loss_sum = rest * infonce.loss_sum
    for term, weight, count in terms.values():
        if weight and count:
            loss_sum = loss_sum + term.loss_sum * (weight * valid / count)
    return DistilledLoss(loss_sum=loss_sum, valid=infonce.valid, anchors=infonce.anchors,
                         candidate_sum=infonce.candidate_sum, infonce_sum=infonce.loss_sum,
                         terms=tuple((name, term) for name, (term, _, _) in terms.items()))
