"""Rules as study arms: negatives selected from one stored search by a declared rule (absolute
margin, relative to the positive, rank window; top or sampled), on real built-in text with a toy
encoder; the false-negative sample and its judge; the configs that declare them."""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np
import pyarrow as pa
import pytest

from embedlab.negatives.candidates import load_candidates, save_candidates
from embedlab.negatives.mining import (
    RULES, MiningConfig, checked_inputs, mine_hard_negatives, search_candidates, selected_set,
)
from embedlab.pairs.builders import Pair, build_pairs
from embedlab.sources.builtin import iter_documents

from test_mining import SCHEMA, encode  # the toy bag-of-words encoder and corpus schema

TOP_K = 60
QUIET = {"progress": lambda message: None}
IDENTITY = {"encoder_id": "toy-bow-64", "corpus_revision": "test-corpus"}
# Every rule and choice a study can declare, each with the quota the tests keep.
RULE_CONFIGS = {
    "margin": MiningConfig(top_k=TOP_K, negatives_per_query=3, false_negative_margin=0.05),
    "margin-skip-2": MiningConfig(top_k=TOP_K, negatives_per_query=3, false_negative_margin=0.05, skip_top=2),
    "relative": MiningConfig(top_k=TOP_K, negatives_per_query=3, rule="relative", relative_fraction=0.95),
    "window": MiningConfig(top_k=TOP_K, negatives_per_query=3, rule="window", window=(5, 40)),
    "margin-sampled": MiningConfig(top_k=TOP_K, negatives_per_query=3, sample_seed=11),
    "relative-sampled": MiningConfig(top_k=TOP_K, negatives_per_query=3, rule="relative", relative_fraction=0.9,
                                     sample_seed=11),
    "window-sampled": MiningConfig(top_k=TOP_K, negatives_per_query=3, rule="window", window=(2, 30),
                                   sample_seed=11),
}


@pytest.fixture(scope="module")
def corpus() -> pa.Table:
    """Real docstrings and Python topic help; every tenth document dev, another tenth test."""
    documents = [*iter_documents("python-docstrings", limit=300), *iter_documents("python-docs", limit=60)]
    return pa.Table.from_pylist([
        {"doc_id": d.doc_id, "source": d.source, "title": d.title, "text": d.text, "hash": d.hash,
         "group_id": d.doc_id, "split": {3: "dev", 7: "test"}.get(i % 10, "train")}
        for i, d in enumerate(documents)], schema=SCHEMA)


@pytest.fixture(scope="module")
def pairs(corpus) -> list[Pair]:
    return build_pairs(corpus, ["title-body"], split="train", seed=0)


@pytest.fixture(scope="module")
def stored(corpus, pairs, tmp_path_factory):
    """One search of every pair's top TOP_K, saved and read back as a rule reads it."""
    group_of, train = checked_inputs(pairs, corpus, frozenset())
    found = search_candidates(pairs, corpus, train, encode, top_k=TOP_K, encoder_id="toy-bow-64", **QUIET)
    directory = save_candidates(tmp_path_factory.mktemp("candidates") / "set", found, {"test": True}, {"flops": 0.0})
    return group_of, load_candidates(directory)


def select(pairs, stored, config: MiningConfig):
    group_of, candidates = stored
    return selected_set(pairs, candidates, group_of, config=config, **IDENTITY, **QUIET)


@pytest.mark.parametrize("name", RULE_CONFIGS)
def test_selecting_by_a_rule_from_stored_candidates_equals_mining_with_it_from_scratch(corpus, pairs, stored, name):
    """Every rule, top or sampled: the set selected from the stored search (saved, read back)
    has the negatives, counts and version of the set mined with that rule from scratch."""
    config = RULE_CONFIGS[name]
    fresh = mine_hard_negatives(pairs, corpus, encode, config=config, **IDENTITY, **QUIET)
    chosen = select(pairs, stored, config)
    assert chosen.negatives == fresh.negatives and chosen.counts == fresh.counts
    assert chosen.version == fresh.version and chosen.to_table().equals(fresh.to_table())
    assert fresh.counts["negatives"] > 0


