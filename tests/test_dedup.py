"""MinHash + LSH near-duplicate detection (embedlab.sources.dedup) on real docstring text."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from embedlab.sources import dedup
from embedlab.sources.builtin import iter_documents
from embedlab.sources.dedup import (
    EMPTY,
    MinHasher,
    NearDuplicateIndex,
    collision_probability,
    estimated_jaccard,
    lsh_params,
    matching_words,
    near_duplicate_clusters,
    shingle_hashes,
    shingle_words,
)


@pytest.fixture(scope="module")
def docstrings() -> list[tuple[str, str]]:
    return [(d.doc_id, d.text) for d in iter_documents("python-docstrings", limit=2000)]


@pytest.fixture(scope="module")
def long_texts(docstrings) -> list[str]:
    return [text for _, text in docstrings if len(text.split()) >= 200]


def exact_jaccard(a: str, b: str) -> float:
    """Jaccard of the word 5-gram shingle sets, computed directly from the definition."""
    sa, sb = shingle_set(a), shingle_set(b)
    return len(sa & sb) / len(sa | sb)


def shingle_set(text: str) -> set[tuple[str, ...]]:
    words = shingle_words(text)
    if len(words) < 5:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + 5]) for i in range(len(words) - 4)}


def mutate(text: str, fraction: float, rng: random.Random) -> str:
    """`text` with about `fraction` of its words replaced by words it does not contain."""
    return " ".join(
        f"zz{rng.randrange(10**6)}" if rng.random() < fraction else word for word in text.split()
    )


def change_words(text: str, count: int) -> str:
    """`text` with `count` words, spread over its middle, replaced."""
    words = text.split()
    for k in range(count):
        words[len(words) * (k + 1) // (count + 1)] = f"changed{k}"
    return " ".join(words)


def test_estimate_close_to_exact_jaccard(docstrings):
    """Signature agreement estimates shingle Jaccard within ~0.1 over the whole range."""
    rng = random.Random(0)
    bases = [text for _, text in docstrings if len(text.split()) >= 100][:100]
    pairs = [(a, mutate(a, rng.choice([0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4]), rng)) for a in bases]
    hasher = MinHasher(128, seed=1)
    estimate = estimated_jaccard(
        hasher.signatures([a for a, _ in pairs]), hasher.signatures([b for _, b in pairs])
    )
    exact = np.array([exact_jaccard(a, b) for a, b in pairs])
    assert exact.min() < 0.3 and exact.max() == 1.0  # the pairs span the range
    assert np.abs(estimate - exact).mean() < 0.04
    assert np.abs(estimate - exact).max() < 0.15


def test_signature_shape_dtype_and_batch_consistency(docstrings):
    """signatures() is signature() row by row: uint64, (N, num_perm), values below 2^31 - 1."""
    texts = [text for _, text in docstrings[:20]]
    hasher = MinHasher(64, seed=3)
    batch = hasher.signatures(texts)
    assert batch.shape == (20, 64) and batch.dtype == np.uint64
    assert (batch < (1 << 31) - 1).all()
    for text, row in zip(texts, batch):
        assert np.array_equal(hasher.signature(text), row)


def test_signature_is_min_of_universal_hashes(docstrings):
    """Each entry is min over shingles x of (a*x + b) mod (2^31 - 1), computed exactly."""
    texts = [text for _, text in docstrings[:5]] + ["a b c", ""]
    hasher = MinHasher(32, seed=7)
    shingles, counts = shingle_hashes(texts)
    starts = np.cumsum(counts) - counts
    prime = (1 << 31) - 1
    for text, start, count in zip(texts, starts, counts):
        xs = [int(x) for x in shingles[start : start + count]]
        expected = [
            min(((int(a) * x + int(b)) % prime for x in xs), default=int(EMPTY))
            for a, b in zip(hasher.a, hasher.b)
        ]
        assert hasher.signature(text).tolist() == expected


def test_signatures_deterministic_across_processes():
    """Signatures do not depend on PYTHONHASHSEED: no salted hash() is involved."""
    code = (
        "from embedlab.sources.dedup import MinHasher;"
        "print(MinHasher(16).signature('the quick brown fox jumps over the lazy dog').tolist())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    expected = MinHasher(16).signature("the quick brown fox jumps over the lazy dog").tolist()
    assert outputs == {f"{expected}\n"}


def test_seed_changes_permutations():
    """Different seeds give different signatures of the same text."""
    text = "one two three four five six seven eight nine ten"
    assert not np.array_equal(MinHasher(seed=1).signature(text), MinHasher(seed=2).signature(text))


@pytest.mark.parametrize("num_perm", [64, 128, 256])
@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9, 0.95])
def test_lsh_params_reach_the_target_recall_with_the_most_rows(threshold, num_perm):
    """At the threshold a pair shares a bucket with probability >= TARGET_RECALL; one row more
    (with the bands the permutations then allow) would fall below it."""
    bands, rows = lsh_params(threshold, num_perm)
    assert bands == num_perm // rows
    assert collision_probability(threshold, bands, rows) >= dedup.TARGET_RECALL
    more = rows + 1
    assert collision_probability(threshold, num_perm // more, more) < dedup.TARGET_RECALL
    assert lsh_params(0.8, 128) == (18, 7)


def test_collision_probability_is_the_banding_curve_by_simulation():
    """The formula against the frequency with which random signatures agreeing entry by entry
    with probability s share a band: 20,000 draws at s = 0.8 for 18 bands of 7 rows."""
    rng = np.random.default_rng(0)
    agree = rng.random((20_000, 18, 7)) < 0.8
    observed = agree.all(axis=2).any(axis=1).mean()
    expected = collision_probability(0.8, 18, 7)
    assert abs(observed - expected) < 4 * np.sqrt(expected * (1 - expected) / 20_000)


def test_exact_jaccard_is_the_python_set_jaccard(docstrings):
    """The vectorised set Jaccard equals Python's set arithmetic on the shingle tuples, over
    pairs from identical to disjoint, empty and one-word texts included, across chunks."""
    rng = random.Random(5)
    texts = [text for _, text in docstrings[:300]] + ["", "one", "one two"]
    texts += [mutate(t, rng.choice([0.01, 0.05, 0.2]), rng) for t in texts[:100]]
    _, sets = MinHasher().signatures_and_sets(texts)
    left = np.array([rng.randrange(len(texts)) for _ in range(3000)] + [0, len(texts) - 103, 300])
    right = np.array([rng.randrange(len(texts)) for _ in range(3000)] + [0, 301, 300])
    left[:100] = np.arange(100)
    right[:100] = np.arange(len(texts) - 100, len(texts))
    original_chunk = dedup._PAIR_CHUNK_VALUES
    try:
        dedup._PAIR_CHUNK_VALUES = 5000  # many chunks, and pairs larger than a chunk
        ours = dedup.exact_jaccard(sets, left, sets, right)
    finally:
        dedup._PAIR_CHUNK_VALUES = original_chunk
    reference = [exact_jaccard(texts[i], texts[j]) if shingle_set(texts[i]) | shingle_set(texts[j]) else 0.0
                 for i, j in zip(left, right)]
    assert ours.tolist() == pytest.approx(reference, abs=1e-12)
    assert 0.0 < min(x for x in reference if x > 0) < 0.5 and max(reference) == 1.0


def test_matching_words_fold_case_punctuation_spacing_width_and_accents():
    assert matching_words("  Café, naïve — RÉSUMÉ!  ｆｕｌｌ\twidth ") == ["cafe", "naive", "resume", "full", "width"]
    assert matching_words("it's x_1") == ["it", "s", "x_1"]


def test_decisions_agree_with_datasketch_verified_by_exact_jaccard(long_texts):
    """Our index finds exactly datasketch's LSH candidates (the same bands and rows) whose
    exact Jaccard reaches the threshold, on pairs not within a few hundredths of it."""
    datasketch = pytest.importorskip("datasketch")
    rng = random.Random(1)
    pairs = [(a, mutate(a, rng.choice([0, 0.003, 0.02, 0.05, 0.3, 0.6]), rng)) for a in long_texts[:60]]
    pairs += [(a, b) for a, b in zip(long_texts[60:70], long_texts[70:80])]
    # Away from the threshold, where two sets of permutations decide alike but by a rare draw.
    pairs = [(a, b) for a, b in pairs if not 0.77 <= exact_jaccard(a, b) <= 0.87]
    assert len(pairs) >= 40

    def minhash(text: str):
        m = datasketch.MinHash(num_perm=128, seed=1)
        m.update_batch([" ".join(s).encode() for s in shingle_set(text)])
        return m

    index = NearDuplicateIndex(threshold=0.8)
    lsh = datasketch.MinHashLSH(num_perm=128, params=lsh_params(0.8, 128))
    for i, (a, _) in enumerate(pairs):
        index.add([i], [a])
        lsh.insert(i, minhash(a))
    ours = [i in dict(found) for i, found in enumerate(index.query_many([b for _, b in pairs]))]
    theirs = [i in lsh.query(minhash(b)) and exact_jaccard(a, b) >= 0.8 for i, (a, b) in enumerate(pairs)]
    assert ours == theirs
    assert any(ours) and not all(ours)


def test_planted_near_copies_are_clustered(docstrings, long_texts):
    """Copies of long docstrings with 1-2 words changed join their original's cluster."""
    chosen = set(long_texts[:30])
    originals = {doc_id: text for doc_id, text in docstrings if text in chosen}
    planted = {
        f"~copy{k}:{doc_id}": change_words(text, 1 + k % 2)
        for k, (doc_id, text) in enumerate(originals.items())
    }
    assert all(exact_jaccard(originals[c.split(":", 1)[1]], t) > 0.8 for c, t in planted.items())
    ids = [doc_id for doc_id, _ in docstrings] + list(planted)
    texts = [text for _, text in docstrings] + list(planted.values())
    groups = near_duplicate_clusters(ids, texts, threshold=0.8)
    for copy_id in planted:
        original = copy_id.split(":", 1)[1]
        assert groups[copy_id] == groups[original]


