"""A trial's key and the storage root's index of finished trials: any change of config, seed,
budget, parent, data, task, user pairs, training code or library version is another key, a
moved parent or data directory is not; an edit off the training path keeps the key; failed,
stopped, non-finite, tuning and copied trials are never indexed, and a stale entry is a miss; a
copy keeps the original's row and values, names where it came from, and the table marks it and
says what reuse saved. No Ray (the real sweep: test_reuse_and_rounds_on_ray.py)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from embedlab.core.code_identity import PACKAGE_DIR, code_revision, import_closure
from embedlab.stats.table import load_table, render
from embedlab.studies.study import Study
from embedlab.sweep import reuse
from embedlab.sweep.reuse import REUSED_FROM, TRIAL_KEY, copy_trial, lookup, record_finished, trial_key

from conftest import tiny_budget, tiny_trial
from test_paired_stats import METRIC, per_query_values, write_run


def write_task(directory: Path, text: str = "a short document") -> Path:
    """A BEIR task of two documents and one judged query."""
    (directory / "qrels").mkdir(parents=True)
    (directory / "corpus.jsonl").write_text(
        json.dumps({"_id": "d1", "title": "", "text": text}) + "\n"
        + json.dumps({"_id": "d2", "title": "", "text": "another one"}) + "\n")
    (directory / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "short"}) + "\n")
    for split in ("test", "dev"):
        (directory / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return directory


@pytest.fixture
def inputs(tmp_path):
    """A trial, its prepared record (its task in a directory of its own) and a code identity."""
    task = write_task(tmp_path / "task")
    prepared = {"data_revision": "r" * 64, "corpus_hash": "c" * 64, "directory": str(tmp_path / "prepared"),
                "eval_tasks": [["python-docstrings", str(task)]]}
    code = {"revision": "0123456789abcdef", "python": "3.11.0", "libraries": {"torch": "2.5.0"}}
    return tiny_trial(), prepared, code, task


def test_a_trial_key_changes_with_everything_that_decides_the_result(inputs, tmp_path):
    """Seed, budget, a config field, the parent's content, the prepared data, a task's content,
    the training code and a library version each change the key; the parent's location and
    the prepared data's location do not."""
    trial, prepared, code, task = inputs
    key = trial_key(trial, prepared, "p" * 64, code)
    assert key == trial_key(trial, dict(prepared), "p" * 64, dict(code))
    other_task = write_task(tmp_path / "task-2", text="a changed document")
    changed = {
        "seed": trial_key(replace(trial, train=replace(trial.train, seed=1)), prepared, "p" * 64, code),
        "budget": trial_key(replace(trial, train=replace(trial.train, budget=tiny_budget(tokens=7_000))), prepared,
                            "p" * 64, code),
        "config": trial_key(replace(trial, masking=replace(trial.masking, ratio=0.3)), prepared, "p" * 64, code),
        "parent": trial_key(trial, prepared, "q" * 64, code),
        "no parent": trial_key(trial, prepared, None, code),
        "data": trial_key(trial, {**prepared, "data_revision": "s" * 64}, "p" * 64, code),
        "task": trial_key(trial, {**prepared, "eval_tasks": [["python-docstrings", str(other_task)]]}, "p" * 64, code),
        "code": trial_key(trial, prepared, "p" * 64, {**code, "revision": "fedcba9876543210"}),
        "library": trial_key(trial, prepared, "p" * 64, {**code, "libraries": {"torch": "2.6.0"}}),
    }
    assert key not in changed.values() and len(set(changed.values())) == len(changed), changed
    extension = replace(trial, extension=True, parent="/here/checkpoint")  # a phase-1 run that has a parent
    moved_parent = replace(extension, parent="/elsewhere/checkpoint")
    moved_data = {**prepared, "directory": "/elsewhere/prepared", "published": "s3://b/p", "tree_hash": "t"}
    shutil.copytree(task, tmp_path / "task-copy")
    moved_task = {**moved_data, "eval_tasks": [["python-docstrings", str(tmp_path / "task-copy")]]}
    assert trial_key(moved_parent, moved_task, "p" * 64, code) == trial_key(extension, prepared, "p" * 64, code)
    assert trial_key(trial, moved_task, "p" * 64, code) == key


def test_the_training_path_is_what_a_trial_can_run_and_an_edit_elsewhere_keeps_the_key(tmp_path):
    """The training path follows every import from a trial's driver, its data sets and the
    evaluation actor: training, model, objectives, data, evaluation, yet no statistics, tables,
    reports or command line; editing a statistics module keeps its revision, editing the model
    changes it."""
    files = import_closure(reuse.TRAINING_PATH)
    for needed in ("sweep/driver.py", "train/loop.py", "model/encoder.py", "objectives/contrastive.py",
                   "evaluate/actor.py", "tasks/metrics.py", "train/trial_data.py", "records/rundir.py"):
        assert needed in files, needed
    assert not [f for f in files if f.split("/")[0] in ("stats", "cli", "report", "bench")]
    copy = tmp_path / "embedlab"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_revision(import_closure(reuse.TRAINING_PATH, copy), copy)
    (copy / "stats" / "paired.py").write_text((copy / "stats" / "paired.py").read_text() + "\n# edited\n")
    assert code_revision(import_closure(reuse.TRAINING_PATH, copy), copy) == before
    (copy / "model" / "encoder.py").write_text((copy / "model" / "encoder.py").read_text() + "\n# edited\n")
    assert code_revision(import_closure(reuse.TRAINING_PATH, copy), copy) != before


