"""Near-duplicate detection with MinHash and LSH banding, verified by exact Jaccard, in numpy.

Words. A text's words are the `\\w+` runs of its normalised (`normalise_text`), accent-folded
(NFKD with combining marks dropped) and lower-cased form (`matching_words`): punctuation,
case, spacing, compatibility forms and accents do not change them. The contamination
audit's window rules (`embedlab.contamination.audit`) use the same words.

Shingles. A text's shingles are its word 5-grams; a text of 1 to 4 words has one shingle,
its whole word sequence; a text without words has none and is never a near-duplicate of
anything (not even of another empty text). Each word is hashed once per call with 8-byte
blake2b (Python's salted `hash()` would differ between processes); an n-gram's hash is a
polynomial over its word hashes modulo 2^64, finished with the splitmix64 mixer. All of this
is numpy over the concatenated words of a batch, so the only per-word Python work is a
vocabulary lookup. A text's shingle set (`ShingleSets`) is its distinct 64-bit shingle hashes.

MinHash. Shingle hashes are reduced to x in [0, p) with the Mersenne prime p = 2^31 - 1, and
permutation i is the universal hash (a_i * x + b_i) mod p with a_i in [1, p), b_i in [0, p)
drawn from numpy's PCG64 seeded with `seed`. The small prime keeps every product below 2^62,
so the arithmetic is exact in uint64 and the reduction mod p is a shift-and-add fold plus one
conditional subtraction, both cheap in numpy. A signature is the per-permutation minimum over
a text's shingles, stored as uint64; empty texts get `EMPTY` everywhere. Signatures are
computed over chunks of about 8192 shingles on a few threads: numpy releases the GIL inside
its loops.

LSH, chosen for recall. The signature is cut into `bands` bands of `rows` rows. Two texts of
Jaccard s share a bucket with probability 1 - (1 - s^rows)^bands; `lsh_params` takes the most
rows (the fewest candidates) for which that probability at the threshold is at least
`TARGET_RECALL` (0.95), with as many bands as the permutations allow. For threshold 0.8 and
128 permutations that is 18 bands of 7 rows: 0.986 at J = 0.8, 0.9998 at J = 0.87 (one word
substituted in 75). The usual choice, datasketch's, balances false positives against false
negatives instead (9 bands of 13 rows) and finds only 40% of the pairs at J = 0.8.

Verification. Candidates are verified by exact Jaccard of their shingle sets >= threshold;
the reported similarity is that exact value. The signature agreement (an unbiased estimate
of Jaccard, standard deviation at most 0.045 with 128 permutations) first drops candidates
estimated below threshold - `ESTIMATE_MARGIN` (0.2): more than four standard deviations, so
it loses a pair at the threshold with probability below 1e-5, and spares most of the exact
set intersections that the wide bands bring.

Big buckets. A bucket of k texts is not expanded into k^2 pairs. It is resolved in leader
rounds: its smallest unresolved member leads, every other unresolved member is verified
against the leader only, the leader and the members that pass are resolved, and the next
round starts on what is left. A bucket of identical texts (thousands of copies of the same
short text) is resolved in one round of k - 1 comparisons. After `MAX_LEADER_ROUNDS`
rounds a bucket's leftovers are dropped: that takes more than 32 mutually dissimilar texts
agreeing on a band of 7 minhashes, and they still meet in the other bands.

Clusters are the connected components of the verified pairs (so they may chain: a ~ b and
b ~ c puts a and c together even if a and c fall below the threshold), and each is named by
its smallest id.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections.abc import Hashable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import TypeVar

import numpy as np

from embedlab.sources.document import normalise_text

K = TypeVar("K", bound=Hashable)

SHINGLE_WORDS = 5
MERSENNE_PRIME = (1 << 31) - 1
EMPTY = np.uint64(np.iinfo(np.uint64).max)  # every entry of an empty text's signature
MAX_LEADER_ROUNDS = 32
# The chance that two texts exactly at the threshold share a bucket (see `lsh_params`).
TARGET_RECALL = 0.95
# Candidates whose signatures agree on less than threshold - ESTIMATE_MARGIN are not verified.
ESTIMATE_MARGIN = 0.2
_WORD = re.compile(r"\w+")
_CHUNK_SHINGLES = 8192
# One thread per usable core (numpy's loops release the GIL), at most 8.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
_THREADS = min(8, _CORES or 1)
_P = np.uint64(MERSENNE_PRIME)
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd, so x -> x * M mod 2^64 is a bijection


# --- words and n-grams ------------------------------------------------------------------


def matching_words(text: str) -> list[str]:
    """The words every matcher compares: the `\\w+` runs of the normalised, accent-folded,
    lower-cased text."""
    folded = unicodedata.normalize("NFKD", normalise_text(text))
    return _WORD.findall("".join(c for c in folded if not unicodedata.combining(c)).lower())


shingle_words = matching_words  # the words shingles are made of


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
    first = np.repeat(np.cumsum(lengths) - lengths, counts) + run_positions(counts)
    padded = np.concatenate((tokens, np.zeros(n, dtype=np.uint64)))
    hashes = np.zeros(len(first), dtype=np.uint64)
    for k in range(n):
        hashes = np.where(k < widths, hashes * _MULTIPLIER + padded[first + k], hashes)
    return _splitmix64(hashes), counts


def ngram_hashes_by_size(
    tokens: np.ndarray, lengths: np.ndarray, sizes: Iterable[int]
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(n, hashes, counts) for each n of `sizes`, smallest first: `ngram_hashes(tokens, lengths,
    n, whole_if_shorter=False)`, built by extending the (n-1)-grams by one word, so all sizes
    up to the largest cost one pass per word position and size."""
    wanted = sorted(set(sizes))
    if not wanted:
        return
    starts = np.cumsum(lengths) - lengths
    position = np.arange(len(tokens)) - np.repeat(starts, lengths)  # each word's place in its text
    room = np.repeat(lengths, lengths) - position  # words from here to the end of its text
    polynomial = np.zeros(len(tokens), dtype=np.uint64)
    padded = np.concatenate((tokens, np.zeros(wanted[-1], dtype=np.uint64)))
    for n in range(1, wanted[-1] + 1):
        polynomial = polynomial * _MULTIPLIER + padded[np.arange(len(tokens)) + n - 1]
        if n in wanted:
            valid = room >= n
            yield n, _splitmix64(polynomial[valid]), np.maximum(lengths - (n - 1), 0)


