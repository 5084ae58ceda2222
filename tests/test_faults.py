"""Faults: a step with a non-finite loss or gradient is rejected (no update, counted, the
schedule clock moves on) and too many in a row stop the trial with `NonFiniteError`; a Ray
Train worker killed with SIGKILL is restarted and the trial ends bitwise where an
uninterrupted one does."""

from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from embedlab.core.config import MaskingConfig, TrainConfig
from embedlab.model.encoder import MLMModel
from embedlab.objectives.masking import mask_tokens
from embedlab.train.loop import run
from embedlab.train.mlm_step import Microbatch, accumulate_gradients, optimizer_step, prepare_microbatch
from embedlab.train.nonfinite import NonFiniteError, STOPPED_KEY
from embedlab.train.optim import build_optimizer
from embedlab.train.session import LocalSession

import synthetic
from gloo import run_on_two_workers
from synthetic import MODEL, bitwise_equal, deterministic, make_loop, rows_for, train, trained_tensors


def _microbatch(seed: int) -> Microbatch:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, MODEL.vocab_size, (4, 16), generator=generator)
    masked = mask_tokens(ids, torch.ones_like(ids, dtype=torch.bool), MaskingConfig(ratio=0.3), mask_id=4,
                         random_token_range=(5, MODEL.vocab_size), generator=generator)
    return prepare_microbatch(masked, torch.ones_like(ids), device=torch.device("cpu"))


def _snapshot(model, optimizer) -> list[torch.Tensor]:
    state = optimizer.state_dict()["state"]
    return [p.detach().clone() for p in model.parameters()] + [
        v.clone() for i in sorted(state) for _, v in sorted(state[i].items())]


@pytest.mark.parametrize("poison", ["gradient", "loss"])
def test_optimizer_step_rejects_a_nonfinite_update(poison):
    """A NaN in one gradient, or an infinite loss, means no optimizer step: weights and Adam
    moments stay bitwise, gradients are dropped, and the result says `rejected`."""
    torch.manual_seed(0)
    model = MLMModel(dataclasses.replace(MODEL, dropout=0.0))
    optimizer = build_optimizer(model, TrainConfig())
    optimizer_step(model, optimizer, accumulate_gradients(model, [_microbatch(1)]), 1.0)  # Adam state exists
    before = _snapshot(model, optimizer)
    result = accumulate_gradients(model, [_microbatch(2)])
    if poison == "gradient":
        next(model.parameters()).grad[3, 5] = float("nan")
    else:
        result.sums[0] = float("inf")  # the step's loss sum, still on the device
    result = optimizer_step(model, optimizer, result, 1.0)
    assert result.rejected and not result.skipped
    assert bitwise_equal(_snapshot(model, optimizer), before)
    assert all(p.grad is None for p in model.parameters())
    clean = optimizer_step(model, optimizer, accumulate_gradients(model, [_microbatch(2)]), 1.0)
    assert not clean.rejected and not bitwise_equal(_snapshot(model, optimizer), before)


def _poison(loop) -> torch.Tensor:
    """Set one embedding column to NaN (every token's input becomes NaN); returns the clean copy."""
    weight = loop.weights()[0].embed.weight
    clean = weight.detach().clone()
    with torch.no_grad():
        weight[:, 0] = float("nan")
    return clean


def _cure(loop, clean: torch.Tensor) -> None:
    with torch.no_grad():
        loop.weights()[0].embed.weight.copy_(clean)


def _trial(kind: str, parent: Path, workers: int = 1, **train):
    return synthetic.phase1_trial(workers, **train) if kind == "mlm" else \
        synthetic.contrastive_trial(parent, workers, **train)


