"""Masking statistics over >= 100k tokens and the MLM loss reduction."""

import torch

from embedlab.config import MaskingConfig
from embedlab.objectives.masking import mask_tokens

MASK_ID, PAD_ID, SEP_ID = 4, 0, 3
VOCAB = 512


def masked_sample(ratio: float):
    generator = torch.Generator().manual_seed(1234)
    ids = torch.randint(5, VOCAB, (1000, 128), generator=generator)
    ids[:, 60] = SEP_ID            # a document boundary in every row
    ids[::3, 100:] = PAD_ID        # padding in a third of the rows
    eligible = (ids != PAD_ID) & (ids != SEP_ID)
    masked = mask_tokens(
        ids, eligible, MaskingConfig(ratio=ratio),
        mask_id=MASK_ID, random_token_range=(5, VOCAB), generator=generator,
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
