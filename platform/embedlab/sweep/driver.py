"""One trial of a sweep, as the Tune function it runs in: train the arm at its seed (and
tuned values), score the checkpoint through the shared evaluation actor, and write the
trial's row, whatever its end."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from embedlab.artifacts.sync import local_directory
from embedlab.checkpoints.io import read_manifest
from embedlab.core import code_identity, store, timing
from embedlab.core.config import TrialConfig
from embedlab.core.telemetry import publish_stages
from embedlab.prepared.directory import PreparedData
from embedlab.records.rundir import error_text, finished_rows, write_per_query, write_row
from embedlab.records.scores import score_trial
from embedlab.studies.recipes import derive
from embedlab.studies.study import Study
from embedlab.sweep.reuse import TRIAL_KEY, record_finished
from embedlab.sweep.progress import EVAL_PROGRESS, evaluate_with_progress
from embedlab.tasks.resolve import arm_eval_tasks
from embedlab.train.nonfinite import NonFiniteError
from embedlab.train.phases import phase_of


def train_trial(trial: TrialConfig, prepared: PreparedData, *, storage_path: str | Path, name: str,
                callbacks: list | None = None, overlap_policy: str | None = None, progress=print):
    """Fit the trial's phase on Ray Train (phase 1, or phases 2-3 with phase 3's mining first).
    Phases 2-3 pass their pairs and mined negatives through the contamination gate first,
    under the study's disclosed-overlap policy `overlap_policy`; `progress` gets the lines of
    that work before training (the audit, mining, teacher labels and documents)."""
    return phase_of(trial).run(trial, prepared, storage_path=storage_path, name=name, callbacks=callbacks,
                               overlap_policy=overlap_policy, progress=progress)


def trial_driver(config: dict[str, Any], *, context: dict[str, Any]) -> None:
    """One Tune trial: train, evaluate through the actor, write the trial's row.

    `config` holds the arm, the seed, the stage ("tune": an Optuna trial; "final": a grid
    trial) and any tuned values as dotted config paths. Every trial leaves a row: "finished",
    "nonfinite" (training stopped by non-finite steps), or "failed" with the error's text,
    written before the error goes on to Tune (which retries the trial once, `experiment.TRIAL_RETRIES`;
    the retry's row replaces it). Every row records the trial's wall time by stage
    (`embedlab.core.timing`, `TrialClock`)."""
    from ray import tune  # here: Ray, which a dry run does not need

    clock = TrialClock()
    study = Study.from_dict(context["study"])
    run_dir = context["run_dir"]
    identity = trial_identity(study, config, tune.get_context().get_trial_id())
    with timing.timed(clock.stages):
        try:
            final = run_trial(study, identity, trial_params(config), context, clock)
        except Exception as error:
            write_row(run_dir, {**identity, "status": "failed",
                                "error": error_text(f"{type(error).__name__}: {error}"), **clock.columns()})
            raise
    tune.report(final)  # outside the try: the row is written, whatever Tune does with this


class TrialClock:
    """A trial driver's wall time by stage, from the moment its function starts: its row's
    `time/*` columns (`columns`), also published to the Ray dashboard."""

    def __init__(self) -> None:
        self.stages = timing.StageClock()
        self.started = time.time()

    def add_loop(self, loop: dict[str, float]) -> None:
        """Move the training loop's own split (rank 0's data wait, training and checkpointing,
        `embedlab.train.loop.loop_seconds`) out of "trial_startup", which the whole fit went to."""
        self.stages.move("trial_startup", {k: v for k, v in loop.items() if k != "wall"})

    def columns(self, run: str | None = None) -> dict[str, float]:
        breakdown = self.stages.breakdown()
        if run is not None:
            publish_stages(run, breakdown)
        return timing.row_columns(breakdown, self.started, time.time())


def trial_params(config: dict[str, Any]) -> dict[str, Any]:
    """A Tune trial config's tuned values as dotted config paths (Optuna's, or a grid entry's)."""
    config = config.get("trial", config)  # a grid entry: the whole trial as one value
    return {**{k: v for k, v in config.items() if "." in k}, **config.get("params", {})}


def trial_identity(study: Study, config: dict[str, Any], trial_id: str) -> dict[str, Any]:
    """The columns every row of a trial has, whatever its end, from its Tune config."""
    entry = config.get("trial", config)
    return {
        "study": study.name, "trial_id": trial_id, "stage": entry.get("stage", "final"), "arm": entry["arm"],
        "seed": entry["seed"], "factor": study.factor, "factor_value": study.factor_value(entry["arm"]),
        **{f"param/{k}": v for k, v in trial_params(config).items()},
        # A grid trial's key: what another study finds it by (`embedlab.sweep.reuse`).
        **({TRIAL_KEY: entry["key"]} if entry.get("key") else {}),
    }


# What a trial's row keeps of its training metrics (besides losses and steps): the budget and
# every compute figure, the observed data shares, the teacher's counts (pairs it judged,
# its disagreements, pairs without a negative, documents it encoded), which the table reads
# to say what the teacher made, and the mined negatives' figures (the search a trial read,
# each rule's drops, the false-negative rates), which the table shows per arm.
KEPT_TRAINING_PREFIXES = ("budget/", "compute/", "data/observed", "data/teacher_", "data/mining_",
                          "data/negatives_dropped/", "data/false_negative")


