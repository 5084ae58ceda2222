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

One code version: being detached, the actor outlives the sweep that created it, so a cluster
can still run one started by an earlier embedlab. It records the code identity it was created
with (`embedlab.core.code_identity`: version and source hash) and `identity()` reports it with
whether an evaluation is in flight. `get_evaluator` uses an evaluator only when that identity is
its own code's: a different one that is idle is killed and replaced (one warning line says so);
one that is busy is refused, naming `embedlab evaluator stop`, since killing it would fail
another sweep's evaluation.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import ray

from embedlab.artifacts.sync import node_path
from embedlab.checkpoints.io import read_manifest
from embedlab.core import code_identity
from embedlab.core.beir import Task, load_task
from embedlab.core.config import EvalConfig
from embedlab.core.errors import UsageError
from embedlab.core.telemetry import EvaluationTelemetry
from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint

ACTOR_NAME = "embedlab-evaluator"
NAMESPACE = "embedlab"
PROGRESS_GROUP = "progress"  # a concurrency group of one thread beside the default one
# The evaluator's share of one GPU on a GPU cluster. It encodes in bursts between trainings,
# so a quarter is enough to run on the device while Ray packs it with other fractional
# requests (mining trial drivers: `embedlab.sweep.cluster.MINING_GPU_SHARE`) onto one device,
# leaving whole devices to the trainers' workers.
EVALUATOR_GPU_SHARE = 0.25
# How long `get_evaluator` waits for the actor to answer `identity()` (it first has to start),
# and for its name to be free after a kill.
IDENTITY_TIMEOUT_S = 300.0
NAME_FREE_TIMEOUT_S = 60.0
# What an evaluator from before code identities reports in place of a version.
UNKNOWN_VERSION = "unknown (before code identities)"

logger = logging.getLogger(__name__)


