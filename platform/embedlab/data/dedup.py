"""Near-duplicate detection with MinHash and LSH banding, vectorised with numpy.

Shingles. A text is normalised (`normalise_text`, then lower-cased) and split on whitespace;
its shingles are its word 5-grams. A text of 1 to 4 words has one shingle, its whole word
sequence; an empty text has none and is never a near-duplicate of anything (not even of
another empty text). Each word is hashed once per call with 8-byte blake2b (Python's salted
`hash()` would differ between processes); an n-gram's hash is a polynomial over its word
hashes modulo 2^64, finished with the splitmix64 mixer. All of this is numpy over the
concatenated words of a batch, so the only per-word Python work is a vocabulary lookup.

MinHash. Shingle hashes are reduced to x in [0, p) with the Mersenne prime p = 2^31 - 1, and
permutation i is the universal hash (a_i * x + b_i) mod p with a_i in [1, p), b_i in [0, p)
drawn from numpy's PCG64 seeded with `seed`. The small prime keeps every product below 2^62,
so the arithmetic is exact in uint64 and the reduction mod p is a shift-and-add fold plus one
conditional subtraction, both cheap in numpy. (datasketch uses p = 2^61 - 1, whose products
need 128 bits; 31 bits of hash are plenty to tell apart the minimum of a few thousand
shingles.) A signature is the per-permutation minimum over a text's shingles, stored as
uint64; empty texts get `EMPTY` everywhere. Signatures are computed over chunks of about
8192 shingles (a chunk's 128 x 8192 work array stays in cache) on a few threads: numpy
releases the GIL inside its loops.

LSH. The signature is cut into `bands` bands of `rows` rows, chosen as datasketch's
`MinHashLSH` does: the pair minimising the equally weighted integrated false-positive
probability (Jaccard below the threshold) plus false-negative probability (above it). For
threshold 0.8 and 128 permutations that is 9 bands of 13 rows. Texts whose signatures agree
on a whole band share a bucket; candidates are verified by estimated Jaccard (the fraction
of equal signature entries, all `num_perm` of them) >= threshold.

Big buckets. A bucket of k texts is not expanded into k^2 pairs. It is resolved in leader
rounds: its smallest unresolved member leads, every other unresolved member is verified
against the leader only, the leader and the members that pass are resolved, and the next
round starts on what is left. A bucket of identical texts (thousands of copies of the same
short text) is resolved in one round of k - 1 comparisons. After `MAX_LEADER_ROUNDS`
rounds a bucket's leftovers are dropped: that takes more than 32 mutually dissimilar texts
agreeing on a band of 13 minhashes, and they still meet in the other bands.

Clusters are the connected components of the verified pairs (so they may chain: a ~ b and
b ~ c puts a and c together even if a and c fall below the threshold), and each is named by
its smallest id.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

import numpy as np

from embedlab.data.document import normalise_text

K = TypeVar("K", bound=Hashable)

SHINGLE_WORDS = 5
MERSENNE_PRIME = (1 << 31) - 1
EMPTY = np.uint64(np.iinfo(np.uint64).max)  # every entry of an empty text's signature
MAX_LEADER_ROUNDS = 32
_CHUNK_SHINGLES = 8192
# One thread per usable core (numpy's loops release the GIL), at most 8.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
_THREADS = min(8, _CORES or 1)
_P = np.uint64(MERSENNE_PRIME)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd, so x -> x * M mod 2^64 is a bijection


# --- words and n-grams ------------------------------------------------------------------


def shingle_words(text: str) -> list[str]:
    """The words shingles are made of: normalised, lower-cased, split on whitespace."""
    return normalise_text(text).lower().split()


def word_hashes(word_lists: Iterable[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 hash of every word, concatenated; number of words of each list).

    Each distinct word is hashed once; the hash depends on the word alone, so hashes from
    separate calls can be compared.
    """
    vocabulary: dict[str, int] = {}
    word_ids: list[int] = []
    lengths: list[int] = []
    for words in word_lists:
        word_ids.extend([vocabulary.setdefault(word, len(vocabulary)) for word in words])
        lengths.append(len(words))
    by_id = np.fromiter(
        (_word_hash(word) for word in vocabulary), dtype=np.uint64, count=len(vocabulary)
    )
    return by_id[np.asarray(word_ids, dtype=np.int64)], np.asarray(lengths, dtype=np.int64)


def _word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")


