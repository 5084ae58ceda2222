"""What a phase 2-3 trial trains on, built and gated before its workers start.

Its frozen pairs table and its pair schedule; in phase 3 its given negatives screened under the
parent, its mined negatives (its rule applied to the search it shares with every trial of the
same parent and pairs), their false-negative sample judged by a teacher, and its teacher's
labels; with embedding distillation its teacher's document vectors. Each set is an artifact (`embedlab.artifacts.build`), made once and read by
every trial that needs it, whose post-condition is the contamination gate against the trial's
evaluation tasks (`embedlab.contamination.gate`): a set holding final-eval items refuses the
trial, unless the study discloses the overlap, before any step reads it. The pairs table and
the prepared data's phase-1 stages pass the same gate (`embedlab.pairs.audit`).

The sweep calls `trial_data` for every trial of a study before it launches any
(`embedlab.sweep.run`), so sets are built once, on the sweep's driver, and the gate's audits
are saved; each trial then calls it again, finding every set and reading the saved audits. A
trial started on its own (a tuning trial, a test) builds what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from embedlab.checkpoints.state import data_seed
from embedlab.artifacts.sync import local_directory
from embedlab.core import timing
from embedlab.core.config import TrialConfig
from embedlab.negatives.phase3 import (
    given_negative_counts, given_negatives_for_phase3, mine_for_phase3, mining_compute, mining_figures,
)
from embedlab.negatives.reading import check_mined_negatives
from embedlab.pairs.audit import check_training_data
from embedlab.pairs.table import pair_table_path, recorded_pair_table
from embedlab.prepared.directory import PreparedData
from embedlab.sources.mixture import Schedule, schedule_target
from embedlab.streams.pair_stream import pair_schedule
from embedlab.tasks.resolve import arm_eval_tasks
from embedlab.teacher.audit import check_teacher_embeddings, check_teacher_labels
from embedlab.teacher.false_negatives import false_negative_figures, false_negatives_for_phase3
from embedlab.teacher.phase3 import (
    teacher_embedding_record, teacher_embeddings_for_trial, teacher_label_record, teacher_labels_for_phase3,
)
from embedlab.train.budget import schedule_units, step_units
from embedlab.train.worker import MadeForTrial


@dataclass(frozen=True)
class TrialData:
    """A trial's data, as `trial_data` built or found it: the pairs table, the schedule over it
    and each builder's first row, and the sets made for it (None where it has none)."""

    pairs_path: Path
    schedule: Schedule
    offsets: dict[str, int]
    given: Path | None = None
    mined: Path | None = None
    false_negatives: Path | None = None
    labels: Path | None = None
    documents: Path | None = None

    def made(self, trial: TrialConfig) -> MadeForTrial:
        """What the trial's checkpoint and row record of its sets (`MadeForTrial`)."""
        return MadeForTrial(
            mined_version=None if self.mined is None else self.mined.name,
            mining_compute={**mining_compute(self.mined), **mining_compute(self.given, "compute/given_negatives")},
            negative_figures={**mining_figures(self.mined, trial), **false_negative_figures(self.false_negatives)},
            given_negatives=given_negative_counts(self.given),
            teacher_labels=teacher_label_record(self.labels, trial.contrastive),
            teacher_embeddings=teacher_embedding_record(self.documents),
        )


def makes_sets(trial: TrialConfig) -> bool:
    """Whether `trial_data` makes sets for `trial` beyond its pairs table: negatives (given or
    mined, phase 3) or a teacher's labels or document vectors."""
    settings = trial.contrastive
    return (trial.spec.negatives and settings.negatives.count > 0) or settings.distillation.weight > 0


def trial_pair_schedule(trial: TrialConfig, pairs_path: Path):
    """The trial's pair schedule over its frozen pairs table and each builder's first row:
    sized for its budget with the stream's margin, capped at `data.mixture.max_epochs` (a
    `MixtureError` when the table cannot fill it), in the trial's batch composition."""
    return pair_schedule(
        pairs_path, dict(trial.contrastive.pairs),
        target_pairs=schedule_target(schedule_units(trial), step_units(trial)),
        max_epochs=trial.data.mixture.max_epochs, seed=data_seed(trial),
        composition=trial.contrastive.batch_composition, step_pairs=step_units(trial),
    )


