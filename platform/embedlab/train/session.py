"""Where a training loop runs: on Ray Train (`RaySession`) or in this process (`LocalSession`).

A session gives the loop its rank, world size and device, its own rows of the stream's
global batches, the checkpoint to resume from, and a way to report metrics with an optional
checkpoint.
The loop itself (`embedlab.train.loop`) knows nothing of Ray, so the exact-resume and
rejected-update guarantees are tested in-process with the same code Ray Train runs.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from embedlab.core.telemetry import TrainingTelemetry
from embedlab.streams.packed import WorkerSplit

Batch = dict[str, torch.Tensor]


class Session(Protocol):
    rank: int
    world: int
    device: torch.device

    def worker_batches(self, rows: int) -> Iterator[Batch]:
        """This worker's `rows` rows of each global batch of `world` x `rows` rows, in order:
        its k-th batch is `worker_rows(global batch k, rank, world)` (the last partial global
        batch dropped)."""

    def resume_point(self):
        """A context manager giving the directory of the latest checkpoint, or None."""

    def report(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        """Every rank calls it at the same steps; rank 0 passes the checkpoint directory."""

    def settle(self) -> None:
        """Return once every report so far is stored (checkpoints registered)."""


# Batches Ray Data's iterator collates ahead of the one the step is consuming, in a
# background thread. `embedlab bench prefetch` measures this against 0 (docs/results/benchmarks.md).
PREFETCH_BATCHES = 1


def train_dataset_name(rank: int) -> str:
    """The name Ray Train gives worker `rank`'s own Dataset (`launch.fit`)."""
    return f"train-{rank}"


# Stream columns that hold real numbers (a teacher's scores, nan where it has none); every
# other column is ids, lengths or counts, and a step reads those as long tensors.
FLOAT_COLUMNS = frozenset({"teacher_scores", "teacher_embedding"})


def batch_tensor(name: str, column) -> torch.Tensor:
    """A stream column as the step reads it: float32 for `FLOAT_COLUMNS`, else long."""
    tensor = torch.as_tensor(column)
    return tensor.float() if name in FLOAT_COLUMNS else tensor.long()


def torch_batches(source, rows: int, prefetch_batches: int = PREFETCH_BATCHES) -> Iterator[Batch]:
    """A Ray Dataset's or dataset shard's rows in order as tensors (`batch_tensor`), `rows` rows
    a batch, the last partial batch dropped."""
    # Ray's `dtypes` casts every column to one dtype or needs every column named up front;
    # collating at the stream's own dtypes and casting here keeps float columns float.
    batches = source.iter_torch_batches(batch_size=rows, drop_last=True, dtypes=None,
                                        prefetch_batches=prefetch_batches)
    return ({name: batch_tensor(name, column) for name, column in batch.items()} for batch in batches)


