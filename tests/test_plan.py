"""The run planner: a real pilot on the local Ray cluster, and the estimate's arithmetic."""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import pytest

from embedlab.studies.study import load_study
from embedlab.sweep.plan import Pilot, estimate_arm, make_plan, pilot_config, run_pilot, steady_intervals
from embedlab.train.metrics_log import log_location, read_metrics

from conftest import tiny_trial, write_study


def test_steady_intervals_leave_out_the_first_interval_and_the_one_after_a_checkpoint():
    """Reports every 10 steps at 6, 11, 16, 24, 29 s (checkpoint at step 30), then step 51 at
    39.5 s: steady 0.5, 0.5, 0.5 and 0.5 s a step; after the checkpoint 0.8."""
    points = [(10, 6.0, False), (20, 11.0, False), (30, 16.0, True), (40, 24.0, False), (50, 29.0, False),
              (51, 29.5, True)]
    steady, after = steady_intervals(points)
    assert steady == pytest.approx([0.5, 0.5, 0.5, 0.5]) and after == pytest.approx([0.8])


def _study(tmp_path: Path, **train):
    path = write_study(tmp_path / "study.py", tiny_trial(**train), seeds=(0, 1),
                       extra="budget=replace(DEFAULT_BUDGET, tokens=50_000)")
    return load_study(path)


