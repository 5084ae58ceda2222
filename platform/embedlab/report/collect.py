"""Read run directories into what the report shows: study records, trial tables, training
logs, and the checkpoints whose representations the figures measure.

Nothing here recomputes a metric; it only finds and orders what the runs wrote.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from embedlab.artifacts.sync import local_directory
from embedlab.core import store
from embedlab.records.rundir import read_record
from embedlab.stats.paired import final_trials
from embedlab.stats.table import load_table, read_study_record

METRICS_LOG = "metrics.jsonl"  # embedlab.train.metrics_log.FILE_NAME (that module imports Ray Train)


@dataclass(frozen=True)
class Run:
    """One run directory as the report reads it."""

    directory: str  # a local path or a storage URI (`embedlab.core.store`)
    record: dict[str, Any]  # study.json
    table: pd.DataFrame  # one row per trial (embedlab.load_table)
    prepared: dict[str, dict[str, Any]]  # prepared.json: arm -> prepared data record
    promotion: dict[str, Any] | None  # promotion.json, once promoted
    logs: dict[str, list[dict[str, Any]]]  # trial id -> every training report (metrics.jsonl)
    label: str  # "P2 joint-vs-contrastive", made unique across the report

    @property
    def study(self) -> dict[str, Any]:
        return self.record["study"]

    @property
    def name(self) -> str:
        return self.study["name"]

    @property
    def metric(self) -> str:
        return self.study["metric"]

    @property
    def arms(self) -> list[str]:
        return list(self.record.get("arm_order", self.study["arms"]))

    @property
    def phase(self) -> int:
        return max(arm.get("phase") or 1 for arm in self.study["arms"].values())

    @property
    def final(self) -> pd.DataFrame:
        """Finished grid trials: the rows every statistic is computed over."""
        return final_trials(self.table)

    def arm_config(self, arm: str) -> dict[str, Any]:
        return self.study["arms"][arm]


@dataclass(frozen=True)
class Probe:
    """A checkpoint whose representation the report measures: each arm's best trial, and the
    parent of a run whose parent is not itself a trial of a reported run."""

    label: str  # "P3 hard-negatives / mined-2 (seed 0)"
    run_label: str
    arm: str  # "parent" for a parent checkpoint
    phase: int
    checkpoint: Path
    prepared_dir: Path
    eval: dict[str, Any]  # the arm's EvalConfig as a dict: task, split, max_length, batch_size
    masking: dict[str, Any]  # the arm's MaskingConfig as a dict
    row: dict[str, Any] | None  # the trial row; None for a parent (scores in study.json)


def read_run(directory: str | Path) -> Run:
    """A run directory's records (a local path or a storage URI); a missing promotion or
    training log is simply absent."""
    directory = store.resolve(directory)
    record = read_study_record(directory)
    table = load_table(directory)
    prepared_path = store.join(directory, "prepared.json")
    prepared = json.loads(store.read_text(prepared_path)) if store.is_file(prepared_path) else {}
    promotion_path = store.join(directory, "promotion.json")
    promotion = read_record(promotion_path, "a promotion record") if store.is_file(promotion_path) else None
    logs = {}
    train = store.join(directory, "train")
    folders = sorted({p.split("/")[0] for p in store.list_tree(train)})  # one listing for every row
    for row in table.to_dict("records"):
        path = _log_path(train, folders, row)
        if path is not None:
            logs[row["trial_id"]] = read_log(path)
    phase = max(arm.get("phase") or 1 for arm in record["study"]["arms"].values())
    return Run(directory=directory, record=record, table=table, prepared=prepared, promotion=promotion,
               logs=logs, label=f"P{phase} {record['study']['name']}")


def _log_path(train: str, folders: list[str], row: dict[str, Any]) -> str | None:
    """The trial's metrics.jsonl: next to its checkpoint, else in its Ray Train run folder
    (one of `folders`, the run's `train/` listing)."""
    checkpoint = row.get("checkpoint")
    if isinstance(checkpoint, str) and store.is_file(beside := store.join(store.parent(checkpoint), METRICS_LOG)):
        return beside
    found = [store.join(train, f, METRICS_LOG) for f in folders if f.endswith(f"-{row['trial_id']}")]
    return next((path for path in found if store.is_file(path)), None)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The reports of one metrics.jsonl; a line still being written (no newline yet) is skipped."""
    reports = []
    for line in store.read_text(path).splitlines():
        try:
            reports.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return reports


def read_runs(directories: list[str | Path]) -> list[Run]:
    """Runs in tour order (phase, then start time), labels made unique by start time."""
    runs = sorted((read_run(d) for d in directories), key=lambda r: (r.phase, r.record.get("started", "")))
    counts = pd.Series([r.label for r in runs]).value_counts()
    unique = []
    for run in runs:
        if counts[run.label] > 1:
            clock = run.record.get("started", "")[11:16] or store.name(run.directory)
            run = dataclasses.replace(run, label=f"{run.label} ({clock})")
        unique.append(run)
    return unique


def best_trials(run: Run) -> list[dict[str, Any]]:
    """Each arm's finished trial with the best study metric and an existing checkpoint."""
    best = []
    final = run.final
    for arm in run.arms:
        rows = final[final["arm"] == arm]
        if "checkpoint" not in rows:  # records kept without their checkpoints: nothing to measure
            continue
        rows = rows[rows["checkpoint"].map(lambda c: isinstance(c, str) and Path(c).is_dir())]
        if rows.empty or run.metric not in rows:
            continue
        best.append(rows.loc[rows[run.metric].astype(float).idxmax()].to_dict())
    return best


def probes(runs: list[Run]) -> list[Probe]:
    """The checkpoints to measure: every run's parent (when no reported trial is that
    checkpoint), then each arm's best trial, in tour order, each checkpoint once."""
    out: list[Probe] = []
    seen: set[str] = set()
    trial_checkpoints = {store.resolve(row["checkpoint"]) for run in runs for row in best_trials(run)}
    for run in runs:
        first_arm = run.arms[0]
        if first_arm not in run.prepared:  # records kept without prepared.json: no data to measure with
            continue
        parent = run.record.get("parent")
        # A checkpoint is a directory or a URI (fetched, verified, when measured).
        if parent and store.exists(parent) and store.resolve(parent) not in trial_checkpoints | seen:
            seen.add(store.resolve(parent))
            out.append(_probe(run, first_arm, parent, None, label=f"parent of {run.label}",
                              phase=run.phase - 1))
        for row in best_trials(run):
            key = store.resolve(row["checkpoint"])
            if key in seen or row["arm"] not in run.prepared:
                continue
            seen.add(key)
            out.append(_probe(run, row["arm"], row["checkpoint"], row,
                              label=f"{run.label} / {row['arm']} (seed {row['seed']})", phase=run.phase))
    return out


def _probe(run: Run, arm: str, checkpoint: str | Path, row: dict[str, Any] | None, *, label: str, phase: int) -> Probe:
    config = run.arm_config(arm)
    return Probe(label=label, run_label=run.label, arm=arm if row is not None else "parent", phase=phase,
                 checkpoint=checkpoint, prepared_dir=local_directory(run.prepared[arm]), eval=config["eval"],
                 masking=config["masking"], row=row)
