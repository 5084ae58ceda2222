"""The encoder and the task as `embedlab evaluate` names them, turned into what the evaluator takes.

An encoder is a checkpoint directory, a pretrained model (`hf:ORG/NAME@COMMIT` or a Hugging
Face or sentence-transformers directory, materialised as a checkpoint:
`embedlab.checkpoints.pretrained`) or `baseline:NAME` (`embedlab.tasks.baselines`). A
task is a Hub task (`hub:DATASET@REVISION` or a HubTask .toml/.json, `hub_tasks.hub_task_argument`),
a BEIR directory, or a built-in task's name, built from the data the checkpoint trained on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from embedlab.checkpoints.io import verify_checkpoint
from embedlab.checkpoints.pretrained import is_pretrained_spec, pretrained_parent
from embedlab.core.beir import Task, load_task
from embedlab.core.config import DataConfig, TrialConfig
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
from embedlab.tasks.resolve import resolve_task
from embedlab.prepared.build import prepare_data
from embedlab.tasks.baselines import evaluate_baseline
from embedlab.tasks.builtin_tasks import BUILTIN_TASKS
from embedlab.tasks.hub_tasks import derive_dev_split, hub_task_argument, load_hub_task

BASELINE_PREFIX = "baseline:"


def baseline_name(encoder: str) -> str | None:
    """NAME of an encoder given as `baseline:NAME`; None for a checkpoint."""
    return encoder.removeprefix(BASELINE_PREFIX) if encoder.startswith(BASELINE_PREFIX) else None


def load_task_argument(task: str, encoder: str, *, dev_fraction: float | None = None, dev_seed: int = 0,
                       progress: Callable[[str], None] = print) -> Task:
    """The task `task` names, to score `encoder` on. `dev_fraction` moves that share of its train
    queries to a derived dev split (`hub_tasks.derive_dev_split`; a task with a dev split keeps it).
    `progress` takes the lines of preparing a built-in task's data."""
    spec = hub_task_argument(task, dev_fraction=dev_fraction, dev_seed=dev_seed)
    if spec is not None:  # materialised (with its derived dev split, if any) in the cache, once
        return load_hub_task(spec)
    prepared_dir = None
    if task in BUILTIN_TASKS and not Path(task).is_dir():
        # The built-in task comes from the same corpus split the checkpoint trained on
        # (baselines and pretrained models, which trained on none of ours: the default data
        # config, the one `make demo` trains on).
        trained = None if baseline_name(encoder) or is_pretrained_spec(encoder) else verify_checkpoint(encoder)
        data = DataConfig() if trained is None or "config" not in trained else TrialConfig.from_dict(
            trained["config"]).data
        prepared_dir = prepare_data(data, progress=progress).directory
    loaded = load_task(resolve_task(task, prepared_dir))
    if dev_fraction is not None:  # the same rule as a Hub task's, in memory
        loaded, _ = derive_dev_split(loaded, dev_fraction, dev_seed)
    return loaded


def score_encoder(encoder: str, task: Task, split: str, *, index: str = "flat") -> dict:
    """The metrics of a checkpoint (searched with the Faiss `index`) or of `baseline:NAME` on `split`."""
    baseline = baseline_name(encoder)
    if baseline is not None:
        return evaluate_baseline(baseline, task, split)
    if is_pretrained_spec(encoder):
        encoder = str(pretrained_parent(encoder))  # pooled and prefixed as its own configuration says
    return evaluate_checkpoint(encoder, task, split, index=index)
