"""Hard negatives for phase 3, mined from the pinned training corpus with an identified encoder.

Every pair's query is searched (exact inner product: Faiss `IndexFlatIP` over L2-normalised
embeddings) among the training-split documents of the corpus, each encoded as "title\\ntext"
(or its text when untitled). Only split "train" is indexed, so a recipe-dev or final-eval
document can never become a negative. The `top_k` results are checked against these rules
in order, and a dropped candidate is counted under the first rule that drops it:

    known-positive         one of the pair's own documents (`Pair.doc_ids`)
    same-group             shares a near-duplicate `group_id` with one of the pair's documents
    positive-text          its text contains a positive's or is contained in one, compared as
                           the word sequences of the normalised (content-hash), case-folded
                           texts; a document with the positive's content hash is the equal
                           case. The positives are the pair's own and those of every pair in
                           its positive group (the other positives of a user's multi-positive
                           pair, `pair_sources.row_ids`), plus `group_positives`. Words, as in
                           the contamination audit, so punctuation around a copy does not
                           hide it and a short positive ("dog") does not match inside a
                           longer word ("dogma"); contained-in, so a corpus copy of a
                           labelled positive without its title ("title. text") is caught too
    near-positive          a near-duplicate of one of those positives (`dedup.NearDuplicateIndex`:
                           word 5-gram Jaccard >= `NEAR_POSITIVE_THRESHOLD`, the dedup rule):
                           an edited copy of a positive, which containment misses and which
                           the margin alone would judge by score
    false-negative-margin  rule "margin" (the default): score > positive_score - margin, where
                           positive_score is sim(query, positive): too close to the positive to
                           trust as a negative, so more likely an unlabelled positive
    false-negative-relative  rule "relative" (NV-Retriever's TopK-PercPos): score >
                           relative_fraction x positive_score, a cut that scales with the positive
    outside-window         rule "window": a search rank outside (first, last), 1-based among all
                           indexed documents: the nearest ranks are skipped as likely positives
    skip-top               the first `skip_top` candidates left by the rules above

Then the pair's `negatives_per_query` negatives are taken from what is left: the first ones,
best first, or (`sample_seed` set) a sample of them drawn by that seed and the pair's id, kept
in rank order, so one pair's draw does not depend on which other pairs are mined. Every
candidate is checked, not only as many as the quota needs, so the drop counts describe the
whole top_k pool and say how hard the negatives could be made.

Mining is two parts that can run apart: the search (`search_candidates`: encode, then
`exact_search` in the fixed blocks of `embedlab.negatives.search`; every pair's top_k with
their scores and the positive's, which `embedlab.negatives.candidates` stores once) and the
rules (`select_negatives`), so a rule is a choice made on stored candidates: selecting by a
rule from stored candidates gives the set that mining with that rule from scratch gives
(`tests/test_negative_rules.py`).

Re-mining is a new recipe revision: `MinedSet.version` is a hash of the encoder id, how it
encodes (`encoding`: the encode length, the pooling and, from phase 3, the code that mines and
encodes, `MINING_CODE`), the corpus revision, the mining config, the pair ids and the pairs'
texts, so mining with anything different gives a new version.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embedlab.artifacts.build import write_json_staged, write_staged
from embedlab.pairs.builders import Pair
from embedlab.sources.dedup import NearDuplicateIndex
from embedlab.sources.document import document_text, normalise_text
from embedlab.negatives.search import query_blocks, search_blocks

FORMAT = "embedlab-mined-negatives/5"  # 2: positive-text over the positive group, both ways; 3: pairs_digest; 4: encoding; 5: rules
RULES = ("known-positive", "same-group", "positive-text", "near-positive", "false-negative-margin",
         "false-negative-relative", "outside-window", "skip-top")
# The score rule a set is selected by (`MiningConfig.rule`), and the reason each drops under.
SCORE_RULES = {"margin": "false-negative-margin", "relative": "false-negative-relative", "window": "outside-window"}
NEAR_POSITIVE_THRESHOLD = 0.8  # the corpus dedup's default threshold
TRAIN_SPLIT = "train"
CORPUS_COLUMNS = ("doc_id", "title", "text", "group_id", "split")
NEGATIVES_FILE = "negatives.parquet"
MANIFEST_FILE = "manifest.json"
# A mining trial's row figures that the study table reads (`embedlab.negatives.phase3.mining_figures`):
# the stored search its negatives were selected from, which trials differing only in the rule
# share; the share of its queries its rule left a negative for (a parent too weak to rank
# positives above most documents leaves the margin rule nothing to keep, and the arm then
# trains on in-batch negatives); and, for a search of a fixed sample of the training
# documents (`negatives.corpus_sample`), how many it read.
MINING_SEARCH = "data/mining_candidates"
MINING_COVERAGE = "data/mining_queries_with_negatives"
MINING_SAMPLE = "data/mining_corpus_sample"
SNIPPET_CHARS = 160
DEV_TEST_ROW = "dev/test documents (never indexed; documents, not candidates)"  # the report's first drop row
_WORD = re.compile(r"\w+")

NEGATIVE_SCHEMA = pa.schema([
    ("pair_id", pa.string()),
    ("doc_id", pa.string()),
    ("rank", pa.int32()),
    ("score", pa.float64()),
    ("positive_score", pa.float64()),
    ("query", pa.string()),
    ("positive", pa.string()),
    ("negative", pa.string()),
])


@dataclass(frozen=True, kw_only=True)
class MiningConfig:
    """How many candidates to search (`top_k`), which survive (`rule`: "margin" drops those
    above the positive's score minus `false_negative_margin`, "relative" those above
    `relative_fraction` times it, "window" those ranked outside `window`), how many survivors to
    skip (`skip_top`) and keep (`negatives_per_query`), and whether the kept ones are the first
    (`sample_seed` None) or a sample drawn by that seed."""

    top_k: int = 50
    negatives_per_query: int = 4
    false_negative_margin: float = 0.05
    skip_top: int = 0
    rule: str = "margin"
    relative_fraction: float = 0.95
    window: tuple[int, int] | None = None
    sample_seed: int | None = None

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"MiningConfig.top_k must be >= 1, got {self.top_k}")
        if self.negatives_per_query < 1:
            raise ValueError(f"MiningConfig.negatives_per_query must be >= 1, got {self.negatives_per_query}")
        if self.false_negative_margin < 0:
            raise ValueError(f"MiningConfig.false_negative_margin must be >= 0, got {self.false_negative_margin}")
        if self.skip_top < 0:
            raise ValueError(f"MiningConfig.skip_top must be >= 0, got {self.skip_top}")
        if self.skip_top + self.negatives_per_query > self.top_k:
            raise ValueError(
                f"MiningConfig.top_k ({self.top_k}) must be at least skip_top + negatives_per_query "
                f"({self.skip_top} + {self.negatives_per_query}), or no query could get its negatives"
            )
        if self.rule not in SCORE_RULES:
            raise ValueError(f"MiningConfig.rule {self.rule!r}; valid: {list(SCORE_RULES)}")
        if not 0 < self.relative_fraction <= 1:
            raise ValueError(f"MiningConfig.relative_fraction must be in (0, 1], got {self.relative_fraction}")
        window = None if self.window is None else tuple(self.window)
        object.__setattr__(self, "window", window)  # JSON gives a list: the config's own form is a tuple
        if (window is not None) != (self.rule == "window"):
            raise ValueError(f"MiningConfig.window {window}: (first, last) ranks with rule 'window', and only then")
        if window is not None and not (len(window) == 2 and 1 <= window[0] <= window[1] <= self.top_k):
            raise ValueError(f"MiningConfig.window {window}: needs 1 <= first <= last <= top_k ({self.top_k})")

    def drops(self, score: float, positive_score: float, rank: int) -> bool:
        """Whether the score rule drops a candidate of `score` at search `rank` (1-based) for a
        pair whose positive scores `positive_score`."""
        if self.rule == "margin":
            return score > positive_score - self.false_negative_margin
        if self.rule == "relative":
            return score > self.relative_fraction * positive_score
        first, last = self.window
        return not first <= rank <= last

    def describe(self) -> str:
        """The rule in words, as the report and the docs name it."""
        rule = {"margin": f"absolute margin {self.false_negative_margin}",
                "relative": f"relative: above {self.relative_fraction} x the positive's score dropped",
                "window": f"rank window {self.window}"}[self.rule]
        kept = "top" if self.sample_seed is None else f"sampled (seed {self.sample_seed})"
        return f"rule {rule}, skip_top {self.skip_top}, {kept}"


@dataclass(frozen=True)
class MinedNegative:
    """One negative of one pair: `rank` is its 1-based place among all indexed documents for the query."""

    pair_id: str
    doc_id: str
    rank: int
    score: float
    positive_score: float


def pairs_digest(pairs: Iterable[Pair], group_positives: Mapping[str, Iterable[str]] | None = None) -> str:
    """sha256 of the texts mining reads from the pairs: each pair's query, positive and group,
    and the group positives, in id order. A user who edits a positive under the same pair id
    gets a new mined set, not one chosen against the old text."""
    rows = sorted((p.pair_id, p.query, p.positive, p.positive_group) for p in pairs)
    groups = sorted((group, sorted(texts)) for group, texts in (group_positives or {}).items())
    return hashlib.sha256(json.dumps([rows, groups]).encode()).hexdigest()


def mining_version(*, encoder_id: str, corpus_revision: str, config: MiningConfig, pair_ids: Iterable[str],
                   pairs_digest: str, encoding: Mapping[str, Any] | None = None) -> str:
    """sha256 of everything that decides the negatives (`pairs_digest`: the pairs' texts;
    `encoding`: how the encoder turns text into vectors, JSON values); pair order does not matter."""
    identity = {
        "format": FORMAT,
        "encoder_id": encoder_id,
        "encoding": dict(encoding or {}),
        "corpus_revision": corpus_revision,
        "config": asdict(config),
        "pair_ids": sorted(pair_ids),
        "pairs_digest": pairs_digest,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class MinedSet:
    """Mined negatives with the identity of what mined them.

    `negatives` has an entry, in rank order, for every mined pair (empty when every
    candidate was dropped); `queries` holds (query, positive) and `documents` the encoded
    text of every pair and document that appears in a negative, so the set can be reviewed
    and trained on without the corpus.
    """

    version: str
    encoder_id: str
    corpus_revision: str
    config: MiningConfig
    negatives: dict[str, tuple[MinedNegative, ...]]
    counts: dict[str, Any]
    queries: dict[str, tuple[str, str]]
    documents: dict[str, str]
    pairs_digest: str
    encoding: dict[str, Any] = field(default_factory=dict)

    def to_table(self) -> pa.Table:
        """One row per negative, by pair id then rank, with the query, positive and negative texts."""
        rows = [
            {**asdict(negative), "query": self.queries[pair_id][0], "positive": self.queries[pair_id][1],
             "negative": self.documents[negative.doc_id]}
            for pair_id in sorted(self.negatives)
            for negative in self.negatives[pair_id]
        ]
        return pa.Table.from_pylist(rows, schema=NEGATIVE_SCHEMA)

    def save(self, directory: Path | str) -> Path:
        """Write negatives.parquet and manifest.json into directory; returns the directory.

        Trials that need the same set may mine it at once: each file is staged under its
        writer's own name (pid and a random suffix) and renamed into place, so a reader sees
        one writer's whole file, never two writers' bytes interleaved."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_staged(directory / NEGATIVES_FILE, lambda staging: pq.write_table(self.to_table(), staging))
        manifest = {
            "format": FORMAT,
            "version": self.version,
            "encoder_id": self.encoder_id,
            "encoding": self.encoding,
            "corpus_revision": self.corpus_revision,
            "config": asdict(self.config),
            "counts": self.counts,
            # The pair ids restore pairs left without negatives and let `load` recompute the version.
            "pair_ids": sorted(self.negatives),
            "pairs_digest": self.pairs_digest,
        }
        # Written last, so a directory with a manifest holds a complete set.
        write_json_staged(directory / MANIFEST_FILE, manifest)
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> MinedSet:
        """A set written by `save`; a manifest whose version does not match its contents is a ValueError."""
        directory = Path(directory)
        manifest_path = directory / MANIFEST_FILE
        if not manifest_path.is_file() or not (directory / NEGATIVES_FILE).is_file():
            raise FileNotFoundError(f"no mined negatives in {directory} ({MANIFEST_FILE} + {NEGATIVES_FILE})")
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest_path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
        config = MiningConfig(**manifest["config"])
        version = mining_version(
            encoder_id=manifest["encoder_id"], corpus_revision=manifest["corpus_revision"],
            config=config, pair_ids=manifest["pair_ids"], pairs_digest=manifest["pairs_digest"],
            encoding=manifest["encoding"],
        )
        if version != manifest["version"]:
            raise ValueError(f"{manifest_path}: version {manifest['version']} does not match its contents ({version})")
        negatives: dict[str, list[MinedNegative]] = {pair_id: [] for pair_id in manifest["pair_ids"]}
        queries: dict[str, tuple[str, str]] = {}
        documents: dict[str, str] = {}
        for row in pq.read_table(directory / NEGATIVES_FILE).to_pylist():
            negatives[row["pair_id"]].append(MinedNegative(
                pair_id=row["pair_id"], doc_id=row["doc_id"], rank=row["rank"],
                score=row["score"], positive_score=row["positive_score"],
            ))
            queries[row["pair_id"]] = (row["query"], row["positive"])
            documents[row["doc_id"]] = row["negative"]
        return cls(
            version=version,
            encoder_id=manifest["encoder_id"],
            corpus_revision=manifest["corpus_revision"],
            config=config,
            negatives={pair_id: tuple(found) for pair_id, found in negatives.items()},
            counts=manifest["counts"],
            queries=queries,
            documents=documents,
            pairs_digest=manifest["pairs_digest"],
            encoding=manifest["encoding"],
        )

    def report(self, examples: int = 5) -> str:
        """Markdown: identity, counts, drops per rule and up to `examples` (query, positive, negative) triples."""
        counts, config = self.counts, self.config
        lines = [
            f"# Mined hard negatives {self.version[:12]}",
            "",
            f"Encoder `{self.encoder_id}`, corpus revision `{self.corpus_revision}`, top_k {config.top_k}, "
            f"{config.negatives_per_query} negatives per query, {config.describe()}."
            + ("" if not self.encoding else " Encoding: " + ", ".join(
                f"{key} {value}" for key, value in sorted(self.encoding.items())) + "."),
            "",
            "| count | value |",
            "|---|---:|",
            f"| queries mined | {counts['queries']} |",
            f"| queries with at least one negative | {counts['queries_with_negatives']} |",
            f"| negatives | {counts['negatives']} |",
            f"| training documents indexed | {counts['training_documents_indexed']} |",
            f"| candidates checked | {counts['candidates']} |",
            f"| mean positive score | {counts['mean_positive_score']:.4f} |",
            f"| mean negative score | {_optional(counts['mean_negative_score'])} |",
            "",
            "## Negatives per query",
            "",
            "| negatives | queries |",
            "|---:|---:|",
            *(f"| {n} | {queries} |" for n, queries in counts["negatives_per_query"].items()),
            "",
            "## Dropped by each exclusion rule",
            "",
            "| rule | dropped |",
            "|---|---:|",
            f"| {DEV_TEST_ROW} | {counts['dev_test_documents_left_out']} |",
            *(f"| {rule} | {counts['dropped'][rule]} |" for rule in RULES),
            "",
            "## Examples",
            "",
        ]
        mined = [pair_id for pair_id in sorted(self.negatives) if self.negatives[pair_id]]
        if not mined:
            lines.append("No query has a negative.")
        # Spread over the sorted ids rather than the first few, which often share one document.
        chosen = mined if len(mined) <= examples else [mined[i * len(mined) // examples] for i in range(examples)]
        for pair_id in chosen:
            query, positive = self.queries[pair_id]
            found = self.negatives[pair_id]
            lines += [
                f"**{pair_id}** (positive score {found[0].positive_score:.3f})",
                "",
                f"- query: {_snippet(query)}",
                f"- positive: {_snippet(positive)}",
                *(f"- negative `{n.doc_id}` (rank {n.rank}, score {n.score:.3f}): {_snippet(self.documents[n.doc_id])}"
                  for n in found),
                "",
            ]
        return "\n".join(lines).rstrip() + "\n"


def _optional(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _snippet(text: str) -> str:
    """Whitespace-collapsed text, cut to SNIPPET_CHARS characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"


def _words(text: str) -> str:
    """The word sequence containment is checked on, space-padded so a match is word-aligned."""
    return f" {' '.join(_WORD.findall(normalise_text(text).casefold()))} "


def _overlaps(document: str, positives: Iterable[str]) -> bool:
    """Whether a document's words (`_words`) contain a positive's or lie inside one."""
    return any(positive in document or (document.strip() and document in positive) for positive in positives)


def _near_positive_groups(positives: Mapping[str, Iterable[str]], candidates: Mapping[Any, str]) -> dict[Any, set[str]]:
    """candidate key -> the positive groups one of whose positives it is a near-duplicate of."""
    index = NearDuplicateIndex(NEAR_POSITIVE_THRESHOLD)
    # One add of every (group, positive), in the order adding group by group would take: the
    # index is the same, but its hashing runs once, not once per group (tens of thousands).
    flat = [(group, text) for group, texts in positives.items() for text in sorted(texts)]
    if flat:
        index.add([group for group, _ in flat], [text for _, text in flat])
    if not len(index) or not candidates:
        return {}
    keys = list(candidates)
    found = index.query_many([candidates[key] for key in keys])
    return {key: {group for group, _ in matches} for key, matches in zip(keys, found) if matches}


def _unit_rows(vectors: np.ndarray, count: int, what: str) -> np.ndarray:
    """encode's output as float32 unit rows (zero rows stay zero), checked to have one row per text."""
    array = np.asarray(vectors, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] != count:
        raise ValueError(f"encode returned shape {array.shape} for {count} {what}")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    return array / np.maximum(norms, np.float32(1e-12))


@dataclass(frozen=True)
class Candidates:
    """What a search found for each pair, before any rule (`search_candidates`): row i of
    `positive_scores`, `scores` and `rows` is pair `pair_ids[i]`'s, its query-positive score and
    its top-k candidates as (score, document row) arrays of shape (pairs, top_k), best first (row
    -1: none); `doc_ids`, `groups` and `texts` are the documents the rows index (every indexed
    training document, or only those that are candidates, in a stored set), `indexed` how many
    training documents were searched and `left_out` how many dev/test documents were not."""

    pair_ids: list[str]
    doc_ids: list[str]
    groups: list[str]
    texts: list[str]
    positive_scores: np.ndarray
    scores: np.ndarray
    rows: np.ndarray
    indexed: int
    left_out: int


def mine_hard_negatives(
    pairs: list[Pair],
    corpus: pa.Table,
    encode: Callable[[list[str]], np.ndarray],
    *,
    config: MiningConfig,
    encoder_id: str,
    corpus_revision: str,
    progress: Callable[[str], None] = print,
    outside_corpus: frozenset[str] = frozenset(),
    group_positives: Mapping[str, Iterable[str]] | None = None,
    encoding: Mapping[str, Any] | None = None,
    encode_query: Callable[[list[str]], np.ndarray] | None = None,
    encode_corpus: Callable[[list[str]], np.ndarray] | None = None,
    search_queries: Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]] | None = None,
) -> MinedSet:
    """Negatives for every pair from the training split of `corpus`, found with `encode(texts) -> (N, d)`
    for documents and positives and `encode_query` (default `encode`) for queries: an encoder
    trained with query and passage prefixes is searched as it is trained and evaluated.

    `corpus` is the corpus table (at least doc_id, title, text, group_id, split) of every
    split: the dev and test rows are never indexed, but the pairs' documents are looked up
    in it for their groups, so each pair's documents must be in it, except for the pairs
    whose ids are in `outside_corpus` (a user's own pairs, `embedlab.pairs.readers`):
    their positives are no corpus documents, so known-positive and same-group cannot apply
    to them, and positive-text and the margin are what keep their positives out.
    `group_positives` (positive group -> texts, `pairs_table.group_positive_texts`) adds the
    positives of group members that are not among `pairs` (rows the schedule does not read).
    `encoding` says how `encode` embeds text (JSON values: encode length, pooling, code); it
    joins the set's version, so an encoder run differently is a new set. `encode_corpus`
    (default `encode`) embeds the training-split documents: the same passage encoding, which a
    caller may serve from a cache of the corpus's vectors (`embedlab.negatives.phase3`).
    `search_queries` (default `exact_search`) is the search, which a caller may spread over
    workers (`embedlab.negatives.sharded`).

    Three stages: `checked_inputs` (the pairs and the corpus they come from), `search_candidates`
    (encode and search: every pair's top-k, no rule applied yet), `selected_set` (the rules).
    """
    group_of, train = checked_inputs(pairs, corpus, outside_corpus)
    candidates = search_candidates(pairs, corpus, train, encode, top_k=config.top_k, encoder_id=encoder_id,
                                   progress=progress, encode_query=encode_query, encode_corpus=encode_corpus,
                                   search_queries=search_queries)
    return selected_set(pairs, candidates, group_of, config=config, encoder_id=encoder_id,
                        corpus_revision=corpus_revision, progress=progress, group_positives=group_positives,
                        encoding=encoding)


def selected_set(pairs: list[Pair], candidates: Candidates, group_of: Mapping[str, str], *, config: MiningConfig,
                 encoder_id: str, corpus_revision: str, progress: Callable[[str], None] = print,
                 group_positives: Mapping[str, Iterable[str]] | None = None,
                 encoding: Mapping[str, Any] | None = None) -> MinedSet:
    """The mined set `config`'s rules select from `candidates` (found for `pairs`, fresh from
    `search_candidates` or stored), with its counts and version: whether the candidates were
    searched now or read back, the set is the same."""
    negatives, dropped = select_negatives(pairs, candidates, group_of, config, group_positives)
    found = [negative for pair_negatives in negatives.values() for negative in pair_negatives]
    text_of = dict(zip(candidates.doc_ids, candidates.texts))
    per_query = Counter(len(pair_negatives) for pair_negatives in negatives.values())
    row_of = {pair_id: i for i, pair_id in enumerate(candidates.pair_ids)}
    positive_scores = candidates.positive_scores[[row_of[pair.pair_id] for pair in pairs]]
    counts = {
        "queries": len(pairs),
        "queries_with_negatives": sum(1 for pair_negatives in negatives.values() if pair_negatives),
        "negatives": len(found),
        # String keys, as JSON stores them, so a loaded set equals the mined one.
        "negatives_per_query": {str(n): per_query[n] for n in sorted(per_query)},
        "training_documents_indexed": candidates.indexed,
        "dev_test_documents_left_out": candidates.left_out,
        "candidates": int(candidates.rows[[row_of[pair.pair_id] for pair in pairs]].size),
        "dropped": {rule: dropped[rule] for rule in RULES},
        "mean_positive_score": float(positive_scores.mean()),
        "mean_negative_score": float(np.mean([n.score for n in found])) if found else None,
    }
    progress(f"mining: {counts['negatives']:,} negatives for {counts['queries_with_negatives']:,} of "
             f"{len(pairs):,} queries; dropped {counts['dropped']}")
    digest = pairs_digest(pairs, group_positives)
    return MinedSet(
        version=mining_version(encoder_id=encoder_id, corpus_revision=corpus_revision, config=config,
                               pair_ids=[pair.pair_id for pair in pairs], pairs_digest=digest, encoding=encoding),
        pairs_digest=digest,
        encoding=dict(encoding or {}),
        encoder_id=encoder_id,
        corpus_revision=corpus_revision,
        config=config,
        negatives=negatives,
        counts=counts,
        queries={pair.pair_id: (pair.query, pair.positive) for pair in pairs if negatives[pair.pair_id]},
        documents={negative.doc_id: text_of[negative.doc_id] for negative in found},
    )


def checked_inputs(pairs: list[Pair], corpus: pa.Table,
                   outside_corpus: frozenset[str]) -> tuple[dict[str, str], pa.Table]:
    """Every corpus document's group, and the training split the candidates come from; a
    ValueError for pairs that repeat or name documents the corpus does not have (their
    near-duplicates could not be excluded), or a corpus without the columns or a training split."""
    if not pairs:
        raise ValueError("no pairs to mine negatives for")
    repeated = sorted(pair_id for pair_id, n in Counter(pair.pair_id for pair in pairs).items() if n > 1)
    if repeated:
        raise ValueError(f"pair ids listed more than once: {repeated[:5]}")
    missing = [column for column in CORPUS_COLUMNS if column not in corpus.column_names]
    if missing:
        raise ValueError(f"corpus table lacks columns {missing}; needs {list(CORPUS_COLUMNS)}")
    group_of = dict(zip(corpus["doc_id"].to_pylist(), corpus["group_id"].to_pylist()))
    unknown = sorted({doc_id for pair in pairs if pair.pair_id not in outside_corpus for doc_id in pair.doc_ids}
                     - group_of.keys())
    if unknown:
        # Without a document's group its near-duplicates could not be excluded.
        raise ValueError(f"pair documents not in the corpus table: {unknown[:5]}")
    train = corpus.filter(pc.equal(corpus["split"], TRAIN_SPLIT))
    if train.num_rows == 0:
        raise ValueError("the corpus table has no training-split documents to mine from")
    return group_of, train


def corpus_sample(train: pa.Table, size: int) -> pa.Table:
    """A fixed sample of `size` training documents to search (0, or `size` at least the split:
    every one): those whose doc_id hashes lowest (sha256), kept in the split's order. The sample
    depends on the documents alone, never on a trial's seed, so every trial, seed and study that
    mines a corpus with one `size` searches the same documents and shares one stored search."""
    if size <= 0 or size >= train.num_rows:
        return train
    digests = [hashlib.sha256(doc_id.encode()).digest() for doc_id in train["doc_id"].to_pylist()]
    lowest = sorted(range(train.num_rows), key=digests.__getitem__)[:size]
    return train.take(pa.array(sorted(lowest), pa.int64()))


def search_candidates(pairs: list[Pair], corpus: pa.Table, train: pa.Table, encode: Callable[[list[str]], np.ndarray],
                      *, top_k: int, encoder_id: str, progress: Callable[[str], None],
                      encode_query: Callable[[list[str]], np.ndarray] | None = None,
                      encode_corpus: Callable[[list[str]], np.ndarray] | None = None,
                      search_queries: Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]
                      | None = None) -> Candidates:
    """The training documents, queries and positives encoded, and every query's `top_k`
    nearest documents by exact inner product (`exact_search`, or `search_queries`; no rule
    applied yet). `train` is the training split, or a sample of it (`corpus_sample`)."""
    texts = [document_text(title, text) for title, text in zip(train["title"].to_pylist(), train["text"].to_pylist())]
    left_out = corpus.num_rows - pc.sum(pc.equal(corpus["split"], TRAIN_SPLIT)).as_py()  # dev/test documents
    searched = (f"{len(texts):,} training documents" if len(texts) + left_out == corpus.num_rows else
                f"a fixed sample of {len(texts):,} of {corpus.num_rows - left_out:,} training documents")
    progress(f"mining: encoding {searched} ({left_out:,} dev/test documents left out) and {len(pairs):,} pairs "
             f"with {encoder_id}")
    doc_vectors = _unit_rows((encode_corpus or encode)(texts), len(texts), "documents")
    query_vectors = _unit_rows((encode_query or encode)([pair.query for pair in pairs]), len(pairs), "queries")
    positive_vectors = _unit_rows(encode([pair.positive for pair in pairs]), len(pairs), "positives")
    scores, rows = (search_queries or exact_search)(doc_vectors, query_vectors, top_k)
    return Candidates(pair_ids=[pair.pair_id for pair in pairs], doc_ids=train["doc_id"].to_pylist(),
                      groups=train["group_id"].to_pylist(), texts=texts,
                      positive_scores=np.einsum("ij,ij->i", query_vectors, positive_vectors), scores=scores, rows=rows,
                      indexed=len(texts), left_out=left_out)