def test_grouped_texts_are_really_similar(docstrings):
    """No false groupings: every text grouped with another shares most of its shingles."""
    ids = [doc_id for doc_id, _ in docstrings]
    text_of = dict(docstrings)
    groups = near_duplicate_clusters(ids, [text for _, text in docstrings])
    grouped = [(i, g) for i, g in groups.items() if i != g]
    assert grouped  # the standard library repeats some docstrings
    assert all(exact_jaccard(text_of[i], text_of[g]) >= 0.6 for i, g in grouped)


def test_unrelated_texts_stay_singletons(long_texts):
    """Distinct docstrings, pairwise dissimilar, each form their own group."""
    texts = long_texts[:40]
    assert max(exact_jaccard(a, b) for i, a in enumerate(texts) for b in texts[i + 1 :]) < 0.5
    groups = near_duplicate_clusters([f"d{i:02d}" for i in range(40)], texts)
    assert all(group == doc_id for doc_id, group in groups.items())


def test_exact_duplicates_grouped_under_smallest_id(long_texts):
    """Identical texts (up to case and whitespace) form one group named by the smallest id."""
    text = long_texts[0]
    ids = ["doc-3", "doc-1", "doc-2", "other"]
    texts = [text, text.upper(), "  ".join(text.split()), long_texts[1]]
    assert near_duplicate_clusters(ids, texts) == {
        "doc-1": "doc-1", "doc-2": "doc-1", "doc-3": "doc-1", "other": "other"
    }