def ngram_hashes(
    tokens: np.ndarray, lengths: np.ndarray, n: int, *, whole_if_shorter: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 hash of every word n-gram, in text order; number of n-grams of each text).

    `tokens` and `lengths` are as returned by `word_hashes`. A text of fewer than n words
    has no n-gram, or with `whole_if_shorter` (if it has any word) one: its whole sequence.
    """
    counts = np.maximum(lengths - (n - 1), 0)
    if whole_if_shorter:
        counts = np.where((lengths > 0) & (lengths < n), 1, counts)
    widths = np.repeat(np.minimum(lengths, n), counts)
    first = np.repeat(np.cumsum(lengths) - lengths, counts) + _positions(counts)
    padded = np.concatenate((tokens, np.zeros(n, dtype=np.uint64)))
    hashes = np.zeros(len(first), dtype=np.uint64)
    for k in range(n):
        hashes = np.where(k < widths, hashes * _MULTIPLIER + padded[first + k], hashes)
    return _splitmix64(hashes), counts


def _positions(counts: np.ndarray) -> np.ndarray:
    """0, 1, ..., c - 1 for each count c, concatenated."""
    return np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: spreads the polynomial's low-entropy bits over all 64."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def shingle_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(hash in [0, 2^31 - 1) of every shingle of every text, concatenated; shingles per text)."""
    tokens, lengths = word_hashes(shingle_words(text) for text in texts)
    hashes, counts = ngram_hashes(tokens, lengths, SHINGLE_WORDS, whole_if_shorter=True)
    return (hashes >> np.uint64(32)) % _P, counts


# --- MinHash ---------------------------------------------------------------------------


class MinHasher:
    """MinHash signatures of texts: `num_perm` permutations (a*x + b) mod (2^31 - 1).

    `a` and `b` hold the permutations' coefficients, uint64 arrays of length `num_perm`.
    """

    def __init__(self, num_perm: int = 128, seed: int = 1) -> None:
        if num_perm < 1:
            raise ValueError(f"num_perm must be positive, got {num_perm}")
        self.num_perm = num_perm
        self.seed = seed
        rng = np.random.default_rng(seed)
        self.a = rng.integers(1, MERSENNE_PRIME, num_perm, dtype=np.uint64)
        self.b = rng.integers(0, MERSENNE_PRIME, num_perm, dtype=np.uint64)

    def signature(self, text: str) -> np.ndarray:
        """uint64 signature of shape (num_perm,); all `EMPTY` for a text without shingles."""
        return self.signatures([text])[0]

    def signatures(self, texts: Sequence[str]) -> np.ndarray:
        """uint64 signatures of shape (len(texts), num_perm), one row per text."""
        shingles, counts = shingle_hashes(texts)
        result = np.full((len(texts), self.num_perm), EMPTY, dtype=np.uint64)
        present = np.flatnonzero(counts)
        ends = np.cumsum(counts[present])
        bounds = _chunk_bounds(ends, _CHUNK_SHINGLES)

        def run(chunk: int) -> None:
            lo, hi = bounds[chunk], bounds[chunk + 1]
            first = ends[lo - 1] if lo else 0
            offsets = np.concatenate(([0], ends[lo : hi - 1] - first))
            permuted = self._permute(shingles[first : ends[hi - 1]])
            result[present[lo:hi]] = np.minimum.reduceat(permuted, offsets, axis=1).T

        with ThreadPoolExecutor(_THREADS) as pool:
            list(pool.map(run, range(len(bounds) - 1)))
        return result

    def _permute(self, x: np.ndarray) -> np.ndarray:
        """(a * x + b) mod p for every permutation (rows) and shingle (columns), exactly.

        With x, a, b < p = 2^31 - 1, v = a*x + b <= p(p - 1) < 2^62. Since 2^31 = 1 mod p,
        v = (v & p) + (v >> 31) mod p, and that sum is at most 2p - 2, so one conditional
        subtraction of p finishes: min(y, y - p) picks y - p unless it wrapped below zero.
        """
        v = np.multiply(self.a[:, None], x[None, :])
        v += self.b[:, None]
        folded = np.bitwise_and(v, _P)
        np.right_shift(v, np.uint64(31), out=v)
        folded += v
        np.subtract(folded, _P, out=v)
        return np.minimum(folded, v, out=folded)


def _chunk_bounds(ends: np.ndarray, size: int) -> np.ndarray:
    """Indices into `ends` cutting texts into runs of about `size` shingles (at least one text)."""
    if len(ends) == 0:
        return np.zeros(1, dtype=np.int64)
    cuts = np.searchsorted(ends, np.arange(size, ends[-1], size), side="left") + 1
    return np.unique(np.concatenate(([0], cuts, [len(ends)])))


