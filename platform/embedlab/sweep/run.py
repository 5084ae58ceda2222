"""Run a study on Ray Tune: one trial per (arm, seed), each a Tune driver function that
fits a phase-1 `TorchTrainer` and asks the shared evaluation actor for its dev metrics.

Run directory (`<storage>/<study>-<timestamp>/`):
    study.json          the resolved study, its hash, the study file's text, versions, and
                        (with a search) "tuning": sampler, trials per arm, seeds, failures
    prepared.json       the prepared data each arm used (paths, hashes, token shares)
    trials/<id>.json    one trial's row, whatever its end: finished, nonfinite, failed
                        (what `embedlab table` reads)
    per_query/<id>.json a scored trial's per-query values (`PER_QUERY_DIR`, for paired tests)
    search.json         each arm's tuned values     optuna.db  Optuna's storage
    train/              Ray Train runs (checkpoints)     tune/  Ray Tune experiment state
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedlab.config import EvalConfig, TrialConfig
from embedlab.data.prepare import keep_ray_data_off_the_console, prepare_data
from embedlab.data.prepared import PreparedData
from embedlab.data.prepared_sync import STORAGE_ENV, local_directory, publish, remote_root
from embedlab.errors import UsageError, UserError
from embedlab.evaluate.beir import load_task
from embedlab.evaluate.checkpoint_eval import arm_eval_tasks, resolve_eval_tasks
from embedlab import store
from embedlab.sweep import capacity, ray_compat
from embedlab.sweep.capacity import RESERVED_CPUS, at_searched_maximum
from embedlab.sweep.paired import PER_QUERY_DIR
from embedlab.sweep.study import Study, load_study, set_path, study_origin
from embedlab.sweep.table import STUDY_FILE, TRIALS_DIR, read_study_record
from embedlab.train.checkpoint import versions

# Each Ray Train report waits for the controller's poll; 2 s by default (RAY-NOTES.md).
RAY_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    # Training progress reaches Tune before the trial's dev metric exists (it comes from the
    # evaluator at the end); Optuna only reads the final result, which has it.
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
}
LOCAL_HOST = "127.0.0.1"
TRIAL_RETRIES = 1
# A trial driver only waits on its trainer; it reserves memory, not a CPU, so the trainer's
# workers can start (a CPU-holding driver deadlocks a 2-CPU box).
TRIAL_DRIVER_RESOURCES = {"CPU": 0, "memory": 200 * 1024**2}
# The share of one GPU the driver of a trial that mines hard negatives asks for on a GPU
# cluster: it encodes the corpus with the parent encoder in its own process, and Ray hides
# every GPU from a process that asks for none, so without a share mining runs on CPU there.
# A quarter, as the evaluator's (`embedlab.evaluate.actor.EVALUATOR_GPU_SHARE`): both encode
# in bursts beside the trainers, and Ray packs fractional requests onto as few devices as
# they fill, leaving whole devices to the trainers' workers.
MINING_GPU_SHARE = 0.25
OPTUNA_FILE = "optuna.db"
ERROR_CHARS = 2_000  # of an error's text kept in a failed trial's row
# Console lines: a trial's budget at each quarter and at most every 30 s between them; the
# evaluator's encoding line polled every 5 s (it writes one at most every 10 s).
BUDGET_LINE_SECONDS = 30.0
EVAL_POLL_SECONDS = 5.0


def connect(address: str | None, progress: Callable[[str], None] = print, job_env: dict[str, str] | None = None) -> None:
    """Join the cluster at `address`, or start a local one (the embedded default); `job_env`
    is set for every process of this job (not for this driver process).

    Refuses a Ray outside `ray_compat.SUPPORTED_RAY` with `ray_compat.RayIncompatible`;
    with EMBEDLAB_ALLOW_UNTESTED_RAY=1 it prints a warning line and goes on.
    """
    import ray

    untested = ray_compat.check_ray_version()
    if untested:
        progress(untested)
    ray_compat.keep_credentials_out_of_trial_envs()  # before any Tune trial: they would reach Ray's logs
    if ray.is_initialized():
        return
    os.environ.update(RAY_ENV)
    # The job's processes on every node: Ray's settings, and `job_env` (the run's remote
    # storage root, `embedlab.data.prepared_sync`); never a credential.
    runtime_env = {"env_vars": {**RAY_ENV, **(job_env or {})}}
    if address:
        progress(f"ray: connecting to {address}")
        _check_reachable(address)
        # Ray uses ~/.ray/auth_token by itself only for a cluster it finds locally; for an
        # explicit address the token must be switched on before connecting.
        ray_compat.enable_token_auth_from_local_token()
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ConnectionError(
                f"cannot reach the Ray cluster at {address!r}: {error} (a cluster with token authentication "
                "needs its token here: ~/.ray/auth_token or RAY_AUTH_TOKEN, with RAY_AUTH_MODE=token)") from None
    else:
        progress("ray: starting a local cluster")
        require_token_auth()
        # Loopback only: the head, its workers and the dashboard are unreachable from the
        # network; Ray's token authentication (on by default in 2.60) guards the rest.
        # ray.init maps 127.0.0.1 to the machine's routable address unless Ray runs in its
        # single-machine mode.
        ray_compat.force_single_machine_mode()
        # WARNING: Ray's own INFO lines ("Started a local Ray instance") stay off the console,
        # which has embedlab's progress lines (the dashboard's address among them).
        context = ray.init(runtime_env=runtime_env, log_to_driver=False, include_dashboard=True,
                           dashboard_host=LOCAL_HOST, logging_level=logging.WARNING)
        if context.dashboard_url:
            progress(f"ray: dashboard at http://{context.dashboard_url}")
    keep_ray_data_off_the_console()
    resources = ray.cluster_resources()
    progress(f"ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs")


def require_token_auth() -> None:
    """Refuse to start a cluster with Ray's token authentication switched off."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        raise ConnectionError("RAY_AUTH_MODE=disabled: embedlab keeps Ray's token authentication on; "
                              "unset it to start a local cluster")


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


