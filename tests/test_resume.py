"""Exact resume within a phase: N steps uninterrupted equal N/2 steps + restore + N/2 steps,
bitwise, in every reported loss and in every weight and optimizer tensor; complete training
state in checkpoints, verified on load and written atomically."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import pytest
import torch

from embedlab.checkpoints.io import CheckpointError, load_encoder, verify_checkpoint
from embedlab.train.loop import loop_seconds

import synthetic
from gloo import run_on_two_workers
from synthetic import STEPS, bitwise_equal, deterministic, train, trained_tensors

HALF = STEPS // 2 + 1  # not a multiple of the cadence (3): the stop writes its own checkpoint


def trial_for(kind: str, parent: Path, workers: int = 1):
    if kind == "mlm":
        return synthetic.phase1_trial(workers)
    if kind == "dual-heads":
        return synthetic.phase1_trial(workers, dual_heads=True)
    return synthetic.contrastive_trial(parent, workers, gradcache=kind == "gradcache")


def full_and_resumed(trial, frozen, root: Path, rank: int = 0, world: int = 1):
    """(reports, tensors) of an uninterrupted run and of the same run stopped at HALF and resumed."""
    full, loop = train(trial, frozen, root / "full", rank=rank, world=world)
    first, _ = train(trial, frozen, root / "split", rank=rank, world=world, stop_after_step=HALF)
    second, resumed = train(trial, frozen, root / "split", rank=rank, world=world)
    return (deterministic(full), trained_tensors(loop)), (deterministic(first + second), trained_tensors(resumed))


@pytest.mark.parametrize("kind", ["mlm", "dual-heads", "joint", "gradcache"])
def test_resume_is_bitwise_exact(kind, frozen, parent, tmp_path):
    """One worker, dropout on: phase 1 (2 microbatches; dual heads, whole-word) and phase 2 (joint
    MLM + symmetric contrastive with a learnable temperature; GradCache) resume bitwise exactly."""
    (full, weights), (resumed, resumed_weights) = full_and_resumed(trial_for(kind, parent), frozen, tmp_path)
    assert [r["train/step"] for r in full] == list(range(1, STEPS + 1))
    assert len({r["train/loss"] for r in full}) == STEPS  # the loss moves: the comparison means something
    assert resumed == full  # every loss, learning rate, gradient norm, share and budget figure
    assert bitwise_equal(resumed_weights, weights)


def _two_worker_runs(root: str, parent: str, rank: int):
    from embedlab.tokenizer.frozen import load_tokenizer

    frozen = load_tokenizer(Path(root) / "tokenizer")
    out = {}
    for kind in ("mlm", "joint"):
        trial = trial_for(kind, Path(parent), workers=2)
        (full, weights), (resumed, resumed_weights) = full_and_resumed(
            trial, frozen, Path(root) / kind, rank=rank, world=2)
        out[kind] = (full, resumed, bitwise_equal(resumed_weights, weights), [w.numpy() for w in weights])
    return out


@pytest.mark.timeout(200)
def test_two_gloo_workers_resume_bitwise_exact(frozen, parent, tmp_path):
    """Two gloo workers (per-rank masking and dropout RNG gathered into one checkpoint, rows r::2):
    phase 1 and the joint phase 2 resume bitwise exactly, and both ranks end with identical weights."""
    shutil.copytree(frozen.path.parent, tmp_path / "tokenizer")
    rank0, rank1 = run_on_two_workers(functools.partial(_two_worker_runs, str(tmp_path), str(parent)), timeout=180)
    for kind in ("mlm", "joint"):
        full, resumed, same_weights, weights = rank0[kind]
        assert len(full) == STEPS and resumed == full and same_weights
        full1, resumed1, same_weights1, weights1 = rank1[kind]
        assert resumed1 == full1 and same_weights1
        global_figures = ["train/loss"] + (["train/grad_norm_contrastive", "train/grad_norm_mlm"] if kind == "joint" else [])
        for key in global_figures:
            assert [r[key] for r in full1] == [r[key] for r in full], key
        assert all((a == b).all() for a, b in zip(weights, weights1))


def test_checkpoint_holds_training_state_and_stays_a_checkpoint(frozen, tmp_path):
    """A training checkpoint records its state files, hashes and policies, and still loads and
    exports as the evaluation and release readers expect."""
    from embedlab.release.export import export_release

    reports, _ = train(synthetic.phase1_trial(), frozen, tmp_path / "run")
    final = sorted((tmp_path / "run").glob("checkpoint_*"))[-1]
    manifest = verify_checkpoint(final)
    state = manifest["training_state"]
    assert state["step"] == STEPS and state["world"] == 1 and state["final"]
    assert set(state["files"]) == {"training_state.safetensors", "training_state.json", "rank-0.safetensors",
                                   "rank-0.json"}
    assert set(manifest["files"]) == {"encoder.safetensors", "mlm_head.safetensors"}
    reliability = manifest["reliability"]
    assert reliability["resume"].startswith("exact within phase")
    assert reliability["checkpoint_every_steps"] == 3 and reliability["max_rejected_steps"] == 8
    assert "schedule clock" in reliability["rejected_update"]
    record = json.loads((final / "training_state.json").read_text())
    assert record["progress"]["batches"] == 2 * STEPS and record["progress"]["tokens"] == reports[-1]["budget/tokens"]
    load_encoder(final)
    released = export_release(final, tmp_path / "release")
    assert "training_state" not in released and not (tmp_path / "release" / "training_state.json").exists()
    load_encoder(tmp_path / "release")


@pytest.mark.parametrize("name, damage", [
    ("training_state.safetensors", "truncate"),
    ("rank-0.safetensors", "flip"),
    ("rank-0.json", "flip"),
    ("training_state.json", "delete"),
])
def test_damaged_state_file_is_a_checkpoint_error_naming_it(name, damage, frozen, tmp_path):
    """A truncated, altered or missing training-state file stops a resume with a CheckpointError
    that names the file."""
    trial = synthetic.phase1_trial()
    train(trial, frozen, tmp_path, stop_after_step=2)
    (checkpoint,) = sorted(tmp_path.glob("checkpoint_*"))
    path = checkpoint / name
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-2] + bytes([data[-2] ^ 1]) + data[-1:])
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match=str(path)):
        train(trial, frozen, tmp_path)


def test_a_finished_run_resumed_again_trains_no_further(frozen, tmp_path):
    """Running a finished run again (same root, as the same Ray run name) restores its final
    checkpoint and stops there: no step past the budget, no new checkpoint."""
    trial = synthetic.phase1_trial()
    _, finished = train(trial, frozen, tmp_path)
    checkpoints = sorted(tmp_path.glob("checkpoint_*"))
    reports, again = train(trial, frozen, tmp_path)
    assert reports == [] and sorted(tmp_path.glob("checkpoint_*")) == checkpoints
    assert again.progress.steps == STEPS and bitwise_equal(trained_tensors(again), trained_tensors(finished))
    # Its loop never ran: none of the restored run's time is this run's (`embedlab.core.timing`).
    assert again.progress.elapsed > 0 and loop_seconds(again) == {"wall": 0.0, "data_wait": 0.0,
                                                                   "checkpointing": 0.0, "training": 0.0}


def test_resume_refuses_another_config_or_worker_count(frozen, tmp_path):
    """Exact resume is within one trial: a changed config or worker count is refused, by name."""
    trial = synthetic.phase1_trial()
    train(trial, frozen, tmp_path, stop_after_step=2)
    changed = dataclasses.replace(trial, train=dataclasses.replace(trial.train, learning_rate=1e-3))
    with pytest.raises(CheckpointError, match="different trial config"):
        train(changed, frozen, tmp_path)
    with pytest.raises(CheckpointError, match="saved by 1 workers, resumed by 2"):
        synthetic.make_loop(trial, frozen, world=2).restore(sorted(tmp_path.glob("checkpoint_*"))[-1])


def test_interrupted_checkpoint_write_leaves_nothing(frozen, tmp_path, monkeypatch):
    """A checkpoint write that fails half-way leaves neither the checkpoint nor its staging directory."""
    import embedlab.checkpoints.io as checkpoint

    def fail_after_weights(directory, training_state):
        assert (directory / "encoder.safetensors").is_file()  # the weights were already written
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "write_training_state", fail_after_weights)
    loop = synthetic.make_loop(synthetic.phase1_trial(), frozen)
    loop.start_clock()
    with pytest.raises(OSError, match="disk full"):
        loop.save(tmp_path / "checkpoint", {}, final=False)
    assert list(tmp_path.iterdir()) == []


def test_worker_rows_interleave_the_global_batch():
    """Rank r of W takes rows r, r + W, ...: the ranks partition the global batch, in a fixed way."""
    from embedlab.streams.packed import worker_rows

    batch = {"input_ids": torch.arange(12).reshape(6, 2)}
    parts = [worker_rows(batch, rank, 3)["input_ids"][:, 0].tolist() for rank in range(3)]
    assert parts == [[0, 6], [2, 8], [4, 10]]


# Real Ray: a phase-2 run resumed by name (same RunConfig name and storage path) through
# `ray.train.get_checkpoint()`, with 2 workers reading the real pair stream.

@pytest.mark.timeout(300)
def test_contrastive_resume_on_ray_by_run_name(ray_session, prepared, tmp_path):
    """On Ray Train with 2 workers, a joint phase-2 run stopped after step 2 and run again under
    the same name reports the losses of an uninterrupted run at every step and ends with its
    weights and optimizer state, bitwise."""
    from safetensors.torch import load_file

    from embedlab.core.config import ContrastiveConfig
    from embedlab.train.contrastive import run_contrastive
    from embedlab.train.worker import RunOptions
    from embedlab.train.metrics_log import read_metrics

    from conftest import tiny_budget, tiny_trial

    parent = _tiny_parent(tmp_path / "parent", prepared)
    trial = dataclasses.replace(
        tiny_trial(num_workers=2, budget=tiny_budget(pairs=80), report_every_steps=1, checkpoint_every_steps=3),
        phase=2, parent=str(parent),
        contrastive=ContrastiveConfig(pairs=(("title-body", 0.6), ("same-source-spans", 0.4)), pair_length=48,
                                      mlm_weight=0.3, symmetric=True, learnable_temperature=True),
    )
    quiet = dict(storage_path=tmp_path / "runs", progress=lambda message: None)
    full = run_contrastive(trial, prepared, name="full", **quiet)
    stopped = run_contrastive(trial, prepared, name="split", options=RunOptions(stop_after_step=2), **quiet)
    resumed = run_contrastive(trial, prepared, name="split", **quiet)
    assert full.error is None and stopped.error is None and resumed.error is None
    assert stopped.metrics["train/step"] == 2 and resumed.metrics["train/step"] == full.metrics["train/step"] == 5
    full_log = deterministic(read_metrics(tmp_path / "runs" / "full" / "metrics.jsonl"))
    split_log = deterministic(read_metrics(tmp_path / "runs" / "split" / "metrics.jsonl"))
    assert [r["train/step"] for r in split_log] == [1, 2, 3, 4, 5]
    assert [{k: v for k, v in r.items() if k != "checkpoint"} for r in split_log] == [
        {k: v for k, v in r.items() if k != "checkpoint"} for r in full_log]
    ends = [Path(r.checkpoint.path) for r in (full, resumed)]
    assert verify_checkpoint(ends[0])["content_hash"] == verify_checkpoint(ends[1])["content_hash"]
    for name in ("training_state.safetensors", "rank-0.safetensors", "rank-1.safetensors"):
        a, b = (load_file(str(end / name)) for end in ends)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _tiny_parent(directory: Path, prepared) -> Path:
    """A random phase-1 checkpoint of the tiny test model, with the prepared data's tokenizer."""
    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.model.encoder import MLMModel

    from conftest import tiny_trial

    torch.manual_seed(3)
    model = MLMModel(tiny_trial().model)
    save_checkpoint(directory, model.encoder, head=model.mlm_head, tokenizer=prepared.tokenizer, fields={"phase": 1})
    return directory
