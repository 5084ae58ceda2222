"""Phase-1 corruption: choose which tokens to predict and what the encoder sees instead.

Selection is a Bernoulli(ratio) draw on every eligible position; PAD and the special
tokens (CLS, SEP = document boundary, MASK, UNK as configured by the caller) are never
eligible. Each selected position is then replaced by MASK with probability
`mask_fraction`, by a uniformly random ordinary token with probability `random_fraction`,
and otherwise left unchanged. Targets are always the clean tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedlab.config import MaskingConfig


@dataclass(frozen=True)
class MaskedBatch:
    """`inputs` (B, T) corrupted ids; `targets` (B, T) clean ids; `selected` (B, T) bool."""

    inputs: torch.Tensor
    targets: torch.Tensor
    selected: torch.Tensor


def mask_tokens(
    input_ids: torch.Tensor,
    eligible: torch.Tensor,
    config: MaskingConfig,
    *,
    mask_id: int,
    random_token_range: tuple[int, int],
    generator: torch.Generator,
) -> MaskedBatch:
    """Corrupt (B, T) `input_ids` at a random subset of the (B, T) bool `eligible` positions.

    `random_token_range` = [low, high) of ordinary token ids used for random replacement.
    The draws come only from `generator`, so the masking RNG is a stream of its own.
    """
    shape = input_ids.shape
    draw = torch.rand(shape, generator=generator, device=input_ids.device)
    selected = (draw < config.ratio) & eligible
    action = torch.rand(shape, generator=generator, device=input_ids.device)
    to_mask = selected & (action < config.mask_fraction)
    to_random = selected & (action >= config.mask_fraction) & (
        action < config.mask_fraction + config.random_fraction
    )
    low, high = random_token_range
    random_ids = torch.randint(low, high, shape, generator=generator, device=input_ids.device)
    inputs = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    inputs = torch.where(to_random, random_ids, inputs)
    return MaskedBatch(inputs=inputs, targets=input_ids, selected=selected)
