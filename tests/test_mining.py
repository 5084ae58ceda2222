"""Tests for embedlab.negatives.mining: hard negatives mined from real built-in text with a toy encoder."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import numpy as np
import pyarrow as pa
import pytest

from embedlab.negatives.mining import DEV_TEST_ROW, MinedSet, MiningConfig, RULES, document_text, mine_hard_negatives
from embedlab.pairs.builders import Pair, build_pairs
from embedlab.sources.builtin import iter_documents

DIM = 64
# Larger than the corpus, with a quota as large, so every training document is a candidate
# for every query and every one that survives the rules is mined: a planted document is
# then mined exactly when no rule drops it.
EVERYTHING = MiningConfig(top_k=1000, negatives_per_query=1000, false_negative_margin=0.0)
GAP = 0.01  # planted near-copies score this much (or a little more) below the positive
SCHEMA = pa.schema([(c, pa.string()) for c in ("doc_id", "source", "title", "text", "hash", "group_id", "split")])


def encode(texts: list[str]) -> np.ndarray:
    """Bag of lower-cased words, each hashed (stably, unlike hash()) into one of DIM slots, L2-normalised."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            out[i, int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big") % DIM] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def similarity(a: str, b: str) -> float:
    first, second = encode([a, b])
    return float(first @ second)


def row(doc_id: str, text: str, *, split: str = "train", group: str | None = None, title: str = "") -> dict:
    return {"doc_id": doc_id, "source": "planted", "title": title, "text": text, "hash": "",
            "group_id": group or doc_id, "split": split}


@pytest.fixture(scope="module")
def base() -> list[dict]:
    """Real docstrings and Python topic help; every tenth document dev, another tenth test."""
    documents = [*iter_documents("python-docstrings", limit=300), *iter_documents("python-docs", limit=60)]
    splits = {3: "dev", 7: "test"}
    return [
        {"doc_id": d.doc_id, "source": d.source, "title": d.title, "text": d.text, "hash": d.hash,
         "group_id": d.doc_id, "split": splits.get(i % 10, "train")}
        for i, d in enumerate(documents)
    ]


@pytest.fixture(scope="module")
def pairs(base) -> list[Pair]:
    """Title -> body pairs of the training documents."""
    return build_pairs(pa.Table.from_pylist(base, schema=SCHEMA), ["title-body"], split="train", seed=0)


@pytest.fixture(scope="module")
def target(pairs) -> Pair:
    """The pair whose query is closest to its positive, among positives of 40+ words (room to plant around)."""
    return max((p for p in pairs if len(p.positive.split()) >= 40), key=lambda p: similarity(p.query, p.positive))


@pytest.fixture(scope="module")
def filler(base, target) -> list[str]:
    """Words of the training document least like the target's query, to dilute planted copies."""
    train = [r for r in base if r["split"] == "train"]
    return min(train, key=lambda r: similarity(target.query, r["text"]))["text"].split()


def near_copy(pair: Pair, filler: list[str], *, in_order: bool) -> str:
    """The positive's words (in order, or reversed so it no longer contains the positive) plus just enough
    filler to score at least GAP below the positive. Both orders have the same words, so the same score."""
    words = pair.positive.split()
    words = words if in_order else words[::-1]
    ceiling = similarity(pair.query, pair.positive) - GAP
    for n in range(len(filler) + 1):
        text = " ".join(words + filler[:n])
        if similarity(pair.query, text) < ceiling:
            return text
    raise AssertionError("the filler cannot dilute the copy enough")


def mine(pairs: list[Pair], rows: list[dict], config: MiningConfig = EVERYTHING, **identity: str) -> MinedSet:
    identity = {"encoder_id": "toy-bow-64", "corpus_revision": "test-corpus", **identity}
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    return mine_hard_negatives(pairs, table, encode, config=config, progress=lambda message: None, **identity)


def mined_ids(mined: MinedSet, pair: Pair) -> list[str]:
    return [n.doc_id for n in mined.negatives[pair.pair_id]]


