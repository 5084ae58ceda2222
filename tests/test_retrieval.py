"""Faiss search and the faiss installation check."""

import numpy as np
import pytest

from embedlab.tasks.retrieval import check_one_faiss, installed_faiss_distributions, search


def test_faiss_inner_product_equals_numpy_top_k():
    """IndexFlatIP's top-10 equals numpy's exact inner-product ranking."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((500, 16)).astype(np.float32)
    queries = rng.standard_normal((20, 16)).astype(np.float32)
    scores, rows = search(docs, queries, 10)
    expected = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    assert (rows == expected).all()
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ docs.T, expected, axis=1), rtol=1e-5)


def test_exactly_one_faiss_distribution_is_installed_here():
    """This environment has exactly one faiss distribution."""
    assert len(installed_faiss_distributions()) == 1


def test_two_faiss_distributions_are_refused():
    """faiss-cpu beside faiss-gpu is an error that says how to fix it; none installed is too."""
    with pytest.raises(ImportError, match="Uninstall all of them"):
        check_one_faiss(["faiss-cpu", "faiss-gpu"])
    with pytest.raises(ImportError, match="extras"):
        check_one_faiss([])


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_indexes_find_nearly_what_flat_finds(kind):
    """IVF and HNSW (unit vectors, 20k docs) recover at least 90% of the exact top-10."""
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((20_000, 32)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[:200] + 0.1 * rng.standard_normal((200, 32)).astype(np.float32)
    _, exact = search(docs, queries, 10)
    _, approximate = search(docs, queries, 10, kind)
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, approximate)])
    assert overlap >= 0.9


def test_unknown_index_kind_lists_valid_ones():
    """An unknown index kind is a ValueError naming the valid kinds."""
    with pytest.raises(ValueError, match="hnsw"):
        search(np.ones((5, 4), np.float32), np.ones((1, 4), np.float32), 3, "lsh")
