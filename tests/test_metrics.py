"""embedlab.tasks.metrics against trec_eval (through pytrec_eval) and hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytrec_eval

from embedlab.tasks.metrics import (
    METRIC_NAMES,
    per_query_metrics,
    rank_run,
    retrieval_metrics,
)

# Our metric name -> trec_eval's name for the same measure.
TREC_NAMES = {
    "ndcg@10": "ndcg_cut_10",
    "recall@100": "recall_100",
    "mrr@10": "recip_rank",
    "map": "map",
}
N_QUERIES = 50
N_DOCS = 300


def _random_task() -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """Seeded qrels and scores covering the awkward cases the comparison must include.

    Scores are rounded to one decimal so many documents tie. Every fifth query has its
    relevant documents scored below everything else (no relevant document in the top 10,
    some beyond rank 100); q0 has only grade-0 judgements; q1 has qrels but no scores; and
    "unjudged" has scores but no qrels.
    """
    rng = np.random.default_rng(20240601)
    doc_ids = [f"d{i:03d}" for i in range(N_DOCS)]
    qrels: dict[str, dict[str, int]] = {}
    scores: dict[str, dict[str, float]] = {}
    for q in range(N_QUERIES):
        qid = f"q{q}"
        judged = rng.choice(N_DOCS, size=int(rng.integers(3, 30)), replace=False)
        grades = rng.integers(0, 3, size=len(judged)) if q != 0 else np.zeros(len(judged))
        qrels[qid] = {doc_ids[d]: int(g) for d, g in zip(judged, grades)}
        raw = np.round(rng.random(N_DOCS), 1)
        if q % 5 == 0:
            relevant = [doc_ids.index(d) for d, g in qrels[qid].items() if g > 0]
            raw[relevant] = -rng.integers(0, 3, size=len(relevant))  # also tied among themselves
        scores[qid] = {doc_id: float(s) for doc_id, s in zip(doc_ids, raw)}
    del scores["q1"]
    scores["unjudged"] = {doc_ids[0]: 1.0}
    return qrels, scores


def _trec_eval(
    qrels: dict[str, dict[str, int]], ranked: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    """trec_eval's per-query measures for our rankings, keyed by our metric names.

    trec_eval re-sorts a run by score and breaks ties by doc id descending, the opposite of
    `rank_run`. Scores n, n-1, ..., 1 following our order remove every tie, so trec_eval
    scores exactly the ranking we score. recip_rank runs on the top 10 only (MRR@10).
    """

    def as_run(ranking: dict[str, list[str]]) -> dict[str, dict[str, float]]:
        return {
            qid: {doc_id: float(len(docs) - i) for i, doc_id in enumerate(docs)}
            for qid, docs in ranking.items()
        }

    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map"})
    top10 = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"})
    results = full.evaluate(as_run(ranked))
    for qid, values in top10.evaluate(as_run({q: d[:10] for q, d in ranked.items()})).items():
        results[qid].update(values)
    return {
        qid: {ours: values[theirs] for ours, theirs in TREC_NAMES.items()}
        for qid, values in results.items()
    }


def test_random_run_matches_trec_eval_per_query() -> None:
    """Every per-query metric equals trec_eval's on a seeded run with ties and misses."""
    qrels, scores = _random_task()
    ranked = rank_run(scores)
    ours = per_query_metrics(qrels, ranked)
    theirs = _trec_eval(qrels, ranked)

    # The fixture really contains the cases it claims to: misses in the top 10, relevant
    # documents beyond rank 100, and ties inside a top 10.
    assert any(ours[q]["mrr@10"] == 0 and q in ranked for q in ours)
    assert any(ours[q]["recall@100"] < 1 for q in ours if q in ranked)
    assert any(len({scores[q][d] for d in ranked[q][:10]}) < 10 for q in ranked)

    assert set(ours) == set(qrels) - {"q0"}
    for qid, values in ours.items():
        expected = theirs.get(qid, dict.fromkeys(METRIC_NAMES, 0.0))  # q1 has no run
        for name in METRIC_NAMES:
            assert values[name] == pytest.approx(expected[name], abs=1e-6), (qid, name)


def test_random_run_means_match_trec_eval() -> None:
    """The averages equal trec_eval -c means over the queries with a relevant document."""
    qrels, scores = _random_task()
    ranked = rank_run(scores)
    theirs = _trec_eval(qrels, ranked)
    averaged = [q for q in qrels if q != "q0"]

    means = retrieval_metrics(qrels, ranked)

    assert means["queries"] == len(averaged) == N_QUERIES - 1
    for name in METRIC_NAMES:
        expected = sum(theirs.get(q, {}).get(name, 0.0) for q in averaged) / len(averaged)
        assert means[name] == pytest.approx(expected, abs=1e-6), name