@dataclasses.dataclass(frozen=True)
class GpuShares:
    """The GPU shares of the processes that encode beside the trainers: the evaluation actor
    and each mining trial's driver (0: none, and that process encodes on CPU)."""

    evaluator: float = 0.0
    mining_driver: float = 0.0


def mines_negatives(trial: TrialConfig) -> bool:
    """Whether the trial's driver encodes with the parent before training: phase 3 with
    `contrastive.hard_negatives`, mining them or screening given negatives by the margin."""
    settings = trial.contrastive
    return trial.phase == 3 and settings.hard_negatives > 0 and (
        settings.mine_negatives or (bool(trial.data.pair_sources) and settings.given_margin is not None))


def _trainer_gpus(trial: TrialConfig) -> float:
    return float(trial.train.num_workers) if trial.train.use_gpu else 0.0


def _whole_gpus_held(shares: float) -> int:
    """Devices a sum of fractional requests occupies once Ray packs them (float-tolerant)."""
    return math.ceil(shares - 1e-9) if shares > 0 else 0


def max_concurrent_trials(trial: TrialConfig, resources: dict[str, float], shares: GpuShares = GpuShares()) -> int:
    """Trials that fit side by side, keeping `RESERVED_CPUS` free for data and evaluation
    (trial drivers reserve no CPU: they only wait on their trainers) and, on a GPU cluster,
    the devices the evaluator's and mining drivers' `shares` occupy."""
    cluster_cpus, cluster_gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    per_trial = trial.train.num_workers * trial.train.cpus_per_worker
    if per_trial + RESERVED_CPUS > cluster_cpus:
        raise UsageError(
            f"a trial needs {per_trial:g} CPUs for its workers plus {RESERVED_CPUS:g} kept free "
            f"for data and evaluation, but the cluster has {cluster_cpus:g}: lower "
            "train.num_workers or train.cpus_per_worker, or use a smaller --profile"
        )
    fit = math.floor((cluster_cpus - RESERVED_CPUS) / per_trial)
    if trial.train.use_gpu:
        if cluster_gpus < trial.train.num_workers:
            raise UsageError(
                f"a trial needs {trial.train.num_workers} GPUs (train.use_gpu, one per worker), but the "
                f"cluster has {cluster_gpus:g}: run on a GPU cluster (--address) or use --profile demo"
            )
        fit = min(fit, math.floor(cluster_gpus / trial.train.num_workers))
    driver = shares.mining_driver if mines_negatives(trial) else 0.0
    # Trainers' workers take whole devices; the shares, packed, take the devices they fill.
    while fit > 1 and fit * _trainer_gpus(trial) + _whole_gpus_held(shares.evaluator + fit * driver) > cluster_gpus:
        fit -= 1
    return max(1, fit)


def study_concurrency(arms: dict[str, TrialConfig], resources: dict[str, float], search: tuple = (),
                      shares: GpuShares = GpuShares()) -> int:
    """Trials of a study that fit side by side: the arm needing the most resources decides,
    as arms may differ in workers or GPUs, and a `search` over a resource path (Optuna may
    pick any value) counts at its most demanding value. An arm that fits nowhere is named."""
    worst, searched = at_searched_maximum(arms, search)
    fits = []
    for arm, trial in worst.items():
        try:
            fits.append(max_concurrent_trials(trial, resources, shares))
        except ValueError as error:
            raise UsageError(f"arm {arm}{' (at its searched maximum)' if searched else ''}: {error}") from None
    return min(fits)


def gpu_shares(arms: dict[str, TrialConfig], resources: dict[str, float], search: tuple = ()) -> GpuShares:
    """The GPU shares to request on a cluster with `resources` (`ray.cluster_resources()`):
    none where it advertises no GPU; else the evaluator's (`EVALUATOR_GPU_SHARE`) and, when an
    arm mines hard negatives, `MINING_GPU_SHARE` for each mining trial's driver; but none
    where one trial's workers need every device, since a trainer takes whole GPUs and shares
    on one of them would leave it waiting forever (that encoding then stays on CPU)."""
    from embedlab.evaluate.actor import evaluator_gpus

    evaluator = evaluator_gpus(resources)
    if not evaluator:
        return GpuShares()
    trials = list(at_searched_maximum(arms, search)[0].values())
    mining = MINING_GPU_SHARE if any(mines_negatives(t) for t in trials) else 0.0
    if max(map(_trainer_gpus, trials)) + _whole_gpus_held(evaluator + mining) > resources.get("GPU", 0):
        return GpuShares()
    return GpuShares(evaluator=evaluator, mining_driver=mining)


def trial_driver_resources(trial: TrialConfig, shares: GpuShares = GpuShares()) -> dict[str, float]:
    """What one trial's driver reserves: `TRIAL_DRIVER_RESOURCES`, plus the mining driver's GPU
    share when the trial mines hard negatives (in the driver, before its trainer starts)."""
    if shares.mining_driver and mines_negatives(trial):
        return {**TRIAL_DRIVER_RESOURCES, "GPU": shares.mining_driver}
    return dict(TRIAL_DRIVER_RESOURCES)


def _driver_resources(study: Study, shares: GpuShares):
    """Tune's resource request for `trial_driver`: a fixed dict without a mining share, else
    per trial, from the arm (and tuned values) in its config."""
    if not shares.mining_driver:
        return dict(TRIAL_DRIVER_RESOURCES)
    from ray import tune

    def request(config: dict[str, Any]):
        trial = set_path(study.arms[config.get("trial", config)["arm"]], trial_params(config))
        return tune.PlacementGroupFactory([trial_driver_resources(trial, shares)])

    return request


