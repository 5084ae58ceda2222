"""The run planner: a real pilot on the local Ray cluster, and the estimate's arithmetic."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import pytest

from embedlab.sweep.plan import Pilot, estimate_arm, make_plan, pilot_config, run_pilot, steady_intervals
from embedlab.sweep.study import load_study
from embedlab.train.metrics_log import log_location, read_metrics

from conftest import tiny_trial, write_study


def test_steady_intervals_leave_out_the_first_step_and_steps_after_checkpoints():
    """Walls 2.0, 2.5, 3.0, 3.8, 4.3 with a checkpoint at step 3: steady 0.5, 0.5, 0.5; after 0.8."""
    steady, after = steady_intervals([2.0, 2.5, 3.0, 3.8, 4.3], {3})
    assert steady == pytest.approx([0.5, 0.5, 0.5]) and after == pytest.approx([0.8])


def _study(tmp_path: Path, **train):
    path = write_study(tmp_path / "study.py", tiny_trial(**train), seeds=(0, 1), extra="budget_tokens=50_000")
    return load_study(path)


def test_pilot_config_is_the_arm_with_a_budget_of_a_few_steps(tmp_path):
    """The pilot trains the arm's own config with a budget of `steps` full steps, a report every step."""
    study = _study(tmp_path)
    config = pilot_config(study, "mask-30", None, 6)
    arm = study.trial_config("mask-30", 0, None)
    step_tokens = arm.train.num_workers * arm.train.batch_rows * arm.data.sequence_length
    assert config.train.budget_tokens == 6 * step_tokens
    assert config.train.report_every_steps == 1 and config.train.checkpoint_every_steps == 2
    assert dataclasses.replace(config, train=arm.train) == arm


def test_estimate_is_startup_plus_steps_plus_checkpoints_plus_evaluation(tmp_path):
    """Hand arithmetic: 50,000 tokens at 1,000 a step is 50 steps; checkpoints every 20 steps
    give 2 intermediate ones; the study's wall time adds set-up and divides by concurrency."""
    study = _study(tmp_path, checkpoint_every_steps=20)
    pilot = Pilot(arm="mask-15", steps=8, units_per_step=1000.0, step_seconds=0.5, step_seconds_low=0.4,
                  step_seconds_high=0.7, checkpoint_seconds=2.0, startup_seconds=30.0, eval_seconds=10.0,
                  peak_memory_bytes=2**30, checkpoint_bytes=5 * 2**20)
    estimate = estimate_arm(study, pilot, trials=2)
    assert (estimate.steps, estimate.checkpoints) == (50, 2)
    assert estimate.trial_seconds == pytest.approx(30 + 50 * 0.5 + 2 * 2.0 + 10)
    assert estimate.trial_seconds_high == pytest.approx(30 + 50 * 0.7 + 2 * 2.0 + 10)
    plan = make_plan(study, {"mask-15": pilot, "mask-30": dataclasses.replace(pilot, arm="mask-30")},
                     concurrency=2, checkpoints_kept=2, setup_seconds=12.0)
    assert plan["trials"] == 4
    assert plan["wall_seconds"] == pytest.approx(12 + 4 * estimate.trial_seconds / 2)
    assert plan["storage_bytes"] == 4 * 2 * 5 * 2**20


def test_a_real_pilot_measures_the_arm_on_the_cluster(ray_session, prepared, tmp_path):
    """A pilot trains the arm through TorchTrainer and the evaluation actor scores it; its
    figures are the ones its metrics log and checkpoint give."""
    study = _study(tmp_path)
    pilot, checkpoint = run_pilot(study, "mask-30", prepared, parent=None, steps=6, storage=tmp_path / "pilot",
                      progress=lambda line: None)
    reports = [r for r in read_metrics(log_location(tmp_path / "pilot", "pilot-mask-30")) if "train/step" in r]
    assert pilot.steps == reports[-1]["train/step"] >= 6
    assert pilot.units_per_step == pytest.approx(reports[-1]["budget/tokens"] / pilot.steps)
    steady, _ = steady_intervals([r["compute/wall_seconds"] for r in reports],
                                 {r["train/step"] for r in reports if r["checkpoint"]})
    assert pilot.step_seconds == pytest.approx(statistics.median(steady))
    assert pilot.step_seconds_low <= pilot.step_seconds <= pilot.step_seconds_high
    assert pilot.startup_seconds > 1.0 and pilot.eval_seconds > 0  # a TorchTrainer never starts in a second
    assert pilot.peak_memory_bytes > 50 * 2**20 and pilot.checkpoint_bytes == sum(
        f.stat().st_size for f in checkpoint.rglob("*") if f.is_file()) > 0
    estimate = estimate_arm(study, pilot, trials=2)
    assert estimate.steps == math.ceil(50_000 / pilot.units_per_step)


def test_plan_refuses_a_contrastive_study_without_parent_and_too_few_steps(tmp_path, capsys):
    """`embedlab plan` on a phase-2 study without --parent, or with --pilot-steps 2, says why."""
    from embedlab.cli import main

    assert main(["plan", "ablations/pooling.py", "--profile", "demo"]) == 2
    assert "needs --parent" in capsys.readouterr().err
    path = write_study(tmp_path / "study.py", tiny_trial())
    assert main(["plan", path, "--pilot-steps", "2"]) == 2
    assert "--pilot-steps 2" in capsys.readouterr().err
