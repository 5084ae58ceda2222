"""Build and fit the `TorchTrainer` every phase runs on (one place for scaling, data
assignment, storage, checkpoints and restarts)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedlab.core.config import TrialConfig
from embedlab.train.nonfinite import NonFiniteError

# Fixed, not a setting: a run only ever reads its latest checkpoint (a restarted worker group
# and a rerun of the same name resume from it, and the final one, the latest when the run ends,
# is the phase's result that evaluation and a child phase use), so keeping more only stores
# more weights and optimizer state; the one before is kept beside it as a spare.
CHECKPOINTS_KEPT = 2  # the latest (what a restart restores, or the final one) and the one before


def fit(
    worker: Callable[[dict[str, Any]], None],
    loop_config: dict[str, Any],
    trial: TrialConfig,
    datasets: list,
    *,
    storage_path: Path | str,
    name: str,
    callbacks: list | None = None,
):
    """Fit `worker` on `trial.train.num_workers` workers (gloo on CPU, NCCL on GPU), worker r
    reading `datasets[r]`, its own rows of the stream; returns the Ray Train `Result`.

    Ray Train splits none of them: each is read whole and in order by its one worker (the
    split by global row is made on the driver, `embedlab.streams.packed.WorkerSplit`). A
    worker group that fails is restarted from the latest checkpoint up to
    `train.max_failures` times; a run whose `name` already has checkpoints under
    `storage_path` resumes from the latest. A trial its workers stopped for non-finite
    steps raises `NonFiniteError` here. Every report is logged in
    `<storage_path>/<name>/metrics.jsonl` (`embedlab.train.metrics_log`).
    """
    # Here: Ray Train (the metrics log and session build on it), imported when a trial launches.
    from ray.train import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from embedlab.train.metrics_log import MetricsLog, log_location
    from embedlab.train.session import train_dataset_name

    if len(datasets) != trial.train.num_workers:
        raise ValueError(f"fit needs one dataset per worker: {len(datasets)} for "
                         f"train.num_workers {trial.train.num_workers}")
    execution = DataConfig.default_ingest_options()
    execution.preserve_order = True
    trainer = TorchTrainer(
        worker,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=trial.train.num_workers,
            use_gpu=trial.train.use_gpu,
            resources_per_worker={"CPU": trial.train.cpus_per_worker},
        ),
        torch_config=TorchConfig(backend="nccl" if trial.train.use_gpu else "gloo"),
        datasets={train_dataset_name(rank): dataset for rank, dataset in enumerate(datasets)},
        dataset_config=DataConfig(datasets_to_split=[], execution_options=execution),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage_path),
            callbacks=[*(callbacks or []), MetricsLog(log_location(storage_path, name))],
            checkpoint_config=CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
            failure_config=FailureConfig(max_failures=trial.train.max_failures),
        ),
    )
    result = trainer.fit()
    raise_if_stopped(result)
    return result


def raise_if_stopped(result) -> None:
    """Raise the `NonFiniteError` that stopped the run's workers (returned by rank 0), if any."""
    error = NonFiniteError.from_return_value(getattr(result, "return_value", None))
    if result.error is None and error is not None:
        raise error
