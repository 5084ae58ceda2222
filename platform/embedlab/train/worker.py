"""What every training worker of a trial is given: one typed `WorkerConfig`.

Ray Train hands `train_loop_per_worker` a JSON-like mapping (its dashboard shows it as such),
so a trial's driver builds a `WorkerConfig` and passes `to_dict()`; the worker reads it back
with `from_dict` (`embedlab.train.loop.run_on_ray`) and reads typed fields, never keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from embedlab.core.config import TrialConfig
from embedlab.train.session import FaultDrill


@dataclass(frozen=True)
class RunOptions:
    """How one attempt runs, beside the trial config (not part of a trial's identity)."""

    stop_after_step: int | None = None
    fault_drill: FaultDrill | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> RunOptions:
        raw = raw or {}
        drill = raw.get("fault_drill")
        return cls(stop_after_step=raw.get("stop_after_step"), fault_drill=FaultDrill(**drill) if drill else None)


@dataclass(frozen=True, kw_only=True)
class MadeForTrial:
    """What was made for a phase-3 trial before its workers started, as its checkpoint records
    it: the mined set's version and what mining and screening cost (`compute/mining_*`,
    `compute/given_negatives_*`), the mined set's row figures (its search, whether this trial
    made it, each rule's drops, the false-negative rates: `negative_figures`), the screened given
    negatives' counts, and the teacher's labels and documents (`embedlab.teacher.phase3`). Empty
    for phases 1-2 without a teacher."""

    mined_version: str | None = None
    mining_compute: dict[str, float] = field(default_factory=dict)
    negative_figures: dict[str, Any] = field(default_factory=dict)
    given_negatives: dict[str, Any] | None = None
    teacher_labels: dict[str, Any] | None = None
    teacher_embeddings: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """One trial's worker settings.

    `sources` are the schedule's sources (phase 1) or pair builders (phases 2-3) in its order,
    the order of the per-source counters; `intended_shares` their shares (tokens, or pairs);
    `schedule` the schedule's version, seed and length, as the manifest records them."""

    trial: TrialConfig
    tokenizer_path: str
    tokenizer_hash: str
    data_revision: str
    sources: tuple[str, ...]
    intended_shares: dict[str, float]
    schedule: dict[str, Any]
    run: RunOptions = field(default_factory=RunOptions)
    made: MadeForTrial = field(default_factory=MadeForTrial)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial.to_dict(), "tokenizer_path": self.tokenizer_path,
            "tokenizer_hash": self.tokenizer_hash, "data_revision": self.data_revision,
            "sources": list(self.sources), "intended_shares": dict(self.intended_shares),
            "schedule": dict(self.schedule), "run": self.run.to_dict(), "made": asdict(self.made),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WorkerConfig:
        return cls(
            trial=TrialConfig.from_dict(raw["trial"]), tokenizer_path=raw["tokenizer_path"],
            tokenizer_hash=raw["tokenizer_hash"], data_revision=raw["data_revision"],
            sources=tuple(raw["sources"]), intended_shares=dict(raw["intended_shares"]),
            schedule=dict(raw["schedule"]), run=RunOptions.from_dict(raw.get("run")),
            made=MadeForTrial(**(raw.get("made") or {})),
        )
