"""Mining once, shared: one stored search read by every trial of a parent and its pairs (its cost
counted once), and the search and encoding spread over Ray workers returning what one process
does, bit for bit. Real Faiss, real Ray, a tiny parent over the session's prepared data."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from embedlab.core.config import DEFAULT_BUDGET, ContrastiveConfig, MixtureConfig, NegativesConfig, TrialConfig

pytestmark = pytest.mark.ray
QUIET = {"progress": lambda line: None}


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A random parent of its own (not `synthetic.write_parent`'s seed), so its searches and
    corpus vectors are no other test's."""
    import torch

    import synthetic
    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.model.encoder import Encoder

    directory = tmp_path_factory.mktemp("shared-mining")
    torch.manual_seed(64)
    save_checkpoint(directory / "parent", Encoder(synthetic.MODEL), head=None,
                    tokenizer=synthetic.tokenizer(directory / "tokenizer"), fields={"phase": 2})
    return directory / "parent"


def mining_trial(parent, **negatives) -> TrialConfig:
    import synthetic

    settings = {"count": 2, "top_k": 20, "margin": 0.0, **negatives}
    return TrialConfig(model=synthetic.MODEL, data=dataclasses.replace(synthetic.DATA, mixture=MixtureConfig(max_epochs=8)),
                       phase=3, parent=str(parent),
                       train=dataclasses.replace(TrialConfig().train, budget=dataclasses.replace(DEFAULT_BUDGET, pairs=24),
                                                 batch_rows=2, num_workers=1),
                       contrastive=ContrastiveConfig(pairs=(("title-body", 1.0),), pair_length=16,
                                                     negatives=NegativesConfig(**settings)))


def searches_in(prepared) -> list[str]:
    """The stored searches under the session's prepared data."""
    from embedlab.negatives.candidates import CANDIDATES_DIR

    root = prepared.directory / CANDIDATES_DIR
    return [p.name for p in root.iterdir() if not p.name.startswith(".")] if root.is_dir() else []


def _mine(trial, prepared, lines: list[str] | None = None):
    from embedlab.negatives.phase3 import mine_for_phase3
    from embedlab.pairs.table import pair_table_path
    from embedlab.train.trial_data import trial_pair_schedule

    path = pair_table_path(prepared, ["title-body"], data=trial.data, **QUIET)
    progress = (lines.append if lines is not None else QUIET["progress"])
    return mine_for_phase3(trial, prepared, path, *trial_pair_schedule(trial, path), progress=progress)


def test_one_search_serves_every_rule_and_study_and_its_cost_is_counted_once(prepared, parent):
    """Three trials of one parent and schedule (the margin rule, the relative rule, and one of
    another study: another learning rate and four negatives) read one stored search: the first
    encodes and searches, the others only select. Each row records the search's whole cost and
    whether it made it; the table sums the cost once. The margin trial trains on exactly the
    negatives one-shot mining gives (`mine_hard_negatives` with the parent encoder)."""
    from embedlab.negatives.mining import MinedSet, mine_hard_negatives
    from embedlab.negatives.phase3 import (
        _parent_encoder, _parent_identity, _scheduled_pairs, mining_compute, mining_config, mining_figures,
    )
    from embedlab.pairs.table import group_positive_texts, pair_table_path
    from embedlab.stats.table import mining_cost, mining_line
    from embedlab.train.trial_data import trial_pair_schedule

    margin = mining_trial(parent)
    relative = mining_trial(parent, rule="relative", relative_fraction=0.9)
    other = dataclasses.replace(mining_trial(parent, count=4), train=dataclasses.replace(
        margin.train, learning_rate=margin.train.learning_rate / 2))
    lines = {name: [] for name in ("margin", "relative", "other")}
    before = set(searches_in(prepared))
    mined = {name: _mine(trial, prepared, lines[name])
             for name, trial in (("margin", margin), ("relative", relative), ("other", other))}
    assert len(set(mined.values())) == 3
    searches = sorted(set(searches_in(prepared)) - before)
    assert len(searches) == 1
    assert any("encoding" in line for line in lines["margin"])
    assert not any("encoding" in line for line in lines["relative"] + lines["other"])

    figures = {name: {**mining_compute(mined[name]), **mining_figures(mined[name], trial)}
               for name, trial in (("margin", margin), ("relative", relative), ("other", other))}
    assert {f["data/mining_candidates"] for f in figures.values()} == {searches[0]}
    assert [f["compute/mining_built"] for f in figures.values()] == [1.0, 0.0, 0.0]
    assert len({f["compute/mining_flops"] for f in figures.values()}) == 1 and figures["margin"]["compute/mining_flops"] > 0
    assert figures["relative"]["data/negatives_dropped/false-negative-relative"] > 0
    assert figures["margin"]["data/negatives_dropped/false-negative-relative"] == 0
    table = pd.DataFrame([{"arm": name, **f} for name, f in figures.items()])
    cost = mining_cost(table)
    assert (cost["searches"], cost["trials"], cost["built"]) == (1, 3, 1)
    assert cost["flops"] == figures["margin"]["compute/mining_flops"]  # once, not three times
    assert "1 search(es) read by 3 trials (1 made here" in mining_line(table)

    path = pair_table_path(prepared, ["title-body"], data=margin.data, **QUIET)
    pairs, outside = _scheduled_pairs(path, *trial_pair_schedule(margin, path))
    encoder_id, encoding = _parent_identity(margin)
    encoder = _parent_encoder(margin, QUIET["progress"], "test")
    one_shot = mine_hard_negatives(pairs, prepared.corpus.read(), encoder.encode, encode_query=encoder.encode_query,
                                   config=mining_config(margin), encoder_id=encoder_id,
                                   corpus_revision=prepared.data_revision, outside_corpus=outside,
                                   group_positives=group_positive_texts(path), encoding=encoding, **QUIET)
    stored = MinedSet.load(mined["margin"])
    assert stored.negatives == one_shot.negatives and stored.version == one_shot.version
    assert stored.counts["negatives"] > 0


