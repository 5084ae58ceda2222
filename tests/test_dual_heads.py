"""Dual LM heads: row routing, per-batch ratio proportions, mixed masking, parity with MLMModel."""

import pytest
import torch

from embedlab.core.config import MaskingConfig, ModelConfig
from embedlab.model.encoder import Encoder, MLMModel, count_parameters
from embedlab.model.heads import MultiHeadMLMModel, route_positions, select_by_head
from embedlab.objectives import dual_mlm
from embedlab.objectives.dual_mlm import (
    assign_ratios,
    combined_loss_sum,
    head_names,
    loss_metrics,
    mask_mixed,
    next_ratios,
    per_head_loss_sums,
    route_heads,
    worker_ratios,
)
from embedlab.objectives.masking import MaskedBatch
from embedlab.objectives.mlm import mlm_loss_sum
from embedlab.train.mlm_step import accumulate_gradients, prepare_microbatch

TINY = ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=97)
MIXED = ((0.05, 4), (0.5, 1))
DUAL = MaskingConfig(mixed_ratios=MIXED, head_per_ratio=True)
SHARED = MaskingConfig(mixed_ratios=MIXED, head_per_ratio=False)
MASK_ID, PAD_ID, SEP_ID = 4, 0, 3


def packed_batch(rows: int, length: int, vocab: int, seed: int):
    """Random ids with a document boundary and trailing padding; returns ids, segments, eligible."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (rows, length), generator=generator)
    segments = torch.ones(rows, length, dtype=torch.long)
    ids[:, length // 2] = SEP_ID
    segments[:, length // 2 + 1:] = 2
    ids[::3, -length // 4:] = PAD_ID
    segments[::3, -length // 4:] = 0
    eligible = (ids != PAD_ID) & (ids != SEP_ID)
    return ids, segments, eligible


def mixed_batch(config: MaskingConfig, rows: int = 10, length: int = 24, seed: int = 0):
    """A masked mixed-ratio batch for TINY: (masked, segments, ratio_index, head_index)."""
    generator = torch.Generator().manual_seed(seed)
    ids, segments, eligible = packed_batch(rows, length, TINY.vocab_size, seed)
    ratio_index = assign_ratios(rows, config.mixed_ratios, generator)
    masked = mask_mixed(ids, eligible, config, ratio_index, mask_id=MASK_ID,
                        random_token_range=(5, TINY.vocab_size), generator=generator)
    return masked, segments, ratio_index, route_heads(config, ratio_index)


def test_each_head_sees_only_its_rows_selected_hidden_states():
    """A hook on each head's dense layer receives exactly the encoder states at its rows' selected positions."""
    torch.manual_seed(0)
    names = head_names(DUAL)
    model = MultiHeadMLMModel(TINY, names).eval()
    masked, segments, ratio_index, head_index = mixed_batch(DUAL)
    seen: dict[str, torch.Tensor] = {}
    for name in names:
        model.heads[name].dense.register_forward_hook(
            lambda module, args, output, name=name: seen.__setitem__(name, args[0].detach())
        )
    logits = model(masked.inputs, segments, masked.selected, head_index)
    hidden = model.encoder(masked.inputs, segments)
    for index, name in enumerate(names):
        rows = (head_index == index).nonzero().squeeze(1)
        expected = hidden[rows][masked.selected[rows]]  # its rows only, row-major
        assert seen[name].shape[0] == int(masked.selected[head_index == index].sum()) > 0
        torch.testing.assert_close(seen[name], expected)
        assert logits[name].shape == (expected.shape[0], TINY.vocab_size)
    assert sum(v.shape[0] for v in seen.values()) == int(masked.selected.sum())


@pytest.mark.parametrize("rows", [5, 8, 10, 32])
def test_the_run_holds_the_4_to_1_proportion_at_every_batch_size(rows):
    """Over a run of batches the rows per ratio are exactly 4:1 at every multiple of 5 rows
    and never a row off in between, at 8 and 32 rows a batch too; rows are shuffled."""
    generator = torch.Generator().manual_seed(0)
    counts, assignments = [0, 0], []
    for batch in range(1, 26):
        ratio_index = assign_ratios(rows, MIXED, generator, counts)
        counts = (torch.tensor(counts) + torch.bincount(ratio_index, minlength=2)).tolist()
        assignments.append(tuple(ratio_index.tolist()))
        seen = batch * rows
        assert abs(counts[1] - seen / 5) < 1 and sum(counts) == seen
        if seen % 5 == 0:
            assert counts == [seen * 4 // 5, seen // 5]
    assert len(set(assignments)) > 1  # the rows that carry each ratio are shuffled


def test_deficit_rule_by_hand():
    """Each row goes to the ratio furthest below its share, ties to the first listed."""
    assert next_ratios([0, 0], [4, 1], 5) == [0, 0, 1, 0, 0]  # deficits .8/.2, .6/.4, .4/.6, ...
    assert next_ratios([0, 0, 0], [1, 1, 1], 4) == [0, 1, 2, 0]
    assert next_ratios([6, 2], [4, 1], 2) == [0, 0]  # 3:1 after 8 rows is caught up: [8, 2]
    for weights in ([0.5, 0.3, 0.2], [3, 2], [7, 1, 1]):
        counts = [0] * len(weights)
        for n, k in enumerate(next_ratios(counts, weights, 200), start=1):
            counts[k] += 1
            assert all(abs(c - n * w / sum(weights)) < 1 for c, w in zip(counts, weights))


def test_workers_split_one_global_assignment():
    """Two workers' rows of a global batch are its assignment dealt as the stream deals rows."""
    assigned = assign_ratios(16, MIXED, torch.Generator().manual_seed(1), [0, 0])
    rank0, rank1 = worker_ratios(assigned, 0, 2), worker_ratios(assigned, 1, 2)
    assert torch.equal(torch.stack([rank0, rank1], dim=1).reshape(-1), assigned)


