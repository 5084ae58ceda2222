"""The retention panel: a fixed, general check run on every checkpoint of every phase.

Built once per prepared data directory from recipe-dev documents (never final-eval, never
training text), so the same panel scores phase 1, 2 and 3:

- `probe`: which source a passage comes from. A multinomial logistic regression (full
  batch, L-BFGS, L2 1e-3) is fitted on frozen embeddings of 75% of the passages and scored
  on the other 25% (split by a hash of the doc id): accuracy.
- `similarity`: passage pairs graded 2 (two spans of one document), 1 (two documents of
  one source) and 0 (two sources); the Spearman rank correlation between cosine
  similarity and grade.
- `mlm`: masked-token accuracy on passages (15% of tokens, fixed seed, 80/10/10) for
  checkpoints that still carry an MLM head; None otherwise. A dual-head checkpoint is
  scored under each of its heads on the same masked passages
  (`retention/mlm_accuracy/mask5`, `.../mask50`), and `retention/mlm_accuracy` is its
  head trained nearest 15%, so every checkpoint has the plain key.

Every score is a fraction or a correlation, so a retention margin against a parent is in
the same absolute units (metric points), never a percentage of the parent's score.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from embedlab.checkpoints.io import head_ratio, head_states, load_encoder, local_checkpoint, mlm_model, read_manifest
from embedlab.core.config import MaskingConfig
from embedlab.objectives.masking import mask_tokens

PROBE_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("text", pa.string()), ("fold", pa.string())])
PAIRS_SCHEMA = pa.schema([("a", pa.string()), ("b", pa.string()), ("grade", pa.int64())])
PER_SOURCE = 60
PAIRS_PER_GRADE = 150
SEED = 0
PANEL_MASKING_RATIO = 0.15  # the masked-token score's ratio, the same for every checkpoint
PANEL_MAX_LENGTH = 128  # its passages are cut here, whatever the trial's eval.max_length
MLM_ACCURACY = "retention/mlm_accuracy"  # per head of a dual-head checkpoint: MLM_ACCURACY/<head>


def _bucket(doc_id: str) -> float:
    return int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big") / 2**64


def build_panel(corpus_table: pa.Table, directory: Path) -> dict:
    """Write probe.parquet and pairs.parquet from the recipe-dev split; returns counts."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dev = corpus_table.filter(pc.equal(corpus_table["split"], "dev")).sort_by("hash")
    rows: dict[str, list] = {"doc_id": [], "source": [], "text": [], "fold": []}
    halves: list[tuple[str, str, str]] = []
    for source in sorted(set(dev["source"].to_pylist())):
        mine = dev.filter(pc.equal(dev["source"], source)).slice(0, PER_SOURCE).to_pydict()
        for doc_id, text in zip(mine["doc_id"], mine["text"]):
            words = text.split()
            if len(words) < 8:
                continue
            passage = " ".join(words[:96])
            rows["doc_id"].append(doc_id)
            rows["source"].append(source)
            rows["text"].append(passage)
            rows["fold"].append("fit" if _bucket(doc_id) < 0.75 else "score")
            if len(words) >= 24:
                middle = len(words) // 2
                halves.append((source, " ".join(words[: min(middle, 64)]), " ".join(words[middle : middle + 64])))
    pq.write_table(pa.table(rows, schema=PROBE_SCHEMA), directory / "probe.parquet")
    pairs = _graded_pairs(rows, halves)
    pq.write_table(pa.table(pairs, schema=PAIRS_SCHEMA), directory / "pairs.parquet")
    counts = {"probe_passages": len(rows["doc_id"]), "sources": len(set(rows["source"])),
              "pairs": len(pairs["grade"])}
    (directory / "panel.json").write_text(json.dumps(counts, indent=2))
    return counts


