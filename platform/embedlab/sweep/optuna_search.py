"""Optuna inside Ray Tune, per arm: the search space, the sampler a tuning budget can support,
and a searcher that hears only final results. Module-level classes, so Tune can checkpoint
the searcher with its experiment."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ray.tune.search.optuna import OptunaSearch

# TPE draws `n_startup_trials` points at random before it fits its density model to the
# finished trials. Optuna's default of 10 leaves a 4-trial search random from end to end
# while it is called TPE; below TPE_MIN_TRIALS the model would rest on one or two points,
# so those budgets use random search and say so.
TPE_MIN_TRIALS = 6
TPE_STARTUP_SHARE = 3  # a third of the budget random, the rest model-guided
TPE_MIN_STARTUP = 2


@dataclass(frozen=True)
class SamplerChoice:
    """The Optuna sampler for `trials` tuning trials per arm, seeded with `seed`.

    The rule (`for_trials`): fewer than `TPE_MIN_TRIALS` trials -> `RandomSampler`; otherwise
    `TPESampler` with `n_startup_trials = max(TPE_MIN_STARTUP, trials // TPE_STARTUP_SHARE)`
    random trials first, so two thirds of the budget follow the model. Every arm gets the
    same choice and seed: the same random draws while random, equal tuning conditions."""

    kind: str  # "random" or "tpe"
    trials: int
    seed: int
    startup: int = 0  # TPE's random trials before its model

    @classmethod
    def for_trials(cls, trials: int, seed: int) -> SamplerChoice:
        if trials < 1:
            raise ValueError(f"tuning trials: {trials}; a sampler needs at least one trial")
        if trials < TPE_MIN_TRIALS:
            return cls("random", trials, seed)
        return cls("tpe", trials, seed, startup=max(TPE_MIN_STARTUP, trials // TPE_STARTUP_SHARE))

    def build(self, done: int = 0):
        """A fresh sampler; `done` trials of this arm already ran (a resumed run), so its
        random stream is shifted by them rather than replaying the first run's draws."""
        from optuna.samplers import RandomSampler, TPESampler

        if self.kind == "random":
            return RandomSampler(seed=self.seed + done)
        return TPESampler(n_startup_trials=self.startup, seed=self.seed + done)

    @property
    def description(self) -> str:
        """What study.json records and tables print: the class, its startup setting, its seed,
        e.g. "TPESampler(n_startup_trials=3, seed=10000), 3 random trials then 6 model-guided"."""
        if self.kind == "random":
            return (f"RandomSampler(seed={self.seed}), random search "
                    f"(TPE needs at least {TPE_MIN_TRIALS} trials per arm)")
        return (f"TPESampler(n_startup_trials={self.startup}, seed={self.seed}), {self.startup} random trials "
                f"then {self.trials - self.startup} model-guided")


@dataclass(frozen=True)
class SearchSpace:
    """Optuna's define-by-run space for one arm: the study's ranges (`embedlab.Search`), plus
    the arm, the tuning seed and the stage as constants of every trial. Optuna trial k runs at
    `seeds[k]` (`Study.tuning_seeds`); a resumed run's later trial numbers wrap around them."""

    search: tuple
    arm: str
    seeds: tuple[int, ...]

    def __call__(self, trial) -> dict[str, Any]:
        for item in self.search:
            if item.choices:
                trial.suggest_categorical(item.path, list(item.choices))
            else:
                trial.suggest_float(item.path, item.low, item.high, log=item.log)
        return {"arm": self.arm, "seed": self.seeds[trial.number % len(self.seeds)], "stage": "tune"}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class FinalResultOptuna(OptunaSearch):
    """OptunaSearch that skips a trial's training-progress reports: the study metric comes
    from the evaluator once training ends, and Optuna is told only that. A trial that errored
    or ended without a finite metric is told FAIL, so the sampler never learns from it:
    OptunaSearch itself would record a missing metric as PRUNED and hand NaN to
    `study.tell`, which only warns."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if _finite(result.get(self._metric)):
            super().on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if error or not _finite((result or {}).get(self._metric)):
            super().on_trial_complete(trial_id, None, error=True)
        else:
            super().on_trial_complete(trial_id, result, error=False)