def select_negatives(pairs: list[Pair], candidates: Candidates, group_of: Mapping[str, str], config: MiningConfig,
                     group_positives: Mapping[str, Iterable[str]] | None = None,
                     ) -> tuple[dict[str, tuple[MinedNegative, ...]], Counter[str]]:
    """Each pair's negatives among its candidates, by `RULES` in order (known positive, same
    group, positive text, near positive, then `config`'s score rule), then `config.skip_top`
    skipped and `config.negatives_per_query` kept (the first, or a seeded sample); and the
    candidates each rule dropped."""
    texts, doc_ids, groups = candidates.texts, candidates.doc_ids, candidates.groups
    row_of = {pair_id: i for i, pair_id in enumerate(candidates.pair_ids)}
    score_rule = SCORE_RULES[config.rule]
    dropped: Counter[str] = Counter()

    @functools.cache
    def document_words(row: int) -> str:
        # Once per document, and only for documents that turn up as candidates.
        return _words(texts[row])

    positives_of: dict[str, set[str]] = {}  # positive group -> its positives' words
    positive_texts: dict[str, set[str]] = {}  # positive group -> its positives
    for group, extra in (group_positives or {}).items():
        positive_texts.setdefault(group, set()).update(extra)
    for pair in pairs:
        positive_texts.setdefault(pair.positive_group, set()).add(pair.positive)
    for group, group_texts in positive_texts.items():
        positives_of[group] = {_words(text) for text in group_texts}
    searched = candidates.rows[[row_of[pair.pair_id] for pair in pairs]]
    near_groups = _near_positive_groups(positive_texts, {row: texts[row] for row in np.unique(searched).tolist()
                                                         if row >= 0})
    mined: dict[str, tuple[MinedNegative, ...]] = {}
    for pair in pairs:
        i = row_of[pair.pair_id]
        own = set(pair.doc_ids)
        own_groups = {group_of[doc_id] for doc_id in pair.doc_ids if doc_id in group_of}
        positives = positives_of[pair.positive_group]
        positive_score = float(candidates.positive_scores[i])
        survivors: list[MinedNegative] = []
        for rank, (score, row) in enumerate(zip(candidates.scores[i].tolist(), candidates.rows[i].tolist()), start=1):
            if doc_ids[row] in own:
                dropped["known-positive"] += 1
            elif groups[row] in own_groups:
                dropped["same-group"] += 1
            elif _overlaps(document_words(row), positives):
                dropped["positive-text"] += 1
            elif pair.positive_group in near_groups.get(row, ()):
                dropped["near-positive"] += 1
            elif config.drops(score, positive_score, rank):
                dropped[score_rule] += 1
            else:
                survivors.append(MinedNegative(pair_id=pair.pair_id, doc_id=doc_ids[row], rank=rank,
                                               score=score, positive_score=positive_score))
        dropped["skip-top"] += min(config.skip_top, len(survivors))
        mined[pair.pair_id] = kept_negatives(survivors[config.skip_top:], config, pair.pair_id)
    return {pair_id: mined[pair_id] for pair_id in sorted(mined)}, dropped