def _graded_pairs(rows: dict[str, list], halves: list[tuple[str, str, str]]) -> dict[str, list]:
    rng = np.random.default_rng(SEED)
    pairs: dict[str, list] = {"a": [], "b": [], "grade": []}
    for index in rng.permutation(len(halves))[:PAIRS_PER_GRADE]:
        _, first, second = halves[index]
        pairs["a"].append(first)
        pairs["b"].append(second)
        pairs["grade"].append(2)
    sources = np.array(rows["source"])
    texts = rows["text"]
    if len(texts) < 2:
        return pairs  # too little recipe-dev text for cross-document pairs
    for grade, same in ((1, True), (0, False)):
        made = attempts = 0
        while made < PAIRS_PER_GRADE and attempts < 50 * PAIRS_PER_GRADE:
            attempts += 1
            i, j = rng.integers(0, len(texts), size=2)
            if i == j or (sources[i] == sources[j]) != same:
                continue
            pairs["a"].append(texts[i])
            pairs["b"].append(texts[j])
            pairs["grade"].append(grade)
            made += 1
    return pairs


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson correlation of average ranks (ties share their mean rank)."""

    def ranks(values: np.ndarray) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        ranked = np.empty(len(values))
        ranked[order] = np.arange(len(values), dtype=np.float64)
        for value in np.unique(values):
            tied = values == value
            ranked[tied] = ranked[tied].mean()
        return ranked

    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx**2).sum() * (ry**2).sum()))


def probe_accuracy(embeddings: np.ndarray, labels: list[str], fit: np.ndarray) -> float:
    """Multinomial logistic regression fitted on rows `fit`, accuracy on the others."""
    classes = sorted(set(labels))
    y = torch.tensor([classes.index(label) for label in labels])
    x = torch.from_numpy(np.asarray(embeddings, dtype=np.float64))
    fit_rows, score_rows = torch.from_numpy(fit), torch.from_numpy(~fit)
    weight = torch.zeros(x.shape[1], len(classes), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(len(classes), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        logits = x[fit_rows] @ weight + bias
        loss = torch.nn.functional.cross_entropy(logits, y[fit_rows]) + 1e-3 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        predicted = (x[score_rows] @ weight + bias).argmax(dim=1)
    return float((predicted == y[score_rows]).double().mean())


def head_metric(head: str) -> str:
    """The retention column of one head of a dual-head checkpoint: retention/mlm_accuracy/mask5."""
    return f"{MLM_ACCURACY}/{head}"


def retention_scores(
    directory: Path,
    encode: Callable[[list[str]], np.ndarray],
    mlm_accuracy: MaskedTokenAccuracy | Callable[[list[str]], float] | None = None,
) -> dict[str, float | None]:
    """The panel's scores for one encoder (`encode` gives L2-normalised rows): source probe,
    graded-pair Spearman and masked-token accuracy, plus one masked-token accuracy per head
    when `mlm_accuracy` is a dual-head checkpoint's (`mlm_accuracy_function`)."""
    probe = pq.read_table(Path(directory) / "probe.parquet").to_pydict()
    pairs = pq.read_table(Path(directory) / "pairs.parquet").to_pydict()
    fit = np.array([fold == "fit" for fold in probe["fold"]], dtype=bool)
    # A panel from very little recipe-dev text may lack a part; that score is then None.
    probe_ready = len(set(probe["source"])) >= 2 and fit.any() and (~fit).any()
    pairs_ready = len(set(pairs["grade"])) >= 2
    probe_score = probe_accuracy(encode(probe["text"]), probe["source"], fit) if probe_ready else None
    spearman = None
    if pairs_ready:
        cosine = (encode(pairs["a"]) * encode(pairs["b"])).sum(axis=1)
        spearman = _spearman(cosine, np.asarray(pairs["grade"], dtype=np.float64))
    return {
        "retention/probe_accuracy": probe_score,
        "retention/similarity_spearman": spearman,
        **_mlm_scores(mlm_accuracy, probe["text"]),
    }


def _mlm_scores(mlm_accuracy: MaskedTokenAccuracy | Callable[[list[str]], float] | None,
                texts: list[str]) -> dict[str, float | None]:
    if mlm_accuracy is None or not texts:
        return {MLM_ACCURACY: None}
    if not isinstance(mlm_accuracy, MaskedTokenAccuracy) or not mlm_accuracy.dual:
        return {MLM_ACCURACY: mlm_accuracy(texts)}
    per_head = mlm_accuracy.per_head(texts)
    return {MLM_ACCURACY: per_head[mlm_accuracy.nearest], **{head_metric(h): v for h, v in per_head.items()}}


