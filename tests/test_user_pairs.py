"""A user's own labelled pairs in phases 2-3: configured from a TOML data spec, frozen once per
prepared directory and file content, split by near-duplicate group, mixed by share, audited
(queries, positives and given negatives) before any trial starts, and their given negatives
screened by the parent encoder into the phase-3 batch. Real text: the standard library's
docstrings; a small prepared directory written by hand, so nothing here starts Ray."""

from __future__ import annotations

import collections
import dataclasses
import functools
import glob
import heapq
import inspect
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedlab.studies.recipes import derive
from embedlab.core.config import (DEFAULT_BUDGET, Budget, ConfigError, ContrastiveConfig, DataConfig, MixtureConfig,
                                  NegativesConfig,
                             TrialConfig)
from embedlab.pairs.readers import PairFiles
from embedlab.prepared.directory import PreparedData
from embedlab.sources.document import content_hash

from test_pair_sources import RIGHTS, longest_paragraph, summary_and_body, write_beir, write_jsonl

QUIET = {"progress": lambda line: None}
# Corpus documents (phase-1 text), evaluation-task items and user pairs come from different
# functions, chosen to share no run of ten words (tempfile.mkstemp's and mkdtemp's docstrings
# do, as do os.replace's and shutil.rmtree's): the audit would rightly find those.
CORPUS_FUNCTIONS = (json.dumps, json.loads, shutil.copyfile, shutil.copytree, textwrap.wrap, textwrap.dedent,
                    glob.glob, heapq.merge, collections.namedtuple, os.makedirs)
TASK_FUNCTIONS = (subprocess.run, subprocess.check_output, shutil.make_archive, os.walk, shutil.chown,
                  textwrap.fill)
USER_FUNCTIONS = (shutil.move, shutil.which, shutil.disk_usage, tempfile.mkstemp, os.listdir, os.replace,
                  heapq.nsmallest, heapq.nlargest, collections.Counter.most_common, textwrap.indent,
                  functools.reduce, itertools.groupby)
CORPUS_SCHEMA = pa.schema([(c, pa.string()) for c in ("doc_id", "source", "title", "text", "hash", "group_id",
                                                      "split")])


def user_rows(**extra) -> list[dict]:
    """(query, positive) from the user functions' docstrings, a negative from the next one's body."""
    docs = [summary_and_body(f) for f in USER_FUNCTIONS]
    return [{"id": f"u{i}", "query": q, "positive": p, "negatives": [docs[(i + 1) % len(docs)][1]], **extra}
            for i, (q, p) in enumerate(docs)]


@pytest.fixture
def prepared(tmp_path) -> PreparedData:
    """A prepared directory as `prepare_data` lays it out, as far as phases 2-3 read it: the
    corpus (python-docstrings documents, all train), the tokenizer sample and a BEIR task."""
    directory = tmp_path / "prepared"
    (directory / "corpus").mkdir(parents=True)
    rows = []
    for function in CORPUS_FUNCTIONS:
        doc_id = f"python-docstrings:{function.__module__}.{function.__qualname__}"
        text = inspect.getdoc(function)
        rows.append({"doc_id": doc_id, "source": "python-docstrings", "title": f"{function.__module__}."
                     f"{function.__qualname__}", "text": text, "hash": content_hash(text), "group_id": doc_id,
                     "split": "train"})
    pq.write_table(pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA), directory / "corpus" / "documents.parquet")
    (directory / "corpus" / "manifest.json").write_text(json.dumps({"hash": "hand-made", "sources": {}}))
    pq.write_table(pa.table({"doc_id": [r["doc_id"] for r in rows]}), directory / "tokenizer_sample.parquet")
    record = {"config": DataConfig().phase1_dict(), "mixture": {"shares": {"python-docstrings": 1.0}},
              "data_revision": "hand-made"}
    return PreparedData(directory, record)


@pytest.fixture
def task_dir(tmp_path) -> Path:
    """An evaluation task of its own (a BEIR folder `eval.task` names): summaries -> docstrings."""
    docs = {f"d{i}": (f.__qualname__, summary_and_body(f)[1]) for i, f in enumerate(TASK_FUNCTIONS)}
    queries = {f"q{i}": summary_and_body(f)[0] for i, f in enumerate(TASK_FUNCTIONS)}
    qrels = {"test": [(f"q{i}", f"d{i}", 1) for i in range(3)], "dev": [(f"q{i}", f"d{i}", 1) for i in range(3, 6)]}
    return write_beir(tmp_path / "task", docs, queries, qrels)


def pairs_budget(pairs: int) -> Budget:
    """The default budget at `pairs` positive pairs (these trials are phases 2-3)."""
    return dataclasses.replace(DEFAULT_BUDGET, pairs=pairs)


def user_data(path: Path, **data) -> DataConfig:
    return DataConfig(pair_files=(PairFiles(name="mine", path=str(path), rights=RIGHTS),), **data)


