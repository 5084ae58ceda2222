"""Cross-device candidates: two gloo workers equal one process in loss and gradients."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from embedlab.model.pooling import l2_normalise
from embedlab.objectives.contrastive import LearnableTemperature, multi_positive_infonce, pair_masks
from embedlab.objectives.gather import gather_no_grad, gather_with_grad
from embedlab.objectives.gradcache import gradcache_step

from gloo import run_on_two_workers

# 9 queries and 11 candidates, split unequally: rank 0 holds 5 queries and 7 candidates.
QUERY_SPLIT, CANDIDATE_SPLIT = 5, 7
QUERY_GROUPS = torch.tensor([0, 1, 2, 3, 3, 4, 5, 6, 42])  # group 3 twice; 42 has no positive
CANDIDATE_GROUPS = torch.tensor([0, 1, 3, 3, 90, 4, 2, 5, 6, 6, 91])  # 90, 91: hard negatives


class TinyEncoder(nn.Module):
    """Random features (B, 12) -> L2-normalised embeddings (B, 8), with a learnable temperature."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 8))
        self.temperature = LearnableTemperature(initial=0.1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return l2_normalise(self.mlp(features))


def build() -> tuple[TinyEncoder, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model, query and candidate features, and a known-false-negative mask (9, 11)."""
    torch.manual_seed(0)
    model = TinyEncoder().double()
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(9, 12, generator=generator, dtype=torch.float64)
    candidates = torch.randn(11, 12, generator=generator, dtype=torch.float64)
    exclude = torch.zeros(9, 11, dtype=torch.bool)
    exclude[0, 4] = exclude[6, 10] = True
    return model, queries, candidates, exclude


def gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_one_process_gather_is_the_identity():
    """Without a process group both gathers return their input unchanged."""
    x = torch.randn(3, 4)
    assert gather_with_grad(x) is x and gather_no_grad(x) is x


def _worker(rank: int):
    model, queries, candidates, exclude = build()
    mine_q = slice(0, QUERY_SPLIT) if rank == 0 else slice(QUERY_SPLIT, None)
    mine_c = slice(0, CANDIDATE_SPLIT) if rank == 0 else slice(CANDIDATE_SPLIT, None)
    all_candidate_groups = gather_no_grad(CANDIDATE_GROUPS[mine_c])
    masks = pair_masks(QUERY_GROUPS[mine_q], all_candidate_groups, exclude=exclude[mine_q])
    # The global valid count is known from the group ids before any forward pass.
    global_valid = masks.positive.any(dim=1).sum()
    dist.all_reduce(global_valid)

    def loss_fn(local_queries, local_candidates):
        return multi_positive_infonce(local_queries, gather_with_grad(local_candidates), masks.positive,
                                      masks.eligible, temperature=model.temperature())

    def sum_gradients() -> list:
        for p in model.parameters():  # embedlab's trainer sums gradients over workers (not DDP's average)
            dist.all_reduce(p.grad)
        return [g.numpy() for g in gradients(model)]

    local = loss_fn(model(queries[mine_q]), model(candidates[mine_c]))
    (local.loss_sum / int(global_valid)).backward()
    plain_grads = sum_gradients()
    model.zero_grad(set_to_none=True)
    gradcache_step(model, queries[mine_q].split(2), candidates[mine_c].split(3), loss_fn,
                   global_valid=int(global_valid))
    figures = torch.tensor([float(local.loss_sum), local.valid, local.candidate_sum], dtype=torch.float64)
    dist.all_reduce(figures)
    return rank, figures.tolist(), torch.equal(all_candidate_groups, CANDIDATE_GROUPS), plain_grads, sum_gradients()


@pytest.mark.timeout(120)
def test_two_gloo_workers_with_unequal_batches_equal_one_process():
    """Two gloo workers (5+4 queries, 7+4 candidates) gathering candidates, plain or with GradCache, give the one-process loss, counts and gradients."""
    results = run_on_two_workers(_worker)

    model, queries, candidates, exclude = build()
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclude)
    whole = multi_positive_infonce(model(queries), model(candidates), masks.positive, masks.eligible,
                                   temperature=model.temperature())
    whole.mean.backward()
    assert whole.valid == 8
    for rank, (loss_sum, valid, candidate_sum), groups_in_order, plain_grads, cached_grads in results:
        assert groups_in_order and (valid, candidate_sum) == (whole.valid, whole.candidate_sum)
        assert abs(loss_sum / valid - float(whole.mean.detach())) < 1e-12
        for plain, cached, want in zip(plain_grads, cached_grads, gradients(model)):
            torch.testing.assert_close(torch.from_numpy(plain), want, atol=1e-12, rtol=1e-10)
            torch.testing.assert_close(torch.from_numpy(cached), want, atol=1e-12, rtol=1e-10)