def run_positions(counts: np.ndarray) -> np.ndarray:
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
    hashes, counts = _shingles(texts)
    return _reduce(hashes), counts


def _shingles(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit hash of every shingle of every text, concatenated; shingles per text)."""
    tokens, lengths = word_hashes(shingle_words(text) for text in texts)
    return ngram_hashes(tokens, lengths, SHINGLE_WORDS, whole_if_shorter=True)


def _reduce(hashes: np.ndarray) -> np.ndarray:
    return (hashes >> np.uint64(32)) % _P


class ShingleSets:
    """The distinct 64-bit shingle hashes of each of n texts, sorted, in one array.

    `values[offsets[i]:offsets[i + 1]]` is text i's set; `sizes` = its size.
    """

    def __init__(self, values: np.ndarray, sizes: np.ndarray) -> None:
        self.values, self.sizes = values, sizes
        self.offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)

    @classmethod
    def of(cls, hashes: np.ndarray, counts: np.ndarray) -> ShingleSets:
        """From `_shingles`' output: each text's hashes, deduplicated and sorted."""
        owner = np.repeat(np.arange(len(counts)), counts)
        order = np.lexsort((hashes, owner))
        hashes, owner = hashes[order], owner[order]
        keep = np.ones(len(hashes), dtype=bool)
        keep[1:] = (hashes[1:] != hashes[:-1]) | (owner[1:] != owner[:-1])
        return cls(hashes[keep], np.bincount(owner[keep], minlength=len(counts)).astype(np.int64))

    @classmethod
    def concat(cls, parts: Sequence[ShingleSets]) -> ShingleSets:
        if not parts:
            return cls(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64))
        return cls(np.concatenate([p.values for p in parts]), np.concatenate([p.sizes for p in parts]))

    def __len__(self) -> int:
        return len(self.sizes)

    def take(self, rows: np.ndarray) -> ShingleSets:
        """The sets of `rows`, in that order."""
        sizes = self.sizes[rows]
        return ShingleSets(self.values[_gather(self.offsets[rows], sizes)], sizes)

    def set_of(self, row: int) -> np.ndarray:
        return self.values[self.offsets[row] : self.offsets[row + 1]]


def _gather(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Positions starts[i], ..., starts[i] + sizes[i] - 1 for each i, concatenated."""
    return np.repeat(starts, sizes) + run_positions(sizes)


_PAIR_CHUNK_VALUES = 1 << 22


