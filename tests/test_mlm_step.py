"""The MLM loss is sum/count over microbatches and workers, never a mean of means."""

import pytest
import torch
import torch.distributed as dist

from embedlab.config import MaskingConfig, ModelConfig
from embedlab.model.encoder import MLMModel
from embedlab.objectives.masking import MaskedBatch, mask_tokens
from embedlab.objectives.mlm import combine, mlm_loss_sum
from embedlab.train.mlm_step import Microbatch, accumulate_gradients, no_reduce

from gloo import run_on_two_workers

CONFIG = ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=101)


def make_batch(rows: int, seed: int, ratio: float) -> Microbatch:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 101, (rows, 24), generator=generator)
    segments = torch.ones_like(ids)
    segments[:, 18:] = 0
    ids[:, 18:] = 0
    masked = mask_tokens(ids, segments > 0, MaskingConfig(ratio=ratio), mask_id=4,
                         random_token_range=(5, 101), generator=generator)
    return Microbatch(masked=masked, segment_ids=segments)


def concat(parts: list[Microbatch]) -> Microbatch:
    cat = lambda name: torch.cat([getattr(p.masked, name) for p in parts])  # noqa: E731
    return Microbatch(
        masked=MaskedBatch(cat("inputs"), cat("targets"), cat("selected")),
        segment_ids=torch.cat([p.segment_ids for p in parts]),
    )


def gradients(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def reference_loss(model: MLMModel, whole: Microbatch) -> torch.Tensor:
    logits = model(whole.masked.inputs, whole.segment_ids, whole.masked.selected)
    return torch.nn.functional.cross_entropy(logits, whole.masked.targets[whole.masked.selected])


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
    parts = [make_batch(2, 1, 0.05), make_batch(5, 2, 0.5), make_batch(1, 3, 0.15)]
    counts = [int(p.masked.selected.sum()) for p in parts]
    assert len(set(counts)) == 3
    result = accumulate_gradients(model, parts)
    split_grads = gradients(model)
    model.zero_grad()
    whole = concat(parts)
    expected = reference_loss(model, whole)
    expected.backward()
    assert result.selected == sum(counts)
    assert abs(result.loss_sum / result.selected - float(expected)) < 1e-10
    for got, want in zip(split_grads, gradients(model)):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def test_no_selected_token_skips_the_step():
    """A step whose microbatches select nothing is reported as skipped with no gradient."""
    model = MLMModel(CONFIG)
    part = make_batch(2, 1, 0.15)
    empty = Microbatch(
        masked=MaskedBatch(part.masked.inputs, part.masked.targets, torch.zeros_like(part.masked.selected)),
        segment_ids=part.segment_ids,
    )
    result = accumulate_gradients(model, [empty])
    assert result.skipped and all(p.grad is None for p in model.parameters())


def _worker(rank: int):
    torch.manual_seed(0)
    model = MLMModel(CONFIG).double()
    parts = [make_batch(2, 1, 0.05), make_batch(5, 2, 0.5)] if rank == 0 else [make_batch(1, 3, 0.15)]

    def reduce(tensor):
        dist.all_reduce(tensor)
        return tensor

    result = accumulate_gradients(model, parts, reduce)
    return rank, result.loss_sum, result.selected, [g.numpy() for g in gradients(model)]


@pytest.mark.timeout(120)
def test_two_gloo_workers_equal_one_process():
    """Two gloo workers with unequal selected counts give the one-process loss and gradients."""
    results = run_on_two_workers(_worker)
    torch.manual_seed(0)
    model = MLMModel(CONFIG).double()
    whole = concat([make_batch(2, 1, 0.05), make_batch(5, 2, 0.5), make_batch(1, 3, 0.15)])
    expected = reference_loss(model, whole)
    expected.backward()
    for rank, loss_sum, selected, grads in results:
        assert selected == int(whole.masked.selected.sum())
        assert abs(loss_sum / selected - float(expected)) < 1e-10
        for got, want in zip(grads, gradients(model)):
            torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-12, rtol=1e-10)