@pytest.mark.parametrize("kind", ["mlm", "joint"])
def test_rejected_step_changes_nothing_but_the_clock(kind, frozen, parent, tmp_path):
    """A step with a NaN weight is rejected: weights and optimizer state stay bitwise, the batch
    counts as consumed (the learning rate of the next step is the uninterrupted run's), the
    counters and the report say so, and a clean step ends the run of rejections."""
    trial = _trial(kind, parent)
    clean_reports, _ = train(trial, frozen, tmp_path / "clean")
    loop = make_loop(trial, frozen)
    loop.start_clock()
    batches = LocalSession(rows_for(trial, frozen), tmp_path / "faulty").global_batches(synthetic.ROWS)

    def step() -> None:
        loop.step([next(batches) for _ in range(loop.batches_per_step)])

    step()
    before = trained_tensors(loop)
    clean = _poison(loop)
    step()
    _cure(loop, clean)
    assert bitwise_equal(trained_tensors(loop), before)
    progress = loop.progress
    assert (progress.steps, progress.skipped, progress.nonfinite, progress.rejected_in_a_row) == (2, 1, 1, 1)
    assert progress.batches == 2 * loop.batches_per_step
    budget_key = "budget/tokens" if kind == "mlm" else "budget/pairs"
    assert loop.metrics()[budget_key] == clean_reports[1][budget_key]
    step()
    assert loop.optimizer.param_groups[0]["lr"] == clean_reports[2]["train/lr"]
    assert (progress.nonfinite, progress.rejected_in_a_row) == (1, 0)
    report = loop.metrics()
    assert report["train/skipped_steps"] == 1 and report["train/nonfinite_steps"] == 1
    assert torch.isfinite(torch.tensor(report["train/loss"]))  # the rejected loss is not averaged in


@pytest.mark.parametrize("kind", ["mlm", "joint"])
def test_consecutive_rejections_stop_the_trial(kind, frozen, parent, tmp_path):
    """With a weight poisoned for good, `max_rejected_steps` rejections in a row raise
    NonFiniteError naming the count and the step, after a last report that says so."""
    trial = _trial(kind, parent, max_rejected_steps=3)
    session = LocalSession(rows_for(trial, frozen), tmp_path)
    loop = make_loop(trial, frozen)
    _poison(loop)
    with pytest.raises(NonFiniteError, match=r"3 consecutive steps rejected .*the last at step 3"):
        run(loop, session)
    last = session.reports[-1]
    assert last[STOPPED_KEY] == 1.0 and last["train/step"] == 3
    assert last["train/nonfinite_steps"] == 3 and last["train/skipped_steps"] == 3
    assert [r["train/rejected_in_a_row"] for r in session.reports] == [1, 2, 3]


def _agree(root: str, parent: str, rank: int):
    from embedlab.tokenizer.frozen import load_tokenizer

    frozen = load_tokenizer(Path(root) / "tokenizer")
    out = {}
    for kind in ("mlm", "joint"):
        trial = _trial(kind, Path(parent), workers=2)
        loop = make_loop(trial, frozen, rank=rank, world=2)
        loop.start_clock()
        batches = LocalSession(rows_for(trial, frozen), Path(root), rank=rank, world=2).global_batches(
            2 * synthetic.ROWS)
        from embedlab.streams.packed import worker_rows

        before = trained_tensors(loop)
        clean = _poison(loop) if rank == 1 else None  # only rank 1's copy of the weights is poisoned
        loop.step([worker_rows(next(batches), rank, 2) for _ in range(loop.batches_per_step)])
        if clean is not None:
            _cure(loop, clean)
        out[kind] = (loop.progress.nonfinite, bitwise_equal(trained_tensors(loop), before))
    return out


@pytest.mark.timeout(120)
def test_two_workers_agree_to_reject(frozen, parent, tmp_path):
    """A NaN on one worker only is seen by both after the all-reduce: both reject the step and
    neither changes its weights or optimizer state."""
    shutil.copytree(frozen.path.parent, tmp_path / "tokenizer")
    results = run_on_two_workers(functools.partial(_agree, str(tmp_path), str(parent)), timeout=100)
    assert results == [{"mlm": (1, True), "joint": (1, True)}] * 2