def kept_training_figures(train: dict[str, Any]) -> dict[str, Any]:
    """The training metrics a trial's row keeps (`KEPT_TRAINING_PREFIXES`)."""
    return {k: v for k, v in train.items() if k.startswith(KEPT_TRAINING_PREFIXES)}


def trial_row(identity: dict[str, Any], train: dict[str, Any], intended: dict[str, float], scores: dict[str, Any],
              *, checkpoint: str, checkpoint_hash: str, data_revision: str) -> dict[str, Any]:
    """A finished trial's row: its identity, the training metrics it keeps
    (`kept_training_figures`, the losses, steps and skipped steps), the data shares the arm
    intended, its evaluation columns and where its checkpoint is."""
    return {
        **identity,
        **kept_training_figures(train),
        **{f"data/intended_share/{k}": v for k, v in intended.items()},
        **{k: train[k] for k in train if k.startswith("train/loss")},
        **{k: train[k] for k in ("train/mlm_loss", "train/contrastive_loss") if k in train},
        "train/steps": train["train/step"],
        "train/skipped_steps": train["train/skipped_steps"],
        **scores,
        "checkpoint": checkpoint,
        "checkpoint_hash": checkpoint_hash,
        "data_revision": data_revision,
        "status": "finished",
    }


def run_trial(study: Study, identity: dict[str, Any], params: dict[str, Any], context: dict[str, Any],
              clock: TrialClock) -> dict:
    """Train and score one trial and write its row (and per-query file), with its time by stage
    on `clock`; returns the trial's final Tune result. `trial_driver` records whatever this raises."""
    # here: Ray (the actor's module imports it too), which a dry run does not need
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from embedlab.evaluate.actor import get_evaluator

    # Before any work: this process imported the source on disk when Ray started it, which
    # may no longer be the code the sweep began with (an edit during the run).
    code_identity.check_same_code(context["code"])
    arm, seed, stage, trial_id = identity["arm"], identity["seed"], identity["stage"], identity["trial_id"]
    run_dir = context["run_dir"]
    trial = derive(study.trial_config(arm, seed, context.get("parent")), params)
    # This node's copy (fetched and verified when the run's storage is remote).
    prepared = PreparedData(local_directory(context["prepared"][arm]), context["prepared"][arm])
    identity = {
        **identity,
        "config_hash": hashlib.sha256(trial.to_json().encode()).hexdigest(),
        "phase": trial.phase, "parent": trial.parent,
        "parent_hash": read_manifest(trial.parent)["content_hash"] if trial.parent else None,
    }
    name = f"{stage}-{arm}-seed{seed}-{trial_id}"
    try:
        # The whole fit first; the loop's own split of it is moved out after (`TrialClock.add_loop`).
        with timing.stage("trial_startup"):
            result = train_trial(
                trial, prepared, storage_path=store.join(run_dir, "train"), name=name,
                callbacks=[TuneReportCallback()], overlap_policy=study.disclosed_overlap,
                # The trial's own output does not reach the console (log_to_driver=False): the lines
                # of its work before training (mining and teacher labels can take many minutes)
                # travel as Tune results, as its evaluation's do.
                progress=lambda line: tune.report({EVAL_PROGRESS: line}),
            )
    except NonFiniteError as error:
        # Deterministic: retrying would stop the same way. The table shows why it has no metrics.
        clock.add_loop(error.loop_seconds)
        write_row(run_dir, {**identity, "status": "nonfinite", "error": str(error), **clock.columns(name)})
        return {study.metric: float("nan")}
    if result.error is not None:
        raise result.error
    clock.add_loop((getattr(result, "return_value", None) or {}).get(timing.LOOP_TIME) or {})
    # A path on the run's storage, or a URI on object storage: every reader fetches and verifies it.
    checkpoint_dir = store.location_of(result.checkpoint.filesystem, result.checkpoint.path, like=run_dir)

    def evaluate(task_dir: str, retention_dir: str | None) -> dict:
        # The trial's own output does not reach the console (log_to_driver=False): its evaluation
        # progress travels as Tune results, which the driver's TrialProgress callback prints.
        return evaluate_with_progress(
            get_evaluator(), (checkpoint_dir, task_dir, trial.eval.split, trial.eval.index, retention_dir),
            request=trial_id, max_length=trial.eval.max_length, dims=trial.eval.dims,
            report=lambda line: tune.report({EVAL_PROGRESS: line}))

    with timing.stage("evaluation"):
        scored = score_trial(evaluate, arm_eval_tasks(trial.eval, context["prepared"][arm]), trial.eval.split,
                             str(prepared.directory / "retention"))
    intended = phase_of(trial).intended_shares(trial, prepared.record)
    row = trial_row(identity, result.metrics, intended, scored.columns, checkpoint=checkpoint_dir,
                    checkpoint_hash=scored.main["checkpoint_hash"], data_revision=prepared.data_revision)
    row.update(clock.columns(name))
    if stage == "final" and any(r.get("status") == "finished" and r.get("stage", "final") == "final"
                                and (r["arm"], r["seed"]) == (arm, seed) and r["trial_id"] != trial_id
                                for r in finished_rows(run_dir)):
        # A trial of an interrupted pass finished after its driver died: one row per (arm, seed).
        row["status"] = "duplicate"
        row["trial_id"] = f"{trial_id}-duplicate"
    # The per-query file first: a row on disk means its trial's per-query values are there too.
    write_per_query(run_dir, row, scored, trial.eval.split)
    write_row(run_dir, row)
    record_finished(run_dir, row, study.metric)  # after its row: an index entry names a whole trial
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
