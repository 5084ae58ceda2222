"""Packed, masked phase-1 batches from synthetic documents, for benches and checks that need no
prepared data: random ids, document lengths drawn from a log-normal fitted to the built-in
corpus (median 34, mean 75 tokens), cut into pieces of at most L and packed."""

from __future__ import annotations

import numpy as np
import torch

from embedlab.core.config import MaskingConfig
from embedlab.objectives.masking import MaskedBatch, mask_tokens
from embedlab.streams.packing import pack_pieces


def synthetic_rows(rows: int, length: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, L) packed ids and segment ids from documents of corpus-like lengths."""
    rng = np.random.default_rng(seed)
    pieces, positions = [], 0
    while positions < rows * length:
        tokens = int(np.clip(rng.lognormal(mean=np.log(34), sigma=1.27), 2, 20 * length))
        document = rng.integers(5, vocab, size=tokens).tolist() + [3]  # SEP = 3
        for start in range(0, len(document), length):
            pieces.append(document[start : start + length])
            positions += len(pieces[-1])
    packed = pack_pieces(pieces, sequence_length=length, pad_id=0)
    ids = torch.from_numpy(packed.input_ids[:rows]).long()
    return ids, torch.from_numpy(packed.segment_ids[:rows]).long()


def synthetic_batch(rows: int, length: int, vocab: int, seed: int,
                    generator: torch.Generator) -> tuple[torch.Tensor, MaskedBatch]:
    """`synthetic_rows` masked as phase 1 masks (15%, 80/10/10, ids from 5 up; MASK = 4):
    (B, T) segment ids and the masked batch, on the CPU."""
    ids, segments = synthetic_rows(rows, length, vocab, seed)
    masked = mask_tokens(ids, (segments > 0) & (ids >= 5), MaskingConfig(), mask_id=4,
                         random_token_range=(5, vocab), generator=generator)
    return segments, masked