def local_resources() -> dict[str, float]:
    """What a local cluster started here would offer, found without starting one: the CPUs
    this process may run on and the CUDA devices torch sees (both honour their masks)."""
    import torch

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"CPU": float(cpus), "GPU": float(torch.cuda.device_count())}


def check_fits(study_path: str | Path, study: Study, resources: dict[str, float], where: str,
               shares: GpuShares = GpuShares()) -> int:
    """The study's concurrency on `resources`; where it does not fit, a UsageError (a ValueError)
    naming the profile of the same study file that fits there (`--profile demo` on a CPU machine)."""
    try:
        return study_concurrency(study.arms, resources, study.search, shares)
    except ValueError as error:
        fitting = profiles_that_fit(study_path, study, resources)
        remedy = (f"run it with --profile {fitting[0]}, or on a cluster that fits it with --address" if fitting
                  else "no profile of this study file fits there: run it on a cluster that fits it with --address")
        remedy += "; on an autoscaling cluster, --wait-for-resources SECONDS waits for its nodes to arrive"
        raise UsageError(
            f"{study_path} at profile {study.profile or '-'} does not fit {where} ({resources.get('CPU', 0):g} CPUs, "
            f"{resources.get('GPU', 0):g} GPUs): {remedy} ({error})") from None


def profiles_that_fit(study_path: str | Path, study: Study, resources: dict[str, float]) -> list[str]:
    """The other profiles (`embedlab.recipes.PROFILES`) at which the study file's every arm fits `resources`."""
    from embedlab.recipes import PROFILES

    fitting = []
    for name in PROFILES:
        if name == study.profile:
            continue
        try:
            other = load_study(study_path, name)
            study_concurrency(other.arms, resources, other.search)
        except ValueError:  # a study() that takes no profile, or an arm that does not fit either
            continue
        fitting.append(name)
    return fitting


def train_trial(trial: TrialConfig, prepared: PreparedData, *, storage_path: str | Path, name: str,
                callbacks: list | None = None, overlap_policy: str | None = None):
    """Fit the trial's phase on Ray Train (phase 1, or phases 2-3 with phase 3's mining first).
    Phases 2-3 pass their pairs and mined negatives through the contamination gate first,
    under the study's disclosed-overlap policy `overlap_policy`."""
    from embedlab.train.contrastive import run_contrastive
    from embedlab.train.phase1 import run_phase1

    if trial.phase == 1:
        return run_phase1(trial, prepared, storage_path=storage_path, name=name, callbacks=callbacks)
    return run_contrastive(trial, prepared, storage_path=storage_path, name=name, callbacks=callbacks,
                           overlap_policy=overlap_policy)


def trial_driver(config: dict[str, Any], *, context: dict[str, Any]) -> None:
    """One Tune trial: train, evaluate through the actor, write the trial's row.

    `config` holds the arm, the seed, the stage ("tune": an Optuna trial; "final": a grid
    trial) and any tuned values as dotted config paths. Every trial leaves a row: "finished",
    "nonfinite" (training stopped by non-finite steps), or "failed" with the error's text,
    written before the error goes on to Tune (which retries the trial once, `TRIAL_RETRIES`;
    the retry's row replaces it)."""
    from ray import tune

    study = Study.from_dict(context["study"])
    run_dir = context["run_dir"]
    identity = trial_identity(study, config, tune.get_context().get_trial_id())
    try:
        final = _run_trial(study, identity, trial_params(config), context)
    except Exception as error:
        write_row(run_dir, {**identity, "status": "failed", "error": _error_text(f"{type(error).__name__}: {error}")})
        raise
    tune.report(final)  # outside the try: the row is written, whatever Tune does with this


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
    }


def _run_trial(study: Study, identity: dict[str, Any], params: dict[str, Any], context: dict[str, Any]) -> dict:
    """Train and score one trial and write its row (and per-query file); returns the trial's
    final Tune result. `trial_driver` records whatever this raises."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from embedlab.evaluate.actor import get_evaluator
    from embedlab.train.checkpoint import read_manifest
    from embedlab.train.nonfinite import NonFiniteError

    arm, seed, stage, trial_id = identity["arm"], identity["seed"], identity["stage"], identity["trial_id"]
    run_dir = context["run_dir"]
    trial = set_path(study.trial_config(arm, seed, context.get("parent")), params)
    # This node's copy (fetched and verified when the run's storage is remote).
    prepared = PreparedData(local_directory(context["prepared"][arm]), context["prepared"][arm])
    identity = {
        **identity,
        "config_hash": hashlib.sha256(trial.to_json().encode()).hexdigest(),
        "phase": trial.phase, "parent": trial.parent,
        "parent_hash": read_manifest(trial.parent)["content_hash"] if trial.parent else None,
    }
    try:
        result = train_trial(
            trial, prepared, storage_path=store.join(run_dir, "train"), name=f"{stage}-{arm}-seed{seed}-{trial_id}",
            callbacks=[TuneReportCallback()], overlap_policy=study.disclosed_overlap,
        )
    except NonFiniteError as error:
        # Deterministic: retrying would stop the same way. The table shows why it has no metrics.
        write_row(run_dir, {**identity, "status": "nonfinite", "error": str(error)})
        return {study.metric: float("nan")}
    if result.error is not None:
        raise result.error
    # A path on the run's storage, or a URI on object storage: every reader fetches and verifies it.
    checkpoint_dir = store.location_of(result.checkpoint.filesystem, result.checkpoint.path, like=run_dir)

    def evaluate(task_dir: str, retention_dir: str | None) -> dict:
        # The trial's own output does not reach the console (log_to_driver=False): its evaluation
        # progress travels as Tune results, which the driver's TrialProgress callback prints.
        return evaluate_with_progress(
            get_evaluator(), (checkpoint_dir, task_dir, trial.eval.split, trial.eval.index, retention_dir),
            request=trial_id, max_length=trial.eval.max_length,
            report=lambda line: tune.report({EVAL_PROGRESS: line}))

    scored = score_trial(evaluate, arm_eval_tasks(trial.eval, context["prepared"][arm]), trial.eval.split,
                         str(prepared.directory / "retention"))
    train = result.metrics
    intended = prepared.record["mixture"]["shares"] if trial.phase == 1 else dict(trial.contrastive.pairs)
    row = {
        **identity,
        **{k: train[k] for k in train if k.startswith(("budget/", "compute/"))},
        **{k: train[k] for k in train if k.startswith("data/observed")},
        **{f"data/intended_share/{k}": v for k, v in intended.items()},
        **{k: train[k] for k in train if k.startswith("train/loss")},
        **{k: train[k] for k in ("train/mlm_loss", "train/contrastive_loss") if k in train},
        "train/steps": train["train/step"],
        "train/skipped_steps": train["train/skipped_steps"],
        **scored.columns,
        "checkpoint": checkpoint_dir,
        "checkpoint_hash": scored.main["checkpoint_hash"],
        "data_revision": prepared.data_revision,
        "status": "finished",
    }
    if stage == "final" and any(r.get("status") == "finished" and r.get("stage", "final") == "final"
                                and (r["arm"], r["seed"]) == (arm, seed) and r["trial_id"] != trial_id
                                for r in _finished_rows(run_dir)):
        # A trial of an interrupted pass finished after its driver died: one row per (arm, seed).
        row["status"] = "duplicate"
        row["trial_id"] = f"{trial_id}-duplicate"
    # The per-query file first: a row on disk means its trial's per-query values are there too.
    write_per_query(run_dir, row, scored, trial.eval.split)
    write_row(run_dir, row)
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _eval_compute_columns(*results: dict[str, Any]) -> dict[str, float]:
    """The evaluations' cost as row columns (`evaluate_checkpoint`), summed over `results` (a
    panel's tasks); a cached result carries the cost of the evaluation that computed it."""
    return {f"compute/{key}": sum(scores[key] for scores in results)
            for key in ("eval_flops", "eval_seconds", "eval_wall_seconds")}


