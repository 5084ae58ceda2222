"""The phases a trial can train, by number, and what a config and a budget need to know of each.

A phase is declared here once (`PHASES`): its name, the config section it trains by, the unit
its data budget counts, whether it starts from a parent and whether it reads a frozen pairs
table. Its training side (launch, loop, data builder, FLOP model) is registered in
`embedlab.train.phases`; everything else asks these two registries rather than comparing
phase numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlab.core.errors import ConfigError


@dataclass(frozen=True)
class PhaseSpec:
    """One phase: `section` is the config section it trains by ("masking": phase 1's MLM;
    "contrastive": phases 2-3), `data_unit` what its data budget counts ("tokens" of packed
    rows, or positive "pairs"), `from_parent` whether a trial starts from a parent checkpoint,
    `reads_pairs` whether it trains on a frozen pairs table, `negatives` whether it may add
    hard negatives (mined or given) to its pairs."""

    number: int
    name: str
    section: str
    data_unit: str
    from_parent: bool
    reads_pairs: bool
    negatives: bool


PHASES: dict[int, PhaseSpec] = {
    1: PhaseSpec(number=1, name="masked language modelling", section="masking", data_unit="tokens",
                 from_parent=False, reads_pairs=False, negatives=False),
    2: PhaseSpec(number=2, name="broad contrastive pretraining", section="contrastive", data_unit="pairs",
                 from_parent=True, reads_pairs=True, negatives=False),
    3: PhaseSpec(number=3, name="supervised contrastive fine-tuning", section="contrastive", data_unit="pairs",
                 from_parent=True, reads_pairs=True, negatives=True),
}


def phase_spec(number: int) -> PhaseSpec:
    """The phase numbered `number`; a ConfigError naming the valid ones otherwise."""
    if isinstance(number, bool) or number not in PHASES:
        valid = ", ".join(f"{spec.number} ({spec.name})" for spec in PHASES.values())
        raise ConfigError(f"phase: {number!r}; valid: {valid}")
    return PHASES[number]
