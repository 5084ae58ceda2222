"""embedlab.tasks.health: each statistic against a naive numpy computation, plus known cases."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from embedlab.tasks import health
from embedlab.tasks.health import (
    alignment,
    anisotropy,
    covariance_spectrum,
    effective_rank,
    health_report,
    similarity_distributions,
    uniformity,
    uniformity_rows,
)

TOL = 1e-9


def _emb(n: int = 60, d: int = 8, seed: int = 1) -> np.ndarray:
    """Fixed seeded float64 embeddings with a shared offset, so they are not isotropic."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) + 0.7 * rng.normal(size=(1, d))


def _unit(v: np.ndarray) -> np.ndarray:
    """v / ||v||, zero vectors unchanged."""
    norm = math.sqrt(sum(float(c) * float(c) for c in v))
    return v / norm if norm > 0 else v


def _naive_spectrum(x: np.ndarray) -> np.ndarray:
    """Covariance by explicit sums over rows, eigenvalues descending, normalised to sum 1."""
    n, d = x.shape
    mean = sum(x[i] for i in range(n)) / n
    cov = np.zeros((d, d))
    for i in range(n):
        diff = x[i] - mean
        cov += np.outer(diff, diff)
    eig = np.sort(np.linalg.eigvalsh(cov / (n - 1)))[::-1]
    eig = np.clip(eig, 0.0, None)
    return eig / eig.sum()


def test_spectrum_matches_naive():
    """covariance_spectrum equals the eigenvalues of an explicitly summed covariance, summing to 1."""
    x = _emb()
    got = covariance_spectrum(x)
    assert got.shape == (x.shape[1],)
    assert np.all(np.diff(got) <= 0)
    assert got.sum() == pytest.approx(1.0, abs=TOL)
    np.testing.assert_allclose(got, _naive_spectrum(x), rtol=0, atol=TOL)


def test_effective_rank_matches_naive():
    """effective_rank equals exp of the entropy of the naive spectrum, term by term."""
    x = _emb()
    p = _naive_spectrum(x)
    entropy = -sum(float(v) * math.log(float(v)) for v in p if v > 0)
    assert effective_rank(x) == pytest.approx(math.exp(entropy), rel=0, abs=TOL)


def test_anisotropy_matches_full_matrix():
    """anisotropy equals the mean off-diagonal entry of the full N x N cosine matrix."""
    x = _emb()
    u = np.stack([_unit(r) for r in x])
    sims = u @ u.T
    n = len(x)
    naive = (sims.sum() - np.trace(sims)) / (n * (n - 1))
    assert anisotropy(x) == pytest.approx(naive, rel=0, abs=TOL)


def test_anisotropy_excludes_zero_rows():
    """All-zero rows are dropped: adding them changes nothing; with < 2 non-zero rows it is nan."""
    x = _emb(n=20)
    padded = np.concatenate([x[:7], np.zeros((5, x.shape[1])), x[7:]])
    assert anisotropy(padded) == pytest.approx(anisotropy(x), rel=0, abs=TOL)
    loops = [
        float(_unit(x[i]) @ _unit(x[j])) for i in range(len(x)) for j in range(len(x)) if i != j
    ]
    assert anisotropy(padded) == pytest.approx(sum(loops) / len(loops), rel=0, abs=TOL)
    assert math.isnan(anisotropy(np.vstack([x[:1], np.zeros((3, x.shape[1]))])))


def test_alignment_matches_loop():
    """alignment equals the loop mean of ||u_i - v_i||^alpha over normalised (or raw) rows."""
    x, y = _emb(seed=2), _emb(seed=3)
    for alpha in (1, 2, 3.5):
        naive = np.mean([np.linalg.norm(_unit(a) - _unit(b)) ** alpha for a, b in zip(x, y)])
        assert alignment(x, y, alpha) == pytest.approx(naive, rel=0, abs=TOL)
    raw = np.mean([np.linalg.norm(a - b) ** 2 for a, b in zip(x, y)])
    assert alignment(x, y, normalize=False) == pytest.approx(raw, rel=0, abs=TOL)
    with pytest.raises(ValueError):
        alignment(x, y[:-1])


