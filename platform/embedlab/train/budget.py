"""The compute budget a trial trains to, in its declared unit.

A trial stops at the first step whose consumption reaches the budget: non-padding tokens
(phase 1), positive pairs (phases 2-3), measured training FLOPs (`train.budget.flops`,
counted by `embedlab.model.flops`) or device seconds (`train.budget.device_seconds`). The
learning-rate schedule runs on the same clock, so two arms with equal budgets see the same
schedule whatever their step sizes. The last step is cut to the share of its rows the budget
has left, sized by the step before it (`final_rows`), so a trial overshoots its budget by
about a row per worker and microbatch, more only when that step cost less than this one;
the first step is never cut, which is why a study refuses a budget below one step.

A lineage-scoped FLOPs budget (`train.budget.scope` "lineage") is the total over a model's
lineage: a child that starts from its parent's weights is charged the parent's measured
training FLOPs (`recorded_flops`) and trains the rest of the budget in its own phase, one
that starts from a random initialisation trains all of it (`split_lineage_budget`).
"""

from __future__ import annotations

import math

import torch

from embedlab.core.config import ConfigError, TrainConfig, TrialConfig
from embedlab.model.flops import expected_step_flops


def consumption(train: TrainConfig, phase: int, *, tokens: float, pairs: float, flops: float,
                device_seconds: float = 0.0) -> tuple[float, float]:
    """(consumed, budget) in the trial's budget unit."""
    consumed = {"tokens": tokens, "pairs": pairs, "flops": flops, "device_seconds": device_seconds}
    return consumed[train.budget.unit(phase)], train.budget.amount(phase)


def schedule_units(trial: TrialConfig) -> int:
    """Tokens (phase 1) or pairs (phases 2-3) the trial's data schedule must hold before its
    margin (`embedlab.sources.mixture.schedule_target`): the data budget, or for a FLOPs budget
    the units at which its steps, predicted without attention (a lower bound of their cost,
    `expected_step_flops`), reach it. A device-time budget has no such bound: its schedule is
    the data budget's, and the trial says so if the stream ends first."""
    budget = trial.train.budget
    if budget.flops <= 0:
        return budget.data(trial.phase)
    return max(1, math.ceil(budget.flops / expected_step_flops(trial, attention=False) * step_units(trial)))


def step_units(trial: TrialConfig) -> int:
    """The data one full step reads, all workers, in its phase's data unit: row positions of
    packed rows (tokens, phase 1) or pairs (phases 2-3)."""
    train = trial.train
    rows = train.num_workers * train.batch_rows * train.microbatches
    return rows * trial.data.sequence_length if trial.spec.data_unit == "tokens" else rows


def final_rows(remaining: float, last_step: float, rows: int) -> int:
    """Rows of each microbatch the next step keeps: all of them unless the budget has less
    left than the last step consumed, then that share of them (at least one), so the last
    step lands on the budget instead of overshooting it by up to a whole step."""
    if last_step <= 0 or remaining >= last_step:
        return rows
    return max(1, min(rows, math.ceil(rows * max(remaining, 0.0) / last_step)))


def trim_rows(batch: dict[str, torch.Tensor], keep: int) -> dict[str, torch.Tensor]:
    """The first `keep` rows of every column of a worker's batch (all share dimension 0)."""
    rows = {name: column.shape[0] for name, column in batch.items()}
    if len(set(rows.values())) > 1:
        raise ValueError(f"batch columns disagree on their row count: {rows}")
    return {name: column[:keep] for name, column in batch.items()}


def recorded_flops(manifest: dict) -> float | None:
    """The measured training FLOPs a checkpoint's weights cost, from its manifest's budget
    record: its lineage's total (`budget/total_flops`) when it counted one, else its own
    (`budget/flops`) when it was trained from scratch (no parent). None when that is not
    known: an older checkpoint that only estimated its FLOPs, or one continued from a parent
    whose training it did not count."""
    budget = manifest.get("budget") or {}
    value = budget.get("budget/total_flops")
    if value is None and manifest.get("parent_hash") is None:
        value = budget.get("budget/flops")
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else None


def split_lineage_budget(total_flops: float, parent_flops: float | None, *,
                         inherits_weights: bool) -> tuple[float, float]:
    """(charged, phase) FLOPs of a lineage-scoped budget of `total_flops`: a trial that starts
    from its parent's weights is charged `parent_flops` (what training them measured) and
    trains total - parent in its own phase; a trial that starts from a random initialisation
    inherits no compute, so it is charged 0 and trains the whole total. The two then consume
    equal total compute. ConfigError when the parent's FLOPs are needed but unknown (None),
    or when they leave nothing of the total to train."""
    if not inherits_weights:
        return 0.0, total_flops
    if parent_flops is None:
        raise ConfigError("train.budget.scope: 'lineage' charges the parent's training FLOPs, but the parent "
                          "checkpoint records none (its manifest's budget/flops, or budget/total_flops for a "
                          "continued checkpoint)")
    if parent_flops >= total_flops:
        raise ConfigError(f"train.budget.flops: the total {total_flops:.4g} is not above the parent's "
                          f"{parent_flops:.4g} training FLOPs, so an arm that starts from its weights has "
                          "nothing left to train")
    return parent_flops, total_flops - parent_flops