def is_empty(signatures: np.ndarray) -> np.ndarray:
    """Which signatures (rows, or a single one) belong to texts without shingles."""
    return signatures[..., 0] == EMPTY


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Fraction of equal entries of signatures `a` and `b` (row-wise); 0 if either is empty."""
    agreement = np.mean(a == b, axis=-1)
    return np.where(is_empty(a) | is_empty(b), 0.0, agreement)


# --- LSH -------------------------------------------------------------------------------


@cache
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows) minimising false-positive plus false-negative probability mass.

    The probability that two texts of Jaccard s share a bucket is 1 - (1 - s^rows)^bands;
    false positives are its integral over [0, threshold], false negatives the integral of
    its complement over [threshold, 1], weighted equally, as in datasketch's MinHashLSH
    (which integrates with scipy's quad; Simpson's rule on 2048 intervals picks the same
    pair). Ties go to the first pair in datasketch's search order: fewer bands, fewer rows.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must lie strictly between 0 and 1, got {threshold}")
    bands, rows = np.array(
        [(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)]
    ).T[:, :, None]

    def collide(s: np.ndarray) -> np.ndarray:
        return 1.0 - (1.0 - s[None, :] ** rows) ** bands

    below, above = _simpson_grid(0.0, threshold), _simpson_grid(threshold, 1.0)
    false_positive = collide(below[0]) @ below[1]
    false_negative = (1.0 - collide(above[0])) @ above[1]
    best = int(np.argmin(0.5 * false_positive + 0.5 * false_negative))
    return int(bands[best, 0]), int(rows[best, 0])


def _simpson_grid(lo: float, hi: float, intervals: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """(points, weights) of Simpson's rule on [lo, hi]: integral = f(points) @ weights."""
    weights = np.ones(intervals + 1)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    return np.linspace(lo, hi, intervals + 1), weights * (hi - lo) / (3 * intervals)


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """uint64 key of each band of each signature, shape (len(signatures), bands)."""
    keys = np.zeros((len(signatures), bands), dtype=np.uint64)
    for row in range(rows):
        keys = keys * _MULTIPLIER + signatures[:, row : bands * rows : rows]
    return _splitmix64(keys)


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element: the number of its run of equal consecutive values, and that run's length."""
    if len(values) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    run = np.cumsum(np.concatenate(([True], values[1:] != values[:-1]))) - 1
    return run, np.bincount(run)[run]


def _buckets(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bucket number, member row) of every row sharing a band key with another row.

    Members are listed bucket by bucket, in increasing row order within a bucket; bucket
    numbers are distinct across bands.
    """
    bucket_parts: list[np.ndarray] = []
    member_parts: list[np.ndarray] = []
    for band in range(keys.shape[1]):
        order = np.argsort(keys[:, band], kind="stable")
        run, size = _runs(keys[order, band])
        shared = size > 1
        bucket_parts.append(run[shared] + band * len(keys))
        member_parts.append(order[shared])
    return np.concatenate(bucket_parts), np.concatenate(member_parts)


def _verified_pairs(
    signatures: np.ndarray, bucket: np.ndarray, member: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """(leader, member) pairs of bucket-mates with estimated Jaccard >= threshold.

    Resolved in leader rounds (see the module docstring), each vectorised over all buckets.
    """
    lefts: list[np.ndarray] = []
    rights: list[np.ndarray] = []
    for _ in range(MAX_LEADER_ROUNDS):
        if len(bucket) == 0:
            break
        first = np.concatenate(([True], bucket[1:] != bucket[:-1]))
        leader = member[first][np.cumsum(first) - 1]
        similar = estimated_jaccard(signatures[leader], signatures[member]) >= threshold
        accepted = similar & ~first
        lefts.append(leader[accepted])
        rights.append(member[accepted])
        keep = ~(similar | first)
        bucket, member = bucket[keep], member[keep]
        alive = _runs(bucket)[1] > 1
        bucket, member = bucket[alive], member[alive]
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([empty, *lefts]), np.concatenate([empty, *rights])


def _components(size: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Smallest row of each row's connected component, by min-label propagation.

    Labels only ever decrease to the label of a neighbour, and label[label] is a row of the
    same component with a label no larger, so pointer jumping is safe and speeds it up.
    """
    label = np.arange(size)
    while True:
        smaller = np.minimum(label[left], label[right])
        updated = label.copy()
        np.minimum.at(updated, left, smaller)
        np.minimum.at(updated, right, smaller)
        updated = updated[updated]
        if np.array_equal(updated, label):
            return label
        label = updated