def test_a_toml_data_spec_with_pair_files_builds(tmp_path):
    """[[pair_files]] in a TOML data spec builds PairFiles (mapping lists as tuples); the trial
    round-trips through JSON; names that clash and shares naming nothing are ConfigErrors."""
    from embedlab.pairs.table import pair_table_path
    from embedlab.studies.spec import load_data_configs

    spec = tmp_path / "data.toml"
    spec.write_text(textwrap.dedent(f"""\
        sources = ["python-docstrings"]
        [[pair_files]]
        name = "mine"
        path = "{tmp_path / 'pairs.jsonl'}"
        rights = "{RIGHTS}"
        query_field = "title"
        positive_field = "body"
        negative_fields = ["wrong_a", "wrong_b"]
        [[beir_pairs]]
        name = "folder"
        path = "{tmp_path / 'beir'}"
        rights = "{RIGHTS}"
        zero_grade_negatives = true
        """))
    [config] = load_data_configs(str(spec))
    assert config.pair_files == (PairFiles(name="mine", path=str(tmp_path / "pairs.jsonl"), rights=RIGHTS,
                                           query_field="title", positive_field="body",
                                           negative_fields=("wrong_a", "wrong_b")),)
    assert [(s.name, s.zero_grade_negatives) for s in config.beir_pairs] == [("folder", True)]
    assert config.pair_source_names == ("mine", "folder")
    trial = TrialConfig(data=config, phase=2, contrastive=ContrastiveConfig(pairs=(("mine", 0.6), ("title-body", 0.4))))
    assert TrialConfig.from_dict(json.loads(trial.to_json())) == trial
    assert "pair_files" not in config.phase1_dict() and config.phase1_dict() == DataConfig(
        sources=("python-docstrings",)).phase1_dict()

    with pytest.raises(ConfigError, match=r"^data.pair_files: pair source names \['title-body'\] are also"):
        DataConfig(pair_files=(PairFiles(name="title-body", path="p.jsonl", rights=RIGHTS),))
    with pytest.raises(ConfigError, match=r"^data.pair_files: pair source names repeat: \['mine', 'mine'\]"):
        DataConfig(pair_files=(PairFiles(name="mine", path="a.jsonl", rights=RIGHTS),
                               PairFiles(name="mine", path="b.jsonl", rights=RIGHTS)))
    message = (r"^contrastive.pairs: unknown pair builder or pair source \['theirs'\]; valid: \['same-source-spans', "
               r"'title-body', 'term-definition', 'synonyms', 'lead-rest', 'keyword', 'mine', 'folder'\]")
    with pytest.raises(ConfigError, match=message):
        pair_table_path(PreparedData(tmp_path, {}), ["mine", "theirs"], data=config, **QUIET)


def test_a_mixture_naming_a_user_source_schedules_its_train_rows_by_share(prepared, tmp_path):
    """A user source and title-body at 3:1: the frozen table holds the built-in pairs and the
    user source's train split only (its provenance and drop counts in the record), the schedule
    gives each its share exactly, and the pre-flight's repetition cap names the user source."""
    from embedlab import Study
    from embedlab.core.errors import UsageError
    from embedlab.pairs.table import pair_table_path
    from embedlab.pairs.user import RECORD_FILE, user_pairs_dir
    from embedlab.sweep.gate import check_pair_schedules
    from embedlab.train.trial_data import trial_pair_schedule

    rows = user_rows()
    rows[0]["negatives"] = [rows[0]["positive"].upper(), *rows[0]["negatives"]]  # dropped and counted
    file = write_jsonl(tmp_path / "pairs.jsonl", rows)
    data = user_data(file, split_seed=1, dev_fraction=0.2, test_fraction=0.2, mixture=MixtureConfig(max_epochs=8))
    trial = TrialConfig(data=data, phase=2, train=dataclasses.replace(TrialConfig().train, budget=pairs_budget(40),
                                                                      batch_rows=4, num_workers=1),
                        contrastive=ContrastiveConfig(pairs=(("title-body", 0.25), ("mine", 0.75))))
    path = pair_table_path(prepared, ["title-body", "mine"], data=data, **QUIET)
    table = pq.read_table(path)
    record = json.loads((user_pairs_dir(prepared, data) / RECORD_FILE).read_text())
    frozen = pq.read_table(user_pairs_dir(prepared, data) / "pairs.parquet").to_pylist()
    train_ids = sorted(r["pair_id"] for r in frozen if r["split"] == "train")
    assert record["splits"] == {"mine": {s: sum(r["split"] == s for r in frozen) for s in ("train", "dev", "test")}}
    assert 0 < len(train_ids) < len(rows)
    builders = table["builder"].to_pylist()
    assert sorted(p for p, b in zip(table["pair_id"].to_pylist(), builders) if b == "mine") == train_ids
    assert collections.Counter(builders) == {"title-body": len(CORPUS_FUNCTIONS), "mine": len(train_ids)}
    assert {"source": "mine", "reason": "text dropped: negative equals positive", "count": 1} in record["exclusions"]
    [source] = record["sources"]
    assert (source["kind"], source["rights"], source["read"]["pairs"]) == ("pair-files", RIGHTS, len(rows))
    assert source["files"][0]["sha256"] == __import__("hashlib").sha256(file.read_bytes()).hexdigest()

    schedule, offsets = trial_pair_schedule(trial, path)
    names = [schedule.sources[i] for i in schedule.source]
    assert len(names) == 40 * 1.1 + 4 * 4 and collections.Counter(names) == {"title-body": 15, "mine": 45}
    picked = np.array([offsets[n] for n in schedule.sources])[schedule.source] + schedule.item
    assert {builders[r] for r, n in zip(picked, names) if n == "mine"} == {"mine"}

    records = {arm: {**prepared.record, "directory": str(prepared.directory)} for arm in ("a", "b")}
    study = Study(name="mine", factor="contrastive.temperature", seeds=(0,), budget=Budget(tokens=1, pairs=40),
                  arms={"a": trial, "b": dataclasses.replace(trial, contrastive=dataclasses.replace(
                      trial.contrastive, temperature=0.1))})
    check_pair_schedules(study, records, str(tmp_path / "parent"))
    # 0.75 of it is past 8 epochs of mine
    over = dataclasses.replace(study, budget=dataclasses.replace(study.budget, pairs=12 * len(train_ids)))
    with pytest.raises(UsageError, match=r"study mine, arm a: .*'mine'"):
        check_pair_schedules(over, records, str(tmp_path / "parent"))


