"""Everything one trial needs (`TrialConfig`): the resolved config saved next to its results."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from embedlab.core.config.checks import build_config, check, check_fields
from embedlab.core.config.contrastive import ContrastiveConfig
from embedlab.core.config.data import PRETRAINED_TOKENIZER, DataConfig
from embedlab.core.config.evaluation import EvalConfig
from embedlab.core.config.phases import PhaseSpec, phase_spec
from embedlab.core.config.model import MODEL_PRESETS, MaskingConfig, ModelConfig
from embedlab.core.config.train import TrainConfig
from embedlab.core.schema import upgrade


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """Everything one trial needs: the resolved config saved next to its results."""

    model: ModelConfig = field(default_factory=lambda: MODEL_PRESETS["small"])
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    phase: int = 1
    contrastive: ContrastiveConfig = field(default_factory=ContrastiveConfig)
    parent: str | None = None  # the parent checkpoint directory (phases 2 and 3, and extensions)
    # Phase 1 continued from `parent`'s encoder and MLM head, e.g. at a longer length (the
    # recipe's 2,048-token extension): a stage of its own, evaluated on its own.
    extension: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "")
        spec = phase_spec(self.phase)
        # Phases 2-3 need a parent before they train; a study may supply it at sweep time.
        check(self.parent is None or spec.from_parent or self.extension, "parent",
              "phase 1 starts from scratch; continuing from a parent is an extension (extension=True)")
        check(not self.extension or not spec.from_parent, "extension", "continues phase 1 (MLM); phases 2-3 always "
              "start from a parent")
        check(not (self.extension and self.masking.head_per_ratio), "extension",
              "continues the parent's single MLM head; one head per ratio is a phase-1 arm from scratch")
        check(spec.from_parent or self.train.budget.scope == "phase", "train.budget.scope",
              "'lineage' charges a parent's training to a phase-2 or phase-3 child; phase 1 counts its own")
        check(spec.data_unit == "tokens" or not self.train.length_schedule, "train.length_schedule",
              "belongs to phase 1 (pair lengths are contrastive.pair_length)")
        if self.train.length_schedule:
            lengths = [length for _, length in self.train.length_schedule]
            check(all(self.data.sequence_length % length == 0 for length in lengths), "train.length_schedule",
                  f"lengths {lengths} must divide data.sequence_length={self.data.sequence_length}, "
                  "the length rows are packed at")
        check(spec.negatives or self.contrastive.negatives.count == 0, "contrastive.negatives.count",
              "mined hard negatives belong to phase 3")
        check(not self.eval.dims or self.eval.dims[-1] < self.model.width, "eval.dims",
              f"widths must be below model.width={self.model.width} (the full width is always scored), got "
              f"{list(self.eval.dims)}")
        dims = self.contrastive.matryoshka.dims
        check(not dims or dims[-1] <= self.model.width, "contrastive.matryoshka.dims",
              f"widths must be at most model.width={self.model.width}, got {list(dims)}")
        check(self.contrastive.mlm_weight == 0 or self.masking.strategy == "token", "masking.strategy",
              "the joint phase-2 MLM term masks pair texts token by token (they carry no word starts)")
        if self.model.pretrained:
            self._check_pretrained()
        check(
            self.data.sequence_length <= self.model.max_length,
            "data.sequence_length",
            f"must be <= model.max_length={self.model.max_length}",
        )
        check(
            self.data.tokenizer_vocab_size <= self.model.vocab_size,
            "data.tokenizer_vocab_size",
            f"must be <= model.vocab_size={self.model.vocab_size}",
        )

    def _check_pretrained(self) -> None:
        """What a pretrained backbone cannot do: lengths past its positions, compiled blocks."""
        model = self.model
        lengths = (("contrastive.pair_length", self.contrastive.pair_length),) if self.spec.reads_pairs else ()
        for name, length in (*lengths, ("eval.max_length", self.eval.max_length)):
            check(length <= model.max_length, name,
                  f"{length} exceeds the pretrained {model.backbone} backbone's {model.max_length} positions")
        check(self.data.tokenizer_kind == PRETRAINED_TOKENIZER, "data.tokenizer_kind",
              f"{self.data.tokenizer_kind!r}: a pretrained {model.backbone} backbone reads data tokenised with its "
              f"own tokenizer ({PRETRAINED_TOKENIZER!r}, set from the parent by `Study.with_pretrained_parent`)")
        check(self.train.compile != "on", "train.compile",
              f"'on': a pretrained {model.backbone} backbone runs eager (train.compile compiles embedlab's blocks)")
        check(self.spec.from_parent or self.extension, "extension",
              f"a pretrained {model.backbone} backbone is never trained from scratch: phase 1 continues its masked "
              "language modelling as an extension (extension=True) from the parent")
        check(not self.masking.mixed_ratios or self.spec.from_parent, "masking.mixed_ratios",
              f"a pretrained {model.backbone} backbone continues its own single MLM head")

    @property
    def spec(self) -> PhaseSpec:
        """The phase this trial trains (`embedlab.core.config.phases`)."""
        return phase_spec(self.phase)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialConfig:
        """Inverse of `to_dict`, for a mapping of any schema (`embedlab.core.schema.upgrade`);
        unknown keys are errors that name them."""
        return build_config(cls, upgrade(raw, "config"), "trial")