def _text_survivors(pairs, stored):
    """Every candidate no text rule drops (known positive, same group, positive text, near
    positive): a window over all ranks is no score rule, and a quota of TOP_K keeps them all."""
    everything = MiningConfig(top_k=TOP_K, negatives_per_query=TOP_K, rule="window", window=(1, TOP_K))
    return select(pairs, stored, everything)


@pytest.mark.parametrize("name", ["margin", "relative", "window"])
def test_each_score_rule_keeps_exactly_the_candidates_its_formula_keeps(pairs, stored, name):
    """Oracle: among the text rules' survivors, the rule keeps those its formula passes (score <=
    positive - margin; score <= fraction x positive; first <= rank <= last), the first three in
    rank order, and counts the rest under its own reason, every other reason unchanged."""
    config = RULE_CONFIGS[name]
    passes = {"margin": lambda n: n.score <= n.positive_score - config.false_negative_margin,
              "relative": lambda n: n.score <= config.relative_fraction * n.positive_score,
              "window": lambda n: config.window[0] <= n.rank <= config.window[1]}[name]
    survivors = _text_survivors(pairs, stored)
    chosen = select(pairs, stored, config)
    kept = {pair_id: tuple(n for n in found if passes(n))[:3] for pair_id, found in survivors.negatives.items()}
    assert chosen.negatives == kept
    reason = {"margin": "false-negative-margin", "relative": "false-negative-relative", "window": "outside-window"}[name]
    failing = sum(not passes(n) for found in survivors.negatives.values() for n in found)
    assert chosen.counts["dropped"][reason] == failing > 0
    for rule in RULES:
        if rule not in (reason, "outside-window"):
            assert chosen.counts["dropped"][rule] == survivors.counts["dropped"][rule]


def test_skip_top_applies_after_any_rule(pairs, stored):
    """skip_top=2 under the relative rule keeps the relative rule's survivors from the third on."""
    relative = dataclasses.replace(RULE_CONFIGS["relative"], negatives_per_query=5)
    skipped = select(pairs, stored, dataclasses.replace(relative, negatives_per_query=3, skip_top=2))
    plain = select(pairs, stored, relative)
    assert skipped.negatives == {p: found[2:5] for p, found in plain.negatives.items()}
    assert skipped.counts["dropped"]["skip-top"] == sum(min(2, len(found)) for found in
                                                        select(pairs, stored, dataclasses.replace(
                                                            relative, negatives_per_query=TOP_K - 2)).negatives.values())


def test_a_sampled_rule_draws_a_fixed_seeded_sample_of_the_survivors(pairs, stored):
    """sample_seed draws each pair's negatives from its survivors without replacement, in rank
    order: the same seed gives the same draws, whatever other pairs are mined; another seed
    other draws; the survivors and drop counts are the top rule's."""
    config = RULE_CONFIGS["margin-sampled"]
    top = select(pairs, stored, dataclasses.replace(config, sample_seed=None, negatives_per_query=TOP_K))
    drawn = select(pairs, stored, config)
    assert drawn.counts["dropped"] == select(pairs, stored, RULE_CONFIGS["margin"]).counts["dropped"]
    for pair_id, found in drawn.negatives.items():
        pool = top.negatives[pair_id]
        assert set(found) <= set(pool) and len(found) == min(3, len(pool))
        assert [n.rank for n in found] == sorted(n.rank for n in found)
    assert any(found != top.negatives[p][:3] for p, found in drawn.negatives.items())  # not the first three
    half = pairs[::2]
    alone = select(half, stored, config)
    assert all(alone.negatives[p.pair_id] == drawn.negatives[p.pair_id] for p in half)
    other = select(pairs, stored, dataclasses.replace(config, sample_seed=12))
    assert other.negatives != drawn.negatives and other.version != drawn.version


