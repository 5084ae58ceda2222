"""Sentence embeddings from token states: padding-aware mean pooling, L2 normalisation.

Special-token policy: CLS and SEP are excluded from the mean (`pool_mask` is 1 only on
content tokens), so the embedding is the average of the text's own tokens. Zero-vector
rule: a row with no content token pools to the zero vector and stays zero after
normalisation (its inner product with everything is 0); it is never NaN.
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


def l2_normalise(embeddings: torch.Tensor) -> torch.Tensor:
    """Unit rows; zero rows stay zero (F.normalize divides by max(norm, eps))."""
    return F.normalize(embeddings, p=2.0, dim=-1, eps=1e-12)
