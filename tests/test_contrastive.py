"""The multi-positive InfoNCE against its formula, standard InfoNCE and finite differences."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from embedlab.objectives.contrastive import (
    ContrastiveLoss,
    LearnableTemperature,
    multi_positive_infonce,
    pair_masks,
    pooled,
    symmetric_infonce,
)


def unit_rows(rows: int, width: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(rows, width, generator=generator, dtype=dtype), dim=-1)


# 7 queries, 10 candidates. Query group 5 has three positives, group 9 none (an invalid row),
# candidate groups 20 and 21 are nobody's positive (hard negatives).
QUERY_GROUPS = torch.tensor([0, 1, 2, 5, 5, 9, 3])
CANDIDATE_GROUPS = torch.tensor([0, 1, 2, 5, 5, 5, 3, 20, 21, 1])


def exclusions() -> torch.Tensor:
    exclude = torch.zeros(7, 10, dtype=torch.bool)
    exclude[0, 7] = True  # a known false negative of query 0
    exclude[3, 5] = True  # an excluded positive: neither positive nor negative
    return exclude


def naive_loss(queries, candidates, query_groups, candidate_groups, exclude, temperature):
    """The recipe's formula with Python loops and math.exp/log: (sum, valid, candidate_sum)."""
    total, valid, candidate_sum = 0.0, 0, 0
    for i, q in enumerate(queries.tolist()):
        scores = {j: math.exp(sum(a * b for a, b in zip(q, d)) / temperature)
                  for j, d in enumerate(candidates.tolist()) if not exclude[i, j]}
        positives = [j for j in scores if candidate_groups[j] == query_groups[i]]
        if not positives:
            continue
        total -= math.log(sum(scores[j] for j in positives) / sum(scores.values()))
        valid += 1
        candidate_sum += len(scores)
    return total, valid, candidate_sum


def test_matches_a_naive_per_row_reference():
    """Loss sum, valid count and candidate count equal a loop over rows of the recipe's formula."""
    queries, candidates = unit_rows(7, 5, 0), unit_rows(10, 5, 1)
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclusions())
    result = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible, temperature=0.1)
    want_sum, want_valid, want_candidates = naive_loss(
        queries, candidates, QUERY_GROUPS.tolist(), CANDIDATE_GROUPS.tolist(), exclusions(), 0.1
    )
    assert (result.valid, result.anchors, result.candidate_sum) == (want_valid, 7, want_candidates)
    assert want_valid == 6 and result.mean_candidates == want_candidates / 6
    assert abs(float(result.loss_sum) - want_sum) < 1e-12


def test_same_group_items_are_positives_never_negatives():
    """pair_masks marks every same-group candidate positive (unless excluded), and positives are always eligible."""
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclusions())
    same_group = QUERY_GROUPS[:, None] == CANDIDATE_GROUPS[None, :]
    assert torch.equal(masks.positive, same_group & ~exclusions())
    assert not (masks.positive & ~masks.eligible).any()
    assert not masks.eligible[0, 7] and not masks.eligible[3, 5] and not masks.positive[3, 5]


def test_positives_are_made_eligible():
    """A positive left out of `eligible` by the caller is still in the denominator (P_i within C_i)."""
    queries, candidates = unit_rows(7, 5, 2), unit_rows(10, 5, 3)
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS)
    negatives_only = masks.eligible & ~masks.positive
    got = multi_positive_infonce(queries, candidates, masks.positive, negatives_only, temperature=0.1)
    want = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible, temperature=0.1)
    assert float(got.loss_sum) == float(want.loss_sum) and got.candidate_sum == want.candidate_sum


def test_single_positive_equals_cross_entropy():
    """With one positive per row over all candidates, the loss is F.cross_entropy on the logits (standard InfoNCE)."""
    queries, candidates = unit_rows(6, 8, 4), unit_rows(9, 8, 5)
    targets = torch.tensor([3, 0, 8, 1, 1, 6])
    positive = F.one_hot(targets, 9).bool()
    result = multi_positive_infonce(queries, candidates, positive, torch.ones_like(positive), temperature=0.05)
    want = F.cross_entropy(queries @ candidates.T / 0.05, targets)
    torch.testing.assert_close(result.mean, want, atol=1e-12, rtol=0)


def test_rows_without_positive_are_excluded_and_counted():
    """A row with no positive adds nothing to the sum, is left out of the mean's count and gets no gradient."""
    queries = unit_rows(7, 5, 6).requires_grad_()
    candidates = unit_rows(10, 5, 7)
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS)
    result = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible, temperature=0.1)
    keep = QUERY_GROUPS != 9
    without = multi_positive_infonce(queries[keep], candidates, masks.positive[keep], masks.eligible[keep],
                                     temperature=0.1)
    assert (result.valid, result.anchors) == (6, 7)
    torch.testing.assert_close(result.mean, without.mean, atol=1e-12, rtol=0)
    result.mean.backward()
    assert torch.isfinite(queries.grad).all() and not queries.grad[5].any()


def test_no_valid_row_gives_a_differentiable_zero():
    """With no positive anywhere, the sum is a zero that still backpropagates (finite, zero gradients)."""
    candidates = unit_rows(4, 3, 8).requires_grad_()
    none = torch.zeros(2, 4, dtype=torch.bool)
    result = multi_positive_infonce(unit_rows(2, 3, 9), candidates, none, ~none, temperature=0.1)
    assert result.valid == 0 and math.isnan(result.mean_candidates)
    result.mean.backward()
    assert float(result.loss_sum.detach()) == 0.0 and not candidates.grad.any()