def test_driver_raises_the_error_that_stopped_the_workers():
    """`launch.fit` turns rank 0's return value into the NonFiniteError the sweep driver catches."""
    from embedlab.train.launch import raise_if_stopped

    stopped = {"stopped": "non-finite", "rejected_in_a_row": 8, "step": 40}
    with pytest.raises(NonFiniteError, match="8 consecutive steps rejected .*at step 40") as caught:
        raise_if_stopped(SimpleNamespace(error=None, return_value=stopped))
    assert (caught.value.rejected_in_a_row, caught.value.step) == (8, 40)
    raise_if_stopped(SimpleNamespace(error=None, return_value=None))


# Real Ray: a worker killed with SIGKILL mid-trial.

@pytest.mark.timeout(400)
def test_killed_worker_restarts_and_ends_as_uninterrupted(two_worker_phase1, prepared, tmp_path):
    """Phase 1 on 2 Ray Train workers: rank 1 SIGKILLs itself after step 3; Ray Train restarts the
    worker group, which restores the step-2 checkpoint, replays step 3 with the same loss, and
    ends with the weights and optimizer state of an uninterrupted run, bitwise."""
    from safetensors.torch import load_file

    from embedlab.checkpoints.io import verify_checkpoint
    from embedlab.train.worker import RunOptions
    from embedlab.train.metrics_log import read_metrics
    from embedlab.train.phase1 import run_phase1
    from embedlab.train.session import FaultDrill

    trial, full, full_metrics = two_worker_phase1  # the uninterrupted run, the same trial
    marker = tmp_path / "drill-fired"
    killed = run_phase1(trial, prepared, storage_path=tmp_path, name="killed",
                        options=RunOptions(fault_drill=FaultDrill(rank=1, step=3, marker=str(marker))))
    assert full.error is None and killed.error is None
    assert marker.read_text().startswith("pid ")
    full_log, killed_log = (
        [{k: v for k, v in r.items() if k != "checkpoint"} for r in deterministic(read_metrics(path))]
        for path in (full_metrics, tmp_path / "killed" / "metrics.jsonl")
    )
    steps = len(full_log)
    assert steps >= 5 and [r["train/step"] for r in full_log] == list(range(1, steps + 1))
    # Attempt 1 reported steps 1-3; attempt 2 restored the step-2 checkpoint, replayed step 3
    # (with the same figures), then trained on.
    assert [r["train/step"] for r in killed_log] == [1, 2, 3, *range(3, steps + 1)]
    assert all(r == full_log[r["train/step"] - 1] for r in killed_log)
    ends = [Path(r.checkpoint.path) for r in (full, killed)]
    assert verify_checkpoint(ends[0])["content_hash"] == verify_checkpoint(ends[1])["content_hash"]
    for name in ("training_state.safetensors", "rank-0.safetensors", "rank-1.safetensors"):
        a, b = (load_file(str(end / name)) for end in ends)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_anchor_without_a_positive_stops_the_step_before_any_update(frozen, parent, monkeypatch):
    """A phase-2 step checks its valid-anchor count, read with its other figures, against its
    anchors: masks that lost a query's positive raise, saying so, and no weight changes."""
    import embedlab.train.contrastive_step as contrastive_step

    real = contrastive_step.pair_masks

    def lose_the_first_positive(*args, **kwargs):
        masks = real(*args, **kwargs)
        positive = masks.positive.clone()
        positive[0] = False
        return dataclasses.replace(masks, positive=positive)

    monkeypatch.setattr(contrastive_step, "pair_masks", lose_the_first_positive)
    loop = make_loop(synthetic.contrastive_trial(parent), frozen)
    loop.start_clock()
    before = trained_tensors(loop)
    batch = {k: torch.as_tensor(v) for k, v in synthetic.pair_rows(frozen, 4).items()}
    with pytest.raises(RuntimeError, match=r"worker 0: 2 anchors without a positive"):
        loop.step([batch])
    assert bitwise_equal(trained_tensors(loop), before)
