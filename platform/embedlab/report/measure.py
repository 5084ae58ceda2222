"""Raw distributions behind the figures, recomputed from checkpoints and prepared data with
the platform's own code paths (tokenise -> pieces -> pack -> mask; encode -> health).

Every draw is seeded, so two reports of the same runs show the same rows and masks, and
every checkpoint is measured on the same masks and texts (paired comparisons).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from embedlab.checkpoints.io import head_ratio, head_states, load_encoder, mlm_model, read_manifest
from embedlab.core.beir import load_task
from embedlab.core.config import MaskingConfig
from embedlab.tasks.resolve import resolve_task
from embedlab.model.encode import encode_texts
from embedlab.model.encoder import MLMModel, segment_attention_mask as attention_mask
from embedlab.objectives.masking import MaskedBatch, mask_tokens
from embedlab.prepared.pieces import PIECES_FILE, tokenize_pieces
from embedlab.streams.packing import flatten_pieces, pack_layout
from embedlab.tasks.health import covariance_spectrum, similarity_distributions
from embedlab.tokenizer.frozen import FrozenTokenizer, load_tokenizer

SEED = 0
MLM_RATIOS = (0.05, 0.15, 0.5)  # masking ratios the held-out MLM loss is measured at
HELDOUT_TARGETS = 256  # expected masked tokens per (source, ratio): ratio r reads 256 / r tokens
HELDOUT_DOCUMENTS = 400  # recipe-dev documents read per source (before the token cap)
MASK_STATISTIC_TOKENS = 100_000  # packed positions the corruption shares are counted over
PLOT_NEGATIVES = 200_000  # negative pairs kept for drawing (the summary uses the evaluator's sample)

# What the encoder sees at each position of a masked row (`token_states`).
PAD, SPECIAL, VISIBLE, MASKED, RANDOM, KEPT = range(6)
STATE_NAMES = ("padding", "special (CLS/SEP)", "not selected", "selected -> [MASK]",
               "selected -> random token", "selected -> kept")


def masking_config(raw: dict[str, Any], **changes: Any) -> MaskingConfig:
    """A MaskingConfig from its study.json form (JSON lists back to tuples), with changes."""
    values = {k: tuple(map(tuple, v)) if k == "mixed_ratios" else v for k, v in raw.items()}
    return dataclasses.replace(MaskingConfig(**values), **changes)


# --------------------------------------------------------------------------- prepared data


@lru_cache(maxsize=4)
def document_lengths(prepared_dir: Path) -> dict[str, np.ndarray]:
    """Per source: the token count (content + SEP) of every training document in pieces.parquet."""
    table = pq.read_table(Path(prepared_dir) / PIECES_FILE, columns=["source", "piece", "doc_tokens"])
    first = table.filter(pc.equal(table["piece"], 0))
    sources = first["source"].to_numpy(zero_copy_only=False)
    lengths = first["doc_tokens"].to_numpy()
    return {name: lengths[sources == name] for name in sorted(set(sources.tolist()))}


@lru_cache(maxsize=4)
def _pieces(prepared_dir: Path) -> pa.Table:
    return pq.read_table(Path(prepared_dir) / PIECES_FILE, columns=["source", "ids", "word_start", "tokens"])


@dataclass(frozen=True)
class PackedSample:
    """Packed (R, L) rows with their word starts, and the source of every piece in them."""

    input_ids: torch.Tensor
    segment_ids: torch.Tensor
    word_start: torch.Tensor
    sources: list[str]  # source of each packed piece, in packing order


def pack(pieces: list[list[int]], flags: list[list[int]], sources: list[str], sequence_length: int,
         pad_id: int, cls_id: int) -> PackedSample:
    """Pieces -> rows by the trainer's packer, every segment opened by CLS and word starts with
    them (`PackLayout`, as `embedlab.streams.packed.pack_window` packs)."""
    values, offsets = flatten_pieces(pieces)
    layout = pack_layout(offsets, sequence_length=sequence_length, opener=True)
    packed = layout.packed(values, pad_id, cls_id)
    word_start = layout.word_starts(flatten_pieces(flags)[0])
    return PackedSample(torch.from_numpy(packed.input_ids).long(), torch.from_numpy(packed.segment_ids).long(),
                        torch.from_numpy(word_start).bool(), sources)


def sample_rows(prepared_dir: Path, sequence_length: int, pad_id: int, cls_id: int, *, rows: int, seed: int = SEED,
                short: bool = False) -> PackedSample:
    """`rows` packed rows of training pieces drawn uniformly (seeded). With `short`, one row of
    short pieces from different sources, so the segment structure of packing is visible."""
    table = _pieces(Path(prepared_dir))
    rng = np.random.default_rng(seed)
    picks = _short_pieces(table, sequence_length, rng) if short else []
    if not picks:  # 8 pieces per row: enough even where most pieces are short
        picks = rng.choice(table.num_rows, size=min(table.num_rows, rows * 8), replace=False).tolist()
    chosen = table.take(picks)
    sample = pack(chosen["ids"].to_pylist(), chosen["word_start"].to_pylist(), chosen["source"].to_pylist(),
                  sequence_length, pad_id, cls_id)
    return PackedSample(sample.input_ids[:rows], sample.segment_ids[:rows], sample.word_start[:rows], sample.sources)


def _short_pieces(table: pa.Table, sequence_length: int, rng: np.random.Generator) -> list[int]:
    """Pieces of 8 to L/3 tokens, one source after another, until they fill a row of L."""
    tokens = table["tokens"].to_numpy()
    sources = table["source"].to_numpy(zero_copy_only=False)
    fits = {name: np.flatnonzero((sources == name) & (tokens >= 8) & (tokens <= sequence_length // 3))
            for name in sorted(set(sources.tolist()))}
    names = [name for name in rng.permutation(sorted(fits)) if len(fits[name])]
    picks: list[int] = []
    while names and sum(int(tokens[i]) for i in picks) < sequence_length:
        picks.append(int(rng.choice(fits[names[len(picks) % len(names)]])))
    return picks


def corrupt(sample: PackedSample, config: MaskingConfig, tokenizer: FrozenTokenizer, seed: int = SEED) -> MaskedBatch:
    """The trainer's corruption of packed rows (eligibility, random-token range as in phase 1)."""
    eligible = (sample.segment_ids > 0) & ~torch.isin(sample.input_ids, torch.tensor(tokenizer.special_ids))
    return mask_tokens(sample.input_ids, eligible, config, mask_id=tokenizer.mask_id,
                       random_token_range=tokenizer.replacement_ids,
                       generator=torch.Generator().manual_seed(seed), word_start=sample.word_start,
                       segment_ids=sample.segment_ids)


