"""The compute budget as one typed object, `config.Budget`: it validates its own values and
derives its unit."""

from __future__ import annotations

import dataclasses

import pytest

from embedlab.config import DEFAULT_BUDGET, Budget, ConfigError


@pytest.mark.parametrize("fields, message", [
    ({"tokens": 0}, "train.budget.tokens: must be positive"),
    ({"pairs": -5}, "train.budget.pairs: must be positive"),
    ({"flops": -1.0}, r"train.budget.flops: must be >= 0 \(0: budget in tokens or pairs\)"),
    ({"device_seconds": -1.0}, r"train.budget.device_seconds: must be >= 0"),
    ({"flops": 1e12, "device_seconds": 60.0}, "train.budget.device_seconds: a trial trains to one budget: set flops "
                                               "or device_seconds, not both"),
    ({"scope": "everything", "flops": 1e12}, r"train.budget.scope: 'everything'; valid: \['phase', 'lineage'\]"),
    ({"scope": "lineage"}, "train.budget.scope: 'lineage' .* needs a train.budget.flops budget"),
])
def test_a_budget_refuses_bad_values_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(DEFAULT_BUDGET, **fields)


def test_a_budget_needs_its_data_figures():
    """Tokens and pairs have no default: whoever declares a budget states both."""
    with pytest.raises(TypeError, match="pairs"):
        Budget(tokens=10_000)
    assert DEFAULT_BUDGET == Budget(tokens=100_000, pairs=2_000)


@pytest.mark.parametrize("fields, phase, unit, amount", [
    ({}, 1, "tokens", 100_000),
    ({}, 2, "pairs", 2_000),
    ({}, 3, "pairs", 2_000),
    ({"flops": 1e12}, 1, "flops", 1e12),
    ({"flops": 1e12, "scope": "lineage"}, 2, "flops", 1e12),
    ({"device_seconds": 90.0}, 1, "device_seconds", 90.0),
    ({"device_seconds": 90.0}, 3, "device_seconds", 90.0),
])
def test_the_unit_is_flops_then_device_seconds_then_the_phase_data(fields, phase, unit, amount):
    budget = dataclasses.replace(DEFAULT_BUDGET, **fields)
    assert budget.unit(phase) == unit and budget.amount(phase) == amount
    # Pairs are declared in phases 2-3 only; a FLOPs or time amount only when set.
    declared = budget.declared(phase)
    assert ("pairs" in declared) == (phase > 1) and declared["tokens"] == 100_000
    assert set(declared) - {"tokens", "pairs"} == ({unit} if unit not in ("tokens", "pairs") else set())
    with pytest.raises(ConfigError, match="phase: must be 1, 2 or 3"):
        budget.unit(4)