def kept_negatives(pool: list[MinedNegative], config: MiningConfig, pair_id: str) -> tuple[MinedNegative, ...]:
    """A pair's `config.negatives_per_query` negatives from the survivors `pool` (rank order):
    the first, or with `config.sample_seed` a sample without replacement drawn by a generator
    seeded with the seed and the pair's id (so one pair's draw does not depend on which other
    pairs are mined), kept in rank order."""
    quota = config.negatives_per_query
    if config.sample_seed is None or len(pool) <= quota:
        return tuple(pool[:quota])
    pair_key = int.from_bytes(hashlib.sha256(pair_id.encode()).digest()[:8], "big")
    chosen = np.random.default_rng([config.sample_seed, pair_key]).choice(len(pool), size=quota, replace=False)
    return tuple(pool[i] for i in sorted(chosen.tolist()))


def exact_search(doc_vectors: np.ndarray, query_vectors: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Mining's search, in one process: `search_blocks` over every block of `query_blocks`."""
    return search_blocks(doc_vectors, query_vectors, top_k, query_blocks(len(query_vectors)))


# ---------------------------------------------------------------------------------------------
# Given negatives (a user's own pairs)

GIVEN_FORMAT = "embedlab-given-negatives/3"  # 2: the encoding in the identity; 3: the text rules
GIVEN_RULE = "false-negative-margin"
GIVEN_RULES = ("positive-text", "near-positive", GIVEN_RULE)


@dataclass(frozen=True)
class GivenPair:
    """A pair with the negatives its source gave, in the source's order."""

    pair_id: str
    query: str
    positive: str
    negatives: tuple[str, ...]


def given_doc_id(pair_id: str, index: int) -> str:
    """The id a pair's `index`-th given negative goes by (its group in the loss, its audit id)."""
    return f"{pair_id}:negative:{index}"


def screen_given_negatives(
    pairs: list[GivenPair], encode: Callable[[list[str]], np.ndarray] | None, *, margin: float | None,
    encode_query: Callable[[list[str]], np.ndarray] | None = None,
) -> tuple[pa.Table, dict[str, Any]]:
    """The given negatives that pass the text rules and the false-negative margin under
    `encode` (`encode_query`, default `encode`, for queries), as a table of `NEGATIVE_SCHEMA`
    (rank: the place in the source's list, from 1), and the counts.

    The mining rules, applied to texts the user labelled as negatives. positive-text and
    near-positive (as in mining, against the pair's own positive) always apply: a copy of
    the positive, verbatim or edited, is no negative whatever the user's file says. Then a
    negative scoring above sim(query, positive) - `margin` is too close to the positive to
    trust. Each drop is counted under its rule. `margin` None applies the text rules only,
    unscored (`encode` is not called).
    """
    rows: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    given = [(row, i, text) for row, pair in enumerate(pairs) for i, text in enumerate(pair.negatives)]
    near = _near_positive_groups({str(row): [pair.positive] for row, pair in enumerate(pairs)},
                                 {k: text for k, (_, _, text) in enumerate(given)})
    copies: dict[int, str] = {}  # given negative -> the text rule that drops it
    for k, (row, _, text) in enumerate(given):
        if _overlaps(_words(text), [_words(pairs[row].positive)]):
            copies[k] = "positive-text"
        elif str(row) in near.get(k, ()):
            copies[k] = "near-positive"
    owners = np.array([row for row, _, _ in given], dtype=np.int64)
    positive_scores, scores = np.full(len(pairs), np.nan), np.full(len(given), np.nan)
    if given and margin is not None:
        if encode is None:
            raise ValueError("screening given negatives needs an encoder")
        queries = _unit_rows((encode_query or encode)([p.query for p in pairs]), len(pairs), "queries")
        positives = _unit_rows(encode([p.positive for p in pairs]), len(pairs), "positives")
        negatives = _unit_rows(encode([text for _, _, text in given]), len(given), "given negatives")
        positive_scores = np.einsum("ij,ij->i", queries, positives)
        scores = np.einsum("ij,ij->i", queries[owners], negatives)
    for k, ((row, index, text), score) in enumerate(zip(given, scores.tolist())):
        pair, positive_score = pairs[row], float(positive_scores[row])
        if k in copies:
            dropped[copies[k]] += 1
            continue
        if margin is not None and score > positive_score - margin:
            dropped[GIVEN_RULE] += 1
            continue
        rows.append({"pair_id": pair.pair_id, "doc_id": given_doc_id(pair.pair_id, index), "rank": index + 1,
                     "score": score, "positive_score": positive_score, "query": pair.query,
                     "positive": pair.positive, "negative": text})
    counts = {
        "pairs": len(pairs),
        "pairs_with_given": sum(1 for pair in pairs if pair.negatives),
        "given": len(given),
        "kept": len(rows),
        "dropped": {rule: dropped[rule] for rule in GIVEN_RULES},
        "margin": margin,
    }
    return pa.Table.from_pylist(rows, schema=NEGATIVE_SCHEMA), counts