class RaySession:
    """Ray Train's worker context (call from inside `train_loop_per_worker`)."""

    def __init__(self) -> None:
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank, self.world = context.get_world_rank(), context.get_world_size()
        self.device = ray.train.torch.get_device()
        self.telemetry = None
        if self.rank == 0:  # reports are all-reduced: one publisher per run is enough

            self.telemetry = TrainingTelemetry(context.get_experiment_name(), self.world)

    def worker_batches(self, rows: int) -> Iterator[Batch]:
        import ray.train

        # Each worker has its own Dataset, built on the driver from the split by global row
        # (`embedlab.streams.packed.WorkerSplit`) and not split by Ray Train (`launch.fit`), so
        # who gets which row never depends on timing.
        return torch_batches(ray.train.get_dataset_shard(train_dataset_name(self.rank)), rows)

    @contextmanager
    def resume_point(self):
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as directory:
            yield Path(directory)

    def report(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        import ray.train

        if self.telemetry is not None:
            self.telemetry.publish(metrics)

        ray.train.report(metrics, checkpoint=None if checkpoint is None else ray.train.Checkpoint.from_directory(
            str(checkpoint)))

    def settle(self) -> None:
        import ray.train

        # The controller registers reports when it polls the workers; until then a report
        # (and its checkpoint) dies with its worker.
        ray.train.get_all_reported_checkpoints()


class LocalSession:
    """One process (or one rank of a process group) reading in-memory rows; rank 0 stores
    checkpoints in `root/checkpoint_<n>` (a root every rank sees) and a new session on the
    same `root` resumes from the latest, as a Ray Train run of the same name does."""

    def __init__(self, rows: dict[str, np.ndarray | torch.Tensor], root: Path, *, rank: int = 0, world: int = 1,
                 device: torch.device = torch.device("cpu")) -> None:
        self.rows = {k: batch_tensor(k, v) for k, v in rows.items()}
        self.root, self.rank, self.world, self.device = Path(root), rank, world, device
        self.reports: list[dict[str, Any]] = []
        self.checkpoints: list[Path] = []

    def global_batches(self, rows: int) -> Iterator[Batch]:
        """The whole stream in order, `rows` rows a batch (the last partial batch dropped)."""
        total = len(next(iter(self.rows.values())))
        for start in range(0, total - rows + 1, rows):
            yield {k: v[start : start + rows] for k, v in self.rows.items()}

    def worker_batches(self, rows: int) -> Iterator[Batch]:
        """This rank's rows only, picked by the split the Ray streams are built from."""
        total = len(next(iter(self.rows.values())))
        mine = torch.as_tensor(WorkerSplit(rank=self.rank, world=self.world, batch_rows=rows).keep(0, total, total))
        for start in range(0, len(mine), rows):
            index = mine[start : start + rows]
            yield {k: v[index] for k, v in self.rows.items()}

    @contextmanager
    def resume_point(self):
        existing = sorted(self.root.glob("checkpoint_*")) if self.root.is_dir() else []
        yield existing[-1] if existing else None

    def report(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        self.reports.append(dict(metrics))
        if checkpoint is not None:
            target = self.root / f"checkpoint_{len(sorted(self.root.glob('checkpoint_*'))):06d}"
            staging = target.with_name(f".{target.name}.partial")
            shutil.copytree(checkpoint, staging)
            staging.rename(target)
            self.checkpoints.append(target)
        if self.world > 1:
            torch.distributed.barrier()  # as Ray Train's report: every rank leaves once the checkpoint is stored

    def settle(self) -> None:
        pass


class DatasetSession:
    """This process alone reading a Ray Dataset (no Ray Train): for measuring the data path
    the training loop sees (`embedlab bench prefetch`), one worker's Dataset at a time (as
    rank 0 of 1: the loop takes every row it reads). Keeps the reports; checkpoints are not
    stored, and there is nothing to resume from."""

    rank, world, device = 0, 1, torch.device("cpu")

    def __init__(self, dataset, prefetch_batches: int = PREFETCH_BATCHES) -> None:
        # In order, as Ray Train reads it (`launch.fit`); Ray Data's default may reorder blocks.
        dataset.context.execution_options.preserve_order = True
        self.dataset, self.prefetch_batches = dataset, prefetch_batches
        self.reports: list[dict[str, Any]] = []

    def worker_batches(self, rows: int) -> Iterator[Batch]:
        return torch_batches(self.dataset, rows, self.prefetch_batches)

    @contextmanager
    def resume_point(self):
        yield None

    def report(self, metrics: dict[str, Any], checkpoint: Path | None) -> None:
        self.reports.append(dict(metrics))

    def settle(self) -> None:
        pass


@dataclass(frozen=True)
class FaultDrill:
    """Worker `rank` kills its own process with SIGKILL after step `step` (once its reports
    are stored), once: the `marker` file (on storage every worker sees) records that the
    drill fired, so the restarted worker trains on. For tests of Ray Train's restart and
    exact restore."""

    rank: int
    step: int
    marker: str

    def fire_if_due(self, session: Session, step: int) -> None:
        marker = Path(self.marker)
        if session.rank == self.rank and step == self.step and not marker.exists():
            session.settle()
            marker.write_text(f"pid {os.getpid()} killed after step {step}\n")
            os.kill(os.getpid(), signal.SIGKILL)