def exact_jaccard(a: ShingleSets, left: np.ndarray, b: ShingleSets, right: np.ndarray) -> np.ndarray:
    """Jaccard of set a[left[k]] and set b[right[k]] for each k, float64 of shape (len(left),);
    0 where both are empty. Vectorised: the two sets of every pair, tagged with the pair's
    number, are sorted together and the equal neighbours counted."""
    left, right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
    result = np.zeros(len(left), dtype=np.float64)
    ends = np.cumsum(a.sizes[left] + b.sizes[right])
    start = 0
    while start < len(left):
        done = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, done + _PAIR_CHUNK_VALUES, side="right")))
        lo, ro = left[start:stop], right[start:stop]
        ls, rs = a.sizes[lo], b.sizes[ro]
        pair = np.arange(len(lo))
        values = np.concatenate((a.values[_gather(a.offsets[lo], ls)], b.values[_gather(b.offsets[ro], rs)]))
        owners = np.concatenate((np.repeat(pair, ls), np.repeat(pair, rs)))
        order = np.lexsort((values, owners))
        values, owners = values[order], owners[order]
        equal = (values[1:] == values[:-1]) & (owners[1:] == owners[:-1])
        shared = np.bincount(owners[1:][equal], minlength=len(lo))
        union = ls + rs - shared
        result[start:stop] = np.where(union > 0, shared / np.maximum(union, 1), 0.0)
        start = stop
    return result


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
        return self.signatures_and_sets(texts)[0]

    def signatures_and_sets(self, texts: Sequence[str]) -> tuple[np.ndarray, ShingleSets]:
        """The signatures, and the shingle sets they were computed from (one pass of hashing)."""
        hashes, counts = _shingles(texts)
        return self._signatures(_reduce(hashes), counts), ShingleSets.of(hashes, counts)

    def _signatures(self, shingles: np.ndarray, counts: np.ndarray) -> np.ndarray:
        result = np.full((len(counts), self.num_perm), EMPTY, dtype=np.uint64)
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
def lsh_params(threshold: float, num_perm: int, recall: float = TARGET_RECALL) -> tuple[int, int]:
    """(bands, rows): the most rows for which two texts of Jaccard exactly `threshold` share a
    bucket with probability >= `recall`, with bands = num_perm // rows.

    That probability is 1 - (1 - threshold^rows)^bands and it grows with Jaccard, so pairs
    above the threshold are found at least as often. More rows mean fewer candidates below
    the threshold; the candidates are verified by exact Jaccard, so they cost time, not
    precision.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must lie strictly between 0 and 1, got {threshold}")
    if not 0.0 < recall < 1.0:
        raise ValueError(f"recall must lie strictly between 0 and 1, got {recall}")
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if collision_probability(threshold, bands, rows) >= recall:
            return bands, rows
    raise ValueError(f"{num_perm} permutations cannot reach recall {recall} at Jaccard {threshold}: use more")


def collision_probability(jaccard: float, bands: int, rows: int) -> float:
    """The chance that two texts of this Jaccard share at least one of `bands` buckets."""
    return 1.0 - (1.0 - jaccard**rows) ** bands


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
    signatures: np.ndarray, sets: ShingleSets, bucket: np.ndarray, member: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """(leader, member) pairs of bucket-mates with exact Jaccard >= threshold.

    Resolved in leader rounds (see the module docstring), each vectorised over all buckets.
    """
    lefts: list[np.ndarray] = []
    rights: list[np.ndarray] = []
    for _ in range(MAX_LEADER_ROUNDS):
        if len(bucket) == 0:
            break
        first = np.concatenate(([True], bucket[1:] != bucket[:-1]))
        leader = member[first][np.cumsum(first) - 1]
        similar = _similar(signatures, sets, leader, signatures, sets, member, threshold)
        accepted = similar & ~first
        lefts.append(leader[accepted])
        rights.append(member[accepted])
        keep = ~(similar | first)
        bucket, member = bucket[keep], member[keep]
        alive = _runs(bucket)[1] > 1
        bucket, member = bucket[alive], member[alive]
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([empty, *lefts]), np.concatenate([empty, *rights])


def _similarity(
    a_signatures: np.ndarray, a_sets: ShingleSets, left: np.ndarray,
    b_signatures: np.ndarray, b_sets: ShingleSets, right: np.ndarray, threshold: float,
) -> np.ndarray:
    """Exact Jaccard of each (left, right) pair whose signatures agree on at least
    threshold - ESTIMATE_MARGIN; 0 for the others (not verified)."""
    similarity = np.zeros(len(left), dtype=np.float64)
    plausible = np.flatnonzero(
        estimated_jaccard(a_signatures[left], b_signatures[right]) >= threshold - ESTIMATE_MARGIN)
    similarity[plausible] = exact_jaccard(a_sets, left[plausible], b_sets, right[plausible])
    return similarity


def _similar(a_signatures, a_sets, left, b_signatures, b_sets, right, threshold: float) -> np.ndarray:
    return _similarity(a_signatures, a_sets, left, b_signatures, b_sets, right, threshold) >= threshold


def connected_components(size: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
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
    LSH bucket and their exact Jaccard is >= threshold; clusters are linked components.
    """
    if len(ids) != len(texts):
        raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
    if len(set(ids)) != len(ids):
        raise ValueError("ids must be distinct")
    # Rows in sorted id order, so a component's smallest row is its smallest id.
    order = sorted(range(len(ids)), key=ids.__getitem__)
    sorted_ids = [ids[i] for i in order]
    signatures, sets = MinHasher(num_perm, seed).signatures_and_sets([texts[i] for i in order])
    rows = np.flatnonzero(~is_empty(signatures))
    bucket, member = _buckets(band_keys(signatures[rows], *lsh_params(threshold, num_perm)))
    left, right = _verified_pairs(signatures, sets, bucket, rows[member], threshold)
    label = connected_components(len(ids), left, right)
    return {sorted_ids[row]: sorted_ids[group] for row, group in enumerate(label)}