def _gate(check: Callable[..., list[dict]], prepared: PreparedData, task_dirs: list[Path], policy: str | None,
          progress: Callable[[str], None]) -> Callable[[Path], Any]:
    """A set's post-condition: `check` of it against every task, under `policy`."""
    def post(directory: Path) -> None:
        with timing.stage("audit"):
            for task_dir in task_dirs:
                check(prepared, task_dir, directory, policy, progress)
    return post


def trial_data(trial: TrialConfig, prepared: PreparedData, *, overlap_policy: str | None = None,
               progress: Callable[[str], None] = print) -> TrialData:
    """The trial's data (module docstring), every set past the gate under `overlap_policy`."""
    settings = trial.contrastive
    builders = list(dict(settings.pairs))
    pairs_path = recorded_pair_table(prepared, builders)
    if pairs_path is None:  # a trial started on its own (the sweep records the table before any trial)
        with timing.stage("data_preparation"):
            pairs_path = pair_table_path(prepared, builders, progress, data=trial.data)
    # Every task of a panel, as the sweep resolved them into the prepared record.
    record = {**prepared.record, "directory": str(prepared.directory)}
    task_dirs = [Path(directory) for _, directory in arm_eval_tasks(trial.eval, record)]
    # A user pair's given negatives are in the table, so they are checked with it.
    for task_dir in task_dirs:
        check_training_data(prepared, task_dir, overlap_policy, progress, pairs_path=pairs_path)
    schedule, offsets = trial_pair_schedule(trial, pairs_path)
    gate = partial(_gate, prepared=prepared, task_dirs=task_dirs, policy=overlap_policy, progress=progress)
    made: dict[str, Path | None] = {}
    with timing.stage("mining"):  # each set's audit, its post-condition, is charged to the audit
        if trial.spec.negatives and settings.negatives.count:
            made["given"] = given_negatives_for_phase3(trial, prepared, pairs_path, schedule, offsets, progress)
            if settings.negatives.mine:
                made["mined"] = mine_for_phase3(trial, prepared, pairs_path, schedule, offsets, progress,
                                                check=gate(check_mined_negatives))
                if settings.negatives.false_negative_sample:
                    made["false_negatives"] = false_negatives_for_phase3(trial, prepared, pairs_path,
                                                                         made["mined"], progress)
        # A teacher without a weight is inert (a study's control arm keeps the field its arms set).
        # Teacher labels score each query's negatives: only a phase with them (the config refuses a
        # score weight without negatives).
        if trial.spec.negatives and settings.distillation.score_weight > 0:
            made["labels"] = teacher_labels_for_phase3(trial, prepared, pairs_path, schedule, offsets,
                                                       mined=made.get("mined"), given=made.get("given"),
                                                       progress=progress, check=gate(check_teacher_labels))
        if settings.distillation.embedding_mse_weight > 0:
            made["documents"] = teacher_embeddings_for_trial(trial, prepared, pairs_path, schedule, offsets,
                                                             progress=progress, check=gate(check_teacher_embeddings))
    return TrialData(pairs_path=pairs_path, schedule=schedule, offsets=offsets, **made)


def build_trial_data(trial: dict[str, Any], record: dict[str, Any], overlap_policy: str | None,
                     lines) -> dict[str, float]:
    """`trial_data` for one trial given as plain values (its config's mapping and its arm's
    prepared record), as the sweep runs it in a Ray task shaped like the trial's own driver, on
    this node's copy of the prepared data; its progress lines go to `lines` (a Ray queue the
    sweep's driver prints from). Returns the task's wall time by stage (`embedlab.core.timing`)."""
    with timing.timed(timing.StageClock()) as clock:
        prepared = PreparedData(local_directory(record), record)
        trial_data(TrialConfig.from_dict(trial), prepared, overlap_policy=overlap_policy, progress=lines.put)
    return clock.breakdown()