def near_duplicate_clusters(
    ids: Sequence[K],
    texts: Sequence[str],
    threshold: float = 0.8,
    num_perm: int = 128,
    seed: int = 1,
) -> dict[K, K]:
    """id -> group id, the smallest id of its near-duplicate cluster (itself if a singleton).

    `ids` must be distinct and mutually comparable. Two texts are linked when they share an
    LSH bucket and their estimated Jaccard is >= threshold; clusters are linked components.
    """
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
    if len(set(ids)) != len(ids):
        raise ValueError("ids must be distinct")
    # Rows in sorted id order, so a component's smallest row is its smallest id.
    order = sorted(range(len(ids)), key=ids.__getitem__)
    sorted_ids = [ids[i] for i in order]
    signatures = MinHasher(num_perm, seed).signatures([texts[i] for i in order])
    rows = np.flatnonzero(~is_empty(signatures))
    bucket, member = _buckets(band_keys(signatures[rows], *lsh_params(threshold, num_perm)))
    left, right = _verified_pairs(signatures, bucket, rows[member], threshold)
    label = _components(len(ids), left, right)
    return {sorted_ids[row]: sorted_ids[group] for row, group in enumerate(label)}


class NearDuplicateIndex:
    """Texts indexed by MinHash LSH, queried for near-duplicates with estimated Jaccard.

    Identical signatures (identical texts, typically) are stored once with all their ids,
    so thousands of copies of one short text cost one candidate, not thousands.
    """

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, seed: int = 1) -> None:
        self.threshold = threshold
        self.hasher = MinHasher(num_perm, seed)
        self.bands, self.rows = lsh_params(threshold, num_perm)
        self._row_of: dict[bytes, int] = {}
        self._signatures: list[np.ndarray] = []
        self._ids: list[list[Hashable]] = []
        self._table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._ids)

    def add(self, ids: Sequence[Hashable], texts: Sequence[str]) -> None:
        """Index `texts` under `ids`; texts without shingles are not indexed."""
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
        for key, signature in zip(ids, self.hasher.signatures(texts)):
            if is_empty(signature):
                continue
            row = self._row_of.setdefault(signature.tobytes(), len(self._row_of))
            if row == len(self._ids):
                self._signatures.append(signature)
                self._ids.append([])
            self._ids[row].append(key)
        self._table = None

    def query(self, text: str) -> list[tuple[Hashable, float]]:
        """(id, estimated Jaccard) of indexed texts at or above the threshold, best first."""
        return self.query_many([text])[0]

    def query_many(self, texts: Sequence[str]) -> list[list[tuple[Hashable, float]]]:
        """`query` for each text, sharing the signature and lookup work."""
        return self.query_signatures(self.hasher.signatures(texts))

    def query_signatures(self, signatures: np.ndarray) -> list[list[tuple[Hashable, float]]]:
        """`query` for texts given by their signatures (from `self.hasher`)."""
        results: list[list[tuple[Hashable, float]]] = [[] for _ in range(len(signatures))]
        if not self._ids:
            return results
        query, row = self._candidates(signatures)
        similarity = estimated_jaccard(signatures[query], self._stored()[0][row])
        passed = np.flatnonzero(similarity >= self.threshold)
        # Best first; ties in the order the texts were added.
        for i in passed[np.lexsort((row[passed], -similarity[passed], query[passed]))]:
            results[query[i]].extend((key, float(similarity[i])) for key in self._ids[row[i]])
        return results

    def _candidates(self, signatures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (query, stored row) pairs that share at least one band key."""
        _, sorted_keys, order = self._stored()
        present = np.flatnonzero(~is_empty(signatures))
        keys = band_keys(signatures[present], self.bands, self.rows)
        queries: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        for band in range(self.bands):
            lo = np.searchsorted(sorted_keys[band], keys[:, band], side="left")
            hits = np.searchsorted(sorted_keys[band], keys[:, band], side="right") - lo
            queries.append(np.repeat(present, hits))
            rows.append(order[band][np.repeat(lo, hits) + _positions(hits)])
        pairs = np.unique(np.stack((np.concatenate(queries), np.concatenate(rows))), axis=1)
        return pairs[0], pairs[1]

    def _stored(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stored signatures; per band, the sorted stored keys and the stored rows in that order."""
        if self._table is None:
            signatures = np.stack(self._signatures)
            keys = band_keys(signatures, self.bands, self.rows).T
            order = np.argsort(keys, axis=1, kind="stable")
            self._table = (signatures, np.take_along_axis(keys, order, axis=1), order)
        return self._table