class Evaluator:
    def __init__(self, torch_threads: int = 1, identity: dict[str, str] | None = None) -> None:
        """`identity`: the code identity to report (`CodeIdentity.to_dict()`; default: the code
        running in this actor; tests pass a stale one)."""
        import torch

        torch.set_num_threads(torch_threads)
        self._tasks: dict[str, Task] = {}
        self._results: dict[tuple, dict] = {}
        self._metrics = None  # created on first use, inside the actor (ray.util.metrics needs a worker)
        self._lock = threading.Lock()  # `progress` runs on another thread than `evaluate`
        self._status: dict = {"request": None, "active": False, "line": None, "lines": 0}
        self._identity = dict(identity) if identity is not None else code_identity.current().to_dict()
        self._in_flight = 0  # evaluate calls running (from their start: task loading counts)

    def task(self, task_dir: str) -> Task:
        key = str(node_path(task_dir).resolve())  # a prepared task: this node's verified copy
        if key not in self._tasks:
            self._tasks[key] = load_task(key)
        return self._tasks[key]

    def evaluate(
        self, checkpoint_dir: str, task_dir: str, split: str, index: str = "flat", retention_dir: str | None = None,
        request: str | None = None, max_length: int = EvalConfig.max_length, dims: tuple[int, ...] = (),
    ) -> dict:
        """Scores of the checkpoint on the task's split, texts cut at `max_length` tokens (cached):
        `evaluate_checkpoint`'s dict, per-query values and evaluation cost included (a cached
        answer repeats the cost of the evaluation that computed it, with "cached" True);
        `request` names this call in `progress()` (default: the checkpoint directory); `dims`
        scores truncated widths too (`EvalConfig.dims`)."""
        with self._lock:
            self._in_flight += 1
        try:
            task = self.task(task_dir)
            key = (read_manifest(checkpoint_dir)["content_hash"], task.hash, split, index, retention_dir, max_length,
                   tuple(dims))
            cached = key in self._results
            if not cached:
                with self._lock:
                    self._status = {"request": request or checkpoint_dir, "active": True, "line": None, "lines": 0}
                try:
                    self._results[key] = evaluate_checkpoint(
                        checkpoint_dir, task, split, index=index, max_length=max_length,
                        retention_dir=None if retention_dir is None else node_path(retention_dir),
                        progress=self._record, dims=tuple(dims),
                    )
                finally:
                    with self._lock:
                        self._status = {**self._status, "active": False}
            self._telemetry().publish(task.name, self._results[key]["seconds"], cached)
            return dict(self._results[key], cached=cached)
        finally:
            with self._lock:
                self._in_flight -= 1

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

    @ray.method(concurrency_group=PROGRESS_GROUP)
    def identity(self) -> dict:
        """The code identity this actor was created with, {"version", "code_hash"}, and
        "in_flight": whether an `evaluate` call is running (answered while one is)."""
        with self._lock:
            return {**self._identity, "in_flight": self._in_flight > 0}

    def _telemetry(self):
        if self._metrics is None:
            self._metrics = EvaluationTelemetry()
        return self._metrics

    def stats(self) -> dict:
        """Tasks loaded, results cached, and the GPUs Ray assigned this actor (ids and
        CUDA_VISIBLE_DEVICES; empty when it asked for none)."""
        return {"tasks_loaded": len(self._tasks), "results_cached": len(self._results),
                "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


# This process's handle per Ray job; emptied whenever it kills an evaluator (`_kill`).
_handles: dict[str, ray.actor.ActorHandle] = {}


def evaluator_gpus(resources: dict[str, float]) -> float:
    """The GPU share the evaluator asks for on a cluster with `resources`
    (`ray.cluster_resources()`): `EVALUATOR_GPU_SHARE` where it advertises a GPU, else none."""
    return EVALUATOR_GPU_SHARE if resources.get("GPU", 0) > 0 else 0.0


def get_evaluator(num_cpus: float = 0, num_gpus: float | None = None) -> ray.actor.ActorHandle:
    """The cluster's evaluation actor, created on first use and found by name afterwards, and
    running this process's embedlab code (`embedlab.core.code_identity`).

    It is detached: it belongs to the cluster, not to the sweep that created it, so trial
    drivers that come and go and sweeps that run side by side all reach the same actor, and
    one sweep's driver exiting does not take it from another (a non-detached actor dies with
    its creator). It holds no CPU reservation: it works between trainings, and on a 2-core
    box a reserved core would starve the trainers' data pipeline. `num_gpus` defaults to
    `evaluator_gpus` of the cluster (a sweep passes its own choice: `sweep.cluster.gpu_shares`);
    requests only count when this call creates the actor, not when it finds it.

    An evaluator found with another code identity is replaced when idle (one warning line);
    when busy, `UsageError` names both versions and `embedlab evaluator stop`. A cached handle
    is used only while it is still the cluster's named evaluator.
    """
    key = ray.get_runtime_context().get_job_id()
    if key in _handles and find_evaluator() != _handles[key]:
        # Killed elsewhere (`embedlab evaluator stop`, another sweep replacing it) or replaced
        # since: the cached handle would fail every call, so the evaluator is looked up again.
        del _handles[key]
    if key not in _handles:
        gpus = evaluator_gpus(ray.cluster_resources()) if num_gpus is None else num_gpus
        handle = start_evaluator(num_cpus, gpus)
        served, running = evaluator_identity(handle), code_identity.current()
        if not code_identity.is_current(served):
            if served["in_flight"]:
                raise UsageError(
                    f"the cluster's evaluator runs {describe_identity(served)} and is evaluating for another "
                    f"sweep; this one runs {running}. Let that sweep finish, or stop the evaluator (its evaluation "
                    f"in flight fails) with: embedlab evaluator stop --address "
                    f"{ray.get_runtime_context().gcs_address}")
            _kill(handle)
            handle = start_evaluator(num_cpus, gpus)
            if not code_identity.is_current(evaluator_identity(handle)):  # another sweep's started in between
                raise UsageError(f"another sweep started an evaluator of other code while this one replaced "
                                 f"{describe_identity(served)}; run again once it has finished")
            logger.warning("evaluator: replaced %s with %s", describe_identity(served), running)
        _handles[key] = handle
    return _handles[key]


def start_evaluator(num_cpus: float = 0, num_gpus: float = 0.0,
                    identity: dict[str, str] | None = None) -> ray.actor.ActorHandle:
    """The named evaluator, created with these arguments or found as it is (then they are
    ignored), its code unchecked: `get_evaluator` is the checked entry point. `identity`
    stands in for the running code's (tests create a stale evaluator with it)."""
    return (
        ray.remote(concurrency_groups={PROGRESS_GROUP: 1})(Evaluator)
        .options(name=ACTOR_NAME, namespace=NAMESPACE, get_if_exists=True, num_cpus=num_cpus,
                 num_gpus=num_gpus, lifetime="detached")
        .remote(identity=identity)
    )


def find_evaluator() -> ray.actor.ActorHandle | None:
    """The cluster's evaluator, or None when there is none."""
    try:
        return ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def evaluator_identity(handle: ray.actor.ActorHandle, timeout_s: float = IDENTITY_TIMEOUT_S) -> dict:
    """What `Evaluator.identity()` returns. An evaluator from before code identities has no such
    method: its version is `UNKNOWN_VERSION`, and it counts as busy while its `progress()` says
    it encodes, or always if it has no `progress()` either (never kill what may be serving)."""
    try:
        return ray.get(handle.identity.remote(), timeout=timeout_s)
    except AttributeError:
        pass
    try:
        busy = bool(ray.get(handle.progress.remote(), timeout=timeout_s)["active"])
    except AttributeError:
        busy = True
    return {"version": UNKNOWN_VERSION, "code_hash": "", "in_flight": busy}


def describe_identity(served: dict) -> str:
    if served["version"] == UNKNOWN_VERSION:
        return "an embedlab from before code identities"
    return str(code_identity.CodeIdentity(version=served["version"], code_hash=served["code_hash"]))


def runs_this_code(served: dict) -> bool:
    """Whether an evaluator that reported `served` (`evaluator_identity`) runs this process's code."""
    return code_identity.is_current(served)


def evaluator_stats(handle: ray.actor.ActorHandle, timeout_s: float = IDENTITY_TIMEOUT_S) -> dict:
    """What `Evaluator.stats()` returns: tasks loaded, results cached, its GPUs."""
    return ray.get(handle.stats.remote(), timeout=timeout_s)


def stop_evaluator() -> dict | None:
    """Kill the cluster's evaluator, if there is one, and wait until its name is free: the
    identity it reported (None when there was none; {} when it did not answer in 10 s).
    An evaluation in flight on it fails."""
    handle = find_evaluator()
    if handle is None:
        _handles.clear()  # any cached one is of an evaluator gone
        return None
    try:
        served = evaluator_identity(handle, timeout_s=10.0)
    except ray.exceptions.GetTimeoutError:
        served = {}
    _kill(handle)
    return served


def _kill(handle: ray.actor.ActorHandle) -> None:
    """Kill the actor and wait until its name is free; no cached handle outlives it."""
    ray.kill(handle)
    _handles.clear()
    deadline = time.monotonic() + NAME_FREE_TIMEOUT_S
    while find_evaluator() is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the evaluator {ACTOR_NAME!r} was killed but its name is still taken after "
                               f"{NAME_FREE_TIMEOUT_S:g} s")
        time.sleep(0.1)
