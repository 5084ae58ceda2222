"""The MLM loss is sum/count over microbatches and workers, never a mean of means."""

import pytest
import torch
import torch.distributed as dist

from embedlab.core.config import MaskingConfig, ModelConfig
from embedlab.model.encoder import MLMModel
from embedlab.objectives.masking import MaskedBatch, mask_tokens
from embedlab.objectives.mlm import combine, mlm_loss_sum
from embedlab.train.mlm_step import Microbatch, accumulate_gradients, prepare_microbatch, sum_all_reduce

from gloo import run_on_two_workers

CONFIG = ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=101)


CPU = torch.device("cpu")


def make_masked(rows: int, seed: int, ratio: float) -> tuple[MaskedBatch, torch.Tensor]:
    """A masked batch of `rows` rows of 24 positions (the last 6 padding) and its segment ids."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 101, (rows, 24), generator=generator)
    segments = torch.ones_like(ids)
    segments[:, 18:] = 0
    ids[:, 18:] = 0
    masked = mask_tokens(ids, segments > 0, MaskingConfig(ratio=ratio), mask_id=4,
                         random_token_range=(5, 101), generator=generator)
    return masked, segments


def make_batch(rows: int, seed: int, ratio: float) -> Microbatch:
    return prepare_microbatch(*make_masked(rows, seed, ratio), device=CPU)


def concat(parts: list[tuple[MaskedBatch, torch.Tensor]]) -> tuple[MaskedBatch, torch.Tensor]:
    cat = lambda name: torch.cat([getattr(masked, name) for masked, _ in parts])  # noqa: E731
    return MaskedBatch(cat("inputs"), cat("targets"), cat("selected")), torch.cat([s for _, s in parts])


def gradients(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def reference_loss(model: MLMModel, whole: tuple[MaskedBatch, torch.Tensor]) -> torch.Tensor:
    """The plain mean cross-entropy over one batch, through the model's boolean-mask path."""
    masked, segments = whole
    logits = model(masked.inputs, segments, masked.selected)
    return torch.nn.functional.cross_entropy(logits, masked.targets[masked.selected])


def test_combine_is_sum_over_count_not_mean_of_means():
    """combine() weights parts by their selected counts."""
    assert combine([(3.0, 1), (30.0, 10)]) == 33.0 / 11
    assert combine([(0.0, 0), (6.0, 3)]) == 2.0


def test_empty_selection_contributes_nothing():
    """A part with no selected token returns (0, 0) and a differentiable zero."""
    loss, count = mlm_loss_sum(torch.zeros(0, 7, requires_grad=True), torch.zeros(0, dtype=torch.long))
    assert count == 0 and float(loss.detach()) == 0.0


def test_microbatches_with_unequal_counts_equal_the_whole_batch():
    """Loss and gradients over 3 microbatches with very different selected counts equal one pass over the whole batch."""
    torch.manual_seed(0)
    model = MLMModel(CONFIG).double()
    masked = [make_masked(2, 1, 0.05), make_masked(5, 2, 0.5), make_masked(1, 3, 0.15)]
    parts = [prepare_microbatch(*m, device=CPU) for m in masked]
    counts = [p.selected for p in parts]
    assert len(set(counts)) == 3
    result = accumulate_gradients(model, parts).result()
    split_grads = gradients(model)
    model.zero_grad()
    expected = reference_loss(model, concat(masked))
    expected.backward()
    assert result.selected == sum(counts)
    assert abs(result.loss_sum / result.selected - float(expected)) < 1e-10
    for got, want in zip(split_grads, gradients(model)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_no_selected_token_skips_the_step():
    """A step whose microbatches select nothing is reported as skipped with no gradient."""
    model = MLMModel(CONFIG)
    masked, segments = make_masked(2, 1, 0.15)
    empty = prepare_microbatch(MaskedBatch(masked.inputs, masked.targets, torch.zeros_like(masked.selected)), segments,
                               device=CPU)
    result = accumulate_gradients(model, [empty])
    assert result.skipped and all(p.grad is None for p in model.parameters())


def _worker(rank: int):
    torch.manual_seed(0)
    model = MLMModel(CONFIG).double()
    parts = [make_batch(2, 1, 0.05), make_batch(5, 2, 0.5)] if rank == 0 else [make_batch(1, 3, 0.15)]

    def reduce(tensor):
        dist.all_reduce(tensor)
        return tensor

    result = accumulate_gradients(model, parts, reduce).result()
    return rank, result.loss_sum, result.selected, [g.numpy() for g in gradients(model)]


@pytest.mark.timeout(120)
def test_two_gloo_workers_equal_one_process():
    """Two gloo workers with unequal selected counts give the one-process loss and gradients."""
    results = run_on_two_workers(_worker)
    torch.manual_seed(0)
    model = MLMModel(CONFIG).double()
    whole = concat([make_masked(2, 1, 0.05), make_masked(5, 2, 0.5), make_masked(1, 3, 0.15)])
    expected = reference_loss(model, whole)
    expected.backward()
    for rank, loss_sum, selected, grads in results:
        assert selected == int(whole[0].selected.sum())
        assert abs(loss_sum / selected - float(expected)) < 1e-10
        for got, want in zip(grads, gradients(model)):
            torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-12, rtol=1e-10)