@dataclasses.dataclass(frozen=True)
class TrialScores:
    """A trial's scores on its task or panel (`score_trial`).

    `columns`: the row's score columns; `per_query`: each query's value of every metric the
    row averages, keyed as its column; `main`: the evaluator's result on the main task (its
    checkpoint and task hashes); `tasks`: the panel's task names, () without a panel;
    `task_hashes`: each panel task's content hash."""

    columns: dict[str, Any]
    per_query: dict[str, dict[str, float]]
    main: dict[str, Any]
    tasks: tuple[str, ...] = ()
    task_hashes: dict[str, str] = dataclasses.field(default_factory=dict)


def score_trial(evaluate: Callable[[str, str | None], dict[str, Any]], tasks: list[tuple[str, str]], split: str,
                retention_dir: str | None) -> TrialScores:
    """Score a checkpoint on `tasks` ((name, directory), main task first) through `evaluate(task
    directory, retention directory or None)`, an `evaluate_checkpoint`-shaped result.

    The main task is evaluated with the retention panel and fills the row's plain columns
    (`_score_columns`) as without a panel. With a panel, every task is evaluated once more
    (the main task's result is reused), without retention, and adds `panel.panel_columns` of its
    `panel.split_columns`: ``<task>/<split>/...`` and the unweighted ``mean/<split>/<metric>`` of
    each retrieval metric, ``<task>/eval/task_hash``, per-query values under ``<task>/<split>/...``,
    and the summed cost of every evaluation."""
    from embedlab.evaluate.metrics import METRIC_NAMES
    from embedlab.evaluate.panel import panel_columns, split_columns

    (_, main_dir), *extra = tasks
    main = evaluate(main_dir, retention_dir)
    per_query = {f"{split}/{metric}": values for metric, values in main["per_query"].items()}
    if not extra:
        return TrialScores({**_score_columns(main, split), **_eval_compute_columns(main)}, per_query, main)
    results = [(tasks[0][0], main), *((name, evaluate(directory, None)) for name, directory in extra)]
    columns = {
        **_score_columns(main, split),
        **panel_columns([(name, split_columns(scores, split)) for name, scores in results],
                        [f"{split}/{metric}" for metric in METRIC_NAMES]),
        **{f"{name}/eval/task_hash": scores["task_hash"] for name, scores in results},
        **_eval_compute_columns(*(scores for _, scores in results)),
    }
    for name, scores in results:
        per_query.update({f"{name}/{split}/{metric}": values for metric, values in scores["per_query"].items()})
    return TrialScores(columns, per_query, main, tuple(name for name, _ in results),
                       {name: scores["task_hash"] for name, scores in results})


def _error_text(text: str) -> str:
    """An error's text for a row: its end, where the exception's own line is."""
    text = text.strip()
    return text if len(text) <= ERROR_CHARS else "..." + text[-ERROR_CHARS:]


EVAL_PROGRESS = "eval/progress"  # a Tune result holding one evaluation progress line (text)


def evaluate_with_progress(evaluator, args: tuple, *, request: str, report: Callable[[str], None],
                           max_length: int = EvalConfig.max_length, poll_seconds: float = EVAL_POLL_SECONDS) -> dict:
    """The evaluation actor's scores for `evaluate(*args)`; meanwhile each new encoding line of
    this `request` (see `Evaluator.progress`) goes to `report`, the last one once it is done,
    and "waiting" once if another trial's evaluation holds the actor first."""
    import ray

    pending = evaluator.evaluate.remote(*args, request=request, max_length=max_length)
    seen, waiting_said = 0, False

    def forward(status: dict) -> None:
        nonlocal seen, waiting_said
        if status["request"] == request and status["lines"] > seen and status["line"]:
            seen = status["lines"]
            report(status["line"])
        elif status["request"] != request and status["active"] and not waiting_said:
            waiting_said = True
            report("evaluation waiting: the evaluator is busy with another trial")

    while True:
        ready, _ = ray.wait([pending], timeout=poll_seconds)
        if ready:
            scores = ray.get(pending)
            if not scores.get("cached"):
                forward(ray.get(evaluator.progress.remote()))
            return scores
        forward(ray.get(evaluator.progress.remote()))