def test_per_ratio_selected_share_over_100k_tokens():
    """5%- and 50%-rows each select their ratio of eligible tokens ± 0.5 pt over ≥ 100k tokens each."""
    generator = torch.Generator().manual_seed(7)
    ids, _, eligible = packed_batch(5000, 128, 512, seed=7)
    ratio_index = assign_ratios(5000, MIXED, generator)
    masked = mask_mixed(ids, eligible, SHARED, ratio_index, mask_id=MASK_ID,
                        random_token_range=(5, 512), generator=generator)
    for index, (ratio, _) in enumerate(MIXED):
        rows = ratio_index == index
        assert int(eligible[rows].sum()) >= 100_000
        share = masked.selected[rows].sum() / eligible[rows].sum()
        assert abs(float(share) - ratio) < 0.005
    assert not (masked.selected & ~eligible).any()
    assert torch.equal(masked.targets, ids)
    assert torch.equal(masked.inputs[~masked.selected], ids[~masked.selected])


def test_mask_mixed_calls_mask_tokens_once_per_ratio_with_its_rows(monkeypatch):
    """Each ratio's rows are masked with that single ratio and their own word starts."""
    calls = []

    def fake_mask_tokens(input_ids, eligible, config, **kwargs):
        calls.append((input_ids, config, kwargs["word_start"]))
        return MaskedBatch(inputs=input_ids, targets=input_ids, selected=eligible)

    monkeypatch.setattr(dual_mlm, "mask_tokens", fake_mask_tokens)
    ids = torch.arange(6)[:, None].expand(6, 4).clone()
    word_start = ids % 2 == 0
    ratio_index = torch.tensor([1, 0, 0, 1, 0, 0])
    mask_mixed(ids, torch.ones(6, 4, dtype=torch.bool), DUAL, ratio_index, mask_id=MASK_ID,
               random_token_range=(5, 97), generator=torch.Generator(), word_start=word_start)
    assert [config.ratio for _, config, _ in calls] == [0.05, 0.5]
    assert all(config.mixed_ratios == () and not config.head_per_ratio for _, config, _ in calls)
    assert calls[0][0][:, 0].tolist() == [1, 2, 4, 5] and calls[1][0][:, 0].tolist() == [0, 3]
    assert torch.equal(calls[1][2], word_start[[0, 3]])


def test_single_head_matches_mlm_model():
    """One head with MLMModel's weights (renamed keys) gives bitwise the same logits; one seed gives one init."""
    torch.manual_seed(3)
    reference = MLMModel(TINY).eval()
    torch.manual_seed(3)
    model = MultiHeadMLMModel(TINY, ("mlm",)).eval()
    pairs = list(zip(reference.named_parameters(), model.named_parameters(), strict=True))
    for (ref_name, ref_param), (name, param) in pairs:
        assert name == ref_name.replace("mlm_head.", "heads.mlm.") and torch.equal(param, ref_param)
    torch.manual_seed(99)
    model = MultiHeadMLMModel(TINY, ("mlm",)).eval()
    state = {k.replace("mlm_head.", "heads.mlm."): v for k, v in reference.state_dict().items()}
    model.load_state_dict(state)
    masked, segments, _, _ = mixed_batch(SHARED)
    head_index = torch.zeros(masked.inputs.shape[0], dtype=torch.long)
    logits = model(masked.inputs, segments, masked.selected, head_index)["mlm"]
    assert torch.equal(logits, reference(masked.inputs, segments, masked.selected))