def _host_counts_worker(rank):
    reduce = sum_all_reduce(torch.device("cpu"))
    counts = reduce(torch.tensor([rank + 1, 10 * (rank + 1)]))
    again = reduce(torch.tensor([100 * (rank + 1)]))  # the host group is made once, then reused
    direct = torch.tensor([rank + 1])
    dist.all_reduce(direct)  # over the default group itself
    return dist.get_backend(), counts.tolist(), again.tolist(), direct.tolist()


@pytest.mark.timeout(120)
def test_host_counts_are_summed_over_gloo_when_the_trainers_group_is_not():
    """Where the trainer's group is not gloo (NCCL on GPUs), host tensors go over a gloo group
    of their own. torch's "fake" backend stands in for NCCL: its all-reduce does nothing, so a
    true sum can only have come through the gloo group."""
    results = run_on_two_workers(_host_counts_worker, backend="fake")
    assert results == [("fake", [3, 30], [300], [1]), ("fake", [3, 30], [300], [2])]


def test_per_source_losses_partition_the_step_loss():
    """Per-source sums and counts (every source present, zeros included) add up to the step's
    loss sum and selected count, and each equals a naive per-token computation."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = MLMModel(CONFIG)
    names = ("bible", "docs", "unused")
    batches, inputs = [], []
    for seed in (1, 2):
        masked, segments = make_masked(4, seed, 0.3)
        source = torch.randint(0, 2, segments.shape, generator=torch.Generator().manual_seed(seed))
        batches.append(prepare_microbatch(masked, segments, device=CPU, source_index=source, source_names=names))
        inputs.append((masked, segments, source))
    result = accumulate_gradients(model, batches).result()
    groups = {k: v for k, v in result.groups.items() if k.startswith("source/")}
    assert set(groups) == {f"source/{n}" for n in names} and groups["source/unused"] == (0.0, 0)
    assert sum(c for _, c in groups.values()) == result.selected
    assert sum(s for s, _ in groups.values()) == pytest.approx(result.loss_sum, rel=1e-7)  # fp32 sum order
    with torch.no_grad():
        expected = {n: [0.0, 0] for n in names}
        for masked, segments, source_index in inputs:
            logits = model(masked.inputs, segments, masked.selected)
            nll = F.cross_entropy(logits, masked.targets[masked.selected], reduction="none")
            for loss, source in zip(nll.tolist(), source_index[masked.selected].tolist()):
                expected[names[source]][0] += loss
                expected[names[source]][1] += 1
    for name in names:
        assert groups[f"source/{name}"][1] == expected[name][1]
        assert groups[f"source/{name}"][0] == pytest.approx(expected[name][0], rel=1e-6)


def test_dual_head_per_source_losses_partition_the_step_loss():
    """With two LM heads, per-source sums and counts over both heads add up to the step's loss
    sum and selected count, and equal a per-token computation through each row's head."""
    import torch.nn.functional as F

    from embedlab.model.heads import MultiHeadMLMModel

    torch.manual_seed(0)
    model = MultiHeadMLMModel(CONFIG, ("r15", "r50"))
    names = ("bible", "docs")
    mixed = ((0.15, 1.0), (0.5, 1.0))
    batches, inputs = [], []
    heads = torch.tensor([0, 1, 1, 0])
    for seed in (1, 2):
        masked, segments = make_masked(4, seed, 0.3)
        generator = torch.Generator().manual_seed(seed)
        source = torch.randint(0, 2, segments.shape, generator=generator)
        batches.append(prepare_microbatch(masked, segments, device=CPU, head_names=model.head_names, head_index=heads,
                                          ratio_index=heads, mixed_ratios=mixed, source_index=source,
                                          source_names=names))
        inputs.append((masked, segments, source))
    result = accumulate_gradients(model, batches).result()
    groups = {k: v for k, v in result.groups.items() if k.startswith("source/")}
    assert sum(c for _, c in groups.values()) == result.selected
    assert sum(s for s, _ in groups.values()) == pytest.approx(result.loss_sum, rel=1e-6)
    expected = {n: [0.0, 0] for n in names}
    with torch.no_grad():
        for masked, segments, source_index in inputs:
            logits = model(masked.inputs, segments, masked.selected, heads)
            for index, head in enumerate(model.head_names):
                rows = masked.selected & (heads == index)[:, None]
                nll = F.cross_entropy(logits[head], masked.targets[rows], reduction="none")
                for loss, source in zip(nll.tolist(), source_index[rows].tolist()):
                    expected[names[source]][0] += loss
                    expected[names[source]][1] += 1
    for name in names:
        assert groups[f"source/{name}"][1] == expected[name][1]
        assert groups[f"source/{name}"][0] == pytest.approx(expected[name][0], rel=1e-6)


def test_prepare_microbatch_refuses_rows_it_cannot_route():
    """Two heads need each row's head, and a head index comes with each row's ratio: either
    missing is refused by name rather than silently dropping rows from the loss."""
    masked, segments = make_masked(2, 1, 0.3)
    with pytest.raises(ValueError, match="head_index is needed"):
        prepare_microbatch(masked, segments, device=CPU, head_names=("r15", "r50"))
    with pytest.raises(ValueError, match="head_index and ratio_index come together"):
        prepare_microbatch(masked, segments, device=CPU, head_names=("r15", "r50"), head_index=torch.tensor([0, 1]))
