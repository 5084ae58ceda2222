"""Optuna inside Ray Tune, per arm: the search space and a searcher that hears only final
results. Module-level classes, so Tune can checkpoint the searcher with its experiment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.tune.search.optuna import OptunaSearch


@dataclass(frozen=True)
class SearchSpace:
    """Optuna's define-by-run space for one arm: the study's ranges (`embedlab.Search`), plus
    the arm, seed and stage as constants of every trial."""

    search: tuple
    arm: str
    seed: int

    def __call__(self, trial) -> dict[str, Any]:
        for item in self.search:
            if item.choices:
                trial.suggest_categorical(item.path, list(item.choices))
            else:
                trial.suggest_float(item.path, item.low, item.high, log=item.log)
        return {"arm": self.arm, "seed": self.seed, "stage": "tune"}


class FinalResultOptuna(OptunaSearch):
    """OptunaSearch that skips a trial's training-progress reports: the study metric comes
    from the evaluator once training ends, and Optuna is told only that."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self._metric in result:
            super().on_trial_result(trial_id, result)
