"""The phase registry: for every phase, what trains it.

A phase is declared in `embedlab.core.config.phases` (its name, config section, budget unit,
whether it starts from a parent or reads pairs); here each declared phase registers how it
trains: `run` launches its `TorchTrainer` (building its data on the way: the packed mixture
stream in phase 1, the pair schedule, negatives and teacher sets in phases 2-3), `loop` is the
`TrainingLoop` every worker runs, and `intended_shares` the data shares its trials are held
to; its FLOP model is registered by the config section it trains by
(`embedlab.model.flops.STEP_FLOPS`). The sweep, the planner and the
recipes ask `phase_of(trial)` instead of comparing phase numbers; a new phase is an entry in
both registries (`tests/test_phases.py` holds them to each other).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedlab.core.config import PHASES, PhaseSpec, TrialConfig, phase_spec
from embedlab.prepared.directory import PreparedData
from embedlab.train.contrastive import ContrastiveLoop, run_contrastive
from embedlab.train.loop import TrainingLoop
from embedlab.train.phase1 import Phase1Loop, run_phase1


@dataclass(frozen=True)
class Phase:
    """How one declared phase (`spec`) trains (module docstring)."""

    spec: PhaseSpec
    run: Callable[..., Any]
    loop: type[TrainingLoop]
    intended_shares: Callable[[TrialConfig, dict[str, Any]], dict[str, float]]


def _run_mlm(trial: TrialConfig, prepared: PreparedData, *, storage_path: str | Path, name: str,
             callbacks: list | None = None, overlap_policy: str | None = None, progress=print):
    # Phase 1's data is the prepared directory's, which the sweep's gate checked before any trial.
    return run_phase1(trial, prepared, storage_path=storage_path, name=name, callbacks=callbacks)


def _mixture_shares(trial: TrialConfig, prepared_record: dict[str, Any]) -> dict[str, float]:
    return prepared_record["mixture"]["shares"]


def _pair_shares(trial: TrialConfig, prepared_record: dict[str, Any]) -> dict[str, float]:
    return dict(trial.contrastive.pairs)


def _contrastive(number: int) -> Phase:
    return Phase(spec=PHASES[number], run=run_contrastive, loop=ContrastiveLoop, intended_shares=_pair_shares)


REGISTRY: dict[int, Phase] = {
    1: Phase(spec=PHASES[1], run=_run_mlm, loop=Phase1Loop, intended_shares=_mixture_shares),
    2: _contrastive(2),
    3: _contrastive(3),
}


def phase_of(trial: TrialConfig) -> Phase:
    """How `trial`'s phase trains; a ConfigError naming the valid phases for one not declared."""
    return REGISTRY[phase_spec(trial.phase).number]

