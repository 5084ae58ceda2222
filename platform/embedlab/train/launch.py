"""Build and fit the `TorchTrainer` every phase runs on (one place for scaling and storage)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedlab.config import TrialConfig


def fit(
    worker: Callable[[dict[str, Any]], None],
    loop_config: dict[str, Any],
    trial: TrialConfig,
    dataset,
    *,
    storage_path: Path,
    name: str,
    callbacks: list | None = None,
):
    """Fit `worker` on `trial.train.num_workers` workers (gloo on CPU, NCCL on GPU) with
    `dataset` as the "train" shard source; returns the Ray Train `Result`."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        worker,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            num_workers=trial.train.num_workers,
            use_gpu=trial.train.use_gpu,
            resources_per_worker={"CPU": trial.train.cpus_per_worker},
        ),
        torch_config=TorchConfig(backend="nccl" if trial.train.use_gpu else "gloo"),
        datasets={"train": dataset},
        run_config=RunConfig(name=name, storage_path=str(storage_path), callbacks=callbacks or []),
    )
    return trainer.fit()