def test_each_rule_is_its_own_mined_set_version(pairs, stored):
    """Rules, their parameters and sampling are part of what decides a set: every config a new version."""
    versions = {select(pairs, stored, config).version for config in RULE_CONFIGS.values()}
    assert len(versions) == len(RULE_CONFIGS)


def test_the_mining_config_refuses_a_rule_it_cannot_apply():
    """Unknown rules, windows without their rule (or with another), windows outside top_k and
    fractions outside (0, 1] are ValueErrors naming the field."""
    for bad, field in (({"rule": "nearest"}, "rule"), ({"window": (1, 5)}, "window"),
                       ({"rule": "window"}, "window"), ({"rule": "window", "window": (0, 5)}, "window"),
                       ({"rule": "window", "window": (9, 3)}, "window"),
                       ({"rule": "window", "window": (1, 99)}, "window"), ({"relative_fraction": 0.0}, "relative_fraction"),
                       ({"relative_fraction": 1.5}, "relative_fraction")):
        with pytest.raises(ValueError, match=f"MiningConfig.{field}"):
            MiningConfig(top_k=50, **bad)
    assert MiningConfig(top_k=50, rule="window", window=[3, 9]).window == (3, 9)  # JSON's list, as a tuple


def test_negatives_config_declares_the_rule_and_names_the_field_it_refuses():
    """NegativesConfig: each bad value is a ConfigError naming its field and what is valid; a
    window from JSON (a list) reads back as the tuple; a derived arm validates again."""
    from embedlab import recipes
    from embedlab.core.config import NegativesConfig, TrialConfig
    from embedlab.core.errors import ConfigError

    bad = (({"rule": "nearest"}, "contrastive.negatives.rule: 'nearest'; valid: ['margin', 'relative', 'window']"),
           ({"window": (1, 5)}, "contrastive.negatives.window"), ({"rule": "window"}, "contrastive.negatives.window"),
           ({"rule": "window", "window": (5, 500)}, "contrastive.negatives.window"),
           ({"relative_fraction": 1.2}, "contrastive.negatives.relative_fraction"),
           ({"skip_top": 99}, "contrastive.negatives.skip_top"), ({"skip_top": -1}, "contrastive.negatives.skip_top"),
           ({"mining_workers": 0}, "contrastive.negatives.mining_workers"),
           ({"false_negative_sample": -1}, "contrastive.negatives.false_negative_sample"))
    for fields, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            NegativesConfig(count=2, **fields)
    base = recipes.phase3_baseline("demo")
    window = recipes.derive(base, {"contrastive.negatives.rule": "window", "contrastive.negatives.window": [11, 100]})
    assert window.contrastive.negatives.window == (11, 100)
    assert TrialConfig.from_dict(window.to_dict()) == window
    with pytest.raises(ConfigError, match="contrastive.negatives.window"):
        recipes.derive(base, {"contrastive.negatives.rule": "window"})
    assert NegativesConfig().rule == "margin" and not NegativesConfig().sample  # the default: today's rule, top


def test_the_false_negative_sample_is_fixed_by_its_seed(pairs, stored):
    """negative_sample: the same set and seed give the same rows, whatever order the file holds
    them in; another seed other rows; a sample larger than the set is the whole set."""
    from embedlab.negatives.false_negatives import negative_sample

    table = select(pairs, stored, RULE_CONFIGS["margin"]).to_table()
    assert table.num_rows > 40
    first = negative_sample(table, 20, seed=3)
    shuffled = table.take(np.random.default_rng(0).permutation(table.num_rows))
    assert negative_sample(shuffled, 20, seed=3).equals(first) and first.num_rows == 20
    assert not negative_sample(table, 20, seed=4).equals(first)
    keys = list(zip(first["pair_id"].to_pylist(), first["rank"].to_pylist()))
    assert keys == sorted(keys) and len(set(keys)) == 20
    assert negative_sample(table, 10_000).num_rows == table.num_rows