def test_a_sharded_search_returns_one_process_candidates_bit_for_bit(ray_session):
    """Exact inner product at width 128 (where Faiss's summation order shows in the last bits),
    2,600 queries (three blocks) over 3,000 documents with planted exact ties: two and three
    Ray workers return one process's scores, rows and tie order."""
    from embedlab.negatives.mining import exact_search
    from embedlab.negatives.sharded import Workers, search_on_workers

    rng = np.random.default_rng(0)
    docs = rng.standard_normal((3000, 128)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    docs[[10, 2000, 2999]] = docs[500]  # four identical documents: exact ties
    queries = rng.standard_normal((2600, 128)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    queries[[3, 1500]] = docs[500]
    scores, rows = exact_search(docs, queries, 50)
    assert sorted(rows[3, :4].tolist()) == [10, 500, 2000, 2999]
    for count in (2, 3):
        sharded = search_on_workers(docs, queries, 50, workers=Workers(count=count))
        assert np.array_equal(sharded[0], scores) and np.array_equal(sharded[1], rows)


def test_mining_on_workers_encodes_and_selects_what_one_process_does(prepared, parent):
    """`negatives.mining_workers=2`: the parent encodes on two Ray Data encoder actors and the
    search runs on two workers; the stored search is the one-process search (the same version,
    the same scores and rows), so the negatives are the same set, and its cost counts the
    workers' FLOPs, equal to one process's."""
    from embedlab.model.encode import encode_texts
    from embedlab.checkpoints.io import load_encoder
    import shutil

    from embedlab.negatives.candidates import CANDIDATES_DIR, load_candidates, read_cost
    from embedlab.negatives.mining import MinedSet
    from embedlab.negatives.phase3 import CORPUS_VECTORS_DIR, CORPUS_VECTORS_FILE, MINING_COST_FILE
    from embedlab.negatives.sharded import Workers, encode_on_workers

    encoder, tokenizer, _ = load_encoder(parent)
    texts = [row["text"] for row in prepared.corpus.read().slice(0, 150).to_pylist()]
    one = encode_texts(encoder, tokenizer, texts, max_length=16, prefix="passage: ")
    assert np.array_equal(encode_on_workers(str(parent), tokenizer, texts, max_length=16, pooling="mean",
                                            prefix="passage: ", workers=Workers(count=2), **QUIET), one)

    trial = mining_trial(parent, rule="window", window=(3, 20))
    local = _mine(trial, prepared)
    one_cost = json.loads((local / MINING_COST_FILE).read_text())
    search = prepared.directory / CANDIDATES_DIR / one_cost["candidates"]
    vectors = prepared.directory / CORPUS_VECTORS_DIR / one_cost["corpus_vectors"]["set"]
    one_process, one_vectors = load_candidates(search), np.load(vectors / CORPUS_VECTORS_FILE)
    for made in (search, local, vectors):  # the workers make all three again
        shutil.rmtree(made)
    sharded = _mine(dataclasses.replace(trial, contrastive=dataclasses.replace(
        trial.contrastive, negatives=dataclasses.replace(trial.contrastive.negatives, mining_workers=2))), prepared)
    assert sharded == local  # the same set: the worker count is not part of what is mined
    assert np.array_equal(np.load(vectors / CORPUS_VECTORS_FILE), one_vectors)
    again = load_candidates(search)
    assert np.array_equal(again.scores, one_process.scores) and np.array_equal(again.rows, one_process.rows)
    assert np.array_equal(again.positive_scores, one_process.positive_scores) and again.doc_ids == one_process.doc_ids
    cost = read_cost(search)
    assert cost["workers"]["workers"] == 2 and cost["corpus_vectors"]["reused"] is False
    assert cost["flops"] == pytest.approx(one_cost["flops"], rel=1e-12) and cost["flops"] > 0
    assert MinedSet.load(sharded).counts["negatives"] > 0


def test_bench_mining_compares_workers_with_one_process_on_the_same_candidates(prepared):
    """`embedlab bench mining`: one process and N workers mine the same pairs; the JSON holds the
    ratio against the one-process reference measured in the same run, and says the candidates
    are identical (no timing is asserted)."""
    from embedlab.bench.measure import comparisons_json
    from embedlab.bench.mining import MiningBench, bench_mining

    result = bench_mining(prepared, MiningBench(workers=2, documents=200, pairs=60, preset="tiny"), **QUIET)
    (comparison,) = result["comparisons"]
    assert (comparison.unit, comparison.better) == ("s", "lower")
    assert comparison.ratio == comparison.embedlab / comparison.reference > 0
    assert result["same_candidates"] is True and (result["workers"], result["pairs"]) == (2, 60)
    assert set(comparisons_json(result["comparisons"])[comparison.name]) >= {"embedlab", "reference", "ratio", "unit"}


def test_a_trials_data_judges_a_fixed_sample_of_its_negatives_and_its_row_carries_the_rates(prepared, parent):
    """`negatives.false_negative_sample=12` (a rank window: every pair has negatives): `trial_data`
    mines, then has all-MiniLM-L6-v2 judge a seeded sample of twelve of the set's negatives; the
    row figures carry both rates, the sample's size and the judge's cost beside the drops; judged
    again from nothing, the sample and its rates are the same (fixed by seed), and the sample is
    `negative_sample`'s."""
    import shutil

    import pyarrow.parquet as pq

    from embedlab.negatives.false_negatives import negative_sample
    from embedlab.negatives.mining import NEGATIVES_FILE
    from embedlab.teacher.false_negatives import MANIFEST_FILE, SAMPLE_FILE
    from embedlab.train.trial_data import trial_data

    trial = mining_trial(parent, count=3, rule="window", window=(2, 20), false_negative_sample=12)
    data = trial_data(trial, prepared, **QUIET)
    assert data.false_negatives is not None and data.mined is not None
    figures = data.made(trial).negative_figures
    assert figures["data/false_negative_sample"] == 12
    for rate in ("teacher", "same_group"):
        assert 0.0 <= figures[f"data/false_negative_rate/{rate}"] <= 1.0
    assert figures["compute/false_negative_flops"] > 0 and figures["data/negatives_dropped/outside-window"] > 0
    sample = pq.read_table(data.false_negatives / SAMPLE_FILE)
    drawn = negative_sample(pq.read_table(data.mined / NEGATIVES_FILE), 12)
    assert sample.select(drawn.column_names).equals(drawn)
    manifest = json.loads((data.false_negatives / MANIFEST_FILE).read_text())
    assert "not a human one" in manifest["disclosure"]
    shutil.rmtree(data.false_negatives)
    again = trial_data(trial, prepared, **QUIET)
    assert pq.read_table(again.false_negatives / SAMPLE_FILE).equals(sample)
    assert json.loads((again.false_negatives / MANIFEST_FILE).read_text())["counts"] == manifest["counts"]
