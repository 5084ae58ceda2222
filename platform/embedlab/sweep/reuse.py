"""Finished trials reused by content: a trial is named by what determines its result (its key),
and a study, a ladder rung, a tour stage or a later round that asks for a trial already
finished under the same storage root copies that trial's row instead of training it again.

The key (`trial_key`) is sha256 over

    config     the resolved trial config (`Study.trial_config` with the arm's tuned values):
               model, data, objective, training with its seed and budget, evaluation; the
               parent's location left out (its content is next)
    parent     the parent checkpoint's content hash, None without one
    data       the prepared data's record without its locations (corpus, tokenizer and pieces
               hashes, tasks, retention panel, the code revision that built it) and the content
               hash of every task the trial is scored on
    artifacts  what the other inputs do not fix: the key of a user's frozen pair sources
               (`pairs.user.user_pairs_key`: every source file read and hashed)
    code       the training path's revision (`code_identity.code_revision` over
               `code_identity.import_closure(TRAINING_PATH)`: every embedlab source file a
               trial's process can run, from its driver through training, its data sets and
               the evaluation actor; an edit to the statistics, tables, reports or command line
               is not one) and the versions of the libraries that compute it

The other sets a phase 2-3 trial trains on (its pairs table, mined and screened negatives,
teacher labels and documents) are artifacts keyed by these same inputs and that same code, so
the key fixes them without building them first. The machine is not in the key: on one storage
root, trials are reused across machines of one kind.

Index: `<storage root>/trial-index/<key[:2]>/<key>.json`, one small file per finished trial
(written whole, by the trial's own driver, after its row), naming the run directory and the
trial id: a lookup reads one file, never a scan of the runs. A hit is checked against the row
itself (finished, a final trial, the same key, a finite study metric, a per-query file), so a
stale entry is a miss. Failed, stopped and non-finite trials are never indexed.

A reused row is the original row with this study's name, arm, factor and a new trial id, and
`reused_from` naming the original (`<run directory>/<trial id>`); its checkpoint is the
original's, so lineage stays whole. Its per-query file is copied beside it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import platform as stdlib_platform
from typing import Any

from embedlab.core import code_identity, store
from embedlab.core.beir import load_task
from embedlab.core.config import TrialConfig
from embedlab.records.rundir import PER_QUERY_DIR, TRIALS_DIR, read_record, write_json
from embedlab.studies.study import Study
from embedlab.tasks.resolve import arm_eval_tasks

INDEX_DIR = "trial-index"
REUSED_FROM = "reused_from"
TRIAL_KEY = "trial_key"
# Where a trial's process starts: its Tune driver function, the data sets built for it, the
# evaluation actor that scores it. Every module they import is on the training path.
TRAINING_PATH = ("embedlab.sweep.driver", "embedlab.train.trial_data", "embedlab.evaluate.actor")
# Libraries whose version can change a trial's numbers.
LIBRARIES = ("torch", "numpy", "ray", "pyarrow", "faiss-cpu", "faiss-gpu", "tokenizers", "transformers",
             "sentence-transformers")
# Prepared-record fields that say where the data are, not what they are.
LOCATIONS = ("directory", "eval_tasks", "published", "tree_hash")


@functools.cache
def training_code() -> dict[str, Any]:
    """The code identity in a trial's key: the training path's revision and library versions."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"revision": code_identity.code_revision(code_identity.import_closure(TRAINING_PATH)),
            "python": stdlib_platform.python_version(), "libraries": versions}


@functools.cache
def _task_hash(directory: str) -> str:
    return load_task(directory).hash


def data_identity(trial: TrialConfig, prepared: dict[str, Any]) -> dict[str, Any]:
    """What the trial's data are, without where: the prepared record less its locations, the
    content hash of each task it is scored on, and a user's pair sources' key."""
    identity: dict[str, Any] = {
        "prepared": {k: v for k, v in prepared.items() if k not in LOCATIONS},
        "tasks": [[name, _task_hash(directory)] for name, directory in arm_eval_tasks(trial.eval, prepared)],
    }
    if trial.data.pair_sources:
        from embedlab.pairs.user import user_pairs_key  # here: pyarrow, which a sweep of phase 1 does not need

        identity["user_pairs"] = user_pairs_key(trial.data)
    return identity


def trial_key(trial: TrialConfig, prepared: dict[str, Any], parent_hash: str | None,
              code: dict[str, Any] | None = None) -> str:
    """The key of a trial: sha256 of its config (less the parent's location), its parent's
    content hash, its data's identity and the training code's (module docstring)."""
    config = trial.to_dict()
    config.pop("parent", None)
    identity = {"config": config, "parent": parent_hash, "data": data_identity(trial, prepared),
                "code": training_code() if code is None else code}
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def index_entry(storage_root: str, key: str) -> str:
    return store.join(storage_root, INDEX_DIR, key[:2], f"{key}.json")


def reusable(row: dict[str, Any], metric: str) -> bool:
    """A row another study may copy: a finished final trial with a key and a finite `metric`."""
    value = row.get(metric)
    return (row.get("status") == "finished" and row.get("stage", "final") == "final" and bool(row.get(TRIAL_KEY))
            and isinstance(value, (int, float)) and math.isfinite(value))


def record_finished(run_dir: str, row: dict[str, Any], metric: str) -> None:
    """Index a trial the run trained (its row written), if another study may reuse it."""
    if not reusable(row, metric) or row.get(REUSED_FROM):
        return
    entry = {"key": row[TRIAL_KEY], "run": store.name(run_dir), "trial_id": row["trial_id"], "arm": row["arm"],
             "seed": row["seed"], "study": row.get("study")}
    write_json(index_entry(store.parent(run_dir), row[TRIAL_KEY]), entry)


def lookup(storage_root: str, key: str, metric: str) -> tuple[str, dict[str, Any]] | None:
    """(run directory, row) of a finished trial with this key under `storage_root`, or None."""
    location = index_entry(storage_root, key)
    if not store.exists(location):
        return None
    entry = read_record(location, "a trial index entry", ("run", "trial_id"))
    run_dir = store.join(storage_root, entry["run"])
    row_file = store.join(run_dir, TRIALS_DIR, f"{entry['trial_id']}.json")
    per_query = store.join(run_dir, PER_QUERY_DIR, f"{entry['trial_id']}.json")
    if not (store.exists(row_file) and store.exists(per_query)):
        return None
    row = read_record(row_file, "a trial row", ("trial_id", "arm", "seed"))
    if row.get(TRIAL_KEY) != key or not reusable(row, metric):
        return None
    return run_dir, row


def copy_trial(source_dir: str, row: dict[str, Any], run_dir: str, study: Study, arm: str) -> dict[str, Any]:
    """Copy a finished trial of `source_dir` into `run_dir` as `study`'s trial of `arm`: its
    per-query file first, then its row (a row on disk means its per-query values are there)."""
    trial_id = f"{row['trial_id']}-reused"
    copied = {**row, "study": study.name, "arm": arm, "factor": study.factor, "factor_value": study.factor_value(arm),
              "trial_id": trial_id, REUSED_FROM: f"{store.name(source_dir)}/{row['trial_id']}"}
    per_query = json.loads(store.read_text(store.join(source_dir, PER_QUERY_DIR, f"{row['trial_id']}.json")))
    per_query.update(trial_id=trial_id, arm=arm)
    write_json(store.join(run_dir, PER_QUERY_DIR, f"{trial_id}.json"), per_query)
    write_json(store.join(run_dir, TRIALS_DIR, f"{trial_id}.json"), copied)
    return copied