def test_negatives_never_break_an_exclusion_rule(base, pairs, target, filler):
    """Over every pair, with every planted case present, no negative is a positive, group member, dev/test or copy."""
    own_doc = target.doc_ids[0]
    strong = mined_ids(mine([target], base), target)[0]
    strong_text = next(r["text"] for r in base if r["doc_id"] == strong)
    rows = [
        *base,
        row("planted:group", near_copy(target, filler, in_order=False), group=own_doc),
        row("planted:contains", near_copy(target, filler, in_order=True)),
        row("planted:dev", strong_text, split="dev"),
        row("planted:test", strong_text, split="test"),
    ]
    mined = mine(pairs, rows, MiningConfig(top_k=50, negatives_per_query=4, false_negative_margin=0.0))
    by_id = {r["doc_id"]: r for r in rows}
    assert mined.counts["negatives"] > 0
    for pair in pairs:
        groups = {by_id[d]["group_id"] for d in pair.doc_ids}
        positive = " ".join(re.findall(r"\w+", pair.positive.lower()))
        for negative in mined.negatives[pair.pair_id]:
            document = by_id[negative.doc_id]
            assert negative.doc_id not in pair.doc_ids
            assert document["group_id"] not in groups
            assert document["split"] == "train"
            words = re.findall(r"\w+", document_text(document["title"], document["text"]).lower())
            assert positive not in " ".join(words)
            assert negative.score <= negative.positive_score


def test_known_positive_is_never_a_negative(base, target):
    """The pair's own document is a candidate (the whole pool is searched) but is dropped as a known positive."""
    mined = mine([target], base)
    assert target.doc_ids[0] not in mined_ids(mined, target)
    assert mined.counts["dropped"]["known-positive"] == 1


def test_near_duplicate_in_the_positive_group_is_excluded(base, target, filler):
    """A near-copy of the positive in its document's group is dropped; the same text in its own group is mined."""
    text = near_copy(target, filler, in_order=False)
    grouped = mine([target], [*base, row("planted:near", text, group=target.doc_ids[0])])
    assert "planted:near" not in mined_ids(grouped, target)
    assert grouped.counts["dropped"]["same-group"] == 1
    alone = mine([target], [*base, row("planted:near", text)])
    assert "planted:near" in mined_ids(alone, target)


def test_document_containing_the_positive_is_excluded(base, target, filler):
    """A document quoting the positive verbatim is dropped; the same words reversed (same score) are mined."""
    quoting = mine([target], [*base, row("planted:quote", near_copy(target, filler, in_order=True))])
    assert "planted:quote" not in mined_ids(quoting, target)
    assert quoting.counts["dropped"]["positive-text"] == 1
    reversed_ = mine([target], [*base, row("planted:quote", near_copy(target, filler, in_order=False))])
    assert "planted:quote" in mined_ids(reversed_, target)


def test_dev_and_test_documents_never_become_negatives(base, target):
    """Dev and test copies of the strongest training candidate are never indexed, while the original is mined."""
    strong = mined_ids(mine([target], base), target)[0]
    text = next(r["text"] for r in base if r["doc_id"] == strong)
    mined = mine([target], [*base, row("planted:dev", text, split="dev"), row("planted:test", text, split="test")])
    assert mined_ids(mined, target)[0] == strong
    assert not {"planted:dev", "planted:test"} & set(mined_ids(mined, target))
    assert mined.counts["dev_test_documents_left_out"] == sum(r["split"] != "train" for r in base) + 2


def test_margin_drops_candidates_scoring_close_to_the_positive(base, target, filler):
    """A candidate scoring within the margin below the positive is dropped at margin 0.05 and mined at margin 0."""
    text = near_copy(target, filler, in_order=False)
    positive_score = similarity(target.query, target.positive)
    assert positive_score - 0.05 < similarity(target.query, text) < positive_score - GAP
    rows = [*base, row("planted:close", text)]
    strict = mine([target], rows, dataclasses.replace(EVERYTHING, false_negative_margin=0.05))
    assert "planted:close" not in mined_ids(strict, target)
    assert all(n.score <= n.positive_score - 0.05 for n in strict.negatives[target.pair_id])
    loose = mine([target], rows)
    assert "planted:close" in mined_ids(loose, target)
    assert strict.counts["dropped"]["false-negative-margin"] > loose.counts["dropped"]["false-negative-margin"]


