"""The encoder's shape (`ModelConfig`, its named presets) and phase 1's corruption (`MaskingConfig`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from embedlab.core.config.checks import check, check_fields, check_positive
from embedlab.core.errors import ConfigError


ATTENTION_PATHS = ("auto", "dense", "varlen")
# The encoders a trial can train: embedlab's own, or a pretrained Hugging Face encoder of one
# of these families behind the same interface (`embedlab.model.pretrained`), named by model_type.
BACKBONES = ("embedlab", "bert", "roberta", "xlm-roberta", "modernbert")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Encoder shape: a bidirectional pre-LayerNorm Transformer with RoPE.

    `vocab_size` is the embedding table's size; a tokenizer with fewer entries fits inside
    it (the unused rows are never selected as inputs or random replacements).

    `backbone` "embedlab" is that encoder. Any other value is a pretrained Hugging Face
    encoder of that family (`BACKBONES`), whose config is derived from the checkpoint's own
    (`embedlab.model.pretrained.model_config`), never declared: its shape for the FLOP counter,
    `ffn_matrices` d x f matrices a feed-forward layer multiplies by (2; 3 for ModernBERT's gated
    one), `position_offset` (the first position id: RoBERTa's start after the padding id),
    `max_length` the positions it has after that offset, `dropout` its attention dropout, and
    the dense attention path, the only one it runs.
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
    # "auto": the variable-length kernel for packed rows on CUDA in bf16/fp16 (flash; not while
    # training with dropout) and on CPU from 1,024 tokens a row (bucketed), the dense
    # block-diagonal mask elsewhere; "dense" or "varlen" force one path.
    attention: str = "auto"
    backbone: str = "embedlab"
    ffn_matrices: int = 2
    position_offset: int = 0

    def __post_init__(self) -> None:
        check_fields(self, "model")
        check(self.attention in ATTENTION_PATHS, "model.attention",
              f"{self.attention!r}; valid: {list(ATTENTION_PATHS)}")
        check(self.backbone in BACKBONES, "model.backbone", f"{self.backbone!r}; valid: {list(BACKBONES)}")
        check_positive(self, "model", "layers", "width", "heads", "ffn_width", "vocab_size", "max_length",
                       "ffn_matrices")
        check(self.width % self.heads == 0, "model.heads", f"must divide width={self.width}")
        check(0.0 <= self.dropout < 1.0, "model.dropout", "must be in [0, 1)")
        check(self.rope_base > 1.0, "model.rope_base", f"{self.rope_base:g}: must be above 1 (RoPE's wavelengths grow with it)")
        check(0.0 < self.layer_norm_eps < 1.0, "model.layer_norm_eps", f"{self.layer_norm_eps:g}: must be in (0, 1)")
        check(self.position_offset >= 0, "model.position_offset", "must be >= 0")
        if self.backbone == "embedlab":
            check((self.width // self.heads) % 2 == 0, "model.heads", "head width must be even for RoPE")
            check(self.ffn_matrices == 2 and self.position_offset == 0, "model.ffn_matrices",
                  "embedlab's encoder has two feed-forward matrices and positions from 0")
        else:
            # transformers' attention has no variable-length path without flash-attn.
            check(self.attention == "dense", "model.attention",
                  f"{self.attention!r}: a pretrained {self.backbone} backbone runs the dense path only")

    @property
    def pretrained(self) -> bool:
        """A pretrained Hugging Face backbone rather than embedlab's own encoder."""
        return self.backbone != "embedlab"

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
MASKING_STRATEGIES = ("token", "whole-word", "span")


@dataclass(frozen=True, kw_only=True)
class MaskingConfig:
    """Phase-1 corruption. Selection is over eligible tokens (never PAD or boundary tokens).

    `strategy`: "token" selects tokens independently; "whole-word" selects whole words
    (every token of a chosen word); "span" selects contiguous spans whose lengths are drawn
    from a geometric distribution (`span_geometric_p`, clipped at `span_max_length`, as in
    SpanBERT). In every strategy `ratio` is the expected share of eligible tokens selected.
    Of the selected positions, `mask_fraction` become MASK, `random_fraction` a random
    non-special token, and the rest stay unchanged (BERT's 80/10/10 by default).

    Mixed ratios (the dual-LM-head method): `mixed_ratios` lists (ratio, sequence weight)
    pairs, e.g. ((0.05, 4), (0.5, 1)) for 5% and 50% masking on sequences in a 4:1 ratio
    inside every batch; `ratio` is then unused. `head_per_ratio` gives each ratio its own LM
    head (the dual-head arm); False shares one head (the control arm).
    """

    ratio: float = 0.15
    mask_fraction: float = 0.8
    random_fraction: float = 0.1
    strategy: str = "token"
    span_geometric_p: float = 0.2
    span_max_length: int = 10
    mixed_ratios: tuple[tuple[float, float], ...] = ()
    head_per_ratio: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "masking")
        check(0.0 < self.ratio < 1.0, "masking.ratio", "must be in (0, 1)")
        check(0.0 <= self.mask_fraction <= 1.0, "masking.mask_fraction", "must be in [0, 1]")
        check(0.0 <= self.random_fraction <= 1.0, "masking.random_fraction", "must be in [0, 1]")
        check(
            self.mask_fraction + self.random_fraction <= 1.0,
            "masking.random_fraction",
            "mask_fraction + random_fraction must be <= 1",
        )
        check(self.strategy in MASKING_STRATEGIES, "masking.strategy",
              f"{self.strategy!r}; valid: {list(MASKING_STRATEGIES)}")
        check(0.0 < self.span_geometric_p <= 1.0, "masking.span_geometric_p", "must be in (0, 1]")
        check(self.span_max_length >= 1, "masking.span_max_length", "must be >= 1")
        for ratio, weight in self.mixed_ratios:
            check(0.0 < ratio < 1.0, "masking.mixed_ratios", f"ratio {ratio} must be in (0, 1)")
            check(weight > 0, "masking.mixed_ratios", f"weight {weight} must be positive")
        check(len(self.mixed_ratios) != 1, "masking.mixed_ratios", "needs at least two ratios, or none")
        check(not self.head_per_ratio or self.mixed_ratios, "masking.head_per_ratio",
              "needs masking.mixed_ratios")
