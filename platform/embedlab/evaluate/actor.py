"""The evaluation actor: one per cluster, shared by every trial of every study.

It loads each task once, scores a checkpoint on a split, and caches results by
(checkpoint content hash, task hash, split, index kind), so asking twice costs nothing.
Calls are served one at a time (an actor's default), so two trials asking at once are
both answered, in turn, from one copy of each task. Trials never
load a corpus themselves; they send a checkpoint path and a task directory.

While it encodes, `progress()` (served on its own thread, `PROGRESS_GROUP`, so a busy
evaluation does not block it) returns the latest throttled encoding line and the request it
belongs to: the trial driver polls it and forwards the line to the sweep's console (workers'
own output does not reach it: `ray.init(log_to_driver=False)`).

On a cluster that advertises GPUs it asks for `EVALUATOR_GPU_SHARE` of one, so it encodes on
CUDA and searches with faiss-gpu when installed: Ray hides every GPU from a process that asks
for none (CUDA_VISIBLE_DEVICES empty), and the evaluator would encode on CPU there.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import ray

from embedlab.config import EvalConfig
from embedlab.evaluate.beir import Task, load_task
from embedlab.data.prepared_sync import node_path
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
from embedlab.train.checkpoint import read_manifest

ACTOR_NAME = "embedlab-evaluator"
NAMESPACE = "embedlab"
PROGRESS_GROUP = "progress"  # a concurrency group of one thread beside the default one
# The evaluator's share of one GPU on a GPU cluster. It encodes in bursts between trainings,
# so a quarter is enough to run on the device while Ray packs it with other fractional
# requests (mining trial drivers: `embedlab.sweep.run.MINING_GPU_SHARE`) onto one device,
# leaving whole devices to the trainers' workers.
EVALUATOR_GPU_SHARE = 0.25


class Evaluator:
    def __init__(self, torch_threads: int = 1) -> None:
        import torch

        torch.set_num_threads(torch_threads)
        self._tasks: dict[str, Task] = {}
        self._results: dict[tuple, dict] = {}
        self._metrics = None  # created on first use, inside the actor (ray.util.metrics needs a worker)
        self._lock = threading.Lock()  # `progress` runs on another thread than `evaluate`
        self._status: dict = {"request": None, "active": False, "line": None, "lines": 0}

    def task(self, task_dir: str) -> Task:
        key = str(node_path(task_dir).resolve())  # a prepared task: this node's verified copy
        if key not in self._tasks:
            self._tasks[key] = load_task(key)
        return self._tasks[key]

    def evaluate(
        self, checkpoint_dir: str, task_dir: str, split: str, index: str = "flat", retention_dir: str | None = None,
        request: str | None = None, max_length: int = EvalConfig.max_length,
    ) -> dict:
        """Scores of the checkpoint on the task's split, texts cut at `max_length` tokens (cached):
        `evaluate_checkpoint`'s dict, per-query values and evaluation cost included (a cached
        answer repeats the cost of the evaluation that computed it, with "cached" True);
        `request` names this call in `progress()` (default: the checkpoint directory)."""
        task = self.task(task_dir)
        key = (read_manifest(checkpoint_dir)["content_hash"], task.hash, split, index, retention_dir, max_length)
        cached = key in self._results
        if not cached:
            with self._lock:
                self._status = {"request": request or checkpoint_dir, "active": True, "line": None, "lines": 0}
            try:
                self._results[key] = evaluate_checkpoint(
                    checkpoint_dir, task, split, index=index, max_length=max_length,
                    retention_dir=None if retention_dir is None else node_path(retention_dir),
                    progress=self._record,
                )
            finally:
                with self._lock:
                    self._status = {**self._status, "active": False}
        self._telemetry().publish(task.name, self._results[key]["seconds"], cached)
        return dict(self._results[key], cached=cached)

    def _record(self, line: str) -> None:
        with self._lock:
            self._status = {**self._status, "line": line, "lines": self._status["lines"] + 1}

    @ray.method(concurrency_group=PROGRESS_GROUP)
    def progress(self) -> dict:
        """The latest evaluation that encoded: {"request": its name, "active": still encoding,
        "line": its latest encoding line or None, "lines": how many it has had (a poller
        forwards only new ones)}."""
        with self._lock:
            return dict(self._status)

    def _telemetry(self):
        if self._metrics is None:
            from embedlab.telemetry import EvaluationTelemetry

            self._metrics = EvaluationTelemetry()
        return self._metrics

    def stats(self) -> dict:
        """Tasks loaded, results cached, and the GPUs Ray assigned this actor (ids and
        CUDA_VISIBLE_DEVICES; empty when it asked for none)."""
        return {"tasks_loaded": len(self._tasks), "results_cached": len(self._results),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


_handles: dict[str, ray.actor.ActorHandle] = {}


def evaluator_gpus(resources: dict[str, float]) -> float:
    """The GPU share the evaluator asks for on a cluster with `resources`
    (`ray.cluster_resources()`): `EVALUATOR_GPU_SHARE` where it advertises a GPU, else none."""
    return EVALUATOR_GPU_SHARE if resources.get("GPU", 0) > 0 else 0.0


def get_evaluator(num_cpus: float = 0, num_gpus: float | None = None) -> ray.actor.ActorHandle:
    """The cluster's evaluation actor, created on first use and found by name afterwards.

    It is detached: it belongs to the cluster, not to the sweep that created it, so trial
    drivers that come and go and sweeps that run side by side all reach the same actor, and
    one sweep's driver exiting does not take it from another (a non-detached actor dies with
    its creator). It holds no CPU reservation: it works between trainings, and on a 2-core
    box a reserved core would starve the trainers' data pipeline. `num_gpus` defaults to
    `evaluator_gpus` of the cluster (a sweep passes its own choice: `sweep.run.gpu_shares`);
    requests only count when this call creates the actor, not when it finds it.
    """
    key = ray.get_runtime_context().get_job_id()
    if key not in _handles:
        gpus = evaluator_gpus(ray.cluster_resources()) if num_gpus is None else num_gpus
        _handles[key] = (
            ray.remote(concurrency_groups={PROGRESS_GROUP: 1})(Evaluator)
            .options(name=ACTOR_NAME, namespace=NAMESPACE, get_if_exists=True, num_cpus=num_cpus,
                     num_gpus=gpus, lifetime="detached")
            .remote()
        )
    return _handles[key]
