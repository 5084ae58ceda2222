"""Typed, frozen configs. Every default in embedlab lives in this module.

A run is described by one `TrialConfig` (model, masking, data, training, evaluation);
a study varies it through `dataclasses.replace`. Validation happens at construction and
errors name the field and the allowed values.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config value is invalid; the message names the field."""


def _check(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_name}: {message}")


def _check_positive(config: object, section: str, *names: str) -> None:
    for name in names:
        _check(getattr(config, name) > 0, f"{section}.{name}", "must be positive")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Encoder shape: a bidirectional pre-LayerNorm Transformer with RoPE.

    `vocab_size` is the embedding table's size; a tokenizer with fewer entries fits inside
    it (the unused rows are never selected as inputs or random replacements).
    """

    preset: str = "custom"
    layers: int = 2
    width: int = 128
    heads: int = 4
    ffn_width: int = 256
    vocab_size: int = 4096
    max_length: int = 512
    rope_base: float = 10000.0
    dropout: float = 0.0
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        _check_positive(self, "model", "layers", "width", "heads", "ffn_width", "vocab_size", "max_length")
        _check(self.width % self.heads == 0, "model.heads", f"must divide width={self.width}")
        _check((self.width // self.heads) % 2 == 0, "model.heads", "head width must be even for RoPE")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)")

    @property
    def head_width(self) -> int:
        return self.width // self.heads


# Named presets. `300m` is the recipe's candidate; the tiny ones fit a 2-core CPU.
MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(preset="tiny", layers=2, width=64, heads=2, ffn_width=128, vocab_size=4096),
    "small": ModelConfig(preset="small", layers=2, width=128, heads=4, ffn_width=256, vocab_size=4096),
    "5m": ModelConfig(preset="5m", layers=4, width=256, heads=4, ffn_width=1024, vocab_size=8192),
    "300m": ModelConfig(
        preset="300m", layers=24, width=1024, heads=16, ffn_width=3072, vocab_size=49152
    ),
}


def model_preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset, optionally with fields replaced."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"model.preset: unknown preset {name!r}; valid: {sorted(MODEL_PRESETS)}")
    return dataclasses.replace(MODEL_PRESETS[name], **overrides)


REPLACEMENT_POLICY = "80% mask token / 10% random token / 10% unchanged"


@dataclass(frozen=True, kw_only=True)
class MaskingConfig:
    """Phase-1 corruption. Selection is over eligible tokens (never PAD or boundary tokens).

    Of the selected positions, `mask_fraction` become MASK, `random_fraction` a random
    non-special token, and the rest stay unchanged (BERT's 80/10/10 by default).
    """

    ratio: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1

    def __post_init__(self) -> None:
        _check(0.0 < self.ratio < 1.0, "masking.ratio", "must be in (0, 1)")
        _check(0.0 <= self.mask_fraction <= 1.0, "masking.mask_fraction", "must be in [0, 1]")
        _check(0.0 <= self.random_fraction <= 1.0, "masking.random_fraction", "must be in [0, 1]")
        _check(
            self.mask_fraction + self.random_fraction <= 1.0,
            "masking.random_fraction",
            "mask_fraction + random_fraction must be <= 1",
        )


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which built-in sources feed training, how the tokenizer is made and rows are packed."""

    sources: tuple[str, ...] = ()  # empty: every built-in source available on this machine
    max_documents_per_source: int = 4000
    tokenizer_vocab_size: int = 4096
    tokenizer_sample_documents: int = 20000
    sequence_length: int = 128
    split_seed: int = 0
    dev_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        _check(isinstance(self.sources, tuple), "data.sources", "must be a tuple of source names")
        _check_positive(self, "data", "max_documents_per_source", "tokenizer_sample_documents")
        _check(self.tokenizer_vocab_size >= 256, "data.tokenizer_vocab_size", "must be >= 256")
        _check(self.sequence_length >= 8, "data.sequence_length", "must be >= 8")
        _check(
            0 < self.dev_fraction and 0 < self.test_fraction and self.dev_fraction + self.test_fraction < 1,
            "data.dev_fraction",
            "dev and test fractions must be positive and sum to less than 1",
        )


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Phase-1 optimisation and the compute budget.

    `budget_tokens` counts consumed non-padding input tokens summed over all workers;
    training stops at the first step that reaches it. `batch_rows` is rows per worker per
    microbatch; a step is `microbatches` of them on every worker.
    """

    budget_tokens: int = 100_000
    batch_rows: int = 16
    microbatches: int = 1
    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 0
    num_workers: int = 2
    cpus_per_worker: float = 0.5
    use_gpu: bool = False
    report_every_steps: int = 10
    torch_threads: int = 1

    def __post_init__(self) -> None:
        _check_positive(
            self, "train", "budget_tokens", "batch_rows", "microbatches", "learning_rate",
            "max_grad_norm", "num_workers", "cpus_per_worker", "report_every_steps", "torch_threads",
        )
        _check(0.0 <= self.warmup_fraction < 1.0, "train.warmup_fraction", "must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How a trial is scored: the built-in retrieval task, on recipe-dev qrels only."""

    task: str = "python-docstrings"
    split: str = "dev"
    batch_size: int = 64
    max_length: int = 128

    def __post_init__(self) -> None:
        _check(self.split in ("dev", "test"), "eval.split", "must be 'dev' or 'test'")
        _check_positive(self, "eval", "batch_size")
        _check(self.max_length >= 8, "eval.max_length", "must be >= 8")


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """Everything one trial needs: the resolved config saved next to its results."""

    model: ModelConfig = field(default_factory=lambda: MODEL_PRESETS["small"])
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        _check(
            self.data.sequence_length <= self.model.max_length,
            "data.sequence_length",
            f"must be <= model.max_length={self.model.max_length}",
        )
        _check(
            self.data.tokenizer_vocab_size <= self.model.vocab_size,
            "data.tokenizer_vocab_size",
            f"must be <= model.vocab_size={self.model.vocab_size}",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrialConfig:
        """Inverse of `to_dict`; unknown keys are errors that name them."""
        parts = {"model": ModelConfig, "masking": MaskingConfig, "data": DataConfig,
                 "train": TrainConfig, "eval": EvalConfig}
        unknown = set(raw) - set(parts)
        if unknown:
            raise ConfigError(f"trial config: unknown sections {sorted(unknown)}; valid: {sorted(parts)}")
        kwargs = {}
        for name, kind in parts.items():
            if name in raw:
                kwargs[name] = _build(kind, raw[name], name)
        return cls(**kwargs)


def _build(kind: type, raw: dict[str, Any], section: str) -> Any:
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(raw) - names
    if unknown:
        raise ConfigError(f"{section}: unknown keys {sorted(unknown)}; valid: {sorted(names)}")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    return kind(**values)
