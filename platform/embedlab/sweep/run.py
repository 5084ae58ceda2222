"""Run a study on Ray Tune: one trial per (arm, seed), each a Tune driver function that
fits a phase-1 `TorchTrainer` and asks the shared evaluation actor for its dev metrics.

Run directory (`<storage>/<study>-<timestamp>/`):
    study.json          the resolved study, its hash, the study file's text, versions
    prepared.json       the prepared data each arm used (paths, hashes, token shares)
    trials/<id>.json    one finished trial's row (what `embedlab table` reads)
    train/              Ray Train runs (checkpoints)     tune/  Ray Tune experiment state
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedlab.config import TrialConfig
from embedlab.data.prepare import PreparedData, prepare_data
from embedlab.evaluate.beir import load_task
from embedlab.evaluate.checkpoint_eval import resolve_task
from embedlab.sweep.study import Study, load_study
from embedlab.sweep.table import STUDY_FILE, TRIALS_DIR
from embedlab.train.checkpoint import versions

# Each Ray Train report waits for the controller's poll; 2 s by default (RAY-NOTES.md).
RAY_ENV = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
# CPUs left free for Ray Data's read tasks and the evaluation actor (RAY-NOTES.md: a
# trainer that takes every CPU starves its own data pipeline and hangs).
RESERVED_CPUS = 1.0


def connect(address: str | None, progress: Callable[[str], None] = print) -> None:
    """Join the cluster at `address`, or start a local one (the embedded default)."""
    import ray

    if ray.is_initialized():
        return
    os.environ.update(RAY_ENV)
    runtime_env = {"env_vars": dict(RAY_ENV)}
    if address:
        progress(f"ray: connecting to {address}")
        _check_reachable(address)
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: {error}") from None
    else:
        progress("ray: starting a local cluster")
        ray.init(runtime_env=runtime_env, log_to_driver=False, include_dashboard=False)
    resources = ray.cluster_resources()
    progress(f"ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs")


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at a host:port address
    (ray.init retries an unreachable GCS for a long time)."""
    target = address.removeprefix("ray://")
    if address == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as error:
        raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: {error}") from None


def max_concurrent_trials(trial: TrialConfig, cluster_cpus: float) -> int:
    per_trial = trial.train.num_workers * trial.train.cpus_per_worker
    if per_trial + RESERVED_CPUS > cluster_cpus:
        raise ValueError(
            f"a trial needs {per_trial:g} CPUs for its workers plus {RESERVED_CPUS:g} kept free "
            f"for data and evaluation, but the cluster has {cluster_cpus:g}: lower "
            "train.num_workers or train.cpus_per_worker"
        )
    return max(1, math.floor((cluster_cpus - RESERVED_CPUS) / per_trial))


def trial_driver(config: dict[str, Any], *, context: dict[str, Any]) -> None:
    """One Tune trial: train, evaluate through the actor, write the trial's row."""
    import ray
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from embedlab.evaluate.actor import get_evaluator
    from embedlab.train.contrastive import run_contrastive
    from embedlab.train.phase1 import run_phase1

    study = Study.from_dict(context["study"])
    arm, seed = config["arm"], config["seed"]
    trial = study.trial_config(arm, seed, context.get("parent"))
    prepared = PreparedData(Path(context["prepared"][arm]["directory"]), context["prepared"][arm])
    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(context["run_dir"])
    run = run_phase1 if trial.phase == 1 else run_contrastive
    result = run(
        trial, prepared, storage_path=run_dir / "train", name=f"{arm}-seed{seed}-{trial_id}",
        callbacks=[TuneReportCallback()],
    )
    if result.error is not None:
        raise result.error
    checkpoint_dir = result.checkpoint.path
    task_dir = str(resolve_task(trial.eval.task, prepared.directory))
    scores = ray.get(get_evaluator().evaluate.remote(
        checkpoint_dir, task_dir, trial.eval.split, trial.eval.index, str(prepared.directory / "retention")
    ))
    train = result.metrics
    intended = prepared.record["mixture"]["shares"] if trial.phase == 1 else dict(trial.contrastive.pairs)
    row = {
        "trial_id": trial_id,
        "arm": arm,
        "seed": seed,
        "factor": study.factor,
        "factor_value": study.factor_value(arm),
        **{k: train[k] for k in train if k.startswith(("budget/", "compute/"))},
        "phase": trial.phase,
        "parent": trial.parent,
        **{k: train[k] for k in train if k.startswith("data/observed")},
        **{f"data/intended_share/{k}": v for k, v in intended.items()},
        "train/loss": train["train/loss"],
        "train/steps": train["train/step"],
        "train/skipped_steps": train["train/skipped_steps"],
        **{f"{trial.eval.split}/{k}": scores[k] for k in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "docs")},
        "eval/task": scores["task"],
        "eval/task_hash": scores["task_hash"],
        "eval/seconds": scores["seconds"],
        "eval/index": scores["index"],
        **{f"{trial.eval.split}/{k}": v for k, v in scores.items()
           if k.startswith("health/") and not isinstance(v, list)},
        **{k: v for k, v in scores.items() if k.startswith("retention/")},
        "checkpoint": checkpoint_dir,
        "checkpoint_hash": scores["checkpoint_hash"],
        "data_revision": prepared.data_revision,
        "status": "finished",
    }
    trials = run_dir / TRIALS_DIR
    trials.mkdir(exist_ok=True)
    staging = trials / f".{trial_id}.json.tmp"
    staging.write_text(json.dumps(row, indent=2, sort_keys=True))
    staging.rename(trials / f"{trial_id}.json")  # atomic: a row is whole or absent
    tune.report({k: v for k, v in row.items() if isinstance(v, (int, float))})