def test_stable_at_tiny_temperature():
    """Logits near 1e3 (temperature 1e-3) give a finite loss and gradients that match float64 in float32."""
    queries64, candidates64 = unit_rows(7, 5, 10), unit_rows(10, 5, 11)
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclusions())
    results = []
    for dtype in (torch.float32, torch.float64):
        queries = queries64.to(dtype).requires_grad_()
        result = multi_positive_infonce(queries, candidates64.to(dtype), masks.positive, masks.eligible,
                                        temperature=1e-3)
        result.mean.backward()
        assert torch.isfinite(result.loss_sum) and torch.isfinite(queries.grad).all()
        results.append((result.mean.detach().double(), queries.grad.double()))
    (loss32, grad32), (loss64, grad64) = results
    assert float(loss64) > 100  # the logits really are in the hundreds
    torch.testing.assert_close(loss32, loss64, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad32, grad64, rtol=1e-5, atol=1e-3)


def test_half_precision_is_computed_in_fp32():
    """bf16 embeddings give an fp32 loss sum."""
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS)
    result = multi_positive_infonce(unit_rows(7, 5, 12, torch.bfloat16), unit_rows(10, 5, 13, torch.bfloat16),
                                    masks.positive, masks.eligible, temperature=0.05)
    assert result.loss_sum.dtype == torch.float32


def test_temperature_divides_the_logits():
    """Doubling the temperature halves the logits: loss(q, tau=0.2) equals loss(q/2, tau=0.1)."""
    queries, candidates = unit_rows(7, 5, 14), unit_rows(10, 5, 15)
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclusions())
    doubled = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible, temperature=0.2)
    halved = multi_positive_infonce(queries / 2, candidates, masks.positive, masks.eligible, temperature=0.1)
    as_tensor = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible,
                                       temperature=torch.tensor(0.2, dtype=torch.float64))
    torch.testing.assert_close(doubled.loss_sum, halved.loss_sum, atol=1e-12, rtol=0)
    torch.testing.assert_close(doubled.loss_sum, as_tensor.loss_sum, atol=1e-12, rtol=0)


def test_symmetric_is_the_pooled_two_directions():
    """The symmetric loss pools the forward term with the transposed reverse term; on 1-1 pairs it is 0.5*(L_qd + L_dq)."""
    queries, candidates = unit_rows(5, 4, 16), unit_rows(5, 4, 17)
    eye = torch.eye(5, dtype=torch.bool)
    both = symmetric_infonce(queries, candidates, eye, ~eye, temperature=0.07)
    targets = torch.arange(5)
    logits = queries @ candidates.T / 0.07
    want = 0.5 * (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets))
    torch.testing.assert_close(both.mean, want, atol=1e-12, rtol=0)
    assert (both.valid, both.anchors, both.candidate_sum) == (10, 10, 50)


def test_pooled_microbatches_equal_the_whole_batch():
    """Pooling the (sum, count) of query microbatches of unequal valid counts gives the whole batch's mean."""
    queries, candidates = unit_rows(7, 5, 20), unit_rows(10, 5, 21)
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclusions())
    whole = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible, temperature=0.1)
    parts = [multi_positive_infonce(queries[rows], candidates, masks.positive[rows], masks.eligible[rows],
                                    temperature=0.1) for rows in (slice(0, 1), slice(1, 7))]
    combined = pooled(parts)
    assert [p.valid for p in parts] == [1, 5] and combined.candidate_sum == whole.candidate_sum
    torch.testing.assert_close(combined.mean, whole.mean, atol=1e-12, rtol=0)


@pytest.mark.parametrize("loss", [multi_positive_infonce, symmetric_infonce])
def test_gradcheck_queries_candidates_and_learnable_temperature(loss):
    """Analytic gradients in float64 match finite differences for queries, candidates and log-temperature."""
    temperature = LearnableTemperature(initial=0.1)
    masks = pair_masks(QUERY_GROUPS[:5], CANDIDATE_GROUPS[:7], exclude=exclusions()[:5, :7])

    def mean_loss(queries, candidates, log_temperature):
        tau = functional_call(temperature, {"log_temperature": log_temperature}, ())
        return loss(F.normalize(queries, dim=-1), F.normalize(candidates, dim=-1), masks.positive,
                    masks.eligible, temperature=tau).mean

    inputs = (unit_rows(5, 3, 18).requires_grad_(), unit_rows(7, 3, 19).requires_grad_(),
              torch.tensor(math.log(0.3), dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(mean_loss, inputs)


def test_learnable_temperature_is_clamped():
    """LearnableTemperature starts at its initial value, stays in bounds and gets no gradient beyond them."""
    temperature = LearnableTemperature(initial=0.05, minimum=0.01, maximum=1.0)
    torch.testing.assert_close(temperature(), torch.tensor(0.05))
    with torch.no_grad():
        temperature.log_temperature.fill_(math.log(1e-4))
    value = temperature()
    value.backward()
    torch.testing.assert_close(value, torch.tensor(0.01))
    assert float(temperature.log_temperature.grad) == 0.0
    with pytest.raises(ValueError, match="minimum <= initial"):
        LearnableTemperature(initial=2.0)


def test_a_count_given_as_a_python_int_is_refused():
    """ContrastiveLoss counts are device tensors (a step reads them once, at its end): an int
    computed by reading the device back is refused by name."""
    with pytest.raises(TypeError, match="ContrastiveLoss.valid must be a 0-dim tensor"):
        ContrastiveLoss(loss_sum=torch.zeros(()), valid=3, anchors=3, candidate_sum=torch.tensor(9))
