"""The phase-1 length schedule: most of the budget at a short length, the rest at a long one.

`train.length_schedule` lists (budget fraction, length) stages, e.g. ((0.9, 128), (0.1, 512))
for BERT's 90%/10% at 128/512. Rows are packed once, at `data.sequence_length` (usually the
last, longest stage; every stage length divides it). During a shorter stage every packed row is cut into
`data.sequence_length / length` rows, so a step consumes the same rows and tokens in every
stage: the data order, the budget clock and a resume's data position do not depend on the
stage, only what each token attends over does. A document crossing a cut continues in the
next row with positions starting again at 0, as a truncated document would.

A stage starts at the first step whose consumed budget (before the step) reaches the sum
of the earlier stages' fractions; the loop records each switch (step, tokens, length).
"""

from __future__ import annotations

import torch


def stage_length(consumed: float, budget: float, stages: tuple[tuple[float, int], ...], packed_length: int) -> int:
    """The sequence length of the step taken at `consumed` of `budget` units."""
    if not stages:
        return packed_length
    boundary = 0.0
    for fraction, length in stages[:-1]:
        boundary += fraction * budget
        if consumed < boundary:
            return length
    return stages[-1][1]


def split_rows(batch: dict[str, torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    """(B, T) columns -> (B * T / length, length) columns, each row cut into consecutive pieces.

    `length` must divide T (checked by `TrialConfig`); T itself returns the batch unchanged.
    """
    out = {}
    for name, column in batch.items():
        rows, width = column.shape
        if width == length:
            return batch
        if width % length:
            raise ValueError(f"{name}: cannot cut rows of {width} positions into rows of {length}")
        out[name] = column.reshape(rows * (width // length), length)
    return out