def token_states(sample: PackedSample, masked: MaskedBatch, tokenizer: FrozenTokenizer) -> torch.Tensor:
    """(R, L) codes PAD / SPECIAL / VISIBLE / MASKED / RANDOM / KEPT of what the encoder sees."""
    states = torch.full_like(sample.input_ids, VISIBLE)
    states[torch.isin(sample.input_ids, torch.tensor(tokenizer.special_ids))] = SPECIAL
    states[sample.segment_ids == 0] = PAD
    selected = masked.selected
    states[selected & (masked.inputs == tokenizer.mask_id)] = MASKED
    states[selected & (masked.inputs != tokenizer.mask_id) & (masked.inputs != masked.targets)] = RANDOM
    # A random draw can hit the original token: it is then indistinguishable from "kept".
    states[selected & (masked.inputs == masked.targets)] = KEPT
    return states


def segment_mask(sample: PackedSample, row: int = 0) -> np.ndarray:
    """(L, L) bool: which key positions each query position of `row` may attend to."""
    return attention_mask(sample.segment_ids[row : row + 1])[0, 0].numpy()


@lru_cache(maxsize=4)
def prepared_tokenizer(prepared_dir: Path) -> FrozenTokenizer:
    return load_tokenizer(Path(prepared_dir) / "tokenizer.json")


# --------------------------------------------------------------------------- held-out MLM