def test_uniformity_matches_loop():
    """uniformity equals log of the loop mean of exp(-t ||u_i - u_j||^2) over pairs i < j."""
    x = _emb()
    u = [_unit(r) for r in x]
    for t in (0.5, 2.0, 7.0):
        terms = [math.exp(-t * float(np.sum((u[i] - u[j]) ** 2))) for i, j in itertools.combinations(range(len(u)), 2)]
        assert uniformity(x, t) == pytest.approx(math.log(sum(terms) / len(terms)), rel=0, abs=TOL)


def test_uniformity_blocks_and_subsample(monkeypatch):
    """Blocked logsumexp matches one block, and the subsample is seeded, sorted and deterministic."""
    x = _emb(n=50)
    whole = uniformity(x)
    monkeypatch.setattr(health, "_BLOCK_ROWS", 7)
    assert uniformity(x) == pytest.approx(whole, rel=0, abs=TOL)

    rows = uniformity_rows(50, max_rows=20, seed=3)
    assert len(rows) == 20 and len(set(rows.tolist())) == 20 and np.all(np.diff(rows) > 0)
    np.testing.assert_array_equal(rows, uniformity_rows(50, max_rows=20, seed=3))
    assert not np.array_equal(rows, uniformity_rows(50, max_rows=20, seed=4))
    np.testing.assert_array_equal(uniformity_rows(20, max_rows=20), np.arange(20))
    sub = uniformity(x, max_rows=20, seed=3)
    assert sub == uniformity(x, max_rows=20, seed=3)
    assert sub == pytest.approx(uniformity(x[rows]), rel=0, abs=TOL)
    assert health.UNIFORMITY_MAX_ROWS == 4096 and health.DEFAULT_SEED == 0


def test_isotropic_gaussian():
    """An isotropic Gaussian has effective rank within 10% of d and anisotropy near 0."""
    d = 32
    x = np.random.default_rng(5).normal(size=(20000, d))
    assert abs(effective_rank(x) - d) <= 0.1 * d
    assert abs(anisotropy(x)) < 0.01


def test_identical_rows_collapse():
    """All rows identical: anisotropy 1, effective rank 1, uniformity 0."""
    x = np.tile(np.random.default_rng(6).normal(size=(1, 12)), (40, 1))
    assert anisotropy(x) == pytest.approx(1.0, abs=TOL)
    assert effective_rank(x) == 1.0
    assert np.all(covariance_spectrum(x) == 0)
    assert uniformity(x) == pytest.approx(0.0, abs=TOL)


@pytest.mark.parametrize("k", [1, 3, 7])
def test_rank_k_data(k):
    """Data spanning k directions (around any mean) has effective rank at most k, near k if even."""
    rng = np.random.default_rng(k)
    basis = np.linalg.qr(rng.normal(size=(24, k)))[0].T  # k orthonormal rows in 24 dims
    x = rng.normal(size=(3000, k)) @ basis + rng.normal(size=(1, 24))
    spectrum = covariance_spectrum(x)
    assert np.count_nonzero(spectrum) == k
    assert 0.9 * k <= effective_rank(x) <= k + 1e-12