class BudgetLines:
    """When a trial's training report earns a console line: its first report (the first
    throughput figure), the first on reaching each quarter of its budget, and between those at
    most one every `every_seconds` per trial."""

    def __init__(self, every_seconds: float = BUDGET_LINE_SECONDS) -> None:
        self.every_seconds = every_seconds
        self.quarter: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def line(self, trial_id: str, result: dict[str, Any], now: float | None = None) -> str | None:
        """"45% of budget, loss 6.812, 1,234 tokens/s" (pairs/s in phases 2-3), or None."""
        fraction = result.get("budget/fraction")
        if fraction is None or fraction >= 1:  # the trial's "finished" line follows
            return None
        now = time.monotonic() if now is None else now
        quarter = int(fraction * 4)
        new_quarter = quarter > self.quarter.get(trial_id, 0)
        if not new_quarter and now - self.last.get(trial_id, -math.inf) < self.every_seconds:
            return None
        self.quarter[trial_id] = max(quarter, self.quarter.get(trial_id, 0))
        self.last[trial_id] = now
        parts = [f"{fraction:.0%} of budget"]
        loss = result.get("train/loss")
        if loss is not None:
            parts.append(f"loss {loss:.3f}")
        for key, unit in (("train/tokens_per_s", "tokens/s"), ("train/pairs_per_s", "pairs/s")):
            if result.get(key):
                parts.append(f"{result[key]:,.0f} {unit}")
        return ", ".join(parts)


def _score_columns(scores: dict[str, Any], split: str) -> dict[str, Any]:
    """An evaluation's numbers as table columns: `<split>/...` metrics and health, `retention/...`."""
    return {
        **{f"{split}/{k}": scores[k] for k in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "docs")},
        "eval/task": scores["task"],
        "eval/task_hash": scores["task_hash"],
        "eval/seconds": scores["seconds"],
        "eval/index": scores["index"],
        **{f"{split}/{k}": v for k, v in scores.items() if k.startswith("health/") and not isinstance(v, list)},
        **{k: v for k, v in scores.items() if k.startswith("retention/")},
    }


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


def dry_run(study_path: str | Path, *, profile: str | None = None, parent: str | None = None) -> str:
    """What `embedlab sweep` would run, without starting Ray or touching data."""
    study = load_study(study_path, profile)
    for arm in study.arms:
        study.trial_config(arm, study.seeds[0], (parent or "PARENT") if study.needs_parent else parent)
    budget = study.budget_text

    def shape(trial: TrialConfig) -> str:
        return (f"model {trial.model.preset}: {trial.model.layers} layers, width {trial.model.width}; "
                f"{trial.train.num_workers} workers x {trial.train.cpus_per_worker:g} CPU"
                + (" + 1 GPU" if trial.train.use_gpu else "") + " per trial")

    shapes = {arm: shape(trial) for arm, trial in study.arms.items()}
    # One line when the arms share model and workers; else each arm's (they size concurrency).
    shape_lines = [f"  {next(iter(shapes.values()))}"] if len(set(shapes.values())) == 1 else \
        [f"  {arm}: {text}" for arm, text in shapes.items()]
    lines = [
        f"study {study.name} ({study_path}), profile {study.profile or '-'}, phase {study.phase}",
        f"  {study.description}" if study.description else "",
        f"  factor {study.factor}; metric {study.metric} (recipe-dev)",
        f"  budget per trial: {budget}",
        *shape_lines,
        "  arms:",
        *[f"    {arm:<22} {study.factor} = {study.factor_value(arm)}" for arm in study.arms],
        f"  seeds: {', '.join(map(str, study.seeds))}",
    ]
    if study.search:
        from embedlab.sweep.optuna_search import SamplerChoice

        sampler = SamplerChoice.for_trials(study.search_trials, study.tuning_seeds[0]).description
        lines.append(f"  tuning seeds: {_seed_range(study.tuning_seeds)} (never a study seed: reported numbers "
                     "come from the seeds above alone)")
        lines.append(f"  Optuna search, {study.search_trials} trials per arm, {sampler}:")
        lines += [f"    {s.path}: " + (f"one of {list(s.choices)}" if s.choices else
                                          f"{s.low:g} .. {s.high:g}" + (" (log)" if s.log else "")) for s in study.search]
    if study.needs_parent:
        lines.append(f"  parent: {parent or 'required: --parent CKPT_DIR or a promoted study'}")
    lines.append(f"  trials: {study.trials} ({len(study.arms)} arms x "
                 + (f"({study.search_trials} tuning + {len(study.seeds)} seeds))" if study.search
                    else f"{len(study.seeds)} seeds)"))
    return "\n".join(line for line in lines if line)


def _seed_range(seeds: tuple[int, ...]) -> str:
    return f"{seeds[0]}..{seeds[-1]}" if len(seeds) > 2 else ", ".join(map(str, seeds))


