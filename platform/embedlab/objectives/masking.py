"""Phase-1 corruption: choose which tokens to predict and what the encoder sees instead.

Only eligible positions are ever selected; PAD and the special tokens (CLS, SEP =
document boundary, MASK, UNK as configured by the caller) are never eligible. Selection
works on *units* and `MaskingConfig.strategy` says what a unit is:

- "token": every eligible token is its own unit and is selected by an independent
  Bernoulli(`ratio`) draw, so the expected share of eligible tokens selected is `ratio`.
- "whole-word": a word (a token with `word_start` True and the tokens up to the next
  word start) is selected by one Bernoulli(`ratio`) draw, and then all its eligible tokens
  are selected; a word is never partly selected. Every token inherits its word's draw,
  so the expected share of eligible tokens selected is `ratio` whatever the word lengths.
- "span" (SpanBERT): each row gets a budget of round(`ratio` x its eligible tokens)
  and spans are added until the budget is met exactly (the last span is cut short so it is
  never exceeded); the share is `ratio` up to that rounding. A span's length ℓ is drawn
  from Geometric(`span_geometric_p`) truncated to 1..`span_max_length` and renormalised,
  as in SpanBERT's code (mean 3.8 for p = 0.2, max 10; `span_length_probabilities`). Its
  start is uniform over the unit starts not yet selected, which is SpanBERT's "redraw
  when the anchor is already masked" without the redraws. Units are words when
  `word_start` is given (SpanBERT masks complete words; ℓ counts words) and tokens
  otherwise. A span stops at the first ineligible position, so it never covers PAD or SEP
  and never crosses a segment boundary (inside a packed row every segment ends with SEP,
  see `embedlab.streams.packing`); spans may touch or overlap earlier ones, as in SpanBERT,
  but only newly covered tokens count towards the budget.

Each selected unit (token, word or span) then gets one replacement decision for all of
its tokens: MASK with probability `mask_fraction`, otherwise random ordinary tokens (each
token drawn independently from `random_token_range`) with probability `random_fraction`,
otherwise unchanged. (`random_token_range` is [low, high), or a 1-D table of ids drawn
from uniformly, as `FrozenTokenizer.replacement_ids` gives it: a pretrained vocabulary's
special tokens are not all at its first ids.) Deciding per unit follows SpanBERT and keeps a chosen word from being
left half-visible; every token still inherits its unit's decision, so the token shares
are `mask_fraction` / `random_fraction` / the rest in every strategy. (Google's BERT
`create_pretraining_data.py` decides per token even under whole-word masking; the
token strategy here is exactly that.) Targets are always the clean tokens. Every draw
comes from the caller's generator, so the masking RNG is a stream of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedlab.core.config import MaskingConfig


@dataclass(frozen=True)
class MaskedBatch:
    """`inputs` (B, T) corrupted ids; `targets` (B, T) clean ids; `selected` (B, T) bool."""

    inputs: torch.Tensor
    targets: torch.Tensor
    selected: torch.Tensor

    def to(self, device: torch.device) -> MaskedBatch:
        """The same batch on `device`."""
        return MaskedBatch(self.inputs.to(device), self.targets.to(device), self.selected.to(device))


def span_length_probabilities(config: MaskingConfig) -> torch.Tensor:
    """(span_max_length,) float64 probabilities of span lengths 1..span_max_length.

    Geometric(span_geometric_p) truncated to that range and renormalised (SpanBERT).
    """
    p = config.span_geometric_p
    lengths = torch.arange(1, config.span_max_length + 1, dtype=torch.float64)
    weights = p * (1.0 - p) ** (lengths - 1)
    return weights / weights.sum()


def mask_tokens(
    input_ids: torch.Tensor,
    eligible: torch.Tensor,
    config: MaskingConfig,
    *,
    mask_id: int,
    random_token_range: tuple[int, int] | torch.Tensor,
    generator: torch.Generator,
    word_start: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
) -> MaskedBatch:
    """Corrupt (B, T) `input_ids` at a random subset of the (B, T) bool `eligible` positions.

    `random_token_range` = [low, high) of ordinary token ids used for random replacement, or
    an (R,) long table of them: `table[randint(0, R)]` draws exactly what `randint(low, high)`
    draws when the table is low..high-1, and leaves the generator in the same state.
    `word_start` (B, T) bool marks the first token of every word (a position after a
    segment boundary or PAD starts a word; SEP and PAD belong to no word). "whole-word"
    requires it, "span" uses it to mask complete words, "token" ignores it.
    `segment_ids` (B, T), when given, stops spans at every segment start too: in packed
    rows a document cut into pieces continues without a SEP between its pieces.
    The draws come only from `generator`, so the masking RNG is a stream of its own.
    """
    shape = input_ids.shape
    device = input_ids.device
    if word_start is not None and word_start.shape != shape:
        raise ValueError(f"word_start has shape {tuple(word_start.shape)}, input_ids {tuple(shape)}")

    if config.strategy == "span":
        selected, unit_start_index = _select_spans(eligible, word_start, segment_ids, config, generator)
    else:
        # Token and whole-word share one draw per position; a token reads the draw at its
        # unit's first position. For "token" that is itself, so the draw order and the
        # results are those of plain per-token Bernoulli masking.
        if config.strategy == "token":
            unit_start_index = torch.arange(shape[1], device=device).expand(shape)
        elif word_start is None:
            raise ValueError("masking strategy 'whole-word' needs word_start (B, T) bool")
        else:
            unit_start_index = _word_start_index(word_start)
        draw = torch.rand(shape, generator=generator, device=device)
        selected = (draw.gather(1, unit_start_index) < config.ratio) & eligible
    action = torch.rand(shape, generator=generator, device=device).gather(1, unit_start_index)
    to_mask = selected & (action < config.mask_fraction)
    to_random = selected & (action >= config.mask_fraction) & (
        action < config.mask_fraction + config.random_fraction
    )
    if isinstance(random_token_range, torch.Tensor):
        table = random_token_range.to(device)
        random_ids = table[torch.randint(0, len(table), shape, generator=generator, device=device)]
    else:
        low, high = random_token_range
        random_ids = torch.randint(low, high, shape, generator=generator, device=device)
    inputs = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    inputs = torch.where(to_random, random_ids, inputs)
    return MaskedBatch(inputs=inputs, targets=input_ids, selected=selected)


def _word_start_index(word_start: torch.Tensor) -> torch.Tensor:
    """(B, T) long: the position of the latest word start at or before each position.

    Positions before a row's first word start map to 0.
    """
    positions = torch.arange(word_start.shape[1], device=word_start.device).expand(word_start.shape)
    return torch.where(word_start, positions, 0).cummax(dim=1).values


def _select_spans(
    eligible: torch.Tensor,
    word_start: torch.Tensor | None,
    segment_ids: torch.Tensor | None,
    config: MaskingConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SpanBERT selection: (B, T) bool selected, (B, T) long start position of each token's span.

    Rows are processed together, one span per row per round, until every row has met its
    budget; each round adds at least one token to every unfinished row, so there are at
    most max(budget) rounds (typically budget / mean span length).
    """
    batch, length = eligible.shape
    device = eligible.device
    positions = torch.arange(length, device=device).expand(batch, length)
    after_ineligible = torch.nn.functional.pad(~eligible[:, :-1], (1, 0), value=True)
    # A token right after an ineligible one always opens a unit, so every eligible token
    # can be reached from a unit start even if `word_start` misses a boundary.
    unit_start = (word_start if word_start is not None else torch.ones_like(eligible)) | after_ineligible
    # First ineligible position at or after each position (T if none): where a span must stop.
    next_barrier = torch.where(eligible, length, positions).flip(1).cummin(dim=1).values.flip(1)
    if segment_ids is not None:
        segment_start = torch.zeros_like(eligible)
        segment_start[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
        unit_start = unit_start | segment_start
        # First segment start strictly after each position: a span starting there may run to it.
        at_or_after = torch.where(segment_start, positions, length).flip(1).cummin(dim=1).values.flip(1)
        strictly_after = torch.nn.functional.pad(at_or_after[:, 1:], (0, 1), value=length)
        next_barrier = torch.minimum(next_barrier, strictly_after)
    # Non-decreasing along each row, so a span's end is a binary search for its last unit + 1.
    unit_index = unit_start.int().cumsum(dim=1, dtype=torch.int32)
    budget = torch.round(config.ratio * eligible.sum(dim=1).double()).long()
    cdf = span_length_probabilities(config).cumsum(0).to(device)

    selected = torch.zeros_like(eligible)
    candidates = unit_start & eligible  # unit starts a new span may begin at
    span_start = positions.clone()
    count = torch.zeros(batch, dtype=torch.long, device=device)
    while True:
        available = candidates.sum(dim=1)
        active = (count < budget) & (available > 0)
        if not active.any():
            break
        pick = (torch.rand(batch, generator=generator, device=device) * available).long()
        # Clamp guards float rounding of rand * available up to `available`.
        pick = torch.minimum(pick, (available - 1).clamp(min=0))
        ranks = candidates.int().cumsum(dim=1, dtype=torch.int32)
        start = torch.searchsorted(ranks, (pick + 1).int()[:, None]).clamp(max=length - 1)
        u = torch.rand(batch, 1, generator=generator, device=device, dtype=torch.float64)
        # Inverse CDF; the clamp covers cdf[-1] landing a rounding error below 1.
        span_units = torch.searchsorted(cdf, u, right=True).clamp(max=config.span_max_length - 1) + 1
        end = torch.searchsorted(unit_index, unit_index.gather(1, start) + span_units.int())
        end = torch.minimum(end, next_barrier.gather(1, start))
        end = torch.where(active[:, None], end, start)  # finished rows take an empty span
        new = (positions >= start) & (positions < end) & ~selected
        gained = new.sum(dim=1)
        over = (count + gained > budget).nonzero().squeeze(1)
        if over.numel():
            # Cut the span so the row lands exactly on its budget; only a row's last span is cut.
            cut = new[over]
            cut &= cut.int().cumsum(dim=1) <= (budget - count)[over, None]
            new[over] = cut
            gained[over] = cut.sum(dim=1)
        selected |= new
        candidates &= ~new
        span_start = torch.where(new, start, span_start)
        count += gained
    return selected, span_start