def test_skip_top_skips_the_closest_survivors(base, target):
    """skip_top=2 leaves out the two best candidates that survive the rules and keeps the next ones, best first."""
    config = MiningConfig(top_k=100, negatives_per_query=5, false_negative_margin=0.0)
    plain = mine([target], base, dataclasses.replace(config, negatives_per_query=7))
    skipped = mine([target], base, dataclasses.replace(config, skip_top=2))
    assert skipped.negatives[target.pair_id] == plain.negatives[target.pair_id][2:]
    assert skipped.counts["dropped"]["skip-top"] == 2
    ranks = [n.rank for n in skipped.negatives[target.pair_id]]
    assert ranks == sorted(ranks)


def test_version_is_stable_and_changes_with_encoder_corpus_config_or_pairs(base, pairs):
    """Re-mining the same inputs, in any pair order, keeps the version; another encoder, corpus,
    config, pair set, or pair text under the same ids changes it."""
    config = MiningConfig(top_k=20)
    first = mine(pairs, base, config)
    again = mine(pairs[::-1], base, config)
    assert again.version == first.version and again.negatives == first.negatives
    others = [
        mine(pairs, base, config, encoder_id="toy-bow-64-v2"),
        mine(pairs, base, config, corpus_revision="test-corpus-2"),
        mine(pairs, base, dataclasses.replace(config, false_negative_margin=0.1)),
        mine(pairs, base, dataclasses.replace(config, skip_top=1)),
        mine(pairs[1:], base, config),
        # The same pair ids with an edited positive (a user's file changed under its ids).
        mine([dataclasses.replace(pairs[0], positive=pairs[0].positive + " (revised)"), *pairs[1:]], base, config),
    ]
    versions = {first.version, *(other.version for other in others)}
    assert len(versions) == len(others) + 1


def test_save_load_round_trip(base, pairs, tmp_path):
    """save then load gives an equal set and table; a manifest edited after saving is refused."""
    mined = mine(pairs, base, MiningConfig(top_k=30, negatives_per_query=3))
    assert any(not found for found in mined.negatives.values())  # pairs without negatives survive the trip too
    mined.save(tmp_path / "mined")
    loaded = MinedSet.load(tmp_path / "mined")
    assert loaded == mined
    assert loaded.to_table().equals(mined.to_table())
    manifest_path = tmp_path / "mined" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["version"] == mined.version and manifest["counts"] == mined.counts
    manifest_path.write_text(json.dumps({**manifest, "encoder_id": "another"}))
    with pytest.raises(ValueError, match="does not match"):
        MinedSet.load(tmp_path / "mined")


def test_table_has_one_row_per_negative_with_texts(base, pairs):
    """to_table: one row per negative, carrying the query, positive and negative texts for review and training."""
    mined = mine(pairs, base, MiningConfig(top_k=30, negatives_per_query=3))
    table = mined.to_table()
    assert table.num_rows == mined.counts["negatives"]
    first = table.slice(0, 1).to_pylist()[0]
    by_pair = {p.pair_id: p for p in pairs}
    assert (first["query"], first["positive"]) == (by_pair[first["pair_id"]].query, by_pair[first["pair_id"]].positive)
    assert first["negative"] == mined.documents[first["doc_id"]]


def test_report_shows_counts_and_examples(base, pairs):
    """The report lists queries, negatives, the per-query distribution, every rule's drops and example triples."""
    mined = mine(pairs, base, MiningConfig(top_k=30, negatives_per_query=3))
    report = mined.report(examples=2)
    counts = mined.counts
    assert f"| queries mined | {counts['queries']} |" in report
    assert f"| negatives | {counts['negatives']} |" in report
    assert f"| {DEV_TEST_ROW} | {counts['dev_test_documents_left_out']} |" in report
    for n, queries in counts["negatives_per_query"].items():
        assert f"| {n} | {queries} |" in report
    for rule in RULES:
        assert f"| {rule} | {counts['dropped'][rule]} |" in report
    assert report.count("- query: ") == 2 and "- negative `" in report


def test_invalid_config_and_inputs_are_refused(base, pairs):
    """Impossible configs, unknown pair documents and repeated pair ids are ValueErrors."""
    with pytest.raises(ValueError, match="skip_top"):
        MiningConfig(top_k=5, negatives_per_query=4, skip_top=2)
    with pytest.raises(ValueError, match="false_negative_margin"):
        MiningConfig(false_negative_margin=-0.1)
    stranger = dataclasses.replace(pairs[0], pair_id="stranger", doc_ids=("nowhere:1",))
    with pytest.raises(ValueError, match="not in the corpus"):
        mine([stranger], base)
    with pytest.raises(ValueError, match="more than once"):
        mine([pairs[0], pairs[0]], base)