def test_per_source_losses_partition_the_step_loss():
    """Per-source sums and counts (every source present, zeros included) add up to the step's
    loss sum and selected count, and each equals a naive per-token computation."""
    import dataclasses

    import torch.nn.functional as F

    torch.manual_seed(0)
    model = MLMModel(CONFIG)
    names = ("bible", "docs", "unused")
    batches = []
    for seed in (1, 2):
        mb = make_batch(4, seed, 0.3)
        source = torch.randint(0, 2, mb.segment_ids.shape, generator=torch.Generator().manual_seed(seed))
        batches.append(dataclasses.replace(mb, source_index=source, source_names=names))
    result = accumulate_gradients(model, batches)
    groups = {k: v for k, v in result.groups.items() if k.startswith("source/")}
    assert set(groups) == {f"source/{n}" for n in names} and groups["source/unused"] == (0.0, 0)
    assert sum(c for _, c in groups.values()) == result.selected
    assert sum(s for s, _ in groups.values()) == pytest.approx(result.loss_sum, rel=1e-7)  # fp32 sum order
    with torch.no_grad():
        expected = {n: [0.0, 0] for n in names}
        for mb in batches:
            logits = model(mb.masked.inputs, mb.segment_ids, mb.masked.selected)
            nll = F.cross_entropy(logits, mb.masked.targets[mb.masked.selected], reduction="none")
            for loss, source in zip(nll.tolist(), mb.source_index[mb.masked.selected].tolist()):
                expected[names[source]][0] += loss
                expected[names[source]][1] += 1
    for name in names:
        assert groups[f"source/{name}"][1] == expected[name][1]
        assert groups[f"source/{name}"][0] == pytest.approx(expected[name][0], rel=1e-6)


def test_dual_head_per_source_losses_partition_the_step_loss():
    """With two LM heads, per-source sums and counts over both heads add up to the step's loss
    sum and selected count, and equal a per-token computation through each row's head."""
    import dataclasses

    import torch.nn.functional as F

    from embedlab.model.heads import MultiHeadMLMModel

    torch.manual_seed(0)
    model = MultiHeadMLMModel(CONFIG, ("r15", "r50"))
    names = ("bible", "docs")
    mixed = ((0.15, 1.0), (0.5, 1.0))
    batches = []
    for seed in (1, 2):
        mb = make_batch(4, seed, 0.3)
        generator = torch.Generator().manual_seed(seed)
        source = torch.randint(0, 2, mb.segment_ids.shape, generator=generator)
        heads = torch.tensor([0, 1, 1, 0])
        batches.append(dataclasses.replace(mb, source_index=source, source_names=names, head_index=heads,
                                           ratio_index=heads))
    result = accumulate_gradients(model, batches, mixed_ratios=mixed)
    groups = {k: v for k, v in result.groups.items() if k.startswith("source/")}
    assert sum(c for _, c in groups.values()) == result.selected
    assert sum(s for s, _ in groups.values()) == pytest.approx(result.loss_sum, rel=1e-6)
    expected = {n: [0.0, 0] for n in names}
    with torch.no_grad():
        for mb in batches:
            logits = model(mb.masked.inputs, mb.segment_ids, mb.masked.selected, mb.head_index)
            for index, head in enumerate(model.head_names):
                rows = mb.masked.selected & (mb.head_index == index)[:, None]
                nll = F.cross_entropy(logits[head], mb.masked.targets[rows], reduction="none")
                for loss, source in zip(nll.tolist(), mb.source_index[rows].tolist()):
                    expected[names[source]][0] += loss
                    expected[names[source]][1] += 1
    for name in names:
        assert groups[f"source/{name}"][1] == expected[name][1]
        assert groups[f"source/{name}"][0] == pytest.approx(expected[name][0], rel=1e-6)
