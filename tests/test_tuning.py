"""Tuning: the sampler a budget can support, Optuna told the truth about failed trials, and the
choice made among finished trials only (a real sweep whose tuning trials partly fail is part of
test_object_storage's study on S3)."""

from __future__ import annotations

import math

import optuna
import pytest

from embedlab import Search
from embedlab.sweep.optuna_search import TPE_MIN_TRIALS, FinalResultOptuna, SamplerChoice, SearchSpace
from embedlab.sweep.tuning import TuningError, best_tuning_row, split_tuning_rows

METRIC = "dev/ndcg@10"


def test_the_sampler_fits_the_trial_count():
    """Below TPE_MIN_TRIALS the search is random and says so; from there TPE with a third of
    the budget (at least 2) as random startup, never Optuna's default of 10."""
    small = SamplerChoice.for_trials(4, 10_000)
    assert isinstance(small.build(), optuna.samplers.RandomSampler)
    assert small.description == "RandomSampler(seed=10000), random search (TPE needs at least 6 trials per arm)"
    for trials, startup in ((TPE_MIN_TRIALS, 2), (9, 3), (30, 10)):
        choice = SamplerChoice.for_trials(trials, 10_000)
        sampler = choice.build()
        assert isinstance(sampler, optuna.samplers.TPESampler) and sampler._n_startup_trials == startup
        assert choice.description.startswith(f"TPESampler(n_startup_trials={startup}, seed=10000)")
    with pytest.raises(ValueError, match="tuning trials: 0"):
        SamplerChoice.for_trials(0, 10_000)


def test_a_resumed_search_does_not_replay_the_first_draws():
    """Seeded alike, a fresh sampler draws the same points; one told that trials already ran
    draws others (a resumed run would otherwise retry its first values)."""
    def draws(done: int) -> list[float]:
        study = optuna.create_study(sampler=SamplerChoice.for_trials(4, 10_000).build(done=done), direction="maximize")
        return [study.ask().suggest_float("x", 0.0, 1.0) for _ in range(3)]

    assert draws(0) == draws(0) and draws(0) != draws(2)


def test_optuna_is_told_a_failed_trial_failed():
    """A trial that errored, reported NaN or ended without the metric is a FAIL in Optuna's
    storage (stock OptunaSearch would call the last PRUNED and hand NaN over as a value); a
    finite result is COMPLETE. Trial k runs at tuning seed k."""
    seeds = (10_000, 10_001, 10_002, 10_003)
    searcher = FinalResultOptuna(space=SearchSpace((Search("train.learning_rate", low=1e-4, high=1e-2, log=True),),
                                                   "a", seeds),
                                 metric=METRIC, mode="max", sampler=SamplerChoice.for_trials(4, 10_000).build())
    configs = [searcher.suggest(f"t{k}") for k in range(4)]
    assert [c["seed"] for c in configs] == list(seeds) and {c["stage"] for c in configs} == {"tune"}
    searcher.on_trial_result("t0", {METRIC: math.nan, "training_iteration": 1})  # not reported as a value
    searcher.on_trial_complete("t0", {METRIC: math.nan})
    searcher.on_trial_complete("t1", None, error=True)
    searcher.on_trial_complete("t2", {"train/loss": 3.0})
    searcher.on_trial_complete("t3", {METRIC: 0.25})
    trials = searcher._ot_study.get_trials(deepcopy=False)
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "FAIL", "COMPLETE"]
    assert trials[0].intermediate_values == {} and searcher._ot_study.best_value == 0.25


def test_the_choice_excludes_failed_and_nonfinite_trials():
    """Only finished rows with a finite metric are chosen from; every other row is a failure
    with its status and error; an arm with none left is a TuningError naming it and each failure."""
    rows = [
        {"trial_id": "t1", "status": "finished", METRIC: 0.30, "param/train.learning_rate": 1e-3},
        {"trial_id": "t2", "status": "nonfinite", "error": "8 consecutive steps rejected"},
        {"trial_id": "t3", "status": "failed", "error": "Traceback ...\nValueError: query 'q1': NaN score"},
        {"trial_id": "t4", "status": "finished", METRIC: math.nan},
        {"trial_id": "t5", "status": "finished", METRIC: 0.20, "param/train.learning_rate": 3e-3},
    ]
    usable, failures = split_tuning_rows(rows, METRIC)
    assert [r["trial_id"] for r in usable] == ["t1", "t5"]
    assert failures == [
        {"trial_id": "t2", "status": "nonfinite", "error": "8 consecutive steps rejected"},
        {"trial_id": "t3", "status": "failed", "error": "Traceback ...\nValueError: query 'q1': NaN score"},
        {"trial_id": "t4", "status": "finished", "error": f"{METRIC} is nan"},
    ]
    assert best_tuning_row("mask-15", rows, METRIC)["trial_id"] == "t1"
    with pytest.raises(TuningError, match=r"arm mask-15: none of its 3 tuning trial\(s\).*"
                                          r"trial t2 nonfinite: 8 consecutive.*trial t3 failed: ValueError: query"):
        best_tuning_row("mask-15", rows[1:4], METRIC)