def test_a_pair_short_of_mined_negatives_masks_the_missing_ones(tmp_path):
    """A pair with one of two mined negatives gets it once and an empty (masked) slot, never
    its last negative repeated; a pair with none gets two empty slots."""
    import pyarrow.parquet as pq
    import synthetic

    from embedlab.streams.pair_stream import group_hash, tokenize_pair_window

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    pq.write_table(pa.table({"pair_id": ["p1", "p2"], "query": ["a fox", "a dog"], "positive": ["fox text", "dog text"],
                             "positive_group": ["g1", "g2"]}), tmp_path / "pairs.parquet")
    pq.write_table(pa.table({"pair_id": ["p1"], "doc_id": ["d9"], "rank": pa.array([0], pa.int32()),
                             "negative": ["the lazy dog"]}), tmp_path / "negatives.parquet")
    out = tokenize_pair_window(
        {"rows": [np.array([0, 1])], "source_index": [np.array([0, 0])]},
        pairs_path=str(tmp_path / "pairs.parquet"), tokenizer_path=str(frozen.path), length=12,
        query_prefix="", passage_prefix="", negatives_path=str(tmp_path / "negatives.parquet"), negatives_per_pair=2)
    assert out["negative_len"][0, 0] > 0 and out["negative_len"][0, 1] == 0
    assert out["negative_group"].tolist() == [[group_hash("d9"), 0], [0, 0]]
    assert out["negative_len"][1].tolist() == [0, 0]
    texts = [(out[side] != frozen.pad_id).sum(axis=1) for side in ("query_ids", "positive_ids")]
    assert out["tokens"].tolist() == (texts[0] + texts[1] + out["negative_len"][:, 0]).tolist()


@pytest.fixture(scope="module")
def long_target(pairs) -> Pair:
    """The pair whose query is closest to its positive among positives of 60+ words: one word
    changed leaves a 5-gram Jaccard of at least (60 - 9) / (60 + 1) > 0.8."""
    return max((p for p in pairs if len(p.positive.split()) >= 60), key=lambda p: similarity(p.query, p.positive))


