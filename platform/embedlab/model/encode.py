"""Texts -> L2-normalised sentence embeddings, in input order, from any batching.

Texts are encoded as `[CLS] prefix + text [SEP]` (truncated to `max_length`), in batches
of similar length (sorted by token count) so little padding is computed, then put back in
input order. Pooling is the checkpoint's (`embedlab.model.pooling.pool`): mean over content
tokens (CLS, SEP and padding excluded), mean over every token of the row (CLS and SEP
included: sentence-transformers' mean) or the CLS state, then L2 normalised (an all-zero row
stays zero). `encoder` is either backbone: embedlab's `Encoder` or a pretrained one
(`embedlab.model.pretrained.PretrainedEncoder`), which take the same inputs.

A large corpus takes minutes to encode, so `encode_texts` can report progress: a line
(texts encoded of the total, texts per second) at most every `PROGRESS_SECONDS`, and one
when the pass ends, through a `progress(str)` callable like every other long step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from embedlab.model.encoder import Encoder
from embedlab.model.flops import FORWARD, FlopTally
from embedlab.model.pooling import l2_normalise, pool
from embedlab.tokenizer.frozen import FrozenTokenizer

PROGRESS_SECONDS = 10.0  # one line per 10 s of encoding: visible on a long pass, quiet on a short one


class EncodingProgress:
    """Throttled progress lines of one encoding pass of `total` texts, named by `label`:
    "<label>: 12,800/50,000 texts encoded (26%), 1,234 texts/s"."""

    def __init__(self, progress: Callable[[str], None], label: str, total: int, *,
                 every_seconds: float = PROGRESS_SECONDS) -> None:
        self.progress, self.label, self.total, self.every_seconds = progress, label, total, every_seconds
        self.started = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        """Report `done` texts encoded if `every_seconds` passed since the last line (always at the end)."""
        now = time.perf_counter()
        if done < self.total and now - self.last < self.every_seconds:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        self.progress(f"{self.label}: {done:,}/{self.total:,} texts encoded ({done / self.total:.0%}), "
                      f"{rate:,.0f} texts/s")


def content_ids(tokenizer: FrozenTokenizer, texts: list[str], *, max_length: int, prefix: str = "") -> list[list[int]]:
    """Each text's token ids as `encode_texts` encodes them: prefixed, cut to leave room for [CLS] and [SEP]."""
    return [ids[: max_length - 2] for ids in tokenizer.encode_batch([prefix + t for t in texts])]


def length_order(content: list[list[int]]) -> list[int]:
    """The order `encode_texts` encodes texts in (by token count, then input position): its
    batches are consecutive runs of `batch_size` of it, so a caller that hands each run to
    another process has every text encoded in the batch, and so the padded shape, it has here."""
    return sorted(range(len(content)), key=lambda i: (len(content[i]), i))


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
    progress: Callable[[str], None] | None = None,
    label: str = "encoding",
    progress_seconds: float = PROGRESS_SECONDS,
    tally: FlopTally | None = None,
) -> np.ndarray:
    """(N,) texts -> (N, d) float32 unit (or zero) rows, row i belonging to texts[i].

    `prefix` (e.g. "query: ") is prepended to every text, as the checkpoint was trained;
    a pretrained backbone's texts are cut at its positions when `max_length` is longer;
    `pooling` is "mean" (content tokens), "mean_all" (every token) or "cls" (the first
    position's state). With
    `progress`, an `EncodingProgress` line named `label` every `progress_seconds` and at the end.
    With `tally` (`embedlab.model.flops.FlopTally`), the forward FLOPs of every batch are added to it.
    """
    width = encoder.config.width
    if encoder.config.pretrained:  # a pretrained backbone has no positions past its own
        max_length = min(max_length, encoder.config.max_length)
    if not texts:
        return np.zeros((0, width), dtype=np.float32)
    content = content_ids(tokenizer, texts, max_length=max_length, prefix=prefix)
    order = length_order(content)
    out = np.zeros((len(texts), width), dtype=np.float32)
    tracker = None if progress is None else EncodingProgress(progress, label, len(texts), every_seconds=progress_seconds)
    half = next(encoder.parameters()).dtype in (torch.float16, torch.bfloat16)  # what attention sees (FLOPs)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        length = max(len(content[i]) for i in chunk) + 2
        input_ids = torch.full((len(chunk), length), tokenizer.pad_id, dtype=torch.long)
        segment_ids = torch.zeros((len(chunk), length), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids = [tokenizer.cls_id, *content[i], tokenizer.sep_id]
            input_ids[row, : len(ids)] = torch.tensor(ids)
            segment_ids[row, : len(ids)] = 1
        if tally is not None:
            tally.encode(encoder.config, segment_ids, mode=FORWARD, device=torch.device(device), half=half,
                         training=encoder.training)
        segment_ids = segment_ids.to(device)
        hidden = encoder(input_ids.to(device), segment_ids)
        pooled = l2_normalise(pool(hidden, segment_ids, pooling).float())
        out[chunk] = pooled.cpu().numpy()
        if tracker is not None:
            tracker.update(start + len(chunk))
    return out
