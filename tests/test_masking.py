"""Masking statistics over >= 100k tokens for every strategy and the MLM loss reduction."""

import functools

import pytest
import torch

from embedlab.core.config import MaskingConfig
from embedlab.objectives.masking import MaskedBatch, mask_tokens

MASK_ID, PAD_ID, SEP_ID = 4, 0, 3
VOCAB = 512


def masked_sample(ratio: float, word_start: torch.Tensor | None = None):
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(5, VOCAB, (1000, 128), generator=generator)
    ids[:, 60] = SEP_ID            # a document boundary in every row
    ids[::3, 100:] = PAD_ID        # padding in a third of the rows
    eligible = (ids != PAD_ID) & (ids != SEP_ID)
    masked = mask_tokens(
        ids, eligible, MaskingConfig(ratio=ratio),
        mask_id=MASK_ID, random_token_range=(5, VOCAB), generator=generator, word_start=word_start,
    )
    return ids, eligible, masked


def test_selection_rate_and_replacement_split_over_100k_tokens():
    """15% ± 0.5 of eligible tokens are selected; 80/10/10 mask/random/same each within ± 1.5 points."""
    ids, eligible, masked = masked_sample(0.15)
    assert int(eligible.sum()) >= 100_000
    rate = masked.selected.sum() / eligible.sum()
    assert abs(float(rate) - 0.15) < 0.005
    sel = masked.selected
    as_mask = (masked.inputs[sel] == MASK_ID).float().mean()
    unchanged = (masked.inputs[sel] == ids[sel]).float().mean()
    # A random draw equals the original token 1/507 of the time; it still counts as random.
    random = 1.0 - as_mask - unchanged
    assert abs(float(as_mask) - 0.80) < 0.015
    assert abs(float(unchanged) - 0.10 - 0.10 / (VOCAB - 5)) < 0.015
    assert abs(float(random) - 0.10) < 0.015


def test_padding_and_boundaries_are_never_selected_or_changed():
    """PAD and SEP positions are never selected and never altered; unselected tokens stay as they were."""
    ids, eligible, masked = masked_sample(0.5)
    assert not masked.selected[~eligible].any()
    assert torch.equal(masked.inputs[~masked.selected], ids[~masked.selected])
    assert torch.equal(masked.targets, ids)


def test_random_replacements_avoid_special_tokens():
    """Random replacements are ordinary tokens, never PAD, SEP or another special id."""
    ids, _, masked = masked_sample(0.3)
    replaced = masked.selected & (masked.inputs != MASK_ID) & (masked.inputs != ids)
    assert replaced.any()
    assert (masked.inputs[replaced] >= 5).all()


def test_masking_is_reproducible_from_its_generator():
    """The same generator seed gives the same corruption."""
    _, _, first = masked_sample(0.15)
    _, _, second = masked_sample(0.15)
    assert torch.equal(first.inputs, second.inputs) and torch.equal(first.selected, second.selected)


def test_token_strategy_ignores_word_start():
    """Passing word_start leaves token masking as it was: same draws, same corruption."""
    word_start = torch.rand(1000, 128, generator=torch.Generator().manual_seed(5)) < 0.4
    _, _, plain = masked_sample(0.15)
    _, _, with_words = masked_sample(0.15, word_start)
    assert torch.equal(plain.inputs, with_words.inputs) and torch.equal(plain.selected, with_words.selected)


# Word-level batches: 1024 rows x 512 positions, words of 1-4 tokens, SEP boundaries at
# random positions (~2.5 per row), PAD tails in a third of the rows; ~480k eligible tokens,
# enough that per-word and per-span replacement decisions still meet the ±1.5 point bounds.
ROWS, LENGTH = 1024, 512


