"""Multi-positive ("log-sum-positive") InfoNCE, as a loss sum and a valid-anchor count.

For anchors q_i (N, d) and candidates d_j (M, d), both L2-normalised so that q_i.d_j is a
cosine similarity in [-1, 1], a temperature tau > 0, eligible candidates C_i and positives
P_i, a subset of C_i, the recipe's Phase-2 objective is

    L_{q->d} = -(1/N_valid) sum_i log( sum_{j in P_i} exp(q_i.d_j / tau)
                                       / sum_{j in C_i} exp(q_i.d_j / tau) )

The sum runs over *valid* anchors only: rows with at least one positive. A row without a
positive has no target (its log-ratio would be -inf), so it is left out of both the sum
and N_valid and is counted as skipped (`ContrastiveLoss.anchors - valid`).

Log-sum-positive versus averaging per-positive cross-entropies. With p_ij the softmax of
q_i.d_j / tau over C_i, this loss is  -log sum_{j in P_i} p_ij : an anchor is satisfied
when its positives *together* hold the probability mass, however it is split among them.
The gradient pulls positive j with weight p_ij / sum_{P_i} p (its share of the positive
mass), so the closest positive dominates and a weak or wrong positive (same-document
spans are weak positives, per the recipe) is not forced onto the anchor. The alternative,
-(1/|P_i|) sum_{j in P_i} log p_ij  (SupCon's L_out, Khosla et al. 2020), pulls every
positive equally: it wants all |P_i| positives equally close, so it cannot reach 0 while
other positives share the denominator, and it drags noisy positives in with the rest. It
suits clean class labels; log-sum-positive suits groups of plausible-but-unequal
positives, which is what Phase 2 has. (SupCon's L_in, -log((1/|P_i|) sum_P p_ij), equals
this loss plus log|P_i| and has the same gradient.) With one positive per anchor both
reduce to the standard InfoNCE, i.e. cross-entropy on the logits.

`temperature` is a temperature (logits are divided by it), never a scale (a multiplier,
as in sentence-transformers' `scale=20`, which is 1/tau = 1/0.05). It is a float or a
0-dim tensor, e.g. from `LearnableTemperature`.

Logits are computed in at least fp32 (bf16/fp16 embeddings are upcast before the matmul,
where a bf16 rounding of 4e-3 would already be 0.4 in a logit at tau = 0.01), and both
log-sums use `logsumexp` with -inf masking, so logits of 1e3 and more neither overflow
nor produce nan.

Microbatches, workers and the two directions of a symmetric loss each contribute a
(loss sum, valid count) pair; the loss of a step is total sum / total count (`pooled`),
never a mean of means, as for the MLM loss (`embedlab.objectives.mlm`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ContrastiveLoss:
    """One contrastive term as figures that add across microbatches, workers and directions.

    loss_sum: 0-dim, differentiable, dtype at least fp32: the sum over valid anchors of
        -log(positive mass / eligible mass).
    valid: 0-dim long, on the loss's device: anchors with at least one positive (the rows in
        the sum). A tensor, so computing it never reads the device back; `int()` reads it.
    anchors: all anchor rows (a shape, so an int); `anchors - valid` rows were skipped for
        having no positive.
    candidate_sum: 0-dim long, on the loss's device: sum over valid anchors of |C_i|
        (eligible candidates, positives included), so `mean_candidates` is the effective
        denominator size the recipe asks to record.
    """

    loss_sum: torch.Tensor
    valid: torch.Tensor
    anchors: int
    candidate_sum: torch.Tensor

    def __post_init__(self) -> None:
        for name in ("valid", "candidate_sum"):
            if not isinstance(getattr(self, name), torch.Tensor):
                raise TypeError(f"ContrastiveLoss.{name} must be a 0-dim tensor on the loss's device, got "
                                f"{type(getattr(self, name)).__name__}: a training step reads its counts once, at its end")

    @property
    def mean(self) -> torch.Tensor:
        """loss_sum / valid; with no valid anchor, the differentiable zero `loss_sum` (never nan)."""
        return torch.where(self.valid > 0, self.loss_sum / self.valid.clamp(min=1), self.loss_sum)

    def objective(self, count: int | None = None, scale: float = 1.0) -> torch.Tensor:
        """What a backward of this term differentiates: scale * loss_sum / count, `count` the
        valid anchors of the whole step (all microbatches and workers) and `scale` the term's
        weight in the step's objective; None: scale * `mean`, this term's own count. One
        expression for every backward path, so a plain step and GradCache
        (`embedlab.objectives.gradcache`) given the same count and scale differentiate the
        same float computation."""
        if count is None:
            return scale * self.mean
        return scale * self.loss_sum / count

    @property
    def mean_candidates(self) -> float:
        """Mean |C_i| over valid anchors (nan if none); reads the counts."""
        valid = int(self.valid)
        return int(self.candidate_sum) / valid if valid else float("nan")


def pooled(parts: Sequence[ContrastiveLoss]) -> ContrastiveLoss:
    """Sum of the sums and of every count: the exact combination of parts (not a mean of means)."""
    return ContrastiveLoss(
        loss_sum=torch.stack([p.loss_sum for p in parts]).sum(),
        valid=torch.stack([p.valid for p in parts]).sum(),
        anchors=sum(p.anchors for p in parts),
        candidate_sum=torch.stack([p.candidate_sum for p in parts]).sum(),
    )


@dataclass(frozen=True)
class PairMasks:
    """positive (N, M) bool: j is in P_i.  eligible (N, M) bool: j is in C_i (positive implies eligible)."""

    positive: torch.Tensor
    eligible: torch.Tensor


def pair_masks(
    query_groups: torch.Tensor, candidate_groups: torch.Tensor, *, exclude: torch.Tensor | None = None
) -> PairMasks:
    """Masks from positive-group ids: (N,) and (M,) integer ids, optional (N, M) bool -> PairMasks.

    positive[i, j] = candidate_groups[j] == query_groups[i]: every candidate of the anchor's
    group is a positive, so a duplicate or paraphrase in the same group is never a negative.
    A candidate that is nobody's positive (a mined hard negative) gets a group id no query has.

    exclude[i, j] = True removes candidate j from anchor i's candidate set entirely, as
    neither positive nor negative: known false negatives, or the anchor's own copy when the
    candidates include the queries (pass an identity matrix).
    """
    if query_groups.ndim != 1 or candidate_groups.ndim != 1:
        raise ValueError(
            f"query_groups and candidate_groups must be 1-D, got shapes "
            f"{tuple(query_groups.shape)} and {tuple(candidate_groups.shape)}"
        )
    same_group = query_groups[:, None] == candidate_groups[None, :]  # (N, M)
    if exclude is None:
        return PairMasks(positive=same_group, eligible=torch.ones_like(same_group))
    if exclude.shape != same_group.shape or exclude.dtype != torch.bool:
        raise ValueError(f"exclude must be a bool tensor of shape {tuple(same_group.shape)}, got "
                         f"{exclude.dtype} {tuple(exclude.shape)}")
    keep = ~exclude
    return PairMasks(positive=same_group & keep, eligible=keep)


def multi_positive_infonce(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    positive: torch.Tensor,
    eligible: torch.Tensor,
    *,
    temperature: torch.Tensor | float,
) -> ContrastiveLoss:
    """The query->candidate log-sum-positive InfoNCE (module docstring) as a sum and counts.

    queries (N, d) and candidates (M, d): L2-normalised embeddings of any float dtype.
    positive (N, M) bool: P_i.  eligible (N, M) bool: C_i; positives are added to it, so
    P_i is always a subset of C_i whatever the caller passes.
    temperature: tau > 0, a float or a 0-dim tensor (learnable, gradients flow into it).

    Reduction: sum over valid anchors (rows with a positive); rows without one contribute
    nothing and are counted in `anchors - valid`. Candidates outside C_i are excluded from
    both log-sums. Divide `loss_sum` by the valid count of the whole step (all microbatches,
    all workers) for the mean.
    """
    if queries.ndim != 2 or candidates.ndim != 2 or candidates.shape[1] != queries.shape[1]:
        raise ValueError(f"queries and candidates must be (N, d) and (M, d), got "
                         f"{tuple(queries.shape)} and {tuple(candidates.shape)}")
    count, rows = queries.shape[0], candidates.shape[0]
    for name, mask in (("positive", positive), ("eligible", eligible)):
        if mask.dtype != torch.bool or mask.shape != (count, rows):
            raise ValueError(f"{name} must be a bool tensor of shape ({count}, {rows}), "
                             f"got {mask.dtype} {tuple(mask.shape)}")
    if not isinstance(temperature, torch.Tensor) and not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    compute_dtype = torch.promote_types(torch.promote_types(queries.dtype, candidates.dtype), torch.float32)
    valid_rows = positive.any(dim=1)  # (N,)
    eligible = eligible | positive
    # A row with no positive has an all -inf positive log-sum, whose backward is nan even if
    # the row were masked out afterwards. Such a row scores over every candidate on both
    # sides instead (a finite zero) and is left out of the sum. No row is dropped by
    # indexing: the valid rows' count would have to be read back from the device first.
    everything = ~valid_rows[:, None]  # (N, 1)
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(compute_dtype)
    similarity = queries.to(compute_dtype) @ candidates.to(compute_dtype).T  # (N, M)
    logits = similarity / temperature
    log_positive_mass = logits.masked_fill(~(positive | everything), -math.inf).logsumexp(dim=1)  # (N,)
    log_eligible_mass = logits.masked_fill(~(eligible | everything), -math.inf).logsumexp(dim=1)  # (N,)
    per_anchor = torch.where(valid_rows, log_eligible_mass - log_positive_mass, 0.0)  # (N,)
    return ContrastiveLoss(
        loss_sum=per_anchor.sum(),
        valid=valid_rows.sum(),
        anchors=count,
        candidate_sum=(eligible & valid_rows[:, None]).sum(),
    )


def symmetric_infonce(
    queries: torch.Tensor,
    candidates: torch.Tensor,
    positive: torch.Tensor,
    eligible: torch.Tensor,
    *,
    temperature: torch.Tensor | float,
) -> ContrastiveLoss:
    """Both directions, query->candidate and candidate->query, pooled into one sum and count.

    Same inputs as `multi_positive_infonce`; the reverse direction uses the transposed masks
    (candidate j's positives are the queries it is a positive of; an exclusion applies both
    ways). For genuinely symmetric pair tasks only: asymmetric query-document tasks need a
    deliberate direction choice (recipe, Phase 2).

    Which average: the pooled one, (S_qd + S_dq) / (V_qd + V_dq). On a symmetric pair batch
    every item has a counterpart, V_qd = V_dq, and this is exactly 0.5 * (L_qd + L_dq) (the
    CLIP average). Unlike the mean of the two means it stays a (sum, count) pair, so it
    combines across microbatches and workers exactly; when the counts differ (say, extra
    candidates that are nobody's positive are not valid reverse anchors) each valid anchor
    of either direction weighs the same.

    Across workers, build the two directions yourself against gathered sets, local queries
    against all candidates and local candidates against all queries, and `pooled` them.
    """
    forward = multi_positive_infonce(queries, candidates, positive, eligible, temperature=temperature)
    reverse = multi_positive_infonce(candidates, queries, positive.T, eligible.T, temperature=temperature)
    return pooled([forward, reverse])


class LearnableTemperature(nn.Module):
    """A learnable temperature tau = exp(clamp(log_tau, log(minimum), log(maximum))).

    Parametrised by log-temperature so that tau stays positive and an optimiser step changes
    it multiplicatively (a step of 0.01 in log_tau is 1% of tau, at 0.01 as at 1.0). The
    clamp bounds the value the loss sees: below `minimum` logits of unit vectors reach
    1/minimum and training becomes unstable (CLIP caps its scale at 100, i.e. tau >= 0.01);
    above `maximum` the softmax over candidates is nearly flat. Outside the bounds the
    gradient of log_tau is zero, so the optimiser stops pushing it further. The parameter
    is 0-dim, so embedlab's optimiser rule (fewer than 2 dims: no weight decay) exempts it.
    """

    def __init__(self, initial: float, *, minimum: float = 0.01, maximum: float = 1.0) -> None:
        super().__init__()
        if not 0.0 < minimum <= initial <= maximum:
            raise ValueError(
                f"temperature bounds must satisfy 0 < minimum <= initial <= maximum, got "
                f"minimum={minimum}, initial={initial}, maximum={maximum}"
            )
        self.minimum, self.maximum = minimum, maximum
        self.log_temperature = nn.Parameter(torch.tensor(math.log(initial)))

    def forward(self) -> torch.Tensor:
        """The current temperature, a 0-dim tensor in [minimum, maximum]."""
        return self.log_temperature.clamp(math.log(self.minimum), math.log(self.maximum)).exp()

    def extra_repr(self) -> str:
        return f"minimum={self.minimum}, maximum={self.maximum}"