def test_the_audit_finds_a_user_pair_holding_an_eval_query_and_the_preflight_refuses(prepared, task_dir, tmp_path):
    """User pairs whose query is a test query of the study's task, whose positive quotes a test
    document and whose given negative is one: the sweep's pre-flight finds all three in the
    frozen table and refuses before any trial; a disclosed-overlap policy lets exactly them through."""
    from embedlab import Study
    from embedlab.contamination.audit import ContaminationError
    from embedlab.core.beir import load_task
    from embedlab.sweep.gate import check_contamination

    task = load_task(task_dir)
    rows = user_rows()
    rows[1]["query"] = task.queries["q0"]
    rows[2]["positive"] = f'The manual says: "{task.corpus["d1"][1]}" and so on.'
    rows[3]["negatives"] = [task.corpus["d2"][1]]
    data = user_data(write_jsonl(tmp_path / "pairs.jsonl", rows), dev_fraction=0.01, test_fraction=0.01)
    base = TrialConfig(data=data, phase=2, contrastive=ContrastiveConfig(pairs=(("mine", 1.0),)))
    base = dataclasses.replace(base, eval=dataclasses.replace(base.eval, task=str(task_dir)))
    study = Study(name="leak", factor="contrastive.temperature", seeds=(0,), budget=Budget(tokens=1, pairs=32),
                  arms={"a": base, "b": dataclasses.replace(base, contrastive=dataclasses.replace(
                      base.contrastive, temperature=0.1))})
    records = {arm: {**prepared.record, "directory": str(prepared.directory)} for arm in study.arms}
    clean = dataclasses.replace(study, arms={arm: dataclasses.replace(c, contrastive=dataclasses.replace(
        c.contrastive, pairs=(("title-body", 1.0),))) for arm, c in study.arms.items()})
    assert check_contamination(clean, records, QUIET["progress"]) == []

    with pytest.raises(ContaminationError, match="stages contrastive-pairs") as refused:
        check_contamination(study, records, QUIET["progress"])
    # Four: the three planted, and d0 (subprocess.run's docstring) sharing a run of ten words with
    # the planted copy of d1 (check_output's, which repeats part of run's).
    assert "4 final-eval finding(s)" in str(refused.value) and "training refused" in str(refused.value)
    findings = check_contamination(dataclasses.replace(study, disclosed_overlap="disclosed: three planted"),
                                    records, QUIET["progress"])
    assert sorted((f["item_kind"], f["item_id"], f["stage_item_id"], f["match"]) for f in findings) == [
        ("document", "d0", "mine:u2:positive", "shared-window"),
        ("document", "d1", "mine:u2:positive", "contained"),
        ("document", "d2", "mine:u3:negative:0", "exact"),
        ("query", "q0", "mine:u1:query", "exact"),
    ]


def test_given_negatives_reach_the_phase3_batch_and_the_margin_drops_a_close_one(tmp_path, prepared):
    """Phase 3 without mining: a scheduled user pair's given negatives fill its slots in the
    batch; the one that scores above (positive - margin) under the parent encoder is dropped and
    counted, its slot masked; the margin "off" keeps both."""
    import synthetic

    from embedlab.checkpoints.io import load_encoder
    from embedlab.model.encode import encode_texts
    from embedlab.negatives.mining import given_doc_id
    from embedlab.negatives.phase3 import given_negative_counts, given_negatives_for_phase3
    from embedlab.pairs.table import pair_table_path
    from embedlab.streams.pair_stream import group_hash, tokenize_pair_window
    from embedlab.train.trial_data import trial_pair_schedule

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    parent = synthetic.write_parent(tmp_path / "parent", frozen)
    encoder, tokenizer, manifest = load_encoder(parent)

    def encode(texts):
        return encode_texts(encoder, tokenizer, texts, max_length=16, pooling=manifest["pooling"]["method"])

    docs = [summary_and_body(f) for f in USER_FUNCTIONS]
    query, positive = encode([docs[0][0], docs[0][1]])
    ceiling = float(query @ positive)
    # Of the other docstrings scoring below the positive, the lowest stays ("far") and the highest
    # ("close") is dropped by a margin between the two: decided by the parent encoder's own scores.
    candidates = sorted((float(score), body) for score, (_, body) in zip(encode([b for _, b in docs[1:]]) @ query,
                                                                          docs[1:]) if score < ceiling)
    (low, far), (high, close) = candidates[0], candidates[-1]
    assert low < high < ceiling
    rows = [{"id": "p", "query": docs[0][0], "positive": docs[0][1], "negatives": [far, close]}]
    scores = np.array([low, high])
    margin = ceiling - float(scores.mean())  # between the two: the near one is within it, the far one is not
    data = dataclasses.replace(synthetic.DATA, pair_files=(PairFiles(
        name="mine", path=str(write_jsonl(tmp_path / "pairs.jsonl", rows)), rights=RIGHTS),),
        dev_fraction=0.01, test_fraction=0.01, mixture=MixtureConfig(max_epochs=8))
    trial = TrialConfig(model=synthetic.MODEL, data=data, phase=3, parent=str(parent),
                        train=dataclasses.replace(TrialConfig().train, budget=pairs_budget(2), batch_rows=1, num_workers=1),
                        contrastive=ContrastiveConfig(pairs=(("mine", 1.0),), pair_length=16,
                                                      negatives=NegativesConfig(count=2, mine=False,
                                                                                given_margin=margin)))
    pairs_path = pair_table_path(prepared, ["mine"], data=data, **QUIET)
    schedule, offsets = trial_pair_schedule(trial, pairs_path)
    given = given_negatives_for_phase3(trial, prepared, pairs_path, schedule, offsets, **QUIET)
    assert given_negative_counts(given) == {
        "pairs": 1, "pairs_with_given": 1, "given": 2, "kept": 1, "margin": margin,
        "dropped": {"positive-text": 0, "near-positive": 0, "false-negative-margin": 1}}
    kept = pq.read_table(given / "negatives.parquet").to_pylist()
    assert [(r["doc_id"], r["rank"], r["negative"]) for r in kept] == [(given_doc_id("mine:p", 0), 1, far)]
    assert kept[0]["score"] == pytest.approx(float(scores[0]), abs=1e-5)

    batch = tokenize_pair_window(
        {"rows": [np.zeros(2, dtype=np.int64)], "source_index": [np.zeros(2, dtype=np.int32)]},
        pairs_path=str(pairs_path), tokenizer_path=str(frozen.path), length=16, query_prefix="",
        passage_prefix="", negatives_path=None, negatives_per_pair=2, given_negatives_path=str(given / "negatives.parquet"))
    far_ids = [frozen.cls_id, *frozen.encode_batch([far])[0][:14], frozen.sep_id]
    assert batch["negative_ids"][0, 0].tolist() == far_ids and batch["negative_len"].tolist() == [[16, 0], [16, 0]]
    assert batch["negative_group"].tolist() == [[group_hash(given_doc_id("mine:p", 0)), 0]] * 2

    # With mining on, mined negatives fill the slots left, a mined copy of a given text skipped.
    mined = tmp_path / "mined.parquet"
    pq.write_table(pa.Table.from_pylist([{"pair_id": "mine:p", "doc_id": doc, "rank": rank, "negative": text}
                                         for rank, (doc, text) in enumerate([("copy", far.upper()), ("other", close)])]),
                   mined)
    filled = tokenize_pair_window(
        {"rows": [np.zeros(1, dtype=np.int64)], "source_index": [np.zeros(1, dtype=np.int32)]},
        pairs_path=str(pairs_path), tokenizer_path=str(frozen.path), length=16, query_prefix="",
        passage_prefix="", negatives_path=str(mined), negatives_per_pair=2, given_negatives_path=str(given / "negatives.parquet"))
    assert filled["negative_group"].tolist() == [[group_hash(given_doc_id("mine:p", 0)), group_hash("other")]]

    off = derive(trial, {"contrastive.negatives.given_margin": "off"})
    kept_all = given_negatives_for_phase3(off, prepared, pairs_path, schedule, offsets, **QUIET)
    assert given_negative_counts(kept_all)["dropped"] == {"positive-text": 0, "near-positive": 0, "false-negative-margin": 0}
    assert [r["negative"] for r in pq.read_table(kept_all / "negatives.parquet").to_pylist()] == [far, close]