def test_similarity_distributions_match_naive():
    """Positive/negative summaries equal those of an explicit loop; counts sum to the pair counts."""
    q, docs = _emb(n=9, d=6, seed=7), _emb(n=13, d=6, seed=8)
    positives = [[0], [1, 2], [], [3, 3], [12], [5], [6, 7, 8], [0], [11]]
    mask = np.zeros((9, 13), dtype=bool)
    for i, ds in enumerate(positives):
        mask[i, ds] = True
    pos, neg = [], []
    for i in range(9):
        for j in range(13):
            s = float(_unit(q[i]) @ _unit(docs[j]))
            (pos if mask[i, j] else neg).append(s)

    for given in (positives, mask):
        out = similarity_distributions(q, docs, given, bins=40)
        assert len(out["bin_edges"]) == 41 and out["bin_edges"][0] == -1.0 and out["bin_edges"][-1] == 1.0
        for summary, values in ((out["positive"], pos), (out["negative"], neg)):
            assert summary["count"] == summary["total"] == len(values) and not summary["sampled"]
            assert len(summary["histogram"]) == 40 and sum(summary["histogram"]) == len(values)
            np.testing.assert_array_equal(summary["histogram"], np.histogram(values, bins=40, range=(-1, 1))[0])
            assert summary["mean"] == pytest.approx(np.mean(values), abs=TOL)
            assert summary["std"] == pytest.approx(np.std(values), abs=TOL)
            quantiles = np.percentile(values, [5, 25, 50, 75, 95])
            assert list(summary["quantiles"]) == ["p05", "p25", "p50", "p75", "p95"]
            np.testing.assert_allclose(list(summary["quantiles"].values()), quantiles, rtol=0, atol=TOL)
        assert out["positive"]["count"] + out["negative"]["count"] == 9 * 13
        json.dumps(out, allow_nan=False)


def test_similarity_negatives_subsampled_deterministically():
    """Beyond max_negatives exactly that many distinct negative pairs are drawn, the same every time."""
    q, docs = _emb(n=30, d=5, seed=9), _emb(n=40, d=5, seed=10)
    positives = [[i % 40, (3 * i + 1) % 40] for i in range(30)]
    a = similarity_distributions(q, docs, positives, max_negatives=200, seed=1)
    b = similarity_distributions(q, docs, positives, max_negatives=200, seed=1)
    assert a == b
    neg = a["negative"]
    assert neg["count"] == 200 and neg["sampled"] and neg["total"] == 30 * 40 - 60
    assert sum(neg["histogram"]) == 200
    assert sum(a["positive"]["histogram"]) == a["positive"]["count"] == 60
    # The sampled negatives are genuine negatives: their mean lies within the full negative range.
    full = similarity_distributions(q, docs, positives)["negative"]
    assert full["count"] == 30 * 40 - 60
    assert full["quantiles"]["p05"] - 0.2 < neg["mean"] < full["quantiles"]["p95"] + 0.2


def test_similarity_rejects_bad_positives():
    """Wrong mask shape, non-boolean masks, wrong list count and out-of-range indices raise."""
    q, docs = _emb(n=3, d=4), _emb(n=5, d=4, seed=2)
    for bad in (np.zeros((3, 4), dtype=bool), np.zeros((3, 5), dtype=int), [[0], [1]], [[0], [5], []]):
        with pytest.raises(ValueError):
            similarity_distributions(q, docs, bad)


def test_health_report_keys_and_json():
    """health_report agrees with the individual functions and is strict-JSON serialisable."""
    docs = _emb(n=80, d=16, seed=11)
    q = docs[:10] + 0.1 * np.random.default_rng(12).normal(size=(10, 16))
    positives = [[i] for i in range(10)]
    report = health_report(docs, q, positives)
    json.dumps(report, allow_nan=False)
    assert report["health/effective_rank"] == effective_rank(docs)
    assert report["health/anisotropy"] == anisotropy(docs)
    assert report["health/uniformity"] == uniformity(docs)
    assert report["health/spectrum_top10"] == covariance_spectrum(docs)[:10].tolist()
    assert report["health/alignment"] == pytest.approx(alignment(q, docs[:10]), abs=TOL)
    dist = similarity_distributions(q, docs, positives)
    assert report["health/positive_similarity_mean"] == dist["positive"]["mean"]
    assert report["health/negative_similarity_mean"] == dist["negative"]["mean"]
    assert report["health/positive_pairs"] == 10 and report["health/negative_pairs"] == 790
    assert report["health/similarity_gap"] > 0

    alone = health_report(docs)
    assert "health/alignment" not in alone and len(alone["health/spectrum_top10"]) == 10
    collapsed = health_report(np.zeros((4, 3)))
    json.dumps(collapsed, allow_nan=False)
    assert collapsed["health/anisotropy"] is None and collapsed["health/effective_rank"] == 1.0
    with pytest.raises(ValueError):
        health_report(docs, q)