def _edited_copy(pair: Pair) -> str:
    """The positive with one of its words that the query shares replaced: no longer containing
    the positive, scoring below it under the toy encoder, and a near-duplicate of it."""
    words = pair.positive.split()
    query_words = set(re.findall(r"[a-z0-9]+", pair.query.lower()))
    for k in range(len(words) // 3, len(words)):
        if set(re.findall(r"[a-z0-9]+", words[k].lower())) & query_words:
            edited = " ".join([*words[:k], "zzyzx", *words[k + 1:]])
            if similarity(pair.query, edited) < similarity(pair.query, pair.positive):
                return edited
    raise AssertionError("no query word to replace in the positive's second two thirds")


def test_an_edited_copy_of_the_positive_is_dropped_as_near_positive(base, long_target):
    """One word changed: containment misses it and its score is under the positive's (the margin,
    0 here, passes it), but the dedup matcher finds it; the same words reversed (same score, no
    shared 5-gram) are mined, so it is the near-duplicate rule that drops the copy."""
    from embedlab.sources.dedup import NearDuplicateIndex

    edited = _edited_copy(long_target)
    index = NearDuplicateIndex(0.8)
    index.add(["positive"], [long_target.positive])
    assert index.query(edited) and not index.query(" ".join(edited.split()[::-1]))
    near = mine([long_target], [*base, row("planted:edited", edited)])
    assert "planted:edited" not in mined_ids(near, long_target)
    assert near.counts["dropped"]["near-positive"] == 1
    reversed_ = mine([long_target], [*base, row("planted:edited", " ".join(edited.split()[::-1]))])
    assert "planted:edited" in mined_ids(reversed_, long_target)


def test_an_edited_copy_of_a_user_positive_is_dropped_too(base, long_target):
    """A user's own pair (no corpus document: known-positive and same-group cannot apply) gets
    the near-positive rule all the same."""
    own = dataclasses.replace(long_target, pair_id="mine:1", doc_ids=("mine:1:positive",), builder="user-pairs",
                              positive_group="mine:1")
    mined = mine_hard_negatives([own], pa.Table.from_pylist([*base, row("planted:edited", _edited_copy(long_target))],
                                                            schema=SCHEMA),
                                encode, config=EVERYTHING, progress=lambda message: None, encoder_id="toy",
                                corpus_revision="test", outside_corpus=frozenset({"mine:1"}))
    assert "planted:edited" not in mined_ids(mined, own)
    assert mined.counts["dropped"]["near-positive"] == 1


def test_queries_are_encoded_with_the_query_encoder_and_documents_with_the_passage_one(base, pairs):
    """With `encode_query`, every score is encode_query(query) . encode(document): a prefix the
    parent was trained with reaches its queries only, as in evaluation."""
    prefixed = lambda texts: encode([f"query: search for {t}" for t in texts])  # noqa: E731
    some = pairs[:5]
    table = pa.Table.from_pylist(base, schema=SCHEMA)
    mined = mine_hard_negatives(some, table, encode, encode_query=prefixed, config=EVERYTHING,
                                progress=lambda message: None, encoder_id="toy", corpus_revision="test")
    text_of = {r["doc_id"]: document_text(r["title"], r["text"]) for r in base}
    for pair in some:
        query = prefixed([pair.query])[0]
        for negative in mined.negatives[pair.pair_id][:5]:
            assert negative.score == pytest.approx(float(query @ encode([text_of[negative.doc_id]])[0]), abs=1e-6)
        assert mined.negatives[pair.pair_id][0].positive_score == pytest.approx(
            float(query @ encode([pair.positive])[0]), abs=1e-6)


def test_given_negatives_that_copy_the_positive_are_dropped_by_the_text_rules(long_target, base):
    """A user's file that lists the positive (re-punctuated) or an edited copy of it as a
    negative: both dropped, each under its rule, with no encoder and no margin; a real
    negative is kept."""
    from embedlab.negatives.mining import GivenPair, screen_given_negatives

    other = next(r["text"] for r in base if r["split"] == "train" and r["doc_id"] not in long_target.doc_ids)
    quoted = f"“{long_target.positive.upper()}”"
    given = GivenPair("mine:1", long_target.query, long_target.positive, (quoted, _edited_copy(long_target), other))
    table, counts = screen_given_negatives([given], None, margin=None)
    assert table["negative"].to_pylist() == [other] and table["rank"].to_pylist() == [3]
    assert counts["dropped"] == {"positive-text": 1, "near-positive": 1, "false-negative-margin": 0}


def test_the_parent_encoder_of_mining_encodes_as_evaluation_does(tmp_path):
    """Mining's parent encoder (`phase3_negatives._parent_encoder`) gives queries the query
    prefix and passages the passage prefix the parent was trained with, read by the one rule
    evaluation reads them by (`checkpoint_eval.checkpoint_prefixes`); its identity records them."""
    import torch

    import synthetic
    from conftest import tiny_trial
    from embedlab.checkpoints.io import load_encoder, save_checkpoint
    from embedlab.core.config import ContrastiveConfig
    from embedlab.checkpoints.io import checkpoint_prefixes
    from embedlab.model.encode import encode_texts
    from embedlab.model.encoder import MLMModel
    from embedlab.negatives.phase3 import _parent_encoder, _parent_identity

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    torch.manual_seed(3)
    prefixes = {"query": "query: ", "passage": "passage: "}
    save_checkpoint(tmp_path / "parent", MLMModel(synthetic.MODEL).encoder, head=None, tokenizer=frozen,
                    fields={"phase": 2}, pooling="cls", prefixes=prefixes)
    trial = dataclasses.replace(tiny_trial(), phase=3, parent=str(tmp_path / "parent"),
                                contrastive=ContrastiveConfig(pair_length=32))
    parent = _parent_encoder(trial, lambda message: None, "test")
    encoder, tokenizer, manifest = load_encoder(tmp_path / "parent")
    assert checkpoint_prefixes(manifest) == prefixes
    texts = ["Return the absolute value of a number.", "Open a file and return a stream."]

    def evaluation(prefix: str) -> np.ndarray:
        return encode_texts(encoder, tokenizer, texts, max_length=32, pooling="cls", prefix=prefix)

    assert np.array_equal(parent.encode_query(texts), evaluation("query: "))
    assert np.array_equal(parent.encode(texts), evaluation("passage: "))
    assert not np.allclose(parent.encode_query(texts), evaluation(""))
    assert _parent_identity(trial)[1]["prefixes"] == prefixes
