"""The phase registries: every declared phase trains, and nothing else chooses by phase number."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from embedlab.core.config import PHASES, Budget, ConfigError, TrialConfig, phase_spec
from embedlab.model.flops import STEP_FLOPS, contrastive_step_flops, expected_step_flops, mlm_step_flops
from embedlab.train.phases import REGISTRY, phase_of

PLATFORM = Path(__file__).resolve().parent.parent / "platform" / "embedlab"


def test_every_declared_phase_is_registered_to_train():
    """Each phase of `core.config.phases` has a training entry for its own spec, a FLOP model for
    its section, and a launcher that takes the driver's arguments."""
    assert set(REGISTRY) == set(PHASES)
    for number, phase in REGISTRY.items():
        assert phase.spec is PHASES[number]
        assert phase.spec.section in STEP_FLOPS
        assert {"storage_path", "name", "callbacks", "overlap_policy", "progress"} <= set(
            inspect.signature(phase.run).parameters)


def test_a_budget_counts_its_phases_data_unit():
    """A data budget trains phase 1 on tokens and phases 2-3 on pairs, as the specs declare."""
    budget = Budget(tokens=1000, pairs=10)
    for number, spec in PHASES.items():
        assert budget.unit(number) == spec.data_unit and budget.data(number) == getattr(budget, spec.data_unit)


def test_an_undeclared_phase_is_refused_naming_the_valid_ones():
    with pytest.raises(ConfigError, match=r"phase: 4; valid: 1 \(masked language modelling\), 2 \(broad"):
        phase_spec(4)
    with pytest.raises(ConfigError, match="phase: 0"):
        TrialConfig(phase=0)


def test_the_flop_model_follows_the_phase_section():
    """`expected_step_flops` is the section's model: MLM for phase 1, contrastive for phases 2-3."""
    phase1 = TrialConfig()
    phase2 = TrialConfig(phase=2, parent="p")
    assert expected_step_flops(phase1) == mlm_step_flops(phase1)
    assert expected_step_flops(phase2) == contrastive_step_flops(phase2)
    assert phase_of(phase2).spec.reads_pairs and not phase_of(phase1).spec.reads_pairs


def _phase_number_tests(tree: ast.AST) -> list[int]:
    """Lines comparing something's `phase` (an attribute or a name) with a number literal."""
    def is_phase(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "phase") or (
            isinstance(node, ast.Name) and node.id == "phase") or (
            isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "phase")

    def is_number(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool) or (
            isinstance(node, ast.Tuple) and all(is_number(e) for e in node.elts))

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_phase(s) for s in sides) and any(is_number(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_no_module_chooses_by_phase_number():
    """Outside the declaration of the phases, no module compares a phase with a number: what a
    phase does is asked of its spec or its registry entry, so adding one is a registration."""
    found = []
    for path in sorted(PLATFORM.rglob("*.py")):
        if path.relative_to(PLATFORM).as_posix() == "core/config/phases.py":
            continue
        found += [f"{path.relative_to(PLATFORM)}:{line}" for line in _phase_number_tests(ast.parse(path.read_text()))]
    assert not found, "phase chosen by number:\n" + "\n".join(found)


def test_the_scan_finds_a_phase_compared_with_a_number():
    tree = ast.parse("if trial.phase == 1:\n    pass\nok = phase in (2, 3)\nfine = spec.reads_pairs\n"
                     "last = record['phase'] < 3\n")
    assert _phase_number_tests(tree) == [1, 3, 5]
