"""A sweep's run directory and the records written into it: a new directory for each run, a
trial's row and per-query file, the rows so far, and the JSON records.

Run directory (`<storage>/<study>-<timestamp>/`):
    study.json          the resolved study, its hash, the study file's text, versions, and
                        (with a search) "tuning": sampler, trials per arm, seeds, failures
    prepared.json       the prepared data each arm used (paths, hashes, token shares)
    trials/<id>.json    one trial's row, whatever its end: finished, nonfinite, failed
                        (what `embedlab table` reads)
    per_query/<id>.json a scored trial's per-query values (`PER_QUERY_DIR`, for paired tests)
    sequential.json     a study run until decided: its design, each round's trials and each
                        look with its boundaries and verdicts (`SEQUENTIAL_FILE`)
    search.json         each arm's tuned values     optuna.db  Optuna's storage
    train/              Ray Train runs (checkpoints)     tune/  Ray Tune experiment state
"""

from __future__ import annotations

import json
import time
from typing import Any

from embedlab.core import store
from embedlab.core.errors import RunRecordError
from embedlab.core.schema import upgrade
from embedlab.records.scores import TrialScores

# Defined here, the run directory's layout, not in the modules that read them (table, paired):
# a trial's driver writes rows without importing pandas or scipy.
TRIALS_DIR = "trials"
PER_QUERY_DIR = "per_query"
SEQUENTIAL_FILE = "sequential.json"
TRIAL_FIELDS = ("trial_id", "arm", "seed")  # what every trial row has, whatever its end

# Of an error's text kept in a failed trial's row. Fixed, not a setting: the row keeps the
# end, where the exception's own line is, and stays a small record.
ERROR_CHARS = 2_000


def new_run_dir(storage: str, name: str) -> str:
    """A fresh `<storage>/<name>-<timestamp>[-n]`; an earlier run is never written into."""
    base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    for attempt in range(1, 100):
        run_dir = store.join(storage, base if attempt == 1 else f"{base}-{attempt}")
        try:
            store.make_dir(run_dir, exist_ok=False)
            return run_dir
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new run directory next to {store.join(storage, base)}")


def write_row(run_dir: str, row: dict[str, Any]) -> None:
    """Write one trial's row atomically: a row is whole or absent, never half-written."""
    store.write_text(store.join(run_dir, TRIALS_DIR, f"{row['trial_id']}.json"), json.dumps(row, indent=2, sort_keys=True))


def write_per_query(run_dir: str, row: dict[str, Any], scored: TrialScores, split: str) -> None:
    """`per_query/<trial_id>.json`: each query's value of every metric the row averages, keyed
    as the row's columns are (`<split>/ndcg@10`; a panel's `<task>/<split>/ndcg@10` too, with the
    panel's "tasks" and "task_hashes"), so a paired test across arms can match queries. Kept
    out of the row, which stays one line of numbers per trial."""
    record = {
        "trial_id": row["trial_id"], "arm": row["arm"], "seed": row["seed"], "stage": row["stage"],
        "split": split, "task_hash": scored.main["task_hash"], "values": scored.per_query,
        **({"tasks": list(scored.tasks), "task_hashes": scored.task_hashes} if scored.tasks else {}),
    }
    store.write_text(store.join(run_dir, PER_QUERY_DIR, f"{row['trial_id']}.json"),
                     json.dumps(record, indent=2, sort_keys=True))


def read_record(location: str, kind: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """One JSON object record of a run directory, or RunRecordError naming the file and the
    problem: empty, truncated or not JSON, not an object, or without a `required` field."""
    text = store.read_text(location)
    if not text.strip():
        raise RunRecordError(f"{location}: empty file, not {kind}")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise RunRecordError(f"{location}: not {kind}: truncated or invalid JSON ({error})") from None
    if not isinstance(record, dict):
        raise RunRecordError(f"{location}: not {kind}: a JSON {type(record).__name__}, not an object")
    absent = [key for key in required if key not in record]
    if absent:
        raise RunRecordError(f"{location}: not {kind}: no {', '.join(repr(k) for k in absent)}")
    return record


def trial_records(run_dir: str) -> list[tuple[str, dict[str, Any]]]:
    """(location, row) of every trial row of the run (`trials/*.json`), each checked by `read_record`."""
    return [(p, upgrade(read_record(p, "a trial row", TRIAL_FIELDS), "row"))
            for p in store.list_files(store.join(run_dir, TRIALS_DIR), ".json")]


def finished_rows(run_dir: str) -> list[dict[str, Any]]:
    """Every trial row of the run, as `trial_records` reads them."""
    return [row for _, row in trial_records(run_dir)]


def last_error_line(error: Any) -> str:
    """The last line of a row's recorded error (where the exception's own line is)."""
    text = error.strip() if isinstance(error, str) else ""
    return text.splitlines()[-1] if text else "no error recorded"


def write_json(location: str, value: Any) -> None:
    store.write_text(location, json.dumps(value, indent=2, sort_keys=True))


def error_text(text: str) -> str:
    """An error's text for a row: its end, where the exception's own line is."""
    text = text.strip()
    return text if len(text) <= ERROR_CHARS else "..." + text[-ERROR_CHARS:]