@functools.cache
def word_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, eligible, word_start), each (ROWS, LENGTH); SEP and PAD start no word."""
    generator = torch.Generator().manual_seed(99)
    ids = torch.randint(5, VOCAB, (ROWS, LENGTH), generator=generator)
    word_lengths = torch.randint(1, 5, (ROWS, LENGTH), generator=generator)
    starts = word_lengths.cumsum(dim=1) - word_lengths
    rows = torch.arange(ROWS)[:, None].expand_as(starts)
    inside = starts < LENGTH
    word_start = torch.zeros(ROWS, LENGTH, dtype=torch.bool)
    word_start[rows[inside], starts[inside]] = True
    ids[torch.rand(ROWS, LENGTH, generator=generator) < 1 / 200] = SEP_ID
    pad_from = torch.randint(LENGTH // 2, LENGTH, (ROWS, 1), generator=generator)
    ids[(torch.arange(LENGTH) >= pad_from) & (torch.arange(ROWS) % 3 == 0)[:, None]] = PAD_ID
    eligible = (ids != PAD_ID) & (ids != SEP_ID)
    after_sep = torch.nn.functional.pad(ids[:, :-1] == SEP_ID, (1, 0))
    return ids, eligible, (word_start | after_sep) & eligible


@functools.cache
def masked_words(strategy: str, ratio: float, with_words: bool = True, seed: int = 7) -> MaskedBatch:
    """`word_batch` corrupted with `strategy`; cached because span masking runs many rounds."""
    ids, eligible, word_start = word_batch()
    return mask_tokens(
        ids, eligible, MaskingConfig(ratio=ratio, strategy=strategy), mask_id=MASK_ID,
        random_token_range=(5, VOCAB), generator=torch.Generator().manual_seed(seed),
        word_start=word_start if with_words else None,
    )


def assert_replacement_split(ids: torch.Tensor, masked: MaskedBatch) -> None:
    """80/10/10 mask/random/unchanged over the selected tokens, each within ± 1.5 points."""
    sel = masked.selected
    as_mask = float((masked.inputs[sel] == MASK_ID).float().mean())
    unchanged = float((masked.inputs[sel] == ids[sel]).float().mean())
    # A random draw equals the original token 1/507 of the time; it still counts as random.
    assert abs(as_mask - 0.80) < 0.015
    assert abs(unchanged - 0.10 - 0.10 / (VOCAB - 5)) < 0.015
    assert abs(1.0 - as_mask - unchanged - 0.10) < 0.015


def tokens_per_word(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Over `word_batch`'s words: (eligible tokens, selected tokens, row), each (words,), by word key."""
    _, eligible, word_start = word_batch()
    # Row-major key: words of row r get r * (LENGTH + 1) + (word starts so far in the row).
    key = (torch.arange(ROWS)[:, None] * (LENGTH + 1) + word_start.long().cumsum(dim=1))[eligible]
    tokens = torch.bincount(key)
    chosen = torch.bincount(key, weights=selected[eligible].double(), minlength=len(tokens))
    return tokens, chosen, torch.arange(len(tokens)) // (LENGTH + 1)


@pytest.mark.parametrize("strategy", ["whole-word", "span"])
def test_word_strategies_select_ratio_and_split_80_10_10(strategy: str):
    """Whole-word and span select 15% ± 0.5 of >= 100k eligible tokens, 80/10/10 ± 1.5, never PAD/SEP."""
    ids, eligible, _ = word_batch()
    masked = masked_words(strategy, 0.15)
    assert int(eligible.sum()) >= 100_000
    assert abs(float(masked.selected.sum() / eligible.sum()) - 0.15) < 0.005
    assert_replacement_split(ids, masked)
    assert not masked.selected[~eligible].any()
    assert torch.equal(masked.inputs[~masked.selected], ids[~masked.selected])
    assert torch.equal(masked.targets, ids)


def test_whole_word_selects_every_word_entirely_or_not_at_all():
    """Whole-word masking never selects part of a word."""
    tokens, chosen, _ = tokens_per_word(masked_words("whole-word", 0.15).selected)
    assert ((chosen == 0) | (chosen == tokens)).all()
    assert (chosen > 0).any()