@lru_cache(maxsize=4)
def heldout_rows(prepared_dir: Path, sources: tuple[str, ...], sequence_length: int) -> dict[str, PackedSample]:
    """Per source: recipe-dev documents cut into pieces and packed exactly as training text
    is, enough tokens for the smallest ratio (documents in content-hash order, so fixed)."""
    tokenizer = prepared_tokenizer(Path(prepared_dir))
    documents = pq.read_table(Path(prepared_dir) / "corpus" / "documents.parquet",
                              columns=["doc_id", "source", "title", "text", "hash", "split"],
                              filters=[("split", "=", "dev")])
    out = {}
    for source in sources:
        mine = documents.filter(pc.equal(documents["source"], source)).sort_by("hash").slice(0, HELDOUT_DOCUMENTS)
        if mine.num_rows == 0:
            continue
        # tokenize_pieces keeps training rows only; relabelled, dev text gets training's exact pieces.
        mine = mine.set_column(mine.schema.get_field_index("split"), "split",
                               pa.array(["train"] * mine.num_rows, pa.string()))
        pieces = tokenize_pieces(mine, tokenizer_path=str(tokenizer.path), sequence_length=sequence_length,
                                 sources=[source])
        ids, flags, total = [], [], 0
        for piece, starts in zip(pieces["ids"].to_pylist(), pieces["word_start"].to_pylist()):
            if total >= HELDOUT_TARGETS / min(MLM_RATIOS):
                break
            ids.append(piece)
            flags.append(starts)
            total += len(piece)
        out[source] = pack(ids, flags, [source] * len(ids), sequence_length, tokenizer.pad_id, tokenizer.cls_id)
    return out


def _mlm_heads(checkpoint: Path) -> tuple[dict[float, MLMModel], FrozenTokenizer] | None:
    """The checkpoint's encoder under each of its MLM heads, keyed by the masking ratio the
    head was trained at (a single head: the checkpoint's ratio); None without a head."""
    manifest = read_manifest(checkpoint)
    named = head_states(checkpoint, manifest)
    if not named:
        return None
    encoder, tokenizer, _ = load_encoder(checkpoint)
    ratio = manifest.get("objective", {}).get("masking_ratio", 0.15)
    states = {ratio if name == "mlm" else head_ratio(name): state for name, state in named.items()}
    return {ratio: mlm_model(encoder, head_state) for ratio, head_state in states.items()}, tokenizer


@dataclass(frozen=True)
class HeldoutLoss:
    """One (checkpoint, source, ratio) point of the held-out MLM loss."""

    nats: float  # mean cross-entropy per masked token
    targets: int  # masked tokens scored
    standard_error: float  # of the mean, over tokens


@torch.inference_mode()
def heldout_mlm_loss(checkpoint: Path, rows: dict[str, PackedSample], masking: dict[str, Any],
                     ratios: tuple[float, ...] = MLM_RATIOS) -> dict[float, dict[str, HeldoutLoss]] | None:
    """{ratio: {source: HeldoutLoss}}, or None for a checkpoint without an MLM head.

    At ratio r a source's first ~`HELDOUT_TARGETS` / r tokens are masked with the arm's
    strategy (so every ratio scores about the same number of tokens) and read by the head
    trained nearest r. The mask draw is seeded, so every checkpoint is scored on the same
    corrupted tokens and the gaps between checkpoints are paired."""
    loaded = _mlm_heads(checkpoint)
    if loaded is None:
        return None
    models, tokenizer = loaded
    out: dict[float, dict[str, HeldoutLoss]] = {}
    for ratio in ratios:
        model = models[min(models, key=lambda trained: abs(trained - ratio))]
        config = masking_config(masking, ratio=ratio, mixed_ratios=(), head_per_ratio=False)
        out[ratio] = {}
        for source, sample in rows.items():
            count = max(1, min(len(sample.input_ids), math.ceil(HELDOUT_TARGETS / ratio / sample.input_ids.shape[1])))
            part = PackedSample(sample.input_ids[:count], sample.segment_ids[:count], sample.word_start[:count],
                                sample.sources)
            masked = corrupt(part, config, tokenizer)
            losses = [torch.nn.functional.cross_entropy(
                model(masked.inputs[i : i + 64], part.segment_ids[i : i + 64], masked.selected[i : i + 64]).float(),
                masked.targets[i : i + 64][masked.selected[i : i + 64]], reduction="none")
                for i in range(0, count, 64) if masked.selected[i : i + 64].any()]
            values = torch.cat(losses).double() if losses else torch.zeros(0, dtype=torch.float64)
            n = len(values)
            out[ratio][source] = HeldoutLoss(
                nats=float(values.mean()) if n else math.nan, targets=n,
                standard_error=float(values.std() / math.sqrt(n)) if n > 1 else math.nan)
    return out