@dataclass(frozen=True)
class MaskedTokenAccuracy:
    """Masked-token accuracy at `PANEL_MASKING_RATIO` of a checkpoint's encoder under each of
    its MLM heads, on one masking of the passages (fixed seed) shared by every head.

    Calling it scores the head nearest the panel's ratio (`nearest`, the one
    `single_head_state` picks and a child continues with at that ratio); `per_head` scores
    them all, by head name ("mlm" for a single-head checkpoint)."""

    model: Any  # an MLMModel whose mlm_head is loaded with each head's state in turn
    heads: dict[str, dict[str, torch.Tensor]]
    nearest: str
    tokenizer: Any
    max_length: int = PANEL_MAX_LENGTH

    @property
    def dual(self) -> bool:
        return "mlm" not in self.heads

    def __call__(self, texts: list[str]) -> float:
        return self._score(texts, [self.nearest])[self.nearest]

    def per_head(self, texts: list[str]) -> dict[str, float]:
        return self._score(texts, list(self.heads))

    @torch.inference_mode()
    def _score(self, texts: list[str], names: list[str]) -> dict[str, float]:
        tokenizer, limit = self.tokenizer, self.max_length
        rows = [[tokenizer.cls_id, *ids[: limit - 2], tokenizer.sep_id] for ids in tokenizer.encode_batch(texts)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
        segments = (ids != tokenizer.pad_id).long()
        eligible = (segments > 0) & ~torch.isin(ids, torch.tensor(tokenizer.special_ids))
        masked = mask_tokens(ids, eligible, MaskingConfig(ratio=PANEL_MASKING_RATIO),
                             mask_id=tokenizer.mask_id,
                             random_token_range=tokenizer.replacement_ids,
                             generator=torch.Generator().manual_seed(SEED))
        # One encoder pass; the heads differ only after it.
        hidden = self.model.encoder(masked.inputs, segments)[masked.selected]
        targets = ids[masked.selected]
        scores = {}
        for name in names:
            self.model.mlm_head.load_state_dict(self.heads[name], strict=False)
            scores[name] = float((self.model.mlm_head(hidden).argmax(dim=1) == targets).double().mean())
        return scores


def nearest_head(names: list[str], ratio: float) -> str:
    """The head a checkpoint with heads `names` continues with at masking `ratio`: "mlm" for a
    single head, else the mask<percent> head trained nearest `ratio` (the first on a tie).
    The rule of `embedlab.checkpoints.io.single_head_state`, on names alone, so promotion
    can tell which of a dual-head parent's heads a child carries from the parent's scores."""
    if not names:
        raise ValueError("nearest_head: no head names")
    return "mlm" if "mlm" in names else min(names, key=lambda name: abs(head_ratio(name) - ratio))


def mlm_accuracy_function(checkpoint_dir: str | Path, max_length: int = PANEL_MAX_LENGTH) -> MaskedTokenAccuracy | None:
    """The masked-token accuracy of a checkpoint's MLM heads (`MaskedTokenAccuracy`), or None
    without a head, before any weights are loaded. Called on texts it scores the head trained
    nearest `PANEL_MASKING_RATIO`, the one a phase-2 child would continue with; `per_head`
    scores every head of a dual-head checkpoint."""
    directory = local_checkpoint(checkpoint_dir)
    heads = head_states(directory, read_manifest(directory))
    # A head stored with other tensors than an MLMHead's (dense, norm, bias) cannot be loaded.
    if not heads or not all(key.startswith(("dense.", "norm.", "bias")) for state in heads.values() for key in state):
        return None
    nearest = nearest_head(list(heads), PANEL_MASKING_RATIO)
    encoder, tokenizer, _ = load_encoder(directory)
    if encoder.config.pretrained:  # a pretrained backbone has no positions past its own
        max_length = min(max_length, encoder.config.max_length)
    return MaskedTokenAccuracy(model=mlm_model(encoder, heads[nearest]), heads=heads, nearest=nearest,
                               tokenizer=tokenizer, max_length=max_length)