def _source(storage: Path) -> Path:
    """A run of study "toy" under `storage` whose rows carry keys, as a sweep's trained rows do."""
    run_dir = write_run(storage, per_query_values())
    target = storage / "toy-20261208-000000"
    run_dir.rename(target)
    for path in (target / "trials").glob("*.json"):
        row = json.loads(path.read_text())
        path.write_text(json.dumps({**row, TRIAL_KEY: f"key-{row['arm']}-{row['seed']}", "checkpoint": f"ckpt/{row['trial_id']}"}))
    return target


def _row(run_dir: Path, trial_id: str) -> dict:
    return json.loads((run_dir / "trials" / f"{trial_id}.json").read_text())


def test_only_a_whole_finished_trial_is_found_and_a_stale_entry_is_a_miss(tmp_path):
    """A finished final row with a key and a finite metric is indexed and found; a failed, a
    non-finite, a tuning or a copied row is never indexed; an entry whose row has since turned
    failed, holds another key or lost its per-query file is a miss; an unknown key is a miss."""
    storage = tmp_path / "runs"
    run_dir = _source(storage)
    row = _row(run_dir, "better-0")
    record_finished(str(run_dir), row, METRIC)
    assert lookup(str(storage), row[TRIAL_KEY], METRIC) == (str(run_dir), row)
    assert lookup(str(storage), "key-none", METRIC) is None
    for status in ({"status": "failed"}, {"status": "nonfinite"}, {"stage": "tune"}, {METRIC: float("nan")},
                   {REUSED_FROM: "other/trial"}):
        unfit = {**_row(run_dir, "same-1"), **status, TRIAL_KEY: f"key-{sorted(status)[0]}"}
        record_finished(str(run_dir), unfit, METRIC)
        assert not Path(reuse.index_entry(str(storage), unfit[TRIAL_KEY])).exists(), status
    (run_dir / "trials" / "better-0.json").write_text(json.dumps({**row, "status": "failed"}))
    assert lookup(str(storage), row[TRIAL_KEY], METRIC) is None
    (run_dir / "trials" / "better-0.json").write_text(json.dumps({**row, TRIAL_KEY: "key-other"}))
    assert lookup(str(storage), row[TRIAL_KEY], METRIC) is None
    (run_dir / "trials" / "better-0.json").write_text(json.dumps(row))
    (run_dir / "per_query" / "better-0.json").unlink()
    assert lookup(str(storage), row[TRIAL_KEY], METRIC) is None


def test_a_copied_trial_keeps_the_original_and_the_table_says_so(tmp_path):
    """Copied into another study's run as its arm: the same row but for its study, arm, factor
    and id, `reused_from` naming the original, the same checkpoint and per-query values; the
    table lists the column and states the compute reuse saved."""
    storage = tmp_path / "runs"
    source = _source(storage)
    base = tiny_trial()
    study = Study(name="other", factor="masking.ratio", arms={"plain": base, "more": replace(
        base, masking=replace(base.masking, ratio=0.3))}, seeds=(0, 1, 2), budget=tiny_budget())
    target = storage / "other-20261208-000001"
    (target / "trials").mkdir(parents=True)
    (target / "per_query").mkdir()
    record = json.loads((source / "study.json").read_text())
    record["study"]["name"], record["reuse"] = "other", True
    record["study"]["arms"] = {"plain": {}, "more": {}}
    record["arm_order"] = ["plain", "more"]
    (target / "study.json").write_text(json.dumps(record))
    for arm, original in (("plain", "control"), ("more", "better")):
        for seed in (0, 1, 2):
            row = _row(source, f"{original}-{seed}")
            copied = copy_trial(str(source), row, str(target), study, arm)
            assert copied[REUSED_FROM] == f"{source.name}/{original}-{seed}" and copied["arm"] == arm
            assert {k: v for k, v in copied.items() if k not in ("study", "arm", "trial_id", "factor", "factor_value",
                                                                  REUSED_FROM)} == {
                k: v for k, v in row.items() if k not in ("study", "arm", "trial_id", "factor", "factor_value")}
            values = json.loads((target / "per_query" / f"{copied['trial_id']}.json").read_text())
            assert values["values"] == json.loads((source / "per_query" / f"{original}-{seed}.json").read_text())["values"]
    table = load_table(target)
    assert table[REUSED_FROM].notna().all() and (table["checkpoint"].str.startswith("ckpt/")).all()
    text = render(target)
    assert "compute spent: 0 trial(s) trained by this run, 0 FLOPs" in text
    assert "reuse saved 6 trial(s), 6e+12 FLOPs" in text and f"{source.name}/better-2" in text
    assert np.isfinite(table["dev/ndcg@10"]).all()
