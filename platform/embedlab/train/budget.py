"""The compute budget a trial trains to, in its declared unit, and the FLOPs estimate.

A trial stops at the first step whose consumption reaches the budget: non-padding tokens
(phase 1), positive pairs (phases 2-3) or, when `train.budget_flops` is set, estimated
training FLOPs. The learning-rate schedule runs on the same clock, so two arms with equal
budgets see the same schedule whatever their step sizes.
"""

from __future__ import annotations

import math

from embedlab.config import ModelConfig, TrainConfig


def body_parameters(config: ModelConfig) -> int:
    """Encoder parameters without the embedding table (a lookup costs no matmul FLOPs)."""
    from embedlab.model.encoder import parameter_counts

    return parameter_counts(config)["encoder"] - config.vocab_size * config.width


def head_parameters(config: ModelConfig) -> int:
    """One MLM head's dense transform plus its (tied) vocabulary projection."""
    return config.width * config.width + config.width * config.vocab_size


def training_flops(config: ModelConfig, tokens: float, selected: float = 0.0, body: int | None = None) -> float:
    """6 x body parameters per encoded token (forward + backward), plus one head per selected
    token. Attention scores and the GradCache re-forward are left out: the estimate counts
    the model's arithmetic, not an implementation's."""
    body = body_parameters(config) if body is None else body
    return 6.0 * body * tokens + 6.0 * head_parameters(config) * selected


def consumption(train: TrainConfig, phase: int, *, tokens: float, pairs: float, flops: float) -> tuple[float, float]:
    """(consumed, budget) in the trial's budget unit."""
    if train.budget_flops > 0:
        return flops, train.budget_flops
    if phase == 1:
        return tokens, train.budget_tokens
    return pairs, train.budget_pairs


def tokens_for(train: TrainConfig, model: ModelConfig) -> int:
    """Non-padding tokens a phase-1 data schedule must hold to reach the budget (a FLOPs
    budget is reached no later than its token equivalent, since heads only add FLOPs)."""
    if train.budget_flops > 0:
        return max(1, math.ceil(train.budget_flops / (6.0 * body_parameters(model))))
    return train.budget_tokens