def test_pilot_config_is_the_arm_for_a_few_of_its_report_intervals(tmp_path):
    """The pilot trains the arm's own config, reporting at its own cadence, for 6 report
    intervals of full steps, with a checkpoint at the third report."""
    study = _study(tmp_path)
    config = pilot_config(study, "mask-30", None, 6)
    arm = study.trial_config("mask-30", 0, None)
    step_tokens = arm.train.num_workers * arm.train.batch_rows * arm.data.sequence_length
    assert config.train.budget.tokens == 6 * arm.train.report_every_steps * step_tokens
    assert config.train.report_every_steps == arm.train.report_every_steps
    assert config.train.checkpoint_every_steps == 3 * arm.train.report_every_steps
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
    figures are the ones its metrics log and checkpoint give. Start-up and evaluation seconds
    are single wall-clock samples of this run (the Tune fit, the actor call) that no log holds:
    how they enter the estimate is the hand-arithmetic test above, and how close a plan comes
    to a measured sweep is a figure for docs/concepts/planning.md, not a pass/fail band."""
    study = _study(tmp_path)
    pilot, checkpoint = run_pilot(study, "mask-30", prepared, parent=None, reports=4, storage=tmp_path / "pilot",
                      progress=lambda line: None)
    reports = [r for r in read_metrics(log_location(tmp_path / "pilot", "pilot-mask-30")) if "train/step" in r]
    assert pilot.steps == reports[-1]["train/step"] >= 4 * 5
    assert pilot.units_per_step == pytest.approx(reports[-1]["budget/tokens"] / pilot.steps)
    steady, after = steady_intervals([(r["train/step"], r["compute/wall_seconds"], r["checkpoint"]) for r in reports])
    assert len(steady) >= 2 and after  # the intervals the module docstring names: steady ones, one after a checkpoint
    assert pilot.step_seconds == pytest.approx(statistics.median(steady), rel=1e-12)
    # The range is the steady intervals' quartiles (inclusive method), computed here apart.
    low, _, high = statistics.quantiles(steady, n=4, method="inclusive")
    assert (pilot.step_seconds_low, pilot.step_seconds_high) == pytest.approx((low, high), rel=1e-12)
    assert pilot.checkpoint_seconds == pytest.approx(max(0.0, statistics.mean(after) - pilot.step_seconds),
                                                     rel=1e-12, abs=1e-12)
    assert pilot.peak_memory_bytes == int(reports[-1]["compute/peak_memory_bytes"])
    assert pilot.checkpoint_bytes == sum(f.stat().st_size for f in checkpoint.rglob("*") if f.is_file()) > 0
    estimate = estimate_arm(study, pilot, trials=2)
    assert estimate.steps == math.ceil(50_000 / pilot.units_per_step)
    assert (tmp_path / "pilot" / "tune-pilot-mask-30").is_dir()  # trained in a Tune trial, as a sweep does


def test_plan_refuses_a_contrastive_study_without_parent_and_too_few_steps(tmp_path, capsys):
    """`embedlab plan` on a phase-2 study without --parent, or with --pilot-reports 2, says why."""
    from embedlab.cli import main

    assert main(["plan", "ablations/pooling.py", "--profile", "demo"]) == 2
    assert "needs --parent" in capsys.readouterr().err
    path = write_study(tmp_path / "study.py", tiny_trial())
    assert main(["plan", path, "--pilot-reports", "2"]) == 2
    assert "--pilot-reports 2" in capsys.readouterr().err


def _bench_json(tmp_path: Path, tokens_per_s: float = 250_000.0) -> str:
    """What `embedlab bench mfu --json` writes, reduced to the fields the planner reads."""
    import json

    path = tmp_path / "bench-mfu.json"
    path.write_text(json.dumps({"bench": {"preset": "300m", "sequence_length": 512, "batch_rows": 64,
                                          "precision": "bf16", "steps": 20}, "device": "NVIDIA H200",
                                "tokens_per_s": tokens_per_s, "mfu": 0.45}))
    return str(path)


def test_a_plan_from_a_gpu_measurement_is_budget_tokens_over_measured_tokens_per_second(tmp_path, capsys):
    """Oracle: 10^9 tokens on 8 GPUs measured at 250,000 tokens/s each take 10^9 / (8 x 250,000)
    = 500 s for the arm at the bench's setting (300m, length 512, 64 rows a GPU, 15% masking);
    the 30% arm costs more FLOPs a step at the same FLOP/s, in proportion. The plan says it
    extrapolates from the measurement, and (without a GPU here) that no pilot ran."""
    import json

    import torch

    from embedlab.cli import main
    from embedlab.model.flops import expected_step_flops
    from embedlab import recipes

    path = write_study(tmp_path / "study.py", recipes.phase1_baseline("gpu-300m"), seeds=(0, 1),
                       extra="budget=replace(DEFAULT_BUDGET, tokens=1_000_000_000)")
    assert main(["plan", path, "--throughput", _bench_json(tmp_path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    arms = plan["arms"]
    assert arms["mask-15"]["trial_seconds"] == pytest.approx(1e9 / (8 * 250_000), rel=1e-9)
    study = load_study(path)
    costs = {arm: expected_step_flops(study.trial_config(arm, 0)) for arm in arms}
    assert arms["mask-30"]["trial_seconds"] == pytest.approx(500 * costs["mask-30"] / costs["mask-15"], rel=1e-9)
    assert plan["wall_seconds"] == pytest.approx(2 * (arms["mask-15"]["trial_seconds"]
                                                      + arms["mask-30"]["trial_seconds"]))
    assert main(["plan", path, "--throughput", _bench_json(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "not piloted: extrapolated from a GPU measurement" in text and "250,000 tokens/s" in text
    assert "rule: trial seconds = training FLOPs / (measured tokens/s" in text
    assert ("this machine has no GPU: the time is extrapolated" in text) == (not torch.cuda.is_available())


def test_plan_refuses_a_gpu_study_without_a_gpu_before_ray_or_data(monkeypatch, capsys):
    """A GPU study here without a GPU, --throughput or --address stops at once naming
    --throughput: no cluster is joined and no data prepared; --throughput for a CPU study, or a
    file that lacks a field, is refused by name."""
    import torch

    import embedlab.sweep.plan
    from embedlab.cli import main

    def fail(*args, **kwargs):
        raise AssertionError("the planner joined a cluster")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(embedlab.sweep.plan, "connect", fail)
    assert main(["plan", "ablations/masking_ratio.py", "--profile", "gpu-300m"]) == 2
    err = capsys.readouterr().err
    assert "trains on GPUs and this machine has none" in err and "--throughput FILE" in err and "demo, cpu" in err


def test_plan_throughput_errors_are_named(tmp_path, capsys):
    """--throughput on a CPU profile, or a file without tokens_per_s, says which and why."""
    import json

    from embedlab.cli import main

    assert main(["plan", "ablations/masking_ratio.py", "--profile", "demo", "--throughput",
                 _bench_json(tmp_path)]) == 2
    assert "trains on CPUs" in capsys.readouterr().err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"bench": {"preset": "300m"}, "device": "NVIDIA H200"}))
    assert main(["plan", "ablations/masking_ratio.py", "--profile", "gpu-300m", "--throughput", str(broken)]) == 2
    assert "no field 'sequence_length'" in capsys.readouterr().err


def test_a_rerun_is_planned_at_the_seeds_its_run_says_it_needs(tmp_path, capsys):
    """`plan --seeds-from RUN`: the rerun's seeds are the largest seeds-needed of the run's
    comparisons that are not significant (from the run's own paired test), the study keeps its
    seeds and adds the next ones, and the plan's trials follow; a run of another study, a tour,
    a one-seed run and a run with nothing left to size are refused in one line."""
    import json

    import numpy as np

    from embedlab.cli import main
    from embedlab.stats.paired import compare_to_control
    from embedlab.stats.rerun import rerun_size, with_seeds
    from embedlab.stats.table import load_table
    from embedlab import recipes
    from test_paired_stats import QUERIES, write_run

    rng = np.random.default_rng(3)
    difficulty = rng.uniform(0.2, 0.7, len(QUERIES))
    values = {(arm, seed): difficulty + rng.normal(0, 0.01) + effect + rng.normal(0, 0.05, len(QUERIES))
              for seed in (0, 1) for arm, effect in (("mask-15", 0.0), ("mask-30", 0.03))}
    run_dir = write_run(tmp_path, values, name="toy")
    tests = compare_to_control(run_dir, load_table(run_dir)).tests.set_index("arm")
    needed = int(tests.loc["mask-30", "seeds_needed"])
    assert not tests.loc["mask-30", "significant"] and needed > 2

    path = write_study(tmp_path / "study.py", recipes.phase1_baseline("gpu-300m"), name="toy", seeds=(0, 1),
                       extra="budget=replace(DEFAULT_BUDGET, tokens=1_000_000_000)")
    study = load_study(path)
    size = rerun_size(run_dir, study)
    assert (size.seeds, size.run_seeds, size.needed, size.significant) == (needed, 2, {"mask-30": needed}, ())
    assert with_seeds(study, 5).seeds == (0, 1, 2, 3, 4) and with_seeds(study, 1).seeds == (0,)

    assert main(["plan", path, "--throughput", _bench_json(tmp_path), "--seeds-from", str(run_dir), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["trials"] == 2 * needed and plan["rerun"]["seeds"] == needed
    assert main(["plan", path, "--throughput", _bench_json(tmp_path), "--seeds-from", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"seeds from {run_dir}: {needed} (the run had 2); seeds needed at 80% power for the "
                          f"observed differences: mask-30 {needed}\n")

    other = write_study(tmp_path / "other.py", recipes.phase1_baseline("gpu-300m"), name="other", seeds=(0, 1),
                        extra="budget=replace(DEFAULT_BUDGET, tokens=1_000_000_000)")
    one_seed = write_run(tmp_path / "one", {key: v for key, v in values.items() if key[1] == 0}, name="toy")
    clear = write_run(tmp_path / "clear", {**values, **{("mask-30", s): values[("mask-15", s)] + 0.5 for s in (0, 1)}},
                      name="toy")
    for args, message in (
            ([other, "--seeds-from", str(run_dir)], "a run of study 'toy', not of 'other'"),
            (["ablations/recipe.py", "--seeds-from", str(run_dir)], "--seeds-from sizes one study from its run"),
            ([path, "--seeds-from", str(one_seed)], "every arm ran one seed"),
            ([path, "--seeds-from", str(clear)], "every comparison is already significant (mask-30)")):
        assert main(["plan", *args, "--throughput", _bench_json(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