# --------------------------------------------------------------------------- embeddings


@dataclass(frozen=True)
class TaskEmbeddings:
    """A checkpoint's dev-split embeddings of a task, encoded as the evaluator encodes them."""

    task: str
    split: str
    queries: np.ndarray  # (Q, d) unit rows
    documents: np.ndarray  # (D, d) unit rows, documents in id order
    positives: list[list[int]]  # per query, rows of its relevant documents (grade > 0)


@lru_cache(maxsize=16)
def task_embeddings(checkpoint: Path, task_dir: Path, split: str, max_length: int, batch_size: int) -> TaskEmbeddings:
    """Encode the task like `embedlab.evaluate.checkpoint_eval` (pooling and prefixes from the
    manifest; documents as "title. text"), so the numbers match the trial rows."""
    encoder, tokenizer, manifest = load_encoder(checkpoint)
    task = load_task(task_dir)
    prefixes = manifest["pooling"].get("prefixes", {"query": "", "passage": ""})

    def encode(texts: list[str], prefix: str) -> np.ndarray:
        return encode_texts(encoder, tokenizer, texts, batch_size=batch_size, max_length=max_length,
                            pooling=manifest["pooling"]["method"], prefix=prefix)

    doc_ids = sorted(task.corpus)
    queries = task.split_queries(split)
    row_of = {doc_id: row for row, doc_id in enumerate(doc_ids)}
    positives = [[row_of[d] for d, grade in task.qrels[split][q].items() if grade > 0 and d in row_of]
                 for q in queries]
    return TaskEmbeddings(task=task.name, split=split,
                          queries=encode(list(queries.values()), prefixes["query"]),
                          documents=encode([task.doc_text(d) for d in doc_ids], prefixes["passage"]),
                          positives=positives)


def probe_embeddings(probe) -> TaskEmbeddings:
    """The dev-split embeddings of a `collect.Probe`'s checkpoint on its arm's task."""
    task_dir = resolve_task(probe.eval["task"], probe.prepared_dir)
    return task_embeddings(probe.checkpoint, task_dir, probe.eval["split"], probe.eval["max_length"],
                           probe.eval["batch_size"])


def pair_similarities(embeddings: TaskEmbeddings) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Cosines of positive pairs, of (a seeded sample of) negative pairs, and the evaluator's
    summary of both (`embedlab.tasks.health.similarity_distributions`)."""
    q, d = embeddings.queries.astype(np.float64), embeddings.documents.astype(np.float64)
    summary = similarity_distributions(q, d, embeddings.positives)
    is_positive = np.zeros((len(q), len(d)), dtype=bool)
    for row, docs in enumerate(embeddings.positives):
        is_positive[row, docs] = True
    cosines = np.clip(q @ d.T, -1.0, 1.0)
    negatives = cosines[~is_positive]
    if negatives.size > PLOT_NEGATIVES:
        negatives = np.random.default_rng(SEED).choice(negatives, PLOT_NEGATIVES, replace=False)
    return cosines[is_positive], negatives, summary


def document_spectrum(embeddings: TaskEmbeddings) -> np.ndarray:
    """Normalised covariance eigenvalues (descending, sum 1) of the document embeddings."""
    return covariance_spectrum(embeddings.documents)