def test_two_heads_add_one_untied_head_worth_of_parameters():
    """Two heads cost MLMModel + d^2 + d + 2d + V, and every head decodes with the embedding table."""
    model = MultiHeadMLMModel(TINY, head_names(DUAL))
    d, vocab = TINY.width, TINY.vocab_size
    assert count_parameters(model) == count_parameters(MLMModel(TINY)) + d * d + d + 2 * d + vocab
    assert all(head.embedding.weight is model.encoder.embed.weight for head in model.heads.values())


def test_heads_routed_on_the_host_compute_what_the_mask_routes():
    """Positions routed on the host (`route_positions`, what a training step sends) give every
    head bitwise the logits, and the encoder the gradients, of the boolean mask and head index."""
    masked, segments, _, head_index = mixed_batch(DUAL, rows=12)
    routed = route_positions(masked.selected, head_index, head_names(DUAL))
    results = []
    for selected, heads in ((masked.selected, head_index), (routed, None)):
        torch.manual_seed(0)
        model = MultiHeadMLMModel(TINY, head_names(DUAL))
        logits = model(masked.inputs, segments, selected, heads)
        sum(value.sum() for value in logits.values()).backward()
        results.append((logits, [p.grad for p in model.parameters()]))
    (mask_logits, mask_grads), (routed_logits, routed_grads) = results
    assert all(torch.equal(mask_logits[name], routed_logits[name]) for name in head_names(DUAL))
    assert all(torch.equal(a, b) for a, b in zip(mask_grads, routed_grads))


def test_loss_on_one_head_gives_no_gradient_to_the_other():
    """Backward from head A's logits leaves head B's parameters at zero gradient, and trains A and the encoder."""
    torch.manual_seed(0)
    model = MultiHeadMLMModel(TINY, head_names(DUAL))
    masked, segments, _, head_index = mixed_batch(DUAL)
    logits = model(masked.inputs, segments, masked.selected, head_index)
    targets = select_by_head(masked.targets, masked.selected, head_index, model.head_names)
    loss_sum, count = mlm_loss_sum(logits["mask5"], targets["mask5"])
    (loss_sum / count).backward()
    for name, param in model.heads["mask50"].named_parameters():
        if not name.startswith("embedding."):  # the tied table is the encoder's, trained by A
            assert param.grad is None or not param.grad.any()
    for param in (*model.heads["mask5"].dense.parameters(), model.heads["mask5"].bias,
                  model.encoder.blocks[0].attn.qkv.weight, model.encoder.embed.weight):
        assert param.grad is not None and param.grad.any()


def test_encoder_state_has_no_head_and_heads_state_round_trips():
    """The encoder state loads into a bare Encoder with no head key; head state omits the tied table and reloads."""
    model = MultiHeadMLMModel(TINY, head_names(DUAL))
    encoder_state = model.encoder_state()
    assert set(encoder_state) == set(Encoder(TINY).state_dict())
    assert not any(key.startswith(("heads", "mlm_head", "dense", "norm.")) for key in encoder_state)
    Encoder(TINY).load_state_dict(encoder_state)
    heads_state = model.heads_state()
    assert sorted(heads_state) == sorted(
        f"{name}.{part}" for name in ("mask5", "mask50")
        for part in ("dense.weight", "dense.bias", "norm.weight", "norm.bias", "bias")
    )
    other = MultiHeadMLMModel(TINY, head_names(DUAL))
    other.load_heads_state(heads_state)
    assert all(torch.equal(other.heads_state()[k], v) for k, v in heads_state.items())
    with pytest.raises(KeyError, match="embedding"):
        other.load_heads_state({**heads_state, "mask5.embedding.weight": encoder_state["embed.weight"]})


