"""Representation health of an embedding model: spectrum, collapse and similarity statistics.

Pure numpy. Every function takes embeddings as a 2-D array of shape ``(N, d)`` (one row per
text) and computes in float64, whatever the input dtype. Malformed input (not 2-D, no rows,
non-finite values, mismatched shapes, invalid parameters) raises ValueError; a statistic
that is undefined for well-formed input (e.g. anisotropy with fewer than two non-zero rows)
is returned as ``nan`` and documented as such.

Statistics (references in each function):

* `covariance_spectrum`: eigenvalues of the centred covariance, descending, summing to 1.
* `effective_rank`: ``exp`` of the Shannon entropy of that spectrum (Roy & Vetterli 2007).
* `anisotropy`: mean cosine similarity over distinct pairs of rows (Ethayarajh 2019).
* `alignment` / `uniformity`: the two contrastive-representation losses of Wang & Isola 2020.
* `similarity_distributions`: cosine similarities of positive and negative query/document
  pairs, summarised and histogrammed on fixed bins.
* `health_report`: all of the above as one flat, strictly JSON-serialisable dict of
  ``health/...`` keys.

Rows are L2-normalised where a statistic is defined on the unit sphere (anisotropy,
similarities, and by default alignment and uniformity); an all-zero row has no direction
and is kept as the zero vector there unless the function says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

UNIFORMITY_MAX_ROWS = 4096
"""`uniformity` uses at most this many rows (a seeded subsample beyond it): O(n^2) pairs."""
DEFAULT_SEED = 0
"""Seed of every subsample taken in this module (`numpy.random.default_rng`)."""
HISTOGRAM_BINS = 40
"""Default number of equal-width similarity histogram bins on [-1, 1]."""
MAX_NEGATIVE_PAIRS = 1_000_000
"""`similarity_distributions` summarises at most this many negative pairs (seeded sample)."""
QUANTILES = (5, 25, 50, 75, 95)
"""Percentiles reported for each similarity distribution (numpy's linear interpolation)."""
SPECTRUM_TOP = 10
"""Number of leading normalised eigenvalues in `health_report` (``health/spectrum_top10``)."""

_BLOCK_ROWS = 1024  # rows per block of the blocked pairwise computations
_PAIR_CHUNK = 65536  # pairs per chunk of gathered row-wise dot products


# --------------------------------------------------------------------------- validation


def _as_matrix(x, name: str = "embeddings", min_rows: int = 1) -> np.ndarray:
    """`x` as a float64 ``(N, d)`` array with N >= `min_rows`, d >= 1, all values finite."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (N, d), got shape {a.shape}")
    if a.shape[0] < min_rows or a.shape[1] < 1:
        raise ValueError(f"{name} needs at least {min_rows} row(s) and 1 column, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return a


def _l2_normalize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows divided by their L2 norm; zero rows stay zero. Returns (normalised, nonzero mask)."""
    norms = np.linalg.norm(x, axis=1)
    nonzero = norms > 0
    safe = np.where(nonzero, norms, 1.0)
    return x / safe[:, None], nonzero


# --------------------------------------------------------------------------- spectrum


def covariance_spectrum(embeddings) -> np.ndarray:
    """Normalised eigenvalue spectrum of the centred covariance of `embeddings`.

    Shapes: `embeddings` ``(N, d)`` -> ``(d,)``.

    Definition: with ``X`` the rows minus their mean and ``C = X^T X / (N - 1)`` (``N > 1``),
    returns the eigenvalues ``lambda_1 >= ... >= lambda_d >= 0`` of ``C`` divided by their sum
    ``trace(C)``, so the result is a probability vector (sums to 1). The normalisation makes
    the ``1 / (N - 1)`` factor immaterial. Eigenvalues below the numerical-rank tolerance
    ``d * eps * lambda_1`` (the one `numpy.linalg.matrix_rank` uses) are set to exactly 0, so
    data of rank k has exactly k non-zero entries rather than k plus rounding noise.

    Degenerate case: when the variance is numerically 0 (all rows identical, or ``N == 1``:
    ``lambda_1 <= (N * eps * max|x|)^2``, the bound on the rounding noise of centring) no
    direction carries variance and the result is all zeros (it does not sum to 1);
    `effective_rank` maps that to 1, the value of a fully collapsed representation.
    """
    x = _as_matrix(embeddings)
    n, d = x.shape
    if n < 2:
        return np.zeros(d)
    centred = x - x.mean(axis=0, keepdims=True)
    cov = centred.T @ centred / (n - 1)
    eig = np.linalg.eigvalsh(cov)[::-1].copy()  # eigvalsh is ascending
    noise = (n * np.finfo(np.float64).eps * float(np.abs(x).max())) ** 2
    if not eig[0] > noise:
        return np.zeros(d)
    eig[eig < d * np.finfo(np.float64).eps * eig[0]] = 0.0
    return eig / eig.sum()


def _spectrum_effective_rank(p: np.ndarray) -> float:
    """exp(Shannon entropy) of a normalised spectrum, 0 log 0 = 0; 1.0 for an all-zero one."""
    p = p[p > 0]
    if p.size == 0:
        return 1.0
    return float(np.exp(-np.sum(p * np.log(p))))


def effective_rank(embeddings) -> float:
    """Effective rank of `embeddings` ``(N, d)``: a float in ``[1, min(N - 1, d)]``.

    Definition (Roy & Vetterli, "The effective rank: a measure of effective dimensionality",
    EUSIPCO 2007): ``exp(H(p))`` with ``p`` the normalised covariance spectrum of
    `covariance_spectrum` and ``H(p) = -sum_i p_i log p_i`` (natural log, ``0 log 0 = 0``).
    It equals k when the variance is spread evenly over k directions, is at most the rank of
    the centred data, and is 1 for a collapsed representation (one direction, or no variance
    at all: see `covariance_spectrum`).
    """
    return _spectrum_effective_rank(covariance_spectrum(embeddings))


# --------------------------------------------------------------------------- anisotropy


def anisotropy(embeddings) -> float:
    """Mean pairwise cosine similarity of the rows of `embeddings` ``(N, d)``: a float in [-1, 1].

    Definition (as in Ethayarajh, "How contextual are contextualized word representations?",
    EMNLP 2019): with ``u_i`` the L2-normalised rows,
    ``(1 / (n (n - 1))) * sum_{i != j} u_i . u_j`` over ordered pairs of distinct rows
    (equivalently the mean over unordered pairs). 0 for isotropic directions, 1 when all rows
    point the same way.

    All-zero rows have no direction and are excluded: ``n`` counts the non-zero rows only.
    Returns ``nan`` when fewer than two non-zero rows remain.

    Computed exactly in O(N d), never forming the N x N similarity matrix, through
    ``sum_{i != j} u_i . u_j = ||sum_i u_i||^2 - sum_i ||u_i||^2``.
    """
    x = _as_matrix(embeddings)
    u, nonzero = _l2_normalize(x)
    u = u[nonzero]
    n = u.shape[0]
    if n < 2:
        return float("nan")
    total = u.sum(axis=0)
    off_diagonal = float(total @ total) - float(np.einsum("ij,ij->", u, u))
    return off_diagonal / (n * (n - 1))


# --------------------------------------------------------------------------- alignment / uniformity


def alignment(queries, positives, alpha: float = 2, normalize: bool = True) -> float:
    """Alignment loss of Wang & Isola 2020 over positive pairs: lower is better.

    Shapes: `queries` ``(N, d)`` and `positives` ``(N, d)``, row i of one paired with row i
    of the other -> float.

    Definition (Wang & Isola, "Understanding contrastive representation learning through
    alignment and uniformity on the hypersphere", ICML 2020, ``L_align``):
    ``mean_i ||f(x_i) - f(y_i)||_2 ^ alpha`` with ``alpha > 0`` (default 2). With `normalize`
    (default, as in the paper, whose encoders map to the unit sphere) rows are first
    L2-normalised, so the value lies in ``[0, 2^alpha]``; zero rows stay zero vectors.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    q = _as_matrix(queries, "queries")
    p = _as_matrix(positives, "positives")
    if q.shape != p.shape:
        raise ValueError(f"queries {q.shape} and positives {p.shape} must have the same shape")
    if normalize:
        q, _ = _l2_normalize(q)
        p, _ = _l2_normalize(p)
    distances = np.linalg.norm(q - p, axis=1)
    return float(np.mean(distances**alpha))


def uniformity_rows(n: int, max_rows: int = UNIFORMITY_MAX_ROWS, seed: int = DEFAULT_SEED) -> np.ndarray:
    """Row indices `uniformity` uses for N = `n` rows: all of them, or a seeded subsample.

    Returns ``arange(n)`` when ``n <= max_rows``; otherwise ``max_rows`` distinct indices drawn
    without replacement by ``numpy.random.default_rng(seed).choice``, sorted ascending. Depends
    only on (n, max_rows, seed), so the same inputs always give the same subsample.
    """
    if max_rows < 2:
        raise ValueError(f"max_rows must be >= 2, got {max_rows}")
    if n <= max_rows:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=max_rows, replace=False))


def uniformity(
    embeddings,
    t: float = 2,
    *,
    max_rows: int = UNIFORMITY_MAX_ROWS,
    seed: int = DEFAULT_SEED,
    normalize: bool = True,
) -> float:
    """Uniformity loss of Wang & Isola 2020 over distinct pairs of rows: lower is more uniform.

    Shapes: `embeddings` ``(N, d)``, ``N >= 2`` -> float.

    Definition (Wang & Isola 2020, ``L_uniform``):
    ``log mean_{i < j} exp(-t ||f(x_i) - f(x_j)||_2^2)`` with ``t > 0`` (default 2), the mean
    over the ``n (n - 1) / 2`` unordered pairs of distinct rows (the same as over ordered
    ones), as the paper's ``torch.pdist`` form. With `normalize` (default) rows are first
    L2-normalised (zero rows stay zero vectors), so the value lies in ``[-4t, 0]``.

    Computed stably as ``logsumexp(-t d_ij^2) - log(#pairs)`` in row blocks, never holding
    more than `_BLOCK_ROWS` x n distances. Cost is O(n^2 d), so for ``N > max_rows``
    (default `UNIFORMITY_MAX_ROWS` = 4096) it is computed on the deterministic subsample
    `uniformity_rows` (N, max_rows, seed) (default seed `DEFAULT_SEED` = 0).
    """
    if not t > 0:
        raise ValueError(f"t must be > 0, got {t}")
    x = _as_matrix(embeddings, min_rows=2)
    x = x[uniformity_rows(x.shape[0], max_rows, seed)]
    if normalize:
        x, _ = _l2_normalize(x)
    n = x.shape[0]
    squared = np.einsum("ij,ij->i", x, x)
    running_max = -math.inf
    running_sum = 0.0  # sum of exp(value - running_max) so far
    for start in range(0, n - 1, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, n - 1)
        block = x[start:stop]
        d2 = squared[start:stop, None] + squared[None, :] - 2.0 * (block @ x.T)
        np.maximum(d2, 0.0, out=d2)
        rows = np.arange(start, stop)[:, None]
        values = -t * d2[np.arange(n)[None, :] > rows]  # pairs (i, j) with j > i
        block_max = float(values.max())
        if block_max > running_max:
            running_sum *= math.exp(running_max - block_max) if running_max > -math.inf else 0.0
            running_max = block_max
        running_sum += float(np.sum(np.exp(values - running_max)))
    pairs = n * (n - 1) // 2
    return running_max + math.log(running_sum) - math.log(pairs)


# --------------------------------------------------------------------------- similarity distributions


PositivesLike = np.ndarray | Sequence[Sequence[int]]


def _positive_pairs(positives: PositivesLike, num_queries: int, num_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """(query index, doc index) arrays of the distinct positive pairs, sorted by flat index."""
    if isinstance(positives, np.ndarray) and positives.ndim == 2:
        if positives.dtype != np.bool_:
            raise ValueError(f"a positives mask must be boolean, got dtype {positives.dtype}")
        if positives.shape != (num_queries, num_docs):
            raise ValueError(f"positives mask shape {positives.shape} != (Q, D) = {(num_queries, num_docs)}")
        qi, di = np.nonzero(positives)
        return qi.astype(np.int64), di.astype(np.int64)
    if len(positives) != num_queries:
        raise ValueError(f"positives has {len(positives)} lists, expected one per query ({num_queries})")
    flat: list[int] = []
    for q, docs in enumerate(positives):
        for doc in docs:
            doc = int(doc)
            if not 0 <= doc < num_docs:
                raise ValueError(f"positive doc index {doc} of query {q} is outside [0, {num_docs})")
            flat.append(q * num_docs + doc)
    ids = np.unique(np.asarray(flat, dtype=np.int64))
    return ids // num_docs, ids % num_docs


def _pair_cosines(q: np.ndarray, d: np.ndarray, qi: np.ndarray, di: np.ndarray) -> np.ndarray:
    """Row-wise dot products q[qi[k]] . d[di[k]] in chunks, clipped to [-1, 1]."""
    out = np.empty(qi.shape[0])
    for start in range(0, qi.shape[0], _PAIR_CHUNK):
        stop = start + _PAIR_CHUNK
        out[start:stop] = np.einsum("ij,ij->i", q[qi[start:stop]], d[di[start:stop]])
    return np.clip(out, -1.0, 1.0)


def _summarise(values: np.ndarray, edges: np.ndarray, total: int) -> dict:
    """count / total / mean / std / quantiles / histogram of one set of similarities."""
    summary: dict = {"count": int(values.size), "total": int(total), "sampled": bool(values.size < total)}
    if values.size:
        summary["mean"] = float(values.mean())
        summary["std"] = float(values.std())
        summary["quantiles"] = {f"p{p:02d}": float(v) for p, v in zip(QUANTILES, np.percentile(values, QUANTILES))}
    else:
        summary["mean"] = summary["std"] = None
        summary["quantiles"] = {f"p{p:02d}": None for p in QUANTILES}
    summary["histogram"] = [int(c) for c in np.histogram(values, bins=edges)[0]]
    return summary


def similarity_distributions(
    queries,
    documents,
    positives: PositivesLike,
    *,
    bins: int = HISTOGRAM_BINS,
    max_negatives: int = MAX_NEGATIVE_PAIRS,
    seed: int = DEFAULT_SEED,
) -> dict:
    """Cosine similarities of positive and negative (query, document) pairs, summarised.

    Shapes: `queries` ``(Q, d)``, `documents` ``(D, d)``; `positives` either a boolean mask
    ``(Q, D)`` (True = relevant) or a sequence of Q sequences of document row indices
    (``positives[q]`` = the relevant documents of query q; duplicates count once).

    Similarity is the cosine of the L2-normalised rows, clipped to [-1, 1]; a zero row
    has no direction, stays the zero vector and so has similarity 0 with everything.
    Positives are all the given pairs; negatives are all other ``Q * D - P`` pairs. When
    there are more than `max_negatives` negatives, exactly `max_negatives` of them are used,
    drawn uniformly without replacement with ``numpy.random.default_rng(seed)``
    (deterministic), and the Q x D similarity matrix is never formed.

    Returns::

        {"bin_edges": [bins + 1 floats, linspace(-1, 1)],
         "positive": summary, "negative": summary}

    where each summary is ``{"count": pairs summarised, "total": pairs in the data,
    "sampled": count < total, "mean", "std" (population, ddof=0),
    "quantiles": {"p05", "p25", "p50", "p75", "p95"} (numpy linear interpolation),
    "histogram": bins ints}``. Histogram bins are ``[e_k, e_{k+1})`` except the last,
    which is closed, so the counts always sum to ``count``. With no pairs of a kind, its
    mean, std and quantiles are None and its histogram all zeros. The dict is JSON-ready.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if max_negatives < 0:
        raise ValueError(f"max_negatives must be >= 0, got {max_negatives}")
    q = _as_matrix(queries, "queries")
    d = _as_matrix(documents, "documents")
    if q.shape[1] != d.shape[1]:
        raise ValueError(f"queries {q.shape} and documents {d.shape} must have the same width")
    num_queries, num_docs = q.shape[0], d.shape[0]
    qi, di = _positive_pairs(positives, num_queries, num_docs)
    qn, _ = _l2_normalize(q)
    dn, _ = _l2_normalize(d)
    num_pairs = num_queries * num_docs
    num_positive = qi.size
    num_negative = num_pairs - num_positive
    edges = np.linspace(-1.0, 1.0, bins + 1)

    positive_values = _pair_cosines(qn, dn, qi, di)
    if num_negative <= max_negatives:
        mask = np.ones((num_queries, num_docs), dtype=bool)
        mask[qi, di] = False
        negative_values = np.clip(qn @ dn.T, -1.0, 1.0)[mask]
    else:
        # A uniform sample without replacement of all pairs, in random order, holding at least
        # max_negatives negatives (at most P positives are in it); the first max_negatives
        # negatives of it are a uniform sample without replacement of the negatives.
        rng = np.random.default_rng(seed)
        drawn = rng.choice(num_pairs, size=max_negatives + num_positive, replace=False)
        positive_ids = qi * num_docs + di
        drawn = drawn[~np.isin(drawn, positive_ids)][:max_negatives]
        negative_values = _pair_cosines(qn, dn, drawn // num_docs, drawn % num_docs)

    return {
        "bin_edges": [float(e) for e in edges],
        "positive": _summarise(positive_values, edges, num_positive),
        "negative": _summarise(negative_values, edges, num_negative),
    }


# --------------------------------------------------------------------------- report


def _json_float(value: float) -> float | None:
    """`value` as a float, or None when it is nan (strict JSON has no NaN)."""
    value = float(value)
    return None if math.isnan(value) else value


def health_report(
    embeddings,
    queries=None,
    positives: PositivesLike | None = None,
    *,
    documents=None,
    alpha: float = 2,
    t: float = 2,
    max_rows: int = UNIFORMITY_MAX_ROWS,
    bins: int = HISTOGRAM_BINS,
    max_negatives: int = MAX_NEGATIVE_PAIRS,
    seed: int = DEFAULT_SEED,
) -> dict:
    """All health statistics as one flat dict of ``health/...`` keys, strictly JSON-serialisable.

    Shapes: `embeddings` ``(N, d)`` (e.g. the corpus embeddings); optional `queries`
    ``(Q, d)`` and `positives` (a ``(Q, D)`` bool mask or Q lists of document row indices,
    see `similarity_distributions`), which index into `documents` ``(D, d)``, by default
    `embeddings` itself.

    Always (on `embeddings`):
    ``health/num_embeddings`` (N), ``health/dim`` (d), ``health/effective_rank``,
    ``health/effective_rank_ratio`` (effective rank / d), ``health/anisotropy``,
    ``health/uniformity`` (None when N < 2), ``health/spectrum_top10`` (the first
    ``min(10, d)`` normalised eigenvalues, a list).

    With both `queries` and `positives`:
    ``health/alignment`` (`alignment` over every positive (query, document) pair, None when
    there is none), ``health/positive_pairs``, ``health/negative_pairs`` (totals in the data),
    ``health/positive_similarity_mean`` / ``_std``, ``health/negative_similarity_mean`` /
    ``_std`` (None when there are no such pairs; negatives possibly sampled, see
    `similarity_distributions`) and ``health/similarity_gap`` (positive mean minus negative
    mean). Undefined values (nan) are reported as None.
    """
    if (queries is None) != (positives is None):
        raise ValueError("queries and positives must be given together")
    x = _as_matrix(embeddings)
    spectrum = covariance_spectrum(x)
    report: dict = {
        "health/num_embeddings": int(x.shape[0]),
        "health/dim": int(x.shape[1]),
        "health/effective_rank": _spectrum_effective_rank(spectrum),
    }
    report["health/effective_rank_ratio"] = report["health/effective_rank"] / x.shape[1]
    report["health/anisotropy"] = _json_float(anisotropy(x))
    report["health/uniformity"] = (
        _json_float(uniformity(x, t, max_rows=max_rows, seed=seed)) if x.shape[0] >= 2 else None
    )
    report["health/spectrum_top10"] = [float(v) for v in spectrum[:SPECTRUM_TOP]]
    if queries is None:
        return report

    docs = x if documents is None else _as_matrix(documents, "documents")
    q = _as_matrix(queries, "queries")
    distributions = similarity_distributions(
        q, docs, positives, bins=bins, max_negatives=max_negatives, seed=seed
    )
    pos, neg = distributions["positive"], distributions["negative"]
    qi, di = _positive_pairs(positives, q.shape[0], docs.shape[0])
    report["health/alignment"] = _json_float(alignment(q[qi], docs[di], alpha)) if qi.size else None
    report["health/positive_pairs"] = pos["total"]
    report["health/negative_pairs"] = neg["total"]
    report["health/positive_similarity_mean"] = pos["mean"]
    report["health/positive_similarity_std"] = pos["std"]
    report["health/negative_similarity_mean"] = neg["mean"]
    report["health/negative_similarity_std"] = neg["std"]
    report["health/similarity_gap"] = (
        pos["mean"] - neg["mean"] if pos["mean"] is not None and neg["mean"] is not None else None
    )
    return report
