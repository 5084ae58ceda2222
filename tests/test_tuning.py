"""Tuning: the sampler a budget can support, Optuna told the truth about failed trials, the
choice made among finished trials only, and a real sweep whose tuning trials partly fail."""

from __future__ import annotations

import json
import math

import optuna
import pytest

from embedlab import Search, load_table
from embedlab.cli import main
from embedlab.sweep.optuna_search import TPE_MIN_TRIALS, FinalResultOptuna, SamplerChoice, SearchSpace
from embedlab.sweep.tuning import TuningError, best_tuning_row, split_tuning_rows
from embedlab.sweep.study import TUNING_SEED_OFFSET
from embedlab.sweep.table import render

from conftest import tiny_trial, write_study

METRIC = "dev/ndcg@10"
DIVERGING = 1e30  # a learning rate whose second step overflows fp32: a non-finite loss


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


@pytest.mark.timeout(400)
def test_a_sweep_whose_tuning_trial_diverges_lists_it_and_tunes_on(ray_session, prepared, tmp_path, capsys):
    """Each arm's two tuning trials draw a good and a diverging learning rate (checked first
    against the study's own sampler): the diverging one leaves a nonfinite row, Optuna records
    it FAIL, study.json and the console list it, the choice takes the finished one, the final
    trials run at the study seed with it, and the table still loads and renders, listing it."""
    choices = (1e-3, 3e-3, DIVERGING)
    probe = optuna.create_study(sampler=SamplerChoice.for_trials(2, TUNING_SEED_OFFSET).build(), direction="maximize")
    drawn = [probe.ask().suggest_categorical("train.learning_rate", list(choices)) for _ in range(2)]
    assert DIVERGING in drawn and set(drawn) - {DIVERGING}, f"the sampler now draws {drawn}: pick other choices"

    study_file = write_study(
        tmp_path / "diverging.py", tiny_trial(num_workers=1, max_rejected_steps=1), name="diverging",
        extra=f"budget=replace(DEFAULT_BUDGET, tokens=4_000), search=(Search('train.learning_rate', choices={choices!r}),), search_trials=2")
    assert main(["sweep", study_file, "--storage", str(tmp_path / "runs")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    run_dir = next((tmp_path / "runs").iterdir())
    table = load_table(run_dir)
    record = json.loads((run_dir / "study.json").read_text())
    tuning = record["tuning"]
    assert tuning["sampler"].startswith(f"RandomSampler(seed={TUNING_SEED_OFFSET})")
    assert tuning["trials_per_arm"] == 2 and tuning["seeds"] == [10_000, 10_001]
    assert set(tuning["failed"]) == {"mask-15", "mask-30"}
    for arm in ("mask-15", "mask-30"):
        tune = table[(table["stage"] == "tune") & (table["arm"] == arm)]
        assert sorted(tune["seed"]) == [10_000, 10_001]
        diverged = tune[tune["param/train.learning_rate"] == DIVERGING]
        assert list(diverged["status"]) == ["nonfinite"] and diverged[METRIC].isna().all()
        assert tuning["failed"][arm] == [{"trial_id": diverged["trial_id"].item(), "status": "nonfinite",
                                          "error": diverged["error"].item()}]
        assert "non-finite" in diverged["error"].item()
        chosen = tune[tune["status"] == "finished"]
        final = table[(table["stage"] == "final") & (table["arm"] == arm)]
        assert list(final["seed"]) == [0] and list(final["status"]) == ["finished"]
        assert final["param/train.learning_rate"].item() == chosen["param/train.learning_rate"].item() != DIVERGING
        stored = optuna.load_study(study_name=f"diverging-{arm}", storage=f"sqlite:///{run_dir / 'optuna.db'}")
        states = {t.params["train.learning_rate"]: t.state.name for t in stored.trials}
        assert states[DIVERGING] == "FAIL" and sorted(states.values()) == ["COMPLETE", "FAIL"]
        assert f"optuna: arm {arm}: 1 of 2 tuning trial(s) failed, excluded from the choice" in out
    # Scored trials have per-query files; the diverged ones, with no scores, have none.
    scored = set(table.loc[table["status"] == "finished", "trial_id"])
    assert {p.stem for p in (run_dir / "per_query").glob("*.json")} == scored
    text = render(run_dir)
    assert "excluded from statistics:" in text
    for trial_id in table.loc[table["status"] == "nonfinite", "trial_id"]:
        assert any(trial_id in line and "nonfinite" in line for line in text.splitlines())
