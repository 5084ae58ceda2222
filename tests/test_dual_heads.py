"""Dual LM heads: row routing, per-batch ratio proportions, mixed masking, parity with MLMModel."""

import pytest
import torch

from embedlab.config import MaskingConfig, ModelConfig
from embedlab.model.encoder import Encoder, MLMModel, count_parameters
from embedlab.model.heads import MultiHeadMLMModel, select_by_head
from embedlab.objectives import dual_mlm
from embedlab.objectives.dual_mlm import (
    apportion,
    assign_ratios,
    combined_loss_sum,
    head_names,
    loss_metrics,
    mask_mixed,
    per_head_loss_sums,
    per_ratio_loss_sums,
    route_heads,
)
from embedlab.objectives.masking import MaskedBatch
from embedlab.objectives.mlm import mlm_loss_sum

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


@pytest.mark.parametrize("rows, expected", [(5, [4, 1]), (10, [8, 2]), (20, [16, 4]), (8, [6, 2])])
def test_every_batch_holds_the_4_to_1_proportion(rows, expected):
    """Every draw gives exactly 4:1 rows for 5/10/20 rows and the largest-remainder 6:2 for 8 rows."""
    generator = torch.Generator().manual_seed(0)
    assignments = [assign_ratios(rows, MIXED, generator) for _ in range(50)]
    for ratio_index in assignments:
        assert torch.bincount(ratio_index, minlength=2).tolist() == expected
    # The counts are fixed but the rows that carry each ratio are shuffled.
    assert len({tuple(a.tolist()) for a in assignments}) > 1


def test_largest_remainder_rounding_rule():
    """Leftover rows go to the largest fractional quotas, ties to the ratio listed first."""
    assert apportion(8, [4, 1]) == [6, 2]        # quotas 6.4, 1.6
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]  # equal remainders: first listed wins
    assert apportion(7, [0.5, 0.3, 0.2]) == [4, 2, 1]  # quotas 3.5, 2.1, 1.4 (exact decimals)
    assert apportion(2, [4, 1]) == [2, 0]        # a sub-row quota can round to zero


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
    """Logits, targets, per-head and per-ratio (sum, count) of a seeded TINY model on one batch."""
    torch.manual_seed(1)
    model = MultiHeadMLMModel(TINY, head_names(config)).eval()
    head_index = route_heads(config, ratio_index)
    with torch.no_grad():  # reporting-path checks: plain floats, no graph
        logits = model(masked.inputs, segments, masked.selected, head_index)
    targets = select_by_head(masked.targets, masked.selected, head_index, model.head_names)
    by_ratio = per_ratio_loss_sums(logits, targets, ratio_index=ratio_index, selected=masked.selected,
                                   head_index=head_index, mixed_ratios=MIXED)
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
