"""Retrieval metrics with trec_eval's definitions: nDCG@10, recall@100, MRR@10 and MAP.

Inputs are plain dictionaries so that any retriever can be scored:

* qrels: ``{query_id: {doc_id: grade}}`` with integer relevance grades. A document is
  *relevant* when its grade is > 0 (trec_eval's default ``relevance_level`` of 1).
* ranked: ``{query_id: [doc_id, ...]}``, best first, no duplicates; `rank_run` builds it
  from retriever scores.

Per query (ranks are 1-based, ``grade(d)`` is 0 for unjudged documents):

* ``ndcg@10`` (trec_eval ``ndcg_cut_10``): ``DCG / IDCG`` with
  ``DCG = sum over ranks r <= 10 of max(grade, 0) / log2(r + 1)`` and IDCG the same sum
  over the qrels' positive grades sorted in descending order. Negative grades count as 0,
  as trec_eval does.
* ``recall@100`` (``recall_100``): relevant documents in the top 100 / all relevant ones.
* ``mrr@10`` (``recip_rank`` on the run cut to 10): 1 / rank of the first relevant
  document in the top 10, 0 when there is none.
* ``map`` (``map``): sum of precision@r over the ranks r of relevant documents in the whole
  given list, divided by the number of relevant documents.

Reduction: the arithmetic mean over the queries in qrels that have at least one relevant
document. Such a query with no ranked list scores 0 on every metric (``trec_eval -c``);
ranked queries absent from qrels are ignored.
"""

from __future__ import annotations

import heapq
import math

METRIC_NAMES = ("ndcg@10", "recall@100", "mrr@10", "map")

_NDCG_CUTOFF = 10
_RECALL_CUTOFF = 100
_MRR_CUTOFF = 10
# 1 / log2(rank + 1) for ranks 1..10, computed once: the nDCG loop only ever needs these.
_DISCOUNTS = tuple(1.0 / math.log2(rank + 1) for rank in range(1, _NDCG_CUTOFF + 1))


def rank_run(scores: dict[str, dict[str, float]], k: int | None = None) -> dict[str, list[str]]:
    """Rank each query's documents by score, descending, keeping the top `k` (all if None).

    Ties are broken by doc id in ascending string order, so a ranking never depends on
    dictionary insertion order. trec_eval breaks ties the other way (doc id *descending*)
    and ignores the order of its input, which is why tests hand it strictly decreasing
    scores derived from this ranking rather than the raw, tied scores.

    Raises ValueError if `k` < 1 or a score is NaN (NaN has no place in an ordering).
    """
    if k is not None and k < 1:
        raise ValueError(f"k must be >= 1 or None, got {k}")
    return {qid: _rank_query(qid, doc_scores, k) for qid, doc_scores in scores.items()}


def _rank_query(qid: str, doc_scores: dict[str, float], k: int | None) -> list[str]:
    if any(map(math.isnan, doc_scores.values())):
        raise ValueError(f"query {qid!r}: NaN score")
    # Two stable sorts with C-level keys: by id, then by score descending. A reversed sort
    # keeps equal elements in their prior (id ascending) order, and this runs several
    # times faster than one sort on a Python (-score, id) key function.
    ranking = sorted(doc_scores)
    ranking.sort(key=doc_scores.__getitem__, reverse=True)
    return ranking if k is None else ranking[:k]


def per_query_metrics(
    qrels: dict[str, dict[str, int]], ranked: dict[str, list[str]]
) -> dict[str, dict[str, float]]:
    """Every metric for each query in `qrels` that has a relevant document.

    Returns ``{query_id: {metric: value}}`` with the keys of `METRIC_NAMES`. Queries without
    a relevant document are left out (every metric would be undefined or 0); queries with
    no entry in `ranked` score 0. Raises ValueError if a ranked list repeats a doc id.
    """
    results: dict[str, dict[str, float]] = {}
    for qid, judgements in qrels.items():
        relevant = {doc_id for doc_id, grade in judgements.items() if grade > 0}
        if relevant:
            ranking = ranked.get(qid, [])
            _check_unique(qid, ranking)
            results[qid] = _query_metrics(judgements, relevant, ranking)
    return results


def retrieval_metrics(
    qrels: dict[str, dict[str, int]], ranked: dict[str, list[str]]
) -> dict[str, float]:
    """Mean of each metric over the queries `per_query_metrics` scores, plus ``queries``.

    ``queries`` is the number of queries averaged over. Raises ValueError when no query in
    `qrels` has a relevant document, since a mean over nothing is undefined.
    """
    return mean_metrics(per_query_metrics(qrels, ranked))


def by_metric(per_query: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """`per_query_metrics`' result turned metric-major: ``{metric: {query_id: value}}``, the
    shape a paired test across checkpoints reads (one metric's values, query by query)."""
    return {name: {qid: values[name] for qid, values in per_query.items()} for name in METRIC_NAMES}


def mean_metrics(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    """The reduction of `retrieval_metrics`: each metric's mean over `per_query`'s queries
    (``math.fsum``, so the order of queries does not change it), plus ``queries``."""
    if not per_query:
        raise ValueError("no query in qrels has a relevant document (grade > 0)")
    count = len(per_query)
    means: dict[str, float] = {
        name: math.fsum(values[name] for values in per_query.values()) / count
        for name in METRIC_NAMES
    }
    means["queries"] = count
    return means


def _check_unique(qid: str, ranking: list[str]) -> None:
    # A repeated document would be counted twice and could push recall above 1.
    if len(set(ranking)) != len(ranking):
        raise ValueError(f"query {qid!r}: ranked list repeats a doc id")


def _query_metrics(
    judgements: dict[str, int], relevant: set[str], ranking: list[str]
) -> dict[str, float]:
    """One query's metrics from a single pass over its ranking."""
    dcg = 0.0
    reciprocal_rank = 0.0
    hits = 0
    hits_at_recall_cutoff = 0
    precision_sum = 0.0
    for rank, doc_id in enumerate(ranking, start=1):
        if rank <= _NDCG_CUTOFF:
            dcg += max(judgements.get(doc_id, 0), 0) * _DISCOUNTS[rank - 1]
        if doc_id not in relevant:
            continue
        hits += 1
        precision_sum += hits / rank
        if rank <= _RECALL_CUTOFF:
            hits_at_recall_cutoff = hits
        if hits == 1 and rank <= _MRR_CUTOFF:
            reciprocal_rank = 1.0 / rank
    return {
        "ndcg@10": dcg / _ideal_dcg(judgements),
        "recall@100": hits_at_recall_cutoff / len(relevant),
        "mrr@10": reciprocal_rank,
        "map": precision_sum / len(relevant),
    }


def _ideal_dcg(judgements: dict[str, int]) -> float:
    """DCG@10 of the best possible ranking: the positive grades, highest first."""
    best = heapq.nlargest(_NDCG_CUTOFF, (grade for grade in judgements.values() if grade > 0))
    return sum(grade * discount for grade, discount in zip(best, _DISCOUNTS))