def run_sweep(
    study_path: str | Path,
    *,
    storage: str | Path = "runs",
    address: str | None = None,
    parent: str | None = None,
    profile: str | None = None,
    resume: str | Path | None = None,
    max_concurrent: int | None = None,
    wait_for_resources: float = 0.0,
    progress: Callable[[str], None] = print,
) -> Path:
    """Run every trial of the study file; returns the run directory.

    `parent` (phases 2-3) is the checkpoint every arm starts from, e.g. a phase-1 winner.
    `resume` is an earlier run directory of the same study: its finished trials are kept
    and only the missing ones run. `max_concurrent` trials run at once (default: as many as
    the cluster's resources hold); on an autoscaling cluster that does not hold one trial
    of every arm yet, the sweep waits up to `wait_for_resources` seconds for its nodes
    (`embedlab.sweep.capacity`; 0 refuses at once)."""
    from ray import tune

    store.check_location(resume if resume is not None else storage)  # no credentials in a location
    storage_root = store.parent(store.resolve(resume)) if resume is not None else store.resolve(storage)
    remote = store.local_path(storage_root) is None
    study = load_study(study_path, profile)
    if resume is not None:
        run_dir = store.resolve(resume)
        record = read_study_record(run_dir)
        if record["study_hash"] != study.hash:
            raise UsageError(
                f"{run_dir} holds study {record['study']['name']!r} (hash {record['study_hash'][:12]}), not "
                f"{study_path} as loaded now (hash {study.hash[:12]}): the study file or --profile changed; "
                "resume refused so the two are never mixed"
            )
        parent = record["parent"] if parent is None else parent
    if parent is None and study.needs_parent:
        parent = study.parent  # a promoted study names its parent itself
    lineage: dict[str, dict[str, float]] = {}
    if parent is not None:
        from embedlab.train.checkpoint import verify_checkpoint

        # Fail before any work on a missing or corrupt parent, or one whose FLOPs a
        # lineage-scoped budget needs and it does not record.
        lineage = study.lineage_budgets(verify_checkpoint(parent))
        parent = store.resolve(parent)
    for arm in study.arms:
        study.trial_config(arm, study.seeds[0], parent)  # every arm has what its phase needs
    import ray

    capacity.check_options(max_concurrent, wait_for_resources)
    if address is None and not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
        # A local cluster would offer this machine: a study that cannot run here fails now,
        # naming the profile that can, not after the cluster has started.
        check_fits(study_path, study, local_resources(), "this machine")
    # Every process of the job (not this driver) reads prepared data through the storage root.
    connect(address, progress, job_env={STORAGE_ENV: storage_root} if remote else None)
    from embedlab.evaluate.actor import get_evaluator

    cluster = f"the cluster at {address}" if address else "the cluster"
    concurrency, resources = capacity.wait_for_capacity(
        lambda present: check_fits(study_path, study, present, cluster, gpu_shares(study.arms, present, study.search)),
        ray.cluster_resources, needs=capacity.trial_needs(study.arms, study.search), timeout_s=wait_for_resources,
        max_concurrent=max_concurrent, progress=progress,
        request=lambda bundles: capacity.request_from_autoscaler(bundles, progress))
    shares = gpu_shares(study.arms, resources, study.search)
    if resources.get("GPU", 0):
        progress(f"ray: GPU shares: evaluator {shares.evaluator:g}, mining trial drivers {shares.mining_driver:g}"
                 if shares.evaluator else "ray: evaluation and mining encode on CPU: one trial's workers take "
                 f"every one of the cluster's {resources['GPU']:g} GPUs")
    budget = study.budget_text
    progress(f"study {study.name} (phase {study.phase}, profile {study.profile or '-'}): {len(study.arms)} arms x "
             f"{len(study.seeds)} seeds at {budget} each")
    for arm, split in lineage.items():
        progress(f"budget: arm {arm} inherits {split['inherited_flops']:.4g} FLOPs with its weights and trains "
                 f"{split['phase_flops']:.4g} in phase {study.phase}")
    prepared = prepare_arms(study, progress)
    overlap = _check_contamination(study, prepared, progress)
    _check_pair_schedules(study, prepared, parent)
    if remote:  # no shared disk: every node fetches the driver's prepared bytes by hash
        publish_prepared(prepared, storage_root, progress)
    if resume is None:
        run_dir = _new_run_dir(store.resolve(storage), study.name)
        record = {
            "study": study.to_dict(),
            "arm_order": list(study.arms),  # the JSON below sorts keys; the study's order is kept here
            "study_hash": study.hash,
            "study_file": store.resolve(study_path),
            "study_source": store.read_text(study_path),
            "study_origin": str(study_origin(study_path)),
            "versions": versions(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "final_eval_overlap": overlap,
            "parent": parent,
            **({"lineage_budgets": lineage} if lineage else {}),
        }
        _write_json(store.join(run_dir, STUDY_FILE), record)
        _write_json(store.join(run_dir, "prepared.json"), prepared)
    progress(f"results in {run_dir}")
    # Created by this driver, so it outlives every trial; detached, it stays for later sweeps.
    evaluator = get_evaluator(num_gpus=shares.evaluator)
    if parent is not None and "parent_scores" not in record:
        # The parent under the same evaluator, so gains and forgetting show side by side.
        arm = next(iter(study.arms))
        config = study.trial_config(arm, study.seeds[0], parent)
        directory = Path(prepared[arm]["directory"])
        scored = score_trial(
            lambda task_dir, retention_dir: ray.get(evaluator.evaluate.remote(
                parent, task_dir, config.eval.split, config.eval.index, retention_dir,
                max_length=config.eval.max_length)),
            arm_eval_tasks(config.eval, prepared[arm]), config.eval.split, str(directory / "retention"))
        # Score columns only, as before panels: the evaluation's cost is the parent's, not a trial's.
        record["parent_scores"] = {k: v for k, v in scored.columns.items() if not k.startswith("compute/")}
        _write_json(store.join(run_dir, STUDY_FILE), record)
        progress(f"parent {store.name(parent)}: {study.metric} {record['parent_scores'][study.metric]:.4f}")
    context = {"study": study.to_dict(), "prepared": prepared, "run_dir": run_dir, "parent": parent}
    driver = tune.with_resources(tune.with_parameters(trial_driver, context=context), _driver_resources(study, shares))
    rows = _finished_rows(run_dir)
    kept = [r for r in rows if _kept_on_resume(r)]
    if resume is not None:
        rerun = len(rows) - len(kept)
        progress(f"resume: {len(kept)} finished trial(s) kept, {study.trials - len(kept)} to run"
                 + (f" ({rerun} failed grid trial(s) among them run again)" if rerun else ""))
    best: dict[str, dict[str, Any]] = {arm: {} for arm in study.arms}
    if study.search:
        best = _tune_arms(study, driver, run_dir, record, rows, concurrency, progress)
        _write_json(store.join(run_dir, "search.json"), best)
    done = {(r["arm"], r["seed"]) for r in kept if r.get("stage", "final") == "final"}
    todo = [{"arm": arm, "seed": seed, "stage": "final", "params": best[arm]}
            for arm in study.arms for seed in study.seeds if (arm, seed) not in done]
    if todo:
        progress(f"tune: {len(todo)} trials, at most {concurrency} at a time")
        _fit(driver, {"trial": tune.grid_search(todo)}, run_dir, "grid", concurrency, progress, study=study)
    return run_dir


def _kept_on_resume(row: dict[str, Any]) -> bool:
    """Whether a resumed run keeps a trial's row as done. A failed grid trial (a crash, after
    Tune's retry) runs again; a nonfinite one would stop the same way, so it stays. Tuning
    trials all stay, failed ones too: each spent one of the arm's equal tuning budget."""
    return row.get("stage", "final") == "tune" or row.get("status") != "failed"


def _tune_arms(study: Study, driver, run_dir: str, record: dict, rows: list[dict], concurrency: int,
               progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Optuna's search per arm, `study.search_trials` trials each at `study.tuning_seeds` (equal
    tuning effort, never at a study seed); returns each arm's best values on the study metric
    (recipe-dev) among its tuning trials that finished with a finite value. Failed and
    nonfinite trials count against the budget, are excluded from the choice, printed, and
    listed in study.json's "tuning"; an arm with none usable raises `TuningError`."""
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
            _fit(driver, None, run_dir, f"optuna-{arm}", concurrency, progress,
                 study=study, searcher=searcher, num_samples=remaining)
            if store.local_path(run_dir) is None:  # keep the run directory's copy current
                store.write_bytes(store.join(run_dir, OPTUNA_FILE), database.read_bytes())
        arm_rows = _tuning_rows(_finished_rows(run_dir), arm)
        _, failures = split_tuning_rows(arm_rows, study.metric)
        if failures:
            tuning["failed"][arm] = failures
            progress(f"optuna: arm {arm}: {len(failures)} of {len(arm_rows)} tuning trial(s) failed, excluded "
                     f"from the choice: {_failure_text(failures)}")
        record["tuning"] = tuning  # written before a TuningError, so the failures are on record
        _write_json(store.join(run_dir, STUDY_FILE), record)
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


def _trial_progress(total: int, metric: str, progress: Callable[[str], None]):
    """A Tune callback that prints one line per trial event, throttled budget lines while a
    trial trains (`BudgetLines`) and its evaluation's encoding lines, instead of Tune's
    periodic status tables."""
    from ray import tune

    class TrialProgress(tune.Callback):
        def __init__(self) -> None:
            self.done = 0
            self.budget = BudgetLines()

        @staticmethod
        def _name(trial) -> str:
            config = trial.config.get("trial", trial.config)
            tuned = {k: v for k, v in config.items() if "." in k} or config.get("params") or {}
            extra = " " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in tuned.items())
            return f"{config.get('stage', 'final')} {config['arm']} seed {config['seed']}" + (extra if tuned else "")

        def on_trial_start(self, iteration, trials, trial, **info):
            progress(f"trial {self._name(trial)}: started")

        def on_trial_result(self, iteration, trials, trial, result, **info):
            line = result.get(EVAL_PROGRESS) or self.budget.line(trial.trial_id, result)
            if line:
                progress(f"trial {self._name(trial)}: {line}")

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.done += 1
            value = trial.last_result.get(metric)
            if value is not None and not math.isfinite(value):  # the driver's nonfinite report
                progress(f"trial {self._name(trial)}: stopped, non-finite training ({self.done}/{total})")
                return
            progress(f"trial {self._name(trial)}: finished ({self.done}/{total})"
                     + (f", {metric} {value:.4f}" if value is not None else ""))

        def on_trial_error(self, iteration, trials, trial, **info):
            self.done += 1
            progress(f"trial {self._name(trial)}: FAILED ({self.done}/{total}); see {trial.local_path}")

    return TrialProgress()