def test_rank_run_breaks_ties_by_doc_id_ascending() -> None:
    """Equal scores are ordered by doc id ascending, whatever the insertion order."""
    scores = {"q": {"b": 1.0, "c": 2.0, "a": 1.0, "e": 0.5, "d": 1.0}}

    assert rank_run(scores) == {"q": ["c", "a", "b", "d", "e"]}
    assert rank_run(scores, k=3) == {"q": ["c", "a", "b"]}
    reversed_order = {"q": dict(reversed(list(scores["q"].items())))}
    assert rank_run(reversed_order) == rank_run(scores)


def test_trec_eval_breaks_ties_by_doc_id_descending() -> None:
    """trec_eval orders tied docs the other way, so raw tied scores cannot be compared."""
    qrels = {"q": {"a": 1}}
    tied = {"q": {"a": 1.0, "b": 1.0}}

    trec = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(tied)

    assert trec["q"]["recip_rank"] == 0.5  # trec_eval ranked b before a
    assert per_query_metrics(qrels, rank_run(tied))["q"]["mrr@10"] == 1.0


def test_hand_computed_example() -> None:
    """All four metrics equal values worked out by hand for one query.

    qrels: d1=2, d2=1, d3=0, d4=1 (relevant: d1, d2, d4); ranking: d3, d1, d5, d2.
    DCG@10  = 0/log2(2) + 2/log2(3) + 0/log2(4) + 1/log2(5) = 1.261860 + 0.430677 = 1.692536
    IDCG@10 = 2/log2(2) + 1/log2(3) + 1/log2(4)             = 2 + 0.630930 + 0.5  = 3.130930
    nDCG@10 = 1.692536 / 3.130930 = 0.540586
    recall@100 = 2/3 (d4 never retrieved); MRR@10 = 1/2 (d1 at rank 2);
    MAP = (precision@2 + precision@4) / 3 = (1/2 + 2/4) / 3 = 1/3.
    """
    qrels = {"q": {"d1": 2, "d2": 1, "d3": 0, "d4": 1}}
    ranked = {"q": ["d3", "d1", "d5", "d2"]}

    values = per_query_metrics(qrels, ranked)["q"]

    assert values["ndcg@10"] == pytest.approx(0.540586, abs=1e-6)
    assert values["ndcg@10"] == pytest.approx(
        (2 / math.log2(3) + 1 / math.log2(5)) / (2 + 1 / math.log2(3) + 1 / math.log2(4))
    )
    assert values["recall@100"] == pytest.approx(2 / 3)
    assert values["mrr@10"] == 0.5
    assert values["map"] == pytest.approx(1 / 3)


def test_cutoffs_apply_at_ranks_10_and_100() -> None:
    """Relevant docs at ranks 11 and 120 give MRR@10 = nDCG@10 = 0 and recall@100 = 1/2.

    MAP still sees both: (1/11 + 2/120) / 2.
    """
    ranking = [f"n{i:03d}" for i in range(150)]
    ranking[10], ranking[119] = "r1", "r2"
    qrels = {"q": {"r1": 1, "r2": 1}}

    values = per_query_metrics(qrels, {"q": ranking})["q"]

    assert values == pytest.approx(
        {"ndcg@10": 0.0, "recall@100": 0.5, "mrr@10": 0.0, "map": (1 / 11 + 2 / 120) / 2}
    )


def test_negative_grades_count_as_zero_gain() -> None:
    """A negative grade adds nothing to DCG, as in trec_eval, instead of subtracting."""
    qrels = {"q": {"bad": -1, "good": 1}}
    ranked = {"q": ["bad", "good"]}

    ours = per_query_metrics(qrels, ranked)["q"]["ndcg@10"]

    assert ours == pytest.approx(1 / math.log2(3))
    assert ours == pytest.approx(_trec_eval(qrels, ranked)["q"]["ndcg@10"])


def test_query_coverage_rules() -> None:
    """Unranked judged queries score 0; unjudged and relevance-free queries are not averaged."""
    qrels = {"hit": {"a": 1}, "unranked": {"a": 1}, "no_relevant": {"a": 0}}
    ranked = {"hit": ["a"], "no_relevant": ["a"], "not_in_qrels": ["a"]}

    means = retrieval_metrics(qrels, ranked)

    assert means == {"ndcg@10": 0.5, "recall@100": 0.5, "mrr@10": 0.5, "map": 0.5, "queries": 2}


def test_invalid_inputs_raise() -> None:
    """No relevant document anywhere, repeated doc ids, NaN scores and k < 1 are rejected."""
    with pytest.raises(ValueError, match="no query in qrels has a relevant document"):
        retrieval_metrics({"q": {"a": 0}}, {"q": ["a"]})
    with pytest.raises(ValueError, match="'q': ranked list repeats a doc id"):
        per_query_metrics({"q": {"a": 1}}, {"q": ["a", "a"]})
    with pytest.raises(ValueError, match="'q': NaN score"):
        rank_run({"q": {"a": math.nan}})
    with pytest.raises(ValueError, match="k must be >= 1"):
        rank_run({"q": {"a": 1.0}}, k=0)
