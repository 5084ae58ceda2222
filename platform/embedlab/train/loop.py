"""The loop every phase runs on a session: resume, step, report, checkpoint, stop.

    resume      restore the latest checkpoint of the run, if any (weights, optimizer,
                progress counters, every RNG), then skip the global batches it had consumed
    step        the phase's optimizer step on this worker's rows of the next global batches
                (the only rows it reads: `Session.worker_batches`); rejected (no update)
                when its loss or gradient is not finite
    report      every `train.report_every_steps` steps, at every checkpoint and at the end
    checkpoint  every `train.checkpoint_every_steps` steps and at the end: the complete
                training state (`embedlab.checkpoints.state`) next to the weights
    stop        at the budget; after `stop_after_step` (a planned interruption: a later run of
                the same name resumes); or with `NonFiniteError` after too many rejections

A phase subclasses `TrainingLoop`: it builds its model, optimizer and generators, and
implements `step`, `metrics` and what its checkpoint holds.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from embedlab.checkpoints.io import load_weights, read_manifest, save_checkpoint
from embedlab.core.config import TrialConfig
from embedlab.core.timing import LOOP_TIME
from embedlab.streams.packed import DATA_ASSIGNMENT
from embedlab.train.budget import final_rows, trim_rows
from embedlab.train.compiling import compile_record
from embedlab.train.device_time import DeviceClock
from embedlab.train.nonfinite import NonFiniteError, REJECTED_UPDATE_POLICY, STOPPED_KEY
from embedlab.train.optim import optimizer_record
from embedlab.train.precision import PRECISION_POLICY, resolve_precision
from embedlab.train.session import Batch, RaySession, Session
from embedlab.train.worker import RunOptions, WorkerConfig
from embedlab.checkpoints.state import (
    RESUME_POLICY,
    RNG_STREAMS,
    TrainingState,
    capture_rng,
    config_hash,
    gather_rank_states,
    load_optimizer_state,
    read_training_state,
    restore_rng,
)


@dataclass
class Progress:
    """Counters every phase keeps: global figures, the same on every worker (but `elapsed`)."""

    steps: int = 0
    batches: int = 0  # global batches consumed: the data position
    skipped: int = 0  # steps without an update (no masked token, or rejected)
    nonfinite: int = 0  # steps rejected for a non-finite loss or gradient
    rejected_in_a_row: int = 0
    elapsed: float = 0.0  # wall seconds of the attempts before this one
    stream_start: float = 0.0  # wall seconds until each attempt's first batches arrived
    data_wait: float = 0.0  # wall seconds spent waiting for batches after those, all attempts
    device_seconds: float = 0.0  # device time of the steps, summed over workers (`device_time`)
    checkpointing: float = 0.0  # wall seconds writing checkpoints and reporting them, all attempts
    last_step_cost: float = 0.0  # budget units the last step consumed (the final step is cut to fit)


class TrainingLoop:
    """A phase's model, optimizer, generators and counters; see the module docstring."""

    trial: TrialConfig
    worker: WorkerConfig
    rank: int
    world: int
    device: torch.device
    optimizer: torch.optim.Optimizer
    masking_rng: torch.Generator
    progress: Progress
    batches_per_step: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    device_clock: DeviceClock | None = None

    def clock(self) -> tuple[float, float]:
        """(consumed, budget) in the trial's budget unit, global."""
        raise NotImplementedError

    def step(self, batches: list[Batch]) -> None:
        """One optimizer step (or a rejected one) on this worker's rows of `batches`."""
        raise NotImplementedError

    def metrics(self) -> dict[str, Any]:
        """The report since the last one (a collective: every rank calls it)."""
        raise NotImplementedError

    def done(self) -> bool:
        raise NotImplementedError

    def stream_ended(self) -> Exception:
        raise NotImplementedError

    def checkpoint_contents(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """`save_checkpoint` keyword arguments: encoder, head, tokenizer, fields, pooling, prefixes."""
        raise NotImplementedError

    def weights(self) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        """(encoder, head or None): the modules the checkpoint's weight files hold."""
        raise NotImplementedError

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        """Trained tensors outside the weight files."""
        return {}

    def load_extra(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    # Shared by every phase.

    def start_clock(self) -> None:
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return self.progress.elapsed + time.perf_counter() - self.started

    def fit_to_budget(self, batches: list[Batch], remaining: float) -> list[Batch]:
        """This worker's rows of the next step, cut when the budget has less `remaining` than
        the last step consumed: to that share of each microbatch's rows (`final_rows`), so a
        trial overshoots its budget by about a row per worker and microbatch."""
        last = self.progress.last_step_cost
        return [trim_rows(part, final_rows(remaining, last, _row_count(part))) for part in batches]

    def sync_device_time(self) -> float:
        """Add every worker's device time since the last sync to `progress.device_seconds`
        (a collective: every rank calls it at the same steps); returns the new total."""
        local = self.device_clock.take() if self.device_clock is not None else 0.0
        total = self.all_reduce(torch.tensor([local], dtype=torch.float64))
        self.progress.device_seconds += float(total[0])
        return self.progress.device_seconds

    def peak_memory_bytes(self) -> int:
        """This worker's peak memory so far: allocated CUDA memory on a GPU, else the process's
        peak resident set (which includes the interpreter and libraries, not only tensors)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB

    def count_rejection(self, rejected: bool) -> None:
        """Count a rejected step; raise once `train.max_rejected_steps` are rejected in a row."""
        progress = self.progress
        if not rejected:
            progress.rejected_in_a_row = 0
            return
        progress.skipped += 1
        progress.nonfinite += 1
        progress.rejected_in_a_row += 1
        if progress.rejected_in_a_row >= self.trial.train.max_rejected_steps:
            raise NonFiniteError(progress.rejected_in_a_row, progress.steps)

    def run_fields(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Manifest fields every phase records alike: the resolved config, seed, data revision,
        precision, distributed setup, reliability policies and the budget consumed."""
        import torch.distributed as dist

        train = self.trial.train
        return {
            "config": self.trial.to_dict(),
            "seed": train.seed,
            "data_revision": self.worker.data_revision,
            "precision": {"policy": resolve_precision(train), "means": PRECISION_POLICY[resolve_precision(train)]},
            "compile": compile_record(train, self.trial.model),
            "optimizer": {
                **optimizer_record(self.optimizer),
                "schedule": {**asdict(train.schedule), "peak_learning_rate": train.learning_rate,
                             "clock": "consumed budget units (tokens, pairs or FLOPs), not steps"},
                "clipping": {"max_grad_norm": train.max_grad_norm, "reported": "train/grad_norm, before clipping"},
                "accumulation": {"microbatches": train.microbatches,
                                 "reduction": "loss sums over microbatches and workers / global counts"},
            },
            "rng_streams": RNG_STREAMS,
            "distributed": {"workers": self.world, "backend": dist.get_backend() if self.world > 1 else "none"},
            "reliability": {
                "rejected_update": REJECTED_UPDATE_POLICY,
                "max_rejected_steps": train.max_rejected_steps,
                "resume": RESUME_POLICY,
                "checkpoint_every_steps": train.checkpoint_every_steps,
                "max_failures": train.max_failures,
                "data_assignment": DATA_ASSIGNMENT,
            },
            "budget": {k: v for k, v in metrics.items() if k.startswith(("budget/", "compute/"))},
        }

    def save(self, directory: Path, metrics: dict[str, Any], *, final: bool) -> Path | None:
        """Write a checkpoint with the complete training state on rank 0 (every rank calls it:
        the RNG states are gathered); returns the directory on rank 0, None elsewhere."""
        ranks = gather_rank_states(capture_rng(self.masking_rng, self.device), self.world, self.device)
        if self.rank != 0:
            return None
        state = TrainingState(
            step=self.progress.steps,
            progress={**asdict(self.progress), "elapsed": self.elapsed()},
            optimizer=self.optimizer,
            ranks=ranks,
            config_hash=config_hash(self.trial.to_json()),
            extra=self.extra_tensors(),
            final=final,
        )
        save_checkpoint(directory, **self.checkpoint_contents(metrics), training_state=state)
        return directory

    def restore(self, directory: Path) -> None:
        """Continue from a checkpoint of this trial: weights in place, optimizer, counters, RNG."""
        manifest = read_manifest(directory)
        loaded = read_training_state(directory, manifest, rank=self.rank, world=self.world,
                                     expected_config_hash=config_hash(self.trial.to_json()))
        load_weights(directory, *self.weights())
        self.load_extra(loaded.extra)
        load_optimizer_state(self.optimizer, loaded.optimizer_tensors, loaded.optimizer_record)
        self.progress = type(self.progress)(**loaded.progress)
        restore_rng(loaded.rank, self.masking_rng, self.device)


def run(loop: TrainingLoop, session: Session, options: RunOptions = RunOptions()) -> None:
    """Train `loop` to its budget (or `options.stop_after_step`) on `session`."""
    with session.resume_point() as directory:
        if directory is not None:
            loop.restore(directory)
    stop_after = options.stop_after_step
    if loop.done() or (stop_after is not None and loop.progress.steps >= stop_after):
        return  # resumed from a checkpoint that already ends this run
    loop.start_clock()
    loop.device_clock = DeviceClock(loop.device, loop.trial.train.torch_threads)
    per_step_time = loop.trial.train.budget.unit(loop.trial.phase) == "device_seconds"
    batches = session.worker_batches(loop.trial.train.batch_rows)
    for _ in range(loop.progress.batches):  # this worker's share of each consumed global batch
        if next(batches, None) is None:
            raise RuntimeError(f"the data stream is shorter than the checkpoint's position "
                               f"({loop.progress.batches} global batches)")
    train = loop.trial.train
    first = True
    while True:
        waited = time.perf_counter()
        group = list(itertools.islice(batches, loop.batches_per_step))
        waited = time.perf_counter() - waited
        if first:
            loop.progress.stream_start += waited
            first = False
        else:
            loop.progress.data_wait += waited
        if len(group) < loop.batches_per_step:
            raise loop.stream_ended()
        before, budget = loop.clock()
        rows = loop.fit_to_budget(group, budget - before)
        try:
            loop.device_clock.start()
            loop.step(rows)
            loop.device_clock.stop()
        except NonFiniteError:
            loop.device_clock.stop()
            _report(loop, session, checkpoint=False, final=False, stopped=True)
            raise
        if per_step_time:  # the budget clock itself: every worker needs the global figure now
            loop.sync_device_time()
        loop.progress.last_step_cost = loop.clock()[0] - before
        step, done = loop.progress.steps, loop.done()
        stop = done or (stop_after is not None and step >= stop_after)
        checkpoint = stop or (train.checkpoint_every_steps > 0 and step % train.checkpoint_every_steps == 0)
        if checkpoint or step % train.report_every_steps == 0:
            _report(loop, session, checkpoint=checkpoint, final=done)
        if stop:
            return
        if options.fault_drill is not None:
            options.fault_drill.fire_if_due(session, step)


def _row_count(batch: dict[str, torch.Tensor]) -> int:
    return next(iter(batch.values())).shape[0]


def _report(loop: TrainingLoop, session: Session, *, checkpoint: bool, final: bool, stopped: bool = False) -> None:
    loop.sync_device_time()
    metrics = loop.metrics()
    # Waiting for batches once the stream runs, as a share of this worker's time: Ray Data
    # prefetches a batch ahead, so near 0 means training never waits for data.
    progress = loop.progress
    metrics["compute/stream_start_seconds"] = progress.stream_start
    metrics["compute/data_wait_seconds"] = progress.data_wait
    metrics["compute/data_wait_fraction"] = progress.data_wait / max(loop.elapsed() - progress.stream_start, 1e-9)
    metrics["compute/peak_memory_bytes"] = loop.peak_memory_bytes()  # rank 0's is the one logged
    metrics["compute/wall_seconds"] = loop.elapsed()
    # Device time of the steps summed over workers; never wall time x workers.
    metrics["compute/device_seconds"] = progress.device_seconds
    metrics["compute/device_clock"] = loop.device_clock.name if loop.device_clock is not None else "none"
    if stopped:
        metrics[STOPPED_KEY] = 1.0
    if not checkpoint:
        session.report(metrics, None)
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        session.report(metrics, loop.save(Path(directory) / "checkpoint", metrics, final=final))
    progress.checkpointing += time.perf_counter() - started


def loop_seconds(loop: TrainingLoop) -> dict[str, float]:
    """This worker's loop time by stage (`embedlab.core.timing`), every attempt's (those a
    checkpoint carries from before a restart), its last checkpoint included: the wall seconds
    of the loop, those it waited for batches (the stream's first ones included), those it wrote
    checkpoints, and the rest, its steps and reports, as training. Zero for a run that resumed
    already done: its loop never ran here."""
    if not hasattr(loop, "started"):
        return {"wall": 0.0, "data_wait": 0.0, "checkpointing": 0.0, "training": 0.0}
    progress = loop.progress
    wall = loop.elapsed()
    waited = progress.stream_start + progress.data_wait
    return {"wall": wall, "data_wait": waited, "checkpointing": progress.checkpointing,
            "training": max(wall - waited - progress.checkpointing, 0.0)}


def run_on_ray(make_loop: Callable[..., TrainingLoop], loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """The body of a `train_loop_per_worker`: build the phase's loop and run it on Ray Train.

    Returns rank 0's loop time by stage (`loop_seconds`: `Result.return_value` on the driver,
    `LOOP_TIME`). A `NonFiniteError` ends the worker normally, returning also what
    `launch.fit` needs to raise it on the driver: Ray Train restarts a failed worker group, and
    a restart would only repeat the same rejections.
    """
    session = RaySession()
    worker = WorkerConfig.from_dict(loop_config)  # Ray Train's mapping of `WorkerConfig.to_dict()`
    loop = make_loop(worker, rank=session.rank, world=session.world, device=session.device)
    try:
        run(loop, session, worker.run)
    except NonFiniteError as error:
        return {"stopped": "non-finite", "rejected_in_a_row": error.rejected_in_a_row, "step": error.step,
                LOOP_TIME: loop_seconds(loop)}
    return {LOOP_TIME: loop_seconds(loop)}