def test_same_group_marks_negatives_from_the_pairs_own_page_or_cluster():
    """A negative sharing the split group (page, module) or the near-duplicate cluster of one of
    its pair's documents is marked; one from elsewhere is not; a pair with no corpus document
    (a user's own) has no mark."""
    from embedlab.negatives.false_negatives import same_group

    groups = {"d1": ("d1", "page-a"), "d2": ("d2", "page-a"), "d3": ("d1", "page-b"), "d4": ("d4", "page-c")}
    sample = pa.table({"pair_id": ["p", "p", "p", "user:1"], "doc_id": ["d2", "d3", "d4", "d4"]})
    assert same_group(sample, {"p": ["d1"], "user:1": ["user:1:positive"]}, groups) == [True, True, False, None]


def test_the_teacher_judges_a_copy_of_the_positive_a_false_negative():
    """The judge (all-MiniLM-L6-v2, real weights from its package) scores each sampled negative
    and its positive against the query: a negative that repeats the positive scores equal, so it
    is judged false; an unrelated one scores below the positive and is not."""
    from embedlab.teacher.false_negatives import JUDGE, judge_negatives, rates
    from embedlab.teacher.labels import load_teacher

    query = "How do I open a file for reading?"
    positive = "open(file, mode='r') opens a file and returns a file object for reading."
    sample = pa.table({"pair_id": ["p1", "p1"], "query": [query] * 2, "positive": [positive] * 2,
                       "negative": [positive, "The Fibonacci numbers grow exponentially."]})
    judged = judge_negatives(load_teacher(JUDGE).encode, sample)
    assert judged["teacher_false_negative"].to_pylist() == [True, False]
    scores = judged["teacher_negative"].to_pylist()
    assert scores[0] == pytest.approx(judged["teacher_positive"].to_pylist()[0], abs=1e-6) and scores[1] < scores[0]
    found = rates(judged.append_column("same_group", pa.array([None, False], pa.bool_())))
    assert (found["teacher_rate"], found["same_group_rate"], found["with_corpus_documents"]) == (0.5, 0.0, 1)


def test_a_corpus_sample_is_fixed_by_the_documents_and_searched_exactly(corpus, pairs):
    """`negatives.corpus_sample`: the sample is the documents whose ids hash lowest, in the
    split's order, whatever order the table lists them in (no seed: every trial shares it); the
    search over it returns each pair's exact top-k among the sampled documents (numpy's ranking
    of the same vectors), and counts the dev/test documents left out, not the unsampled ones."""
    from embedlab.negatives.mining import corpus_sample
    from embedlab.sources.document import document_texts

    _, train = checked_inputs(pairs, corpus, frozenset())
    sample = corpus_sample(train, 100)
    ids = train["doc_id"].to_pylist()
    lowest = set(sorted(ids, key=lambda doc_id: hashlib.sha256(doc_id.encode()).digest())[:100])
    assert sample["doc_id"].to_pylist() == [doc_id for doc_id in ids if doc_id in lowest]
    reversed_train = train.take(pa.array(range(train.num_rows - 1, -1, -1)))
    assert sorted(corpus_sample(reversed_train, 100)["doc_id"].to_pylist()) == sorted(lowest)
    assert corpus_sample(train, 0) is train and corpus_sample(train, train.num_rows) is train

    lines: list[str] = []
    found = search_candidates(pairs, corpus, sample, encode, top_k=TOP_K, encoder_id="toy-bow-64",
                              progress=lines.append)
    documents = encode(document_texts(sample))
    scores = encode([pair.query for pair in pairs]) @ documents.T
    for i in range(len(pairs)):
        np.testing.assert_allclose(found.scores[i], np.sort(scores[i])[::-1][:TOP_K], atol=1e-6)
        np.testing.assert_allclose(scores[i][found.rows[i]], found.scores[i], atol=1e-6)
    dev_test = sum(split != "train" for split in corpus["split"].to_pylist())
    assert (found.indexed, found.left_out, found.doc_ids) == (100, dev_test, sample["doc_id"].to_pylist())
    assert f"a fixed sample of 100 of {train.num_rows:,} training documents ({dev_test:,} dev/test" in lines[0]


