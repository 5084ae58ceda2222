"""Optuna's search for each arm of a study (the searcher itself: `embedlab.sweep.optuna_search`):
the run's Optuna storage, each arm's tuning trials as a Tune experiment, and the choice of
its best tuned values among the trials that finished with a finite metric."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedlab.core import store
from embedlab.core.errors import UserError
from embedlab.records.rundir import finished_rows, write_json
from embedlab.stats.table import STUDY_FILE
from embedlab.studies.study import Study
from embedlab.sweep.experiment import fit

# Fixed, not a setting: the run directory's layout (`embedlab.records.rundir`) names it, so a
# resumed run finds its Optuna storage there.
OPTUNA_FILE = "optuna.db"


def tune_arms(study: Study, driver, run_dir: str, record: dict, rows: list[dict], concurrency: int,
              progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Optuna's search per arm, `study.search_trials` trials each at `study.tuning_seeds` (equal
    tuning effort, never at a study seed); returns each arm's best values on the study metric
    (recipe-dev) among its tuning trials that finished with a finite value. Failed and
    nonfinite trials count against the budget, are excluded from the choice, printed, and
    listed in study.json's "tuning"; an arm with none usable raises `TuningError`."""
    # here: Optuna and Ray Tune (the searcher's module imports it), which a dry run does not need
    import optuna

    from embedlab.sweep.optuna_search import FinalResultOptuna, SamplerChoice, SearchSpace

    database = _optuna_database(run_dir)
    storage_url = f"sqlite:///{database}"
    sampler = SamplerChoice.for_trials(study.search_trials, study.tuning_seeds[0])
    tuning = {"sampler": sampler.description, "trials_per_arm": study.search_trials,
              "seeds": list(study.tuning_seeds), "failed": {}}
    best: dict[str, dict[str, Any]] = {}
    for arm in study.arms:
        attempted = _tuning_rows(rows, arm)
        remaining = study.search_trials - len(attempted)
        if remaining > 0:
            progress(f"optuna: arm {arm}: {remaining} of {study.search_trials} tuning trials, {sampler.description} "
                     f"(storage {storage_url}, study {study.name}-{arm})")
            searcher = FinalResultOptuna(
                space=SearchSpace(study.search, arm, study.tuning_seeds), metric=study.metric, mode="max",
                sampler=sampler.build(done=len(attempted)), study_name=f"{study.name}-{arm}",
                storage=optuna.storages.RDBStorage(storage_url),
            )
            fit(driver, None, run_dir, f"optuna-{arm}", concurrency, progress,
                study=study, searcher=searcher, num_samples=remaining)
            if store.local_path(run_dir) is None:  # keep the run directory's copy current
                store.write_bytes(store.join(run_dir, OPTUNA_FILE), database.read_bytes())
        arm_rows = _tuning_rows(finished_rows(run_dir), arm)
        _, failures = split_tuning_rows(arm_rows, study.metric)
        if failures:
            tuning["failed"][arm] = failures
            progress(f"optuna: arm {arm}: {len(failures)} of {len(arm_rows)} tuning trial(s) failed, excluded "
                     f"from the choice: {_failure_text(failures)}")
        record["tuning"] = tuning  # written before a TuningError, so the failures are on record
        write_json(store.join(run_dir, STUDY_FILE), record)
        top = best_tuning_row(arm, arm_rows, study.metric, where=run_dir)
        best[arm] = {k.removeprefix("param/"): v for k, v in top.items() if k.startswith("param/")}
        progress(f"optuna: arm {arm}: best {study.metric} {top[study.metric]:.4f} at {best[arm]} "
                 f"(tuning seed {top['seed']})")
    return best


class TuningError(UserError, RuntimeError):
    """An arm's tuning left no trial to choose from: every one failed or went non-finite."""


def _tuning_rows(rows: list[dict[str, Any]], arm: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("stage") == "tune" and r["arm"] == arm]


def split_tuning_rows(rows: list[dict[str, Any]], metric: str) -> tuple[list[dict], list[dict]]:
    """An arm's tuning rows as (usable, failures): usable rows finished with a finite `metric`;
    every other row becomes a failure {"trial_id", "status", "error"} (study.json's
    "tuning.failed" entries)."""
    usable, failures = [], []
    for row in sorted(rows, key=lambda r: str(r["trial_id"])):
        value = row.get(metric)
        finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if row.get("status") == "finished" and finite:
            usable.append(row)
            continue
        error = row.get("error") or (f"{metric} is {value}" if row.get("status") == "finished"
                                     else f"status {row.get('status')}")
        failures.append({"trial_id": row["trial_id"], "status": row.get("status"), "error": error})
    return usable, failures


def best_tuning_row(arm: str, rows: list[dict[str, Any]], metric: str, *, where: str = "") -> dict[str, Any]:
    """The arm's tuning row with the highest `metric` among those that finished with a finite
    value; `TuningError` naming the arm and every failure when there is none."""
    usable, failures = split_tuning_rows(rows, metric)
    if not usable:
        raise TuningError(
            f"optuna: arm {arm}: none of its {len(rows)} tuning trial(s) finished with a finite {metric}"
            + (f": {_failure_text(failures)}" if failures else "") + (f"; see {where}" if where else ""))
    return max(usable, key=lambda r: r[metric])


def _failure_text(failures: list[dict]) -> str:
    return "; ".join(f"trial {f['trial_id']} {f['status']}: {f['error'].splitlines()[-1] if f['error'] else ''}"
                     for f in failures)


def _optuna_database(run_dir: str) -> Path:
    """The run's Optuna SQLite file: in the run directory when that is local, else a local
    working copy (SQLite needs a local file) fetched from and written back to the run's."""
    local = store.local_path(run_dir)
    if local is not None:
        return local / OPTUNA_FILE
    path = store.cache_dir() / "optuna" / f"{store.name(run_dir)}-{hashlib.sha256(run_dir.encode()).hexdigest()[:8]}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    remote = store.join(run_dir, OPTUNA_FILE)
    if store.is_file(remote):
        path.write_bytes(store.read_bytes(remote))
    return path
