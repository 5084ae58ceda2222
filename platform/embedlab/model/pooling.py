"""Sentence embeddings from token states: padding-aware pooling, L2 normalisation.

A row is one text, `[CLS] content [SEP]` then padding (segment ids 1 on its tokens, 0 on
padding). Three pooling methods (`POOLING_METHODS`, `pool`):

    mean      the average of the content tokens: CLS and SEP are excluded, so the embedding is
              the average of the text's own tokens (embedlab's encoder's default)
    mean_all  the average of every token of the row, CLS and SEP included: sentence-transformers'
              "mean", the pooling a pretrained parent's own configuration names
    cls       the first position's state

Zero-vector rule: under "mean" a row with no content token pools to the zero vector and stays
zero after normalisation (its inner product with everything is 0); it is never NaN. Under
"mean_all" and "cls" every row has a token to pool (CLS at least).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mean_pool(hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, d) states and (B, T) 0/1 mask -> (B, d) mean over masked positions (0 if none)."""
    weights = pool_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    total = (hidden * weights).sum(dim=1)
    count = weights.sum(dim=1).clamp(min=1.0)
    return total / count


def pool(hidden: torch.Tensor, segment_ids: torch.Tensor, method: str) -> torch.Tensor:
    """(B, T, d) states of one-text rows and their (B, T) segment ids (> 0 on the row's tokens)
    -> (B, d) pooled states by `method` (module docstring), not normalised."""
    if method == "cls":
        return hidden[:, 0]
    real = segment_ids > 0
    if method == "mean_all":
        return mean_pool(hidden, real)
    if method != "mean":
        raise ValueError(f"pooling {method!r}; valid: mean, cls, mean_all")
    lengths = real.sum(dim=1, keepdim=True)  # (B, 1) tokens of the row, CLS and SEP included
    positions = torch.arange(hidden.shape[1], device=hidden.device)[None, :]
    return mean_pool(hidden, (positions >= 1) & (positions < lengths - 1))


def l2_normalise(embeddings: torch.Tensor) -> torch.Tensor:
    """Unit rows; zero rows stay zero (F.normalize divides by max(norm, eps))."""
    return F.normalize(embeddings, p=2.0, dim=-1, eps=1e-12)