def test_user_pairs_of_one_near_duplicate_group_stay_in_one_split(prepared, tmp_path):
    """Two pairs whose queries are near duplicates (one three words shorter) share a group and
    land in one split under every seed: both in the frozen train table, or neither."""
    from embedlab.pairs.table import pair_table_path
    from embedlab.pairs.user import user_pairs_dir

    walk = longest_paragraph(os.walk)
    rows = user_rows()[:6] + [  # the first six: other groups
        {"id": "walk-a", "query": walk, "positive": summary_and_body(os.scandir)[1]},
        {"id": "walk-b", "query": " ".join(walk.split()[:-3]), "positive": summary_and_body(itertools.groupby)[1]},
    ]
    file = write_jsonl(tmp_path / "pairs.jsonl", rows)
    landed = collections.Counter()
    for seed in range(12):
        data = user_data(file, split_seed=seed, dev_fraction=0.3, test_fraction=0.3)
        frozen = {r["pair_id"]: r for r in pq.read_table(user_pairs_dir(prepared, data) / "pairs.parquet").to_pylist()}
        assert frozen["mine:walk-a"]["positive_group"] == frozen["mine:walk-b"]["positive_group"] == "mine:walk-a"
        assert frozen["mine:walk-a"]["split"] == frozen["mine:walk-b"]["split"]
        streamed = set(pq.read_table(pair_table_path(prepared, ["mine"], data=data, **QUIET))["pair_id"].to_pylist())
        assert {"mine:walk-a", "mine:walk-b"} & streamed in (set(), {"mine:walk-a", "mine:walk-b"})
        assert streamed == {p for p, r in frozen.items() if r["split"] == "train"}
        landed[frozen["mine:walk-a"]["split"]] += 1
    assert set(landed) == {"train", "dev", "test"}


def test_the_frozen_pair_table_is_rebuilt_when_the_users_file_changes(prepared, tmp_path):
    """The same file gives the same table, built once; an edited file (same path, new bytes)
    gives a new user-pairs key and a new table with the edit."""
    from embedlab.pairs.table import pair_table_path
    from embedlab.pairs.user import user_pairs_key

    rows = user_rows()
    file = write_jsonl(tmp_path / "pairs.jsonl", rows)
    data = user_data(file, dev_fraction=0.01, test_fraction=0.01)
    lines: list[str] = []
    first = pair_table_path(prepared, ["mine"], lines.append, data=data)
    assert pair_table_path(prepared, ["mine"], lines.append, data=data) == first
    assert sum(line.startswith("data: building pairs") for line in lines) == 1
    key = user_pairs_key(data)
    before = pq.read_table(first)["query"].to_pylist()

    rows[4]["query"] = "Return the docstring's own summary, edited by its user."
    write_jsonl(file, rows)
    assert user_pairs_key(data) != key
    second = pair_table_path(prepared, ["mine"], lines.append, data=data)
    assert second != first and first.is_file()
    after = pq.read_table(second)["query"].to_pylist()
    assert sorted(set(after) - set(before)) == [rows[4]["query"]] and len(after) == len(before)
    kept = sorted(p.name for p in (prepared.directory / "user-pairs").iterdir() if not p.name.startswith("."))  # not the locks
    assert kept == sorted([key, user_pairs_key(data)])


def test_the_frozen_pair_table_is_rebuilt_when_the_code_that_builds_it_changes(prepared, tmp_path, monkeypatch):
    """The key covers every module the table's rows come from (the builders and the table code,
    user pairs through their own key): an edit to the table code under the same inputs gives a
    new table path, never the old file."""
    import inspect
    import shutil
    from functools import partial

    from embedlab.artifacts import build as artifacts
    from embedlab.core.code_identity import PACKAGE_DIR, code_revision
    from embedlab.pairs import table as pairs_table
    from embedlab.pairs.builders import build_pairs, merge_positive_groups

    for function in (pairs_table.pair_table_path, pairs_table.builtin_pairs_table, build_pairs, merge_positive_groups):
        assert Path(inspect.getsourcefile(function)).relative_to(PACKAGE_DIR).as_posix() in pairs_table.PAIR_SOURCES
    first = pairs_table.pair_table_path(prepared, ["title-body"], progress=lambda line: None)
    copy = tmp_path / "package"
    for name in pairs_table.PAIR_SOURCES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE_DIR / name, copy / name)
    # The artifact layer keys by the revision of the code's files: read them from the copy.
    monkeypatch.setattr(artifacts, "code_revision", partial(code_revision, root=copy))
    assert pairs_table.pair_table_path(prepared, ["title-body"], progress=lambda line: None) == first
    with open(copy / "pairs/table.py", "a", encoding="utf-8") as edited:
        edited.write("# an edit\n")
    second = pairs_table.pair_table_path(prepared, ["title-body"], progress=lambda line: None)
    assert second != first and second.is_file() and first.is_file()