def _failed_rows(study: Study, run_dir: str):
    """A Tune callback that writes a "failed" row for a trial that errored without writing one
    itself (its process died: out of memory, a lost node), so every trial leaves a row."""
    from ray import tune

    class FailedRows(tune.Callback):
        def on_trial_error(self, iteration, trials, trial, **info):
            if store.exists(store.join(run_dir, TRIALS_DIR, f"{trial.trial_id}.json")):
                return  # the driver's own row says more
            error = trial.get_error() or f"see {trial.local_path}"
            write_row(run_dir, {**trial_identity(study, trial.config, trial.trial_id), "status": "failed",
                                "error": _error_text(str(error))})

    return FailedRows()


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


def _fit(driver, param_space, run_dir: str, name: str, concurrency: int, progress: Callable[[str], None], *,
         study: Study, searcher=None, num_samples: int = 1) -> None:
    from ray import tune

    total = num_samples if param_space is None else len(param_space["trial"]["grid_search"])
    # Each pass of a resumed run gets its own Tune experiment next to the earlier ones.
    base, n = name, 1
    while store.exists(store.join(run_dir, "tune", name)):
        name, n = f"{base}-{n}", n + 1
    tuner = tune.Tuner(
        driver,
        param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, search_alg=searcher, num_samples=num_samples),
        run_config=tune.RunConfig(name=name, storage_path=store.join(run_dir, "tune"), verbose=0,
                                  callbacks=[_trial_progress(total, study.metric, progress),
                                             _failed_rows(study, run_dir)],
                                  # A trial whose trainer died (a lost node, a removed placement
                                  # group) runs once more before it counts as failed.
                                  failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES)),
    )
    results = tuner.fit()
    failed = [r for r in results if r.error is not None]
    if failed:
        progress(f"tune: {len(failed)} trial(s) failed; see {store.join(run_dir, 'tune', name)}")


