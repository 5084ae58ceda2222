"""A running sweep's console lines, instead of Tune's periodic status tables: a Tune callback
with one line per trial event, a trial's throttled budget lines (`BudgetLines`), and the lines
of its work before training and of its evaluation's encoding, which the trial forwards as Tune
results (`evaluate_with_progress`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from embedlab.core.config import EvalConfig

# Console lines: a trial's budget at each quarter and at most every 30 s between them; the
# evaluator's encoding line polled every 5 s (it writes one at most every 10 s). Fixed: they
# pace the console, not the training; polling at half the evaluator's pace shows each of its
# lines while it is current.
BUDGET_LINE_SECONDS = 30.0
EVAL_POLL_SECONDS = 5.0
# A Tune result holding one progress line (text) of a trial's driver, before training (audit,
# mining, teacher labels) or while its evaluation encodes: the key the trial writes and the
# callback reads.
EVAL_PROGRESS = "eval/progress"


def evaluate_with_progress(evaluator, args: tuple, *, request: str, report: Callable[[str], None],
                           max_length: int = EvalConfig.max_length, poll_seconds: float = EVAL_POLL_SECONDS,
                           dims: tuple[int, ...] = ()) -> dict:
    """The evaluation actor's scores for `evaluate(*args)`; meanwhile each new encoding line of
    this `request` (see `Evaluator.progress`) goes to `report`, the last one once it is done,
    and "waiting" once if another trial's evaluation holds the actor first."""
    import ray  # here: Ray, which a dry run does not need

    pending = evaluator.evaluate.remote(*args, request=request, max_length=max_length, dims=tuple(dims))
    seen, waiting_said = 0, False

    def forward(status: dict) -> None:
        nonlocal seen, waiting_said
        if status["request"] == request and status["lines"] > seen and status["line"]:
            seen = status["lines"]
            report(status["line"])
        elif status["request"] != request and status["active"] and not waiting_said:
            waiting_said = True
            report("evaluation waiting: the evaluator is busy with another trial")

    while True:
        ready, _ = ray.wait([pending], timeout=poll_seconds)
        if ready:
            scores = ray.get(pending)
            if not scores.get("cached"):
                forward(ray.get(evaluator.progress.remote()))
            return scores
        forward(ray.get(evaluator.progress.remote()))


class BudgetLines:
    """When a trial's training report earns a console line: its first report (the first
    throughput figure), the first on reaching each quarter of its budget, and between those at
    most one every `every_seconds` per trial."""

    def __init__(self, every_seconds: float = BUDGET_LINE_SECONDS) -> None:
        self.every_seconds = every_seconds
        self.quarter: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def line(self, trial_id: str, result: dict[str, Any], now: float | None = None) -> str | None:
        """"45% of budget, loss 6.812, 1,234 tokens/s" (pairs/s in phases 2-3), or None."""
        fraction = result.get("budget/fraction")
        if fraction is None or fraction >= 1:  # the trial's "finished" line follows
            return None
        now = time.monotonic() if now is None else now
        quarter = int(fraction * 4)
        new_quarter = quarter > self.quarter.get(trial_id, 0)
        if not new_quarter and now - self.last.get(trial_id, -math.inf) < self.every_seconds:
            return None
        self.quarter[trial_id] = max(quarter, self.quarter.get(trial_id, 0))
        self.last[trial_id] = now
        parts = [f"{fraction:.0%} of budget"]
        loss = result.get("train/loss")
        if loss is not None:
            parts.append(f"loss {loss:.3f}")
        for key, unit in (("train/tokens_per_s", "tokens/s"), ("train/pairs_per_s", "pairs/s")):
            if result.get(key):
                parts.append(f"{result[key]:,.0f} {unit}")
        return ", ".join(parts)


def trial_progress(total: int, metric: str, progress: Callable[[str], None]):
    """A Tune callback that prints one line per trial event, throttled budget lines while a
    trial trains (`BudgetLines`) and its evaluation's encoding lines, instead of Tune's
    periodic status tables."""
    from ray import tune  # here: Ray, which a dry run does not need

    class TrialProgress(tune.Callback):
        def __init__(self) -> None:
            self.done = 0
            self.budget = BudgetLines()

        @staticmethod
        def _name(trial) -> str:
            config = trial.config.get("trial", trial.config)
            tuned = {k: v for k, v in config.items() if "." in k} or config.get("params") or {}
            extra = " " + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in tuned.items())
            return f"{config.get('stage', 'final')} {config['arm']} seed {config['seed']}" + (extra if tuned else "")

        def on_trial_start(self, iteration, trials, trial, **info):
            progress(f"trial {self._name(trial)}: started")

        def on_trial_result(self, iteration, trials, trial, result, **info):
            line = result.get(EVAL_PROGRESS) or self.budget.line(trial.trial_id, result)
            if line:
                progress(f"trial {self._name(trial)}: {line}")

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.done += 1
            value = trial.last_result.get(metric)
            if value is not None and not math.isfinite(value):  # the driver's nonfinite report
                progress(f"trial {self._name(trial)}: stopped, non-finite training ({self.done}/{total})")
                return
            progress(f"trial {self._name(trial)}: finished ({self.done}/{total})"
                     + (f", {metric} {value:.4f}" if value is not None else ""))

        def on_trial_error(self, iteration, trials, trial, **info):
            self.done += 1
            progress(f"trial {self._name(trial)}: FAILED ({self.done}/{total}); see {trial.local_path}")

    return TrialProgress()