def run_sweep(
    study_path: str | Path,
    *,
    storage: str | Path = "runs",
    address: str | None = None,
    parent: str | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """Run every (arm, seed) trial of the study file; returns the run directory.

    `parent` (phases 2-3) is the checkpoint every arm starts from, e.g. a phase-1 winner."""
    from ray import tune

    study = load_study(study_path)
    if parent is not None:
        from embedlab.train.checkpoint import verify_checkpoint

        verify_checkpoint(Path(parent))  # fail before any work on a missing or corrupt parent
        parent = str(Path(parent).resolve())
    for arm in study.arms:
        study.trial_config(arm, study.seeds[0], parent)  # every arm has what its phase needs
    connect(address, progress)
    import ray

    from embedlab.evaluate.actor import get_evaluator

    concurrency = max_concurrent_trials(next(iter(study.arms.values())), ray.cluster_resources().get("CPU", 0))
    budget = (f"{study.budget_tokens:,} non-padding tokens" if study.phase == 1
              else f"{study.budget_pairs:,} positive pairs")
    progress(f"study {study.name} (phase {study.phase}): {len(study.arms)} arms x {len(study.seeds)} seeds "
             f"at {budget} each")
    prepared = _prepare_arms(study, progress)
    overlap = _check_contamination(study, prepared, progress)
    run_dir = _new_run_dir(Path(storage), study.name)
    progress(f"results in {run_dir}")
    record = {
        "study": study.to_dict(),
        "arm_order": list(study.arms),  # the JSON below sorts keys; the study's order is kept here
        "study_hash": study.hash,
        "study_file": str(Path(study_path).resolve()),
        "study_source": Path(study_path).read_text(),
        "versions": versions(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "final_eval_overlap": overlap,
        "parent": parent,
    }
    (run_dir / STUDY_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
    (run_dir / "prepared.json").write_text(json.dumps(prepared, indent=2, sort_keys=True))
    get_evaluator()  # created and owned by this driver, so it outlives every trial
    progress(f"tune: {len(study.arms) * len(study.seeds)} trials, at most {concurrency} at a time")
    context = {"study": study.to_dict(), "prepared": prepared, "run_dir": str(run_dir), "parent": parent}
    # A trial driver only waits on its trainer; it reserves memory, not a CPU, so the
    # trainer's workers can start (a CPU-holding driver deadlocks a 2-CPU box).
    driver = tune.with_resources(
        tune.with_parameters(trial_driver, context=context), {"CPU": 0, "memory": 200 * 1024**2}
    )
    tuner = tune.Tuner(
        driver,
        param_space={"arm": tune.grid_search(list(study.arms)), "seed": tune.grid_search(list(study.seeds))},
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name="tune", storage_path=str(run_dir), verbose=1),
    )
    results = tuner.fit()
    failed = [r for r in results if r.error is not None]
    if failed:
        progress(f"tune: {len(failed)} trial(s) failed; see {run_dir / 'tune'}")
    return run_dir


def _check_contamination(study: Study, prepared: dict[str, dict], progress: Callable[[str], None]) -> list[dict]:
    """Refuse training data holding final-eval items unless the study discloses its policy."""
    from embedlab.data.contamination import check_training_data

    findings: list[dict] = []
    checked: set[tuple[str, str]] = set()
    for arm, config in study.arms.items():
        record = prepared[arm]
        task_dir = resolve_task(config.eval.task, Path(record["directory"]))
        if (record["directory"], str(task_dir)) in checked:
            continue
        checked.add((record["directory"], str(task_dir)))
        data = PreparedData(Path(record["directory"]), record)
        findings += check_training_data(data, task_dir, study.disclosed_overlap, progress)
    if findings:
        progress(f"audit: {len(findings)} final-eval item(s) overlap the training data; "
                 f"disclosed-overlap policy: {study.disclosed_overlap}")
    else:
        progress("audit: no final-eval item found in the training data")
    return findings


def _new_run_dir(storage: Path, name: str) -> Path:
    """A fresh `<storage>/<name>-<timestamp>[-n]`; an earlier run is never written into."""
    base = storage.resolve() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    for attempt in range(1, 100):
        run_dir = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a new run directory next to {base}")


def _prepare_arms(study: Study, progress: Callable[[str], None]) -> dict[str, dict]:
    """Prepare each distinct data config once; map every arm to its prepared record."""
    by_config: dict[str, PreparedData] = {}
    out: dict[str, dict] = {}
    for arm, config in study.arms.items():
        key = json.dumps(dataclasses.asdict(config.data), sort_keys=True, default=str)
        if key not in by_config:
            by_config[key] = prepare_data(config.data, progress=progress)
        prepared = by_config[key]
        out[arm] = {**prepared.record, "directory": str(prepared.directory)}
    scored_on = set()
    for arm, config in study.arms.items():
        task_dir = resolve_task(config.eval.task, Path(out[arm]["directory"]))
        if not task_dir.is_dir():
            raise FileNotFoundError(f"arm {arm}: evaluation task {config.eval.task!r} was not built")
        scored_on.add((load_task(task_dir).hash, config.eval.split))
    if len(scored_on) != 1:
        raise ValueError("arms are scored on different task contents or splits; comparison refused")
    return out

