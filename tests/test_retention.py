"""The retention panel's statistics against reference computations."""

import numpy as np
import pandas as pd

from embedlab.tasks.retention import _spearman, probe_accuracy


def test_spearman_equals_pandas_with_ties():
    """Spearman's rho with tied grades equals pandas' average-rank implementation."""
    rng = np.random.default_rng(0)
    grades = rng.integers(0, 3, size=300).astype(float)
    cosine = grades * 0.2 + rng.normal(0, 0.3, size=300)
    expected = pd.Series(cosine).corr(pd.Series(grades), method="spearman")
    assert abs(_spearman(cosine, grades) - expected) < 1e-12


def test_probe_separates_separable_sources_and_not_random_labels():
    """The probe scores ~1.0 on well-separated classes and near chance on random labels."""
    rng = np.random.default_rng(1)
    centres = rng.normal(size=(3, 16)) * 5
    labels = [f"s{i % 3}" for i in range(600)]
    x = np.stack([centres[i % 3] + rng.normal(size=16) for i in range(600)])
    fit = rng.random(600) < 0.75
    assert probe_accuracy(x, labels, fit) > 0.98
    shuffled = list(rng.permutation(labels))
    assert probe_accuracy(rng.normal(size=(600, 16)), shuffled, fit) < 0.5


def test_prepared_panel_comes_from_recipe_dev_text(prepared):
    """The panel's passages are recipe-dev documents only and cover every graded level."""
    import pyarrow.parquet as pq

    probe = pq.read_table(prepared.directory / "retention" / "probe.parquet").to_pydict()
    pairs = pq.read_table(prepared.directory / "retention" / "pairs.parquet").to_pydict()
    corpus = prepared.corpus.read().to_pydict()
    split = dict(zip(corpus["doc_id"], corpus["split"]))
    assert {split[d] for d in probe["doc_id"]} == {"dev"}
    assert set(pairs["grade"]) == {0, 1, 2}


def test_a_panel_from_almost_no_dev_text_scores_none_not_an_error(tmp_path):
    """With one recipe-dev document the panel is built, and its missing parts score None."""
    import pyarrow as pa

    from embedlab.tasks.retention import build_panel, retention_scores

    corpus = pa.table({"doc_id": ["a"], "source": ["s"], "title": [""], "hash": ["h"], "split": ["dev"],
                       "text": ["one two three four five six seven eight nine ten"]})
    build_panel(corpus, tmp_path)
    scores = retention_scores(tmp_path, lambda texts: np.ones((len(texts), 4)) / 2)
    assert scores == {"retention/probe_accuracy": None, "retention/similarity_spearman": None,
                      "retention/mlm_accuracy": None}
