"""Texts -> L2-normalised sentence embeddings, in input order, from any batching.

Texts are encoded as `[CLS] prefix + text [SEP]` (truncated to `max_length`), in batches
of similar length (sorted by token count) so little padding is computed, then put back in
input order. Pooling is the checkpoint's: mean over content tokens (CLS, SEP and padding
excluded) or the CLS state, then L2 normalised (an all-zero row stays zero).
"""

from __future__ import annotations

import numpy as np
import torch

from embedlab.model.encoder import Encoder
from embedlab.model.pooling import l2_normalise, mean_pool
from embedlab.tokenizer import FrozenTokenizer


@torch.inference_mode()
def encode_texts(
    encoder: Encoder,
    tokenizer: FrozenTokenizer,
    texts: list[str],
    *,
    batch_size: int = 64,
    max_length: int = 128,
    device: torch.device | str = "cpu",
    pooling: str = "mean",
    prefix: str = "",
) -> np.ndarray:
    """(N,) texts -> (N, d) float32 unit (or zero) rows, row i belonging to texts[i].

    `prefix` (e.g. "query: ") is prepended to every text, as the checkpoint was trained;
    `pooling` is "mean" (content tokens) or "cls" (the first position's state).
    """
    width = encoder.config.width
    if not texts:
        return np.zeros((0, width), dtype=np.float32)
    content = [ids[: max_length - 2] for ids in tokenizer.encode_batch([prefix + t for t in texts])]
    order = sorted(range(len(texts)), key=lambda i: (len(content[i]), i))
    out = np.zeros((len(texts), width), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        length = max(len(content[i]) for i in chunk) + 2
        input_ids = torch.full((len(chunk), length), tokenizer.pad_id, dtype=torch.long)
        segment_ids = torch.zeros((len(chunk), length), dtype=torch.long)
        pool_mask = torch.zeros((len(chunk), length), dtype=torch.bool)
        for row, i in enumerate(chunk):
            ids = [tokenizer.cls_id, *content[i], tokenizer.sep_id]
            input_ids[row, : len(ids)] = torch.tensor(ids)
            segment_ids[row, : len(ids)] = 1
            pool_mask[row, 1 : len(ids) - 1] = True
        hidden = encoder(input_ids.to(device), segment_ids.to(device))
        pooled = hidden[:, 0] if pooling == "cls" else mean_pool(hidden, pool_mask.to(device))
        pooled = l2_normalise(pooled.float())
        out[chunk] = pooled.cpu().numpy()
    return out