class NearDuplicateIndex:
    """Texts indexed by MinHash LSH, queried for near-duplicates verified by exact Jaccard.

    Texts with identical shingle sets (identical texts, typically) are stored once with all
    their ids, so thousands of copies of one short text cost one candidate, not thousands.
    """

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, seed: int = 1) -> None:
        self.threshold = threshold
        self.hasher = MinHasher(num_perm, seed)
        self.bands, self.rows = lsh_params(threshold, num_perm)
        self._row_of: dict[bytes, int] = {}
        self._signatures: list[np.ndarray] = []
        self._sets: list[np.ndarray] = []
        self._ids: list[list[Hashable]] = []
        self._table: tuple[np.ndarray, ShingleSets, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._ids)

    def add(self, ids: Sequence[Hashable], texts: Sequence[str]) -> None:
        """Index `texts` under `ids`; texts without shingles are not indexed."""
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids but {len(texts)} texts")
        signatures, sets = self.hasher.signatures_and_sets(texts)
        for number, (key, signature) in enumerate(zip(ids, signatures)):
            if is_empty(signature):
                continue
            shingles = sets.set_of(number)
            row = self._row_of.setdefault(shingles.tobytes(), len(self._row_of))
            if row == len(self._ids):
                self._signatures.append(signature)
                self._sets.append(shingles)
                self._ids.append([])
            self._ids[row].append(key)
        self._table = None

    def query(self, text: str) -> list[tuple[Hashable, float]]:
        """(id, exact Jaccard) of indexed texts at or above the threshold, best first."""
        return self.query_many([text])[0]

    def query_many(self, texts: Sequence[str]) -> list[list[tuple[Hashable, float]]]:
        """`query` for each text, sharing the signature and lookup work."""
        signatures, sets = self.hasher.signatures_and_sets(texts)
        results: list[list[tuple[Hashable, float]]] = [[] for _ in range(len(texts))]
        if not self._ids:
            return results
        stored, stored_sets, _, _ = self._stored()
        query, row = self._candidates(signatures)
        similarity = _similarity(signatures, sets, query, stored, stored_sets, row, self.threshold)
        passed = np.flatnonzero(similarity >= self.threshold)
        # Best first; ties in the order the texts were added.
        for i in passed[np.lexsort((row[passed], -similarity[passed], query[passed]))]:
            results[query[i]].extend((key, float(similarity[i])) for key in self._ids[row[i]])
        return results

    def _candidates(self, signatures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (query, stored row) pairs that share at least one band key."""
        _, _, sorted_keys, order = self._stored()
        present = np.flatnonzero(~is_empty(signatures))
        keys = band_keys(signatures[present], self.bands, self.rows)
        queries: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        for band in range(self.bands):
            lo = np.searchsorted(sorted_keys[band], keys[:, band], side="left")
            hits = np.searchsorted(sorted_keys[band], keys[:, band], side="right") - lo
            queries.append(np.repeat(present, hits))
            rows.append(order[band][np.repeat(lo, hits) + run_positions(hits)])
        pairs = np.unique(np.stack((np.concatenate(queries), np.concatenate(rows))), axis=1)
        return pairs[0], pairs[1]

    def _stored(self) -> tuple[np.ndarray, ShingleSets, np.ndarray, np.ndarray]:
        """Stored signatures and sets; per band, the sorted stored keys and the stored rows in that order."""
        if self._table is None:
            signatures = np.stack(self._signatures)
            keys = band_keys(signatures, self.bands, self.rows).T
            order = np.argsort(keys, axis=1, kind="stable")
            sets = ShingleSets(np.concatenate(self._sets), np.array([len(x) for x in self._sets], dtype=np.int64))
            self._table = (signatures, sets, np.take_along_axis(keys, order, axis=1), order)
        return self._table