def run_arm(config: MaskingConfig, masked, segments, ratio_index):
    """Logits, targets and per-head (sum, count) of a seeded TINY model on one batch, and the
    per-ratio (sum, count) groups the training step reports for it."""
    torch.manual_seed(1)
    model = MultiHeadMLMModel(TINY, head_names(config)).eval()
    head_index = route_heads(config, ratio_index)
    with torch.no_grad():  # reporting-path checks: plain floats, no graph
        logits = model(masked.inputs, segments, masked.selected, head_index)
    targets = select_by_head(masked.targets, masked.selected, head_index, model.head_names)
    step = accumulate_gradients(model, [prepare_microbatch(
        masked, segments, device=torch.device("cpu"), head_names=model.head_names, head_index=head_index,
        ratio_index=ratio_index, mixed_ratios=MIXED)]).result()
    by_ratio = {key.removeprefix("ratio/"): value for key, value in step.groups.items() if key.startswith("ratio/")}
    return logits, targets, per_head_loss_sums(logits, targets), by_ratio


def test_combined_loss_weights_every_selected_token_equally():
    """The total is all heads' NLL sum over all selected tokens, i.e. one mean over the concatenated tokens."""
    masked, segments, ratio_index, _ = mixed_batch(DUAL, rows=20)
    logits, targets, by_head, _ = run_arm(DUAL, masked, segments, ratio_index)
    total, count = combined_loss_sum(by_head)
    oracle, oracle_count = mlm_loss_sum(torch.cat(list(logits.values())), torch.cat(list(targets.values())))
    assert count == oracle_count == int(masked.selected.sum())
    torch.testing.assert_close(total, oracle)
    metrics = loss_metrics({name: (float(s), c) for name, (s, c) in by_head.items()}, {})
    assert metrics["train/loss"] == pytest.approx(float(oracle) / oracle_count)
    for name, (loss_sum, head_count) in by_head.items():
        assert metrics[f"train/selected/head/{name}"] == head_count > 0
        assert metrics[f"train/loss/head/{name}"] == pytest.approx(float(loss_sum) / head_count)


def test_per_ratio_report_groups_rows_in_both_arms():
    """Dual arm: per-ratio figures equal per-head ones; shared arm: its one head's loss split by row ratio."""
    masked, segments, ratio_index, _ = mixed_batch(DUAL, rows=20)
    _, _, dual_heads, dual_ratios = run_arm(DUAL, masked, segments, ratio_index)
    for name, (loss_sum, count) in dual_heads.items():
        assert dual_ratios[name][1] == count
        assert dual_ratios[name][0] == pytest.approx(float(loss_sum), rel=1e-5)
    logits, targets, shared_heads, shared_ratios = run_arm(SHARED, masked, segments, ratio_index)
    assert list(shared_heads) == ["mlm"]
    token_ratio = ratio_index[:, None].expand(masked.selected.shape)[masked.selected]
    for index, name in enumerate(("mask5", "mask50")):
        oracle, count = mlm_loss_sum(logits["mlm"][token_ratio == index], targets["mlm"][token_ratio == index])
        assert shared_ratios[name][1] == count > 0
        assert shared_ratios[name][0] == pytest.approx(float(oracle), rel=1e-5)
    metrics = loss_metrics({"mlm": (float(shared_heads["mlm"][0]), shared_heads["mlm"][1])}, shared_ratios)
    assert metrics["train/selected/ratio/mask5"] + metrics["train/selected/ratio/mask50"] == (
        metrics["train/selected/head/mlm"]
    )


def test_a_dual_head_run_records_the_proportion_it_ran_at(tmp_path):
    """A phase-1 run with mixed ratios reports, and its checkpoint manifest records, the rows
    each ratio got over the whole run: the deficit rule's counts over all its rows."""
    import json

    import synthetic

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    trial = synthetic.phase1_trial(dual_heads=True)
    reports, loop = synthetic.train(trial, frozen, tmp_path / "run")
    rows = loop.progress.batches * trial.train.batch_rows
    weights = [weight for _, weight in trial.masking.mixed_ratios]
    counts = torch.bincount(torch.tensor(next_ratios([0, 0], weights, rows)), minlength=2).tolist()
    expected = dict(zip(dual_mlm.ratio_names(trial.masking.mixed_ratios), counts))
    assert {name: reports[-1][f"masking/ratio_rows/{name}"] for name in expected} == expected
    manifests = sorted((tmp_path / "run").rglob("manifest.json"), key=lambda p: p.stat().st_mtime)
    assert json.loads(manifests[-1].read_text())["objective"]["observed_ratio_rows"] == expected


def test_head_names_and_ratios_round_trip():
    """Every head name reads back as its ratio, decimal ratios included (2.5% is "mask2_5")."""
    from embedlab.checkpoints.io import head_ratio

    ratios = ((0.05, 4), (0.5, 1), (0.025, 1), (0.125, 1))
    assert [head_ratio(name) for name in dual_mlm.ratio_names(ratios)] == pytest.approx([r for r, _ in ratios])