def test_whole_word_without_word_start_raises():
    """Whole-word masking without word_start is a ValueError, not a silent fallback."""
    ids, eligible, _ = word_batch()
    with pytest.raises(ValueError, match="word_start"):
        mask_tokens(ids, eligible, MaskingConfig(strategy="whole-word"), mask_id=MASK_ID,
                    random_token_range=(5, VOCAB), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("with_words", [True, False])
def test_span_meets_every_row_budget_exactly(with_words: bool):
    """Span masking selects exactly round(ratio x eligible tokens) in every row."""
    _, eligible, _ = word_batch()
    selected = masked_words("span", 0.15, with_words).selected
    budget = torch.round(0.15 * eligible.sum(dim=1).double()).long()
    assert torch.equal(selected.sum(dim=1), budget)


@pytest.mark.parametrize("with_words", [True, False])
def test_span_runs_follow_truncated_geometric_and_stay_in_their_segment(with_words: bool):
    """Runs average SpanBERT's truncated Geometric(0.2) mean of 1..10 units (± 15%) and stay in a segment."""
    ids, _, word_start = word_batch()
    selected = masked_words("span", 0.15, with_words).selected
    p, lengths = 0.2, torch.arange(1, 11, dtype=torch.float64)
    weights = p * (1 - p) ** (lengths - 1)
    expected = float((lengths * weights).sum() / weights.sum())  # SpanBERT's 3.8
    run_starts = selected & ~torch.nn.functional.pad(selected[:, :-1], (1, 0))
    units = word_start if with_words else torch.ones_like(selected)
    mean_run = float((selected & units).sum() / run_starts.sum())
    assert abs(mean_run - expected) < 0.15 * expected
    segment = (ids == SEP_ID).long().cumsum(dim=1)
    inside_run = selected[:, 1:] & selected[:, :-1]
    assert torch.equal(segment[:, 1:][inside_run], segment[:, :-1][inside_run])


def test_span_with_word_start_masks_complete_words_but_the_trimmed_last():
    """Span masking over words leaves at most one partly selected word per row: the one cut at the budget."""
    tokens, chosen, row = tokens_per_word(masked_words("span", 0.15).selected)
    partial = (chosen > 0) & (chosen < tokens)
    assert torch.bincount(row[partial], minlength=ROWS).max() <= 1


@pytest.mark.parametrize("strategy", ["whole-word", "span"])
def test_word_strategies_are_reproducible_from_their_generator(strategy: str):
    """The same generator seed gives the same corruption; another seed gives another."""
    # __wrapped__ bypasses the cache, so `second` is a fresh run from a fresh generator.
    first, second = masked_words(strategy, 0.15), masked_words.__wrapped__(strategy, 0.15)
    assert torch.equal(first.inputs, second.inputs) and torch.equal(first.selected, second.selected)
    assert not torch.equal(first.selected, masked_words(strategy, 0.15, seed=8).selected)


def test_spans_stop_at_segment_starts_without_a_boundary_token():
    """With segment_ids, every selected token lies in the same segment as its span's start, even
    where no SEP separates segments; without them, spans do run across (the check is not vacuous)."""
    from embedlab.core.config import MaskingConfig as Config
    from embedlab.objectives.masking import _select_spans

    generator = torch.Generator().manual_seed(11)
    rows, length = 512, 128
    segments = torch.ones(rows, length, dtype=torch.long)
    for row in range(rows):  # segments of 3-9 tokens back to back, no SEP between them
        position, segment = 0, 1
        while position < length:
            size = int(torch.randint(3, 10, (1,), generator=generator))
            segments[row, position : position + size] = segment
            position, segment = position + size, segment + 1
    eligible = torch.ones(rows, length, dtype=torch.bool)
    config = Config(ratio=0.3, strategy="span")

    def crossings(segment_ids):
        selected, span_start = _select_spans(eligible, None, segment_ids, config, torch.Generator().manual_seed(3))
        assert abs(float(selected.sum() / eligible.sum()) - 0.3) < 0.005
        return int((segments.gather(1, span_start)[selected] != segments[selected]).sum())

    assert crossings(segments) == 0
    assert crossings(None) > 0