def test_a_sampled_search_is_declared_and_refused_below_top_k():
    """A corpus sample smaller than the candidates searched is refused naming the field; a
    table whose rows read a sampled search says so in its mining line."""
    import pandas as pd

    from embedlab.core.config import ConfigError, NegativesConfig
    from embedlab.stats.table import MINING_SAMPLE, MINING_SEARCH, mining_line

    with pytest.raises(ConfigError, match=r"contrastive\.negatives\.corpus_sample: 50: 0 \(every training "
                                          r"document\) or at least top_k \(100\)"):
        NegativesConfig(count=2, corpus_sample=50)
    assert NegativesConfig(count=2, corpus_sample=100).corpus_sample == 100
    table = pd.DataFrame({MINING_SEARCH: ["s1", "s1"], "compute/mining_flops": [1e9, 1e9],
                          "compute/mining_seconds": [2.0, 2.0], "compute/mining_built": [1.0, 0.0]})
    assert "sample" not in mining_line(table)
    assert ("searched a fixed sample of 16,384 training documents, not all of them "
            "(contrastive.negatives.corpus_sample)") in mining_line(table.assign(**{MINING_SAMPLE: [16384.0] * 2}))


def test_arms_whose_rule_left_most_queries_without_negatives_are_named():
    """An arm whose mined negatives cover under half its queries (averaged over its seeds) is
    named with its share: it trained mostly on in-batch negatives; arms above, or without
    mining, are not."""
    import pandas as pd

    from embedlab.stats.table import MINING_COVERAGE, mining_coverage_line

    table = pd.DataFrame({"arm": ["in-batch", "in-batch", "mined-2", "mined-2", "window", "window"],
                          "seed": [0, 1] * 3, "stage": ["final"] * 6, "status": ["finished"] * 6,
                          MINING_COVERAGE: [None, None, 0.001, 0.0, 0.9, 0.3]})
    line = mining_coverage_line(table)
    assert line.startswith("warning: mined negatives for under 50% of the queries (mined-2 0.1% of its queries")
    assert re.search(r"\((.*?) of its queries", line).group(1) == "mined-2 0.1%"  # the one arm below half
    assert mining_coverage_line(table.assign(**{MINING_COVERAGE: [None, None, 0.6, 0.5, 0.9, 0.8]})) == ""


def test_near_positive_groups_index_every_positive_at_once_as_group_by_group(corpus):
    """The near-positive rule's index takes every group's positives in one add: its matches
    (groups per candidate) are those of an index built one group at a time, as it was."""
    from embedlab.negatives.mining import NEAR_POSITIVE_THRESHOLD, _near_positive_groups
    from embedlab.sources.dedup import NearDuplicateIndex

    texts = corpus["text"].to_pylist()
    positives = {f"g{i}": {texts[i], texts[i + 1] + " edited", texts[i][: len(texts[i]) // 2]} for i in range(0, 120, 3)}
    candidates = {i: text for i, text in enumerate(texts[:200])}
    one_by_one = NearDuplicateIndex(NEAR_POSITIVE_THRESHOLD)
    for group, members in positives.items():
        one_by_one.add([group] * len(members), sorted(members))
    expected = {key: {group for group, _ in found} for key, found in
                zip(candidates, one_by_one.query_many(list(candidates.values()))) if found}
    assert len(expected) > 40 and _near_positive_groups(positives, candidates) == expected