def _mining_trial(tmp_path: Path) -> TrialConfig:
    """A phase-3 trial mining 2 negatives for the user pairs and title-body, from a tiny parent."""
    import synthetic

    parent = synthetic.write_parent(tmp_path / "parent", synthetic.tokenizer(tmp_path / "tokenizer"))
    data = dataclasses.replace(synthetic.DATA, pair_files=(PairFiles(
        name="mine", path=str(write_jsonl(tmp_path / "pairs.jsonl", user_rows())), rights=RIGHTS),),
        mixture=MixtureConfig(max_epochs=8))
    return TrialConfig(model=synthetic.MODEL, data=data, phase=3, parent=str(parent),
                       train=dataclasses.replace(TrialConfig().train, budget=pairs_budget(8), batch_rows=2, num_workers=1),
                       contrastive=ContrastiveConfig(pairs=(("mine", 0.5), ("title-body", 0.5)), pair_length=16,
                                                     negatives=NegativesConfig(count=2, top_k=5, margin=0.0)))


def test_phase3_mines_negatives_for_user_pairs_beside_built_in_ones(prepared, tmp_path):
    """User pairs have no corpus documents: mining takes them anyway (known-positive and
    same-group cannot apply) and gives them training documents as negatives."""
    from embedlab.negatives.mining import MinedSet
    from embedlab.negatives.phase3 import mine_for_phase3
    from embedlab.pairs.table import pair_table_path
    from embedlab.sweep.cluster import mines_negatives
    from embedlab.train.trial_data import trial_pair_schedule

    trial = _mining_trial(tmp_path)
    data = trial.data
    assert mines_negatives(trial) and not mines_negatives(dataclasses.replace(
        trial, contrastive=dataclasses.replace(trial.contrastive, negatives=dataclasses.replace(
            trial.contrastive.negatives, mine=False, given_margin="off"))))
    path = pair_table_path(prepared, ["mine", "title-body"], data=data, **QUIET)
    schedule, offsets = trial_pair_schedule(trial, path)
    mined = MinedSet.load(mine_for_phase3(trial, prepared, path, schedule, offsets, **QUIET))
    corpus = set(prepared.corpus.read()["doc_id"].to_pylist())
    user = [p for p in mined.negatives if p.startswith("mine:")]
    assert user and len(user) < len(mined.negatives)
    assert all(n.doc_id in corpus for p in mined.negatives for n in mined.negatives[p])
    assert sum(len(mined.negatives[p]) for p in user) > 0


def test_a_changed_encode_length_or_mining_code_mines_a_new_set(prepared, tmp_path, monkeypatch):
    """The mined set's version covers how the parent encodes (pair_length, its pooling) and the
    code that mines; the same inputs reuse the set. Given negatives screened by the parent the same."""
    from embedlab.negatives import phase3 as phase3_negatives
    from embedlab.negatives.mining import MinedSet
    from embedlab.pairs.table import pair_table_path
    from embedlab.train.trial_data import trial_pair_schedule

    trial = _mining_trial(tmp_path)
    data = trial.data
    path = pair_table_path(prepared, ["mine", "title-body"], data=data, **QUIET)
    schedule, offsets = trial_pair_schedule(trial, path)

    def sets(trial):
        return (phase3_negatives.mine_for_phase3(trial, prepared, path, schedule, offsets, **QUIET),
                phase3_negatives.given_negatives_for_phase3(trial, prepared, path, schedule, offsets, **QUIET))

    first = sets(trial)
    assert sets(trial) == first
    mined = MinedSet.load(first[0])
    assert mined.encoding["max_length"] == 16 and mined.encoding["pooling"] == "mean" and mined.encoding["code"]
    longer = sets(dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, pair_length=24)))
    assert longer[0] != first[0] and longer[1] != first[1] and MinedSet.load(longer[0]).encoding["max_length"] == 24
    monkeypatch.setattr(phase3_negatives, "code_revision", lambda sources: "other mining code")
    recoded = sets(trial)
    assert recoded[0] not in (first[0], longer[0]) and recoded[1] not in (first[1], longer[1])


def test_corpus_vectors_are_encoded_once_and_a_reusing_set_equals_one_mined_without_them(prepared, tmp_path):
    """Trials of other seeds (other scheduled pairs) from one parent mine against the training
    documents' vectors encoded once (`corpus_vectors`); the set that reuses them holds the
    negatives and the recorded cost of the same set mined from scratch."""
    import json
    import shutil

    from embedlab.negatives.candidates import CANDIDATES_DIR
    from embedlab.negatives.mining import MinedSet
    from embedlab.negatives.phase3 import CORPUS_VECTORS_DIR, MINING_COST_FILE, mine_for_phase3
    from embedlab.pairs.table import pair_table_path
    from embedlab.train.trial_data import trial_pair_schedule

    trial = _mining_trial(tmp_path)
    other = dataclasses.replace(trial, train=dataclasses.replace(trial.train, seed=trial.train.seed + 1))
    path = pair_table_path(prepared, ["mine", "title-body"], data=trial.data, **QUIET)

    def mine(trial, lines):
        return mine_for_phase3(trial, prepared, path, *trial_pair_schedule(trial, path), progress=lines.append)

    def vector_sets() -> set[str]:  # other tests' parents may have left theirs
        root = prepared.directory / CORPUS_VECTORS_DIR
        return {p.name for p in root.iterdir() if not p.name.startswith(".")} if root.is_dir() else set()

    first_lines, second_lines, fresh_lines = [], [], []
    before = vector_sets()
    first, second = mine(trial, first_lines), mine(other, second_lines)
    assert second != first  # other pairs: a set of its own
    assert len(vector_sets() - before) == 1  # one set of vectors for both
    assert not any("reused" in line for line in first_lines)
    assert any(line.startswith("mining: ") and "vectors reused from" in line for line in second_lines)
    reused = json.loads((second / MINING_COST_FILE).read_text())
    assert reused["corpus_vectors"]["reused"] is True
    reused_negatives = MinedSet.load(second).negatives
    assert any(reused_negatives.values())

    shutil.rmtree(prepared.directory / CORPUS_VECTORS_DIR / reused["corpus_vectors"]["set"])
    shutil.rmtree(prepared.directory / CANDIDATES_DIR / reused["candidates"])  # the search, which reused them
    shutil.rmtree(second)
    fresh = mine(other, fresh_lines)
    assert fresh == second and not any("reused" in line for line in fresh_lines)
    assert MinedSet.load(fresh).negatives == reused_negatives
    from_scratch = json.loads((fresh / MINING_COST_FILE).read_text())
    assert reused["flops"] == from_scratch["flops"] > 0