def _finished_rows(run_dir: str) -> list[dict[str, Any]]:
    return [json.loads(store.read_text(p)) for p in store.list_files(store.join(run_dir, TRIALS_DIR), ".json")]


def _write_json(location: str, value: Any) -> None:
    store.write_text(location, json.dumps(value, indent=2, sort_keys=True))


def _check_contamination(study: Study, prepared: dict[str, dict], progress: Callable[[str], None]) -> list[dict]:
    """Refuse training data holding final-eval items unless the study discloses its policy.

    Before any trial starts, each arm's stages against its evaluation task: the phase-1
    stages of its data (pretraining text of its sources, the tokenizer sample) and, in phases
    2-3, the frozen pairs table of its builders (built here if no trial built it yet). Phase
    3's mined negatives exist only once a trial has mined them: `run_contrastive` checks them
    there, before it trains."""
    from embedlab.data.contamination import check_training_data
    from embedlab.data.pair_stream import pair_table_path

    findings: dict[str, dict] = {}
    checked: set[tuple[str, str, str | None]] = set()
    for arm, config in study.arms.items():
        record = prepared[arm]
        data = PreparedData(Path(record["directory"]), record)
        builders = sorted(dict(config.contrastive.pairs)) if config.phase > 1 else []
        # A user's pair sources (config.data.pair_files ...) join the table: their queries,
        # positives and given negatives are checked with the built-in pairs.
        pairs_path = pair_table_path(data, builders, progress, data=config.data) if builders else None
        for _, task_dir in arm_eval_tasks(config.eval, record):  # every task of a panel
            if (record["directory"], task_dir, str(pairs_path)) in checked:
                continue
            checked.add((record["directory"], task_dir, str(pairs_path)))
            for finding in check_training_data(data, Path(task_dir), study.disclosed_overlap, progress,
                                               pairs_path=pairs_path):
                findings.setdefault(json.dumps(finding, sort_keys=True), finding)  # arms sharing data find it once
    if findings:
        progress(f"audit: {len(findings)} final-eval item(s) overlap the training data; "
                 f"disclosed-overlap policy: {study.disclosed_overlap}")
    else:
        progress("audit: no final-eval item found in the training data")
    return list(findings.values())


def _check_pair_schedules(study: Study, prepared: dict[str, dict], parent: str | None) -> None:
    """Refuse, before any trial starts, a phase-2/3 arm whose pair schedule the frozen pairs
    cannot fill within the repetition cap (`data.mixture.max_epochs`): otherwise every trial
    of that arm fails inside Ray, one after the other, and the study ranks the arms that ran."""
    from embedlab.data.mixture import MixtureError
    from embedlab.data.pair_stream import PAIR_TABLES, pair_table_name, pair_table_path
    from embedlab.train.contrastive import trial_pair_schedule

    if study.phase == 1:
        return
    for arm in study.arms:
        trial = study.trial_config(arm, study.seeds[0], parent)
        data = PreparedData(Path(prepared[arm]["directory"]), prepared[arm])
        builders = list(dict(trial.contrastive.pairs))
        path = pair_table_path(data, builders, lambda _: None, data=trial.data)
        # Recorded for the trials: they read this table (on any node, a copy of it) instead of
        # hashing the user's pair files again, which live on this machine only.
        prepared[arm].setdefault(PAIR_TABLES, {})[pair_table_name(builders)] = path.relative_to(data.directory).as_posix()
        try:
            trial_pair_schedule(trial, path)
        except MixtureError as error:
            raise UsageError(f"study {study.name}, arm {arm}: its budget schedules more pairs than the frozen pairs "
                             f"hold: {error}; lower the budget or the profile's pairs") from None


def _new_run_dir(storage: str, name: str) -> str:
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


def publish_prepared(prepared: dict[str, dict], storage: str, progress: Callable[[str], None]) -> None:
    """Publish each arm's prepared directory under `storage` (`prepared_sync.publish`) and
    record where and its tree hash in the arm's record, which every trial fetches by."""
    published: dict[str, str] = {}
    for record in prepared.values():
        directory = record["directory"]
        if directory not in published:
            published[directory] = publish(Path(directory), storage, progress)
        record["published"] = store.join(remote_root(storage), Path(directory).name)
        record["tree_hash"] = published[directory]


def prepare_arms(study: Study, progress: Callable[[str], None]) -> dict[str, dict]:
    """Prepare each distinct data config once; map every arm to its prepared record."""
    by_config: dict[str, PreparedData] = {}
    out: dict[str, dict] = {}
    for arm, config in study.arms.items():
        key = json.dumps(config.data.phase1_dict(), sort_keys=True, default=str)  # pair sources share it
        if key not in by_config:
            by_config[key] = prepare_data(config.data, progress=progress)
        prepared = by_config[key]
        out[arm] = {**prepared.record, "directory": str(prepared.directory)}
    scored_on = set()
    for arm, config in study.arms.items():
        if config.eval.panel:  # resolved (Hub tasks materialised) once, here, for every trial
            out[arm]["eval_tasks"] = [[name, str(directory)] for name, directory in
                                      resolve_eval_tasks(config.eval, Path(out[arm]["directory"]))]
        task_dirs = [Path(directory) for _, directory in arm_eval_tasks(config.eval, out[arm])]
        if not task_dirs[0].is_dir():
            raise FileNotFoundError(f"arm {arm}: evaluation task {config.eval.task!r} was not built")
        scored_on.add((tuple(load_task(directory).hash for directory in task_dirs), config.eval.split))
    if len(scored_on) != 1:
        raise UsageError("arms are scored on different task contents or splits; comparison refused")
    return out