def test_clusters_are_deterministic(docstrings):
    """Same input, or the same input in another order, gives the same groups."""
    ids = [doc_id for doc_id, _ in docstrings]
    texts = [text for _, text in docstrings]
    first = near_duplicate_clusters(ids, texts)
    assert near_duplicate_clusters(ids, texts) == first
    assert near_duplicate_clusters(ids[::-1], texts[::-1]) == first


def test_empty_and_short_texts():
    """Empty texts match nothing; texts under 5 words are one shingle, equal only if identical."""
    ids = ["e1", "e2", "e3", "s1", "s2", "s3", "s4"]
    texts = ["", "   ", "\n", "Hello  World", "hello world", "hello there world", "a"]
    assert near_duplicate_clusters(ids, texts) == {
        "e1": "e1", "e2": "e2", "e3": "e3", "s1": "s1", "s2": "s1", "s3": "s3", "s4": "s4"
    }
    assert (MinHasher().signature("") == EMPTY).all()
    assert estimated_jaccard(MinHasher().signature(""), MinHasher().signature(" ")) == 0.0


def test_big_bucket_of_identical_texts_is_linear():
    """Thousands of copies of one tiny text collapse into one group without pairwise work."""
    texts = ["ok then"] * 5000 + [f"text number {i} is here" for i in range(2000)]
    groups = near_duplicate_clusters(list(range(len(texts))), texts)
    assert set(groups[i] for i in range(5000)) == {0}
    assert all(groups[i] == i for i in range(5000, len(texts)))


def test_index_query(long_texts):
    """The index returns verified near-duplicates, best first, and nothing for empty text."""
    index = NearDuplicateIndex(threshold=0.8)
    index.add(["a", "b", "c"], [long_texts[0], long_texts[1], change_words(long_texts[0], 1)])
    index.add(["a-again"], [long_texts[0]])
    found = index.query(change_words(long_texts[0], 1))
    assert [key for key, _ in found][:1] == ["c"] and found[0][1] == 1.0
    assert {key for key, _ in found} == {"a", "a-again", "c"}
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    assert index.query("") == [] and index.query(long_texts[2]) == []
    texts = [long_texts[1], "", long_texts[0]]
    assert index.query_many(texts) == [index.query(text) for text in texts]


@pytest.mark.parametrize("threshold", [0.0, 1.0, 1.5])
def test_a_dedup_threshold_outside_zero_one_is_refused_at_the_config(threshold):
    """1.0 used to pass validation and fail deep in lsh_params: the config refuses it, naming the field."""
    from embedlab.core.config import ConfigError, DataConfig

    with pytest.raises(ConfigError, match=rf"data.near_duplicate_threshold: {threshold} is not strictly between 0 and 1"):
        DataConfig(near_duplicate_threshold=threshold)