def test_every_positive_of_a_multi_positive_beir_query_is_a_row_of_its_group_and_is_scheduled(prepared, tmp_path):
    """A BEIR query with three relevant documents is three rows of the frozen pairs table, one per
    (query, positive), best grade first, ids "<pair id>#<i>", one positive group (never each
    other's negatives); a one-positive query keeps its pair id. Each row is one positive pair of
    the budget, and the schedule reads all four rows, each as often as the others (±1)."""
    from embedlab.pairs.readers import BEIRPairs, beir_doc_text
    from embedlab.pairs.table import pair_table_path
    from embedlab.pairs.user import RECORD_FILE, user_pairs_dir
    from embedlab.train.trial_data import trial_pair_schedule

    docs = [summary_and_body(f) for f in USER_FUNCTIONS[:4]]
    corpus = {f"d{i}": (USER_FUNCTIONS[i].__qualname__, docs[i][1]) for i in range(4)}
    queries = {"q0": docs[0][0], "q1": docs[3][0]}
    train = [("q0", "d0", 2), ("q0", "d1", 3), ("q0", "d2", 1), ("q1", "d3", 1)]
    root = write_beir(tmp_path / "beir", corpus, queries, {"train": train})
    data = DataConfig(beir_pairs=(BEIRPairs(name="folder", path=str(root), rights=RIGHTS),),
                      dev_fraction=0.01, test_fraction=0.01, mixture=MixtureConfig(max_epochs=8))
    path = pair_table_path(prepared, ["folder"], data=data, **QUIET)
    rows = pq.read_table(path).to_pylist()
    text = {d: beir_doc_text(*corpus[d]) for d in corpus}
    assert [(r["pair_id"], r["query"], r["positive"], r["positive_group"], r["doc_ids"]) for r in rows] == [
        ("folder:q0#0", docs[0][0], text["d1"], "folder:q0", ["folder:d1", "folder:d0", "folder:d2"]),
        ("folder:q0#1", docs[0][0], text["d0"], "folder:q0", ["folder:d1", "folder:d0", "folder:d2"]),
        ("folder:q0#2", docs[0][0], text["d2"], "folder:q0", ["folder:d1", "folder:d0", "folder:d2"]),
        ("folder:q1", docs[3][0], text["d3"], "folder:q1", ["folder:d3"]),
    ]
    assert {tuple(r["positives"]) for r in rows[:3]} == {(text["d1"], text["d0"], text["d2"])}
    assert [r["scores"] for r in rows] == [[3.0, 2.0, 1.0]] * 3 + [[1.0]]
    record = json.loads((user_pairs_dir(prepared, data) / RECORD_FILE).read_text())
    assert record["splits"] == {"folder": {"train": 2, "dev": 0, "test": 0}}
    assert record["rows"] == {"folder": {"train": 4, "dev": 0, "test": 0}}

    trial = TrialConfig(data=data, phase=2, contrastive=ContrastiveConfig(pairs=(("folder", 1.0),)),
                        train=dataclasses.replace(TrialConfig().train, budget=pairs_budget(8), batch_rows=2, num_workers=1))
    schedule, offsets = trial_pair_schedule(trial, path)
    read = collections.Counter((offsets["folder"] + schedule.item).tolist())
    assert sorted(read) == [0, 1, 2, 3] and max(read.values()) - min(read.values()) <= 1
    assert sum(read.values()) == len(schedule.item) >= 8


def test_the_data_audit_contrastive_pairs_stage_covers_the_specs_user_pairs(prepared, task_dir, tmp_path):
    """`embedlab data audit`'s contrastive-pairs stage, given the spec's data config, holds the
    user pairs' train split beside the built-in pairs: a user pair whose query is a test query
    and one whose given negative is a test document are findings of that stage, as in the
    sweep's pre-flight; without the config the stage is the built-in pairs alone."""
    from embedlab.sweep.gate import run_audit
    from embedlab.contamination.stages import PAIRS_STAGE
    from embedlab.core.beir import load_task

    task = load_task(task_dir)
    rows = user_rows()
    rows[1]["query"] = task.queries["q0"]
    rows[3]["negatives"] = [task.corpus["d2"][1]]
    data = user_data(write_jsonl(tmp_path / "pairs.jsonl", rows), dev_fraction=0.01, test_fraction=0.01)

    def findings(**config) -> set[tuple]:
        report = run_audit(prepared, stages=(PAIRS_STAGE,), extra_tasks=[task_dir], **QUIET, **config)
        return {(f.stage, f.split, f.item_kind, f.item_id, f.stage_item_id, f.match) for f in report.findings}

    built_in = findings()
    assert findings(data=data) - built_in == {
        (PAIRS_STAGE, "test", "query", "q0", "mine:u1:query", "exact"),
        (PAIRS_STAGE, "test", "document", "d2", "mine:u3:negative:0", "exact"),
    }
    assert not any(item.startswith("mine:") for *_, item, _ in built_in)


def test_the_data_card_lists_each_user_pair_source_its_provenance_and_its_drops(prepared, tmp_path):
    """A directory with a card (the card module's own writer): freezing user pairs rewrites
    data_card.json and data_card.md with each source (a JSONL file and a BEIR folder), its files'
    sha256, its rights note, its pair and row counts and its drops in the exclusion report."""
    import hashlib

    from embedlab.pairs.readers import BEIRPairs
    from embedlab.pairs.user import user_pairs_dir
    from embedlab.prepared.card import card_dict, write_card

    manifest = {"hash": "hand-made", "sources": {}, "unavailable_sources": {}, "split_rule": "all train",
                "dedup": {"exact": "content hash", "near": "none", "multi_document_clusters": 0,
                          "documents_in_multi_document_clusters": 0, "cross_source_clusters": 0},
                "exclusions": [{"source": "python-docstrings", "reason": "empty text", "count": 2}]}
    (prepared.directory / "corpus" / "manifest.json").write_text(json.dumps(manifest))
    record = {**prepared.record, "corpus_hash": "hand-made", "tokenizer_hash": "0" * 64,
              "tokenizer": {"kind": "bpe", "vocab_size": 64}, "tokenizer_sample_documents": len(CORPUS_FUNCTIONS),
              "mixture": {"shares": {"python-docstrings": 1.0}, "origin": "hand-made", "schedule": "deficit/1",
                          "seed": 0, "max_epochs": 1.0, "notes": []}, "pieces": {}}
    prepared = PreparedData(prepared.directory, record)
    write_card(prepared.directory, card_dict(record, manifest, {}))
    assert json.loads((prepared.directory / "data_card.json").read_text())["user_pairs"] == {}

    rows = user_rows()[:4]
    rows[0]["negatives"] = [rows[0]["positive"].upper()]  # a negative equal to its positive
    file = write_jsonl(tmp_path / "pairs.jsonl", rows)
    docs = [summary_and_body(f) for f in USER_FUNCTIONS[4:7]]
    root = write_beir(tmp_path / "beir", {f"d{i}": ("", d[1]) for i, d in enumerate(docs)}, {"q0": docs[0][0]},
                      {"train": [("q0", "d0", 1), ("q0", "d1", 1), ("q0", "d2", 0)]})
    beir_rights = "CC BY-SA 4.0, attribution in NOTICE"
    data = DataConfig(pair_files=(PairFiles(name="mine", path=str(file), rights=RIGHTS),),
                      beir_pairs=(BEIRPairs(name="folder", path=str(root), rights=beir_rights),),
                      dev_fraction=0.01, test_fraction=0.01)
    key = user_pairs_dir(prepared, data, **QUIET).name

    card = json.loads((prepared.directory / "data_card.json").read_text())
    [pairs] = card["user_pairs"].values()
    sha = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in (
        ("pairs.jsonl", file), ("corpus.jsonl", root / "corpus.jsonl"), ("queries.jsonl", root / "queries.jsonl"),
        ("qrels/train.tsv", root / "qrels" / "train.tsv"))}
    assert [(s["name"], s["kind"], s["rights"], {f["path"]: f["sha256"] for f in s["files"]})
            for s in pairs["sources"]] == [
        ("mine", "pair-files", RIGHTS, {"pairs.jsonl": sha["pairs.jsonl"]}),
        ("folder", "beir-pairs", beir_rights, {n: sha[n] for n in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv")}),
    ]
    assert pairs["exclusions"] == [{"source": "mine", "reason": "text dropped: negative equals positive", "count": 1}]
    assert pairs["rows"] == {"mine": {"train": 4, "dev": 0, "test": 0}, "folder": {"train": 2, "dev": 0, "test": 0}}

    markdown = (prepared.directory / "data_card.md").read_text().splitlines()
    report = markdown[markdown.index("## Exclusion report"):]
    assert report[2:6] == ["| source | reason | count |", "|---|---|---:|", "| python-docstrings | empty text | 2 |",
                           "| mine | text dropped: negative equals positive | 1 |"]
    section = markdown[markdown.index(f"## User pair sources ({key})"):]
    assert [line for line in section if line.startswith(("| mine ", "| folder "))] == [
        f"| mine | pair-files | {pairs['sources'][0]['revision']} | 4 | 4 | 4 | 4 | 0 | 0 | {RIGHTS} |",
        f"| folder | beir-pairs | {pairs['sources'][1]['revision']} | 1 | 1 | 2 | 1 | 0 | 0 | {beir_rights} |",
    ]
    assert [line for line in section if line.startswith("- `")] == [
        f"- `mine` file `pairs.jsonl`: sha256 `{sha['pairs.jsonl']}`",
        *(f"- `folder` file `{n}`: sha256 `{sha[n]}`" for n in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv")),
    ]


def test_mining_on_the_users_corpus_never_returns_a_labelled_positive(prepared, tmp_path):
    """The user's documents are corpus documents (as a local_files source makes them) and their
    BEIR judgements a pair source: query shutil.move's summary, positives its body (titled, best
    grade) and shutil.copy2's body. In the corpus the first is stored without its title and the
    second case-changed and re-wrapped; they are the query's two nearest documents, both below the
    first positive's score. Mined with margin 0, neither is ever a negative of either row:
    positive-text covers both ways of containment and every positive of the row's group,
    scheduled or not."""
    from test_mining import encode

    from embedlab.negatives.mining import MiningConfig, mine_hard_negatives
    from embedlab.pairs.builders import PAIR_SCHEMA, Pair
    from embedlab.pairs.readers import BEIRPairs
    from embedlab.pairs.table import group_positive_texts, pair_table_path

    (query, moved), (_, copied) = summary_and_body(shutil.move), summary_and_body(shutil.copy2)
    root = write_beir(tmp_path / "beir", {"d0": ("shutil.move", moved), "d1": ("", copied)}, {"q0": query},
                      {"train": [("q0", "d0", 2), ("q0", "d1", 1)]})
    data = DataConfig(beir_pairs=(BEIRPairs(name="folder", path=str(root), rights=RIGHTS),),
                      dev_fraction=0.01, test_fraction=0.01)
    path = pair_table_path(prepared, ["folder"], data=data, **QUIET)
    pairs = [Pair(**{**r, "doc_ids": tuple(r["doc_ids"])}) for r in pq.read_table(path, columns=PAIR_SCHEMA.names).to_pylist()]
    assert [(p.pair_id, p.positive) for p in pairs] == [("folder:q0#0", f"shutil.move. {moved}"),
                                                        ("folder:q0#1", copied)]
    mine_docs = [{"doc_id": "mydocs:move.txt", "title": "", "text": moved},
                 {"doc_id": "mydocs:copy2.txt", "title": "", "text": "\n".join(textwrap.wrap(copied.upper(), 30))}]
    corpus = pa.concat_tables([prepared.corpus.read(), pa.Table.from_pylist([
        {**d, "source": "mydocs", "hash": content_hash(d["text"]), "group_id": d["doc_id"], "split": "train"}
        for d in mine_docs], schema=CORPUS_SCHEMA)])

    # The precondition, by the encoder's own scores: the two copies are the query's nearest documents
    # and the margin keeps both for the first row (both score below its positive).
    scores = (encode([query]) @ encode(corpus["text"].to_pylist()).T)[0]
    ranked = [corpus["doc_id"][int(i)].as_py() for i in np.argsort(-scores)]
    ceiling = float(encode([query])[0] @ encode([pairs[0].positive])[0])
    below = [d for d, s in zip(corpus["doc_id"].to_pylist(), scores) if s <= ceiling]
    assert ranked[:2] == ["mydocs:move.txt", "mydocs:copy2.txt"] and set(ranked[:2]) <= set(below)

    config = MiningConfig(top_k=len(corpus), negatives_per_query=len(corpus), false_negative_margin=0.0)
    identity = {"encoder_id": "toy-bow-64", "corpus_revision": "hand-made", "progress": QUIET["progress"],
                "outside_corpus": frozenset(p.pair_id for p in pairs)}
    mined = mine_hard_negatives(pairs, corpus, encode, config=config, **identity)
    negatives = {p: [n.doc_id for n in found] for p, found in mined.negatives.items()}
    corpus_ids = set(prepared.corpus.read()["doc_id"].to_pylist())
    assert set(negatives["folder:q0#0"]) == {d for d in below if d.startswith("python-docstrings:")}
    assert not {"mydocs:move.txt", "mydocs:copy2.txt"} & {d for found in negatives.values() for d in found}
    assert mined.counts["dropped"]["positive-text"] == 4  # both copies, for each of the two rows
    assert all(set(found) <= corpus_ids for found in negatives.values())

    # The first row alone (the schedule may read one row of a group): its sibling's copy would be
    # its best negative; the table's group positives keep it out.
    alone = mine_hard_negatives(pairs[:1], corpus, encode, config=config, **identity)
    assert alone.negatives["folder:q0#0"][0].doc_id == "mydocs:copy2.txt"
    kept = mine_hard_negatives(pairs[:1], corpus, encode, config=config, group_positives=group_positive_texts(path),
                               **identity)
    assert [n.doc_id for n in kept.negatives["folder:q0#0"]] == negatives["folder:q0#0"]


def test_mining_from_a_parent_on_object_storage_equals_mining_from_its_local_copy(prepared, tmp_path, s3_server,
                                                                                  monkeypatch):
    """A phase-3 trial whose parent is an s3:// URI mines through this node's verified copy of
    it: the same negatives, for the same version, as from the checkpoint on local disk."""
    import synthetic

    from embedlab.core import store
    from embedlab.negatives.candidates import CANDIDATES_DIR
    from embedlab.negatives.mining import MinedSet
    from embedlab.negatives.phase3 import MINING_COST_FILE, mine_for_phase3
    from embedlab.pairs.table import pair_table_path
    from embedlab.train.trial_data import trial_pair_schedule

    monkeypatch.setenv("EMBEDLAB_CACHE", str(tmp_path / "node-cache"))
    parent = synthetic.write_parent(tmp_path / "parent", synthetic.tokenizer(tmp_path / "tokenizer"))
    remote = store.join(s3_server.bucket("mining-parent"), "runs", "p", "checkpoint_000000")
    store.upload_tree(Path(parent), remote)
    data = dataclasses.replace(synthetic.DATA, mixture=MixtureConfig(max_epochs=8))
    mined = {}
    for where, location in (("s3", remote), ("local", str(parent))):
        trial = TrialConfig(model=synthetic.MODEL, data=data, phase=3, parent=location,
                            train=dataclasses.replace(TrialConfig().train, budget=pairs_budget(8), batch_rows=2, num_workers=1),
                            contrastive=ContrastiveConfig(pairs=(("title-body", 1.0),), pair_length=16,
                                                          negatives=NegativesConfig(count=2, top_k=5, margin=0.0)))
        path = pair_table_path(prepared, ["title-body"], data=data, **QUIET)
        schedule, offsets = trial_pair_schedule(trial, path)
        directory = mine_for_phase3(trial, prepared, path, schedule, offsets, **QUIET)
        mined[where] = (directory.name, MinedSet.load(directory).negatives)
        # The next one mines afresh instead of reading this one's set and search.
        search = json.loads((directory / MINING_COST_FILE).read_text())["candidates"]
        shutil.rmtree(prepared.directory / CANDIDATES_DIR / search)
        shutil.rmtree(directory)
    assert mined["s3"] == mined["local"] and mined["s3"][1]
    assert (store.cache_dir() / "checkpoints").is_dir()  # the URI was read through this node's cache


def test_trials_read_the_pair_table_the_sweep_froze_without_the_users_files(prepared, tmp_path):
    """The sweep records each arm's frozen pair table in the prepared record; a trial on a node
    without the user's pair files (they live on the submitting machine) reads that table,
    where building it again would need the files."""
    from embedlab.pairs.table import PAIR_TABLES, pair_table_name, pair_table_path, recorded_pair_table

    pairs_file = write_jsonl(tmp_path / "pairs.jsonl", user_rows())
    data = user_data(pairs_file)
    builders = ["mine", "title-body"]
    path = pair_table_path(prepared, builders, data=data, **QUIET)
    record = {**prepared.record, PAIR_TABLES: {pair_table_name(builders): path.relative_to(prepared.directory).as_posix()}}
    elsewhere = PreparedData(prepared.directory, record)
    pairs_file.unlink()
    assert recorded_pair_table(elsewhere, list(reversed(builders))) == path
    assert recorded_pair_table(elsewhere, ["title-body"]) is None  # another set: built as before
    from embedlab.sources.external import SourceError

    with pytest.raises(SourceError, match="does not exist"):
        pair_table_path(prepared, builders, data=data, **QUIET)
