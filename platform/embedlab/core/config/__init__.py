"""Typed, frozen configs. Every default in embedlab lives in this module.

A run is described by one `TrialConfig` (model, masking, data, training, evaluation);
a study varies it through `dataclasses.replace`. Validation happens at construction and
errors name the field and the allowed values.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedlab.core.config.sources import BEIRPairs, BUILDER_NAMES, HFDataset, HFPairs, LocalFiles, PairFiles
from embedlab.core.config.tasks import HubTask, PanelError, check_task_names
from embedlab.core.errors import ConfigError
from embedlab.core.schema import upgrade


def _check(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_name}: {message}")


def _check_positive(config: object, section: str, *names: str) -> None:
    for name in names:
        _check(getattr(config, name) > 0, f"{section}.{name}", "must be positive")


ATTENTION_PATHS = ("auto", "dense", "varlen")


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
    # "auto": the variable-length kernel for packed rows on CUDA in bf16/fp16 (flash; not while
    # training with dropout) and on CPU from 1,024 tokens a row (bucketed), the dense
    # block-diagonal mask elsewhere; "dense" or "varlen" force one path.
    attention: str = "auto"

    def __post_init__(self) -> None:
        _check(self.attention in ATTENTION_PATHS, "model.attention",
               f"{self.attention!r}; valid: {list(ATTENTION_PATHS)}")
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
        _check(0.0 < self.ratio < 1.0, "masking.ratio", "must be in (0, 1)")
        _check(0.0 <= self.mask_fraction <= 1.0, "masking.mask_fraction", "must be in [0, 1]")
        _check(0.0 <= self.random_fraction <= 1.0, "masking.random_fraction", "must be in [0, 1]")
        _check(
            self.mask_fraction + self.random_fraction <= 1.0,
            "masking.random_fraction",
            "mask_fraction + random_fraction must be <= 1",
        )
        _check(self.strategy in MASKING_STRATEGIES, "masking.strategy",
               f"{self.strategy!r}; valid: {list(MASKING_STRATEGIES)}")
        _check(0.0 < self.span_geometric_p <= 1.0, "masking.span_geometric_p", "must be in (0, 1]")
        _check(self.span_max_length >= 1, "masking.span_max_length", "must be >= 1")
        for ratio, weight in self.mixed_ratios:
            _check(0.0 < ratio < 1.0, "masking.mixed_ratios", f"ratio {ratio} must be in (0, 1)")
            _check(weight > 0, "masking.mixed_ratios", f"weight {weight} must be positive")
        _check(len(self.mixed_ratios) != 1, "masking.mixed_ratios", "needs at least two ratios, or none")
        _check(not self.head_per_ratio or self.mixed_ratios, "masking.head_per_ratio",
               "needs masking.mixed_ratios")


SAMPLING_SCHEDULES = ("deficit/1",)
TOKENIZER_KINDS = ("bpe", "unigram", "byte-level")


@dataclass(frozen=True, kw_only=True)
class MixtureConfig:
    """Shares of consumed non-padding tokens per source (phase 1), and how they are drawn.

    `shares` pairs source names with shares summing to 1; empty means the recipe's phase-1
    pilot mixture mapped onto the available built-in sources (`embedlab.sources.mixture`).
    `max_epochs` caps repetition: no source is read more than that many times over.
    `schedule` names the versioned sampling algorithm; `seed` orders documents within sources.
    """

    shares: tuple[tuple[str, float], ...] = ()
    max_epochs: float = 4.0
    seed: int = 0
    schedule: str = "deficit/1"

    def __post_init__(self) -> None:
        names = [name for name, _ in self.shares]
        _check(len(set(names)) == len(names), "data.mixture.shares", f"names repeat: {names}")
        for name, share in self.shares:
            _check(share > 0, "data.mixture.shares", f"share of {name!r} must be positive, got {share}")
        if self.shares:
            total = sum(share for _, share in self.shares)
            _check(abs(total - 1.0) < 1e-6, "data.mixture.shares", f"must sum to 1, got {total:.6f}")
        _check(self.max_epochs > 0, "data.mixture.max_epochs", "must be positive")
        _check(self.schedule in SAMPLING_SCHEDULES, "data.mixture.schedule",
               f"{self.schedule!r}; valid: {list(SAMPLING_SCHEDULES)}")

    @property
    def share_map(self) -> dict[str, float]:
        return dict(self.shares)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which sources are built, how they are deduplicated, split, tokenised, mixed and packed."""

    sources: tuple[str, ...] = ()  # empty: every built-in source available on this machine
    local_files: tuple[LocalFiles, ...] = ()  # extra sources: jsonl / parquet / txt files or directories
    hf_datasets: tuple[HFDataset, ...] = ()  # extra sources: Hugging Face datasets pinned by revision
    # A user's own labelled pairs for phases 2-3 (`embedlab.pairs.readers`), named beside the
    # built-in pair builders in `contrastive.pairs`. They take no part in phase 1's corpus,
    # tokenizer or pieces, so they are not in the prepared directory's key (`prepare.prepare_key`).
    pair_files: tuple[PairFiles, ...] = ()
    hf_pairs: tuple[HFPairs, ...] = ()
    beir_pairs: tuple[BEIRPairs, ...] = ()
    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    near_duplicate_threshold: float = 0.8
    tokenizer_kind: str = "bpe"
    tokenizer_vocab_size: int = 4096
    tokenizer_sample_documents: int = 20000
    sequence_length: int = 128
    split_seed: int = 0
    dev_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        _check(isinstance(self.sources, tuple), "data.sources", "must be a tuple of source names")
        _check_positive(self, "data", "tokenizer_sample_documents")
        _check(0.0 < self.near_duplicate_threshold < 1.0, "data.near_duplicate_threshold",
               f"{self.near_duplicate_threshold} is not strictly between 0 and 1 (MinHash banding needs a "
               "threshold below 1; exact duplicates are removed before it)")
        _check(self.tokenizer_kind in TOKENIZER_KINDS, "data.tokenizer_kind",
               f"{self.tokenizer_kind!r}; valid: {list(TOKENIZER_KINDS)}")
        _check(self.tokenizer_vocab_size >= 256, "data.tokenizer_vocab_size", "must be >= 256")
        _check(self.sequence_length >= 8, "data.sequence_length", "must be >= 8")
        _check(
            0 < self.dev_fraction and 0 < self.test_fraction and self.dev_fraction + self.test_fraction < 1,
            "data.dev_fraction",
            "dev and test fractions must be positive and sum to less than 1",
        )
        external = [s.name for s in (*self.local_files, *self.hf_datasets)]
        _check(len(set(external)) == len(external), "data.local_files", f"external source names repeat: {external}")
        users = self.pair_source_names
        _check(len(set(users)) == len(users), "data.pair_files", f"pair source names repeat: {list(users)}")
        clashes = sorted(set(users) & (set(external) | set(BUILDER_NAMES)))
        _check(not clashes, "data.pair_files", f"pair source names {clashes} are also document source or built-in "
               f"pair builder names ({', '.join(BUILDER_NAMES)}); a share must name one thing")
        if self.sources and self.mixture.shares:
            outside = sorted(set(self.mixture.share_map) - set(self.sources) - set(external))
            _check(not outside, "data.mixture.shares", f"names sources that are not built: {outside}")

    @property
    def pair_sources(self) -> tuple[PairFiles | HFPairs | BEIRPairs, ...]:
        """The user's pair sources, files then datasets then BEIR folders."""
        return (*self.pair_files, *self.hf_pairs, *self.beir_pairs)

    @property
    def pair_source_names(self) -> tuple[str, ...]:
        return tuple(source.name for source in self.pair_sources)

    def phase1_dict(self) -> dict[str, Any]:
        """The fields that decide the prepared directory: all but the pair sources."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in PAIR_SOURCE_FIELDS}


PAIR_SOURCE_FIELDS = ("pair_files", "hf_pairs", "beir_pairs")


SCHEDULE_KINDS = ("linear", "cosine", "wsd", "constant")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """The learning rate as a multiple of the peak, a function of the consumed budget.

    The clock is the trial's budget unit (tokens in phase 1, pairs in phases 2-3, measured
    FLOPs or device seconds), never steps, so arms whose steps differ in size see the same schedule,
    and a resumed run continues from its consumed budget. Linear warmup over the first
    `warmup_fraction` of the budget, then: "linear" to `min_lr_fraction` at the budget,
    "cosine" (half a cosine) to it, "wsd" (warmup-stable-decay) at the peak until the last
    `decay_fraction` of the budget and linearly to it over that, or "constant" at the peak.
    """

    kind: str = "linear"
    warmup_fraction: float = 0.1
    decay_fraction: float = 0.2  # "wsd" only: the share of the budget the final decay takes
    min_lr_fraction: float = 0.0  # the floor the decay ends at, as a fraction of the peak

    def __post_init__(self) -> None:
        _check(self.kind in SCHEDULE_KINDS, "train.schedule.kind", f"{self.kind!r}; valid: {list(SCHEDULE_KINDS)}")
        _check(0.0 <= self.warmup_fraction < 1.0, "train.schedule.warmup_fraction", "must be in [0, 1)")
        _check(0.0 < self.decay_fraction <= 1.0 - self.warmup_fraction, "train.schedule.decay_fraction",
               "must be in (0, 1 - warmup_fraction]")
        _check(0.0 <= self.min_lr_fraction <= 1.0, "train.schedule.min_lr_fraction", "must be in [0, 1]")


PARAMETER_CATEGORIES = ("weight", "bias", "norm", "embedding", "temperature")


@dataclass(frozen=True, kw_only=True)
class GroupSettings:
    """Overrides for one parameter category's optimizer group (`PARAMETER_CATEGORIES`):
    its learning rate as a multiple of the schedule's, and its own betas or epsilon."""

    category: str
    lr_scale: float = 1.0
    betas: tuple[float, float] | None = None
    eps: float | None = None

    def __post_init__(self) -> None:
        _check(self.category in PARAMETER_CATEGORIES, "train.optimizer.groups.category",
               f"{self.category!r}; valid: {list(PARAMETER_CATEGORIES)}")
        _check(self.lr_scale > 0, "train.optimizer.groups.lr_scale", "must be positive")
        _check(self.betas is None or (len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas)),
               "train.optimizer.groups.betas", "must be two numbers in [0, 1)")
        _check(self.eps is None or self.eps > 0, "train.optimizer.groups.eps", "must be positive")


FUSED_MODES = ("auto", "on", "off")


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW with one parameter group per category (`embedlab.train.optim`).

    Categories: "embedding" (the token embedding table, also the tied MLM decoder), "norm"
    (LayerNorm weights and biases), "bias" (every other bias, the MLM vocabulary bias
    included), "temperature" (a learnable contrastive temperature) and "weight" (every other
    matrix). The categories in `no_decay` get no weight decay; the rest get
    `train.weight_decay`. `fused`: "auto" uses PyTorch's fused AdamW kernel where the
    device has one (CPU and CUDA in torch >= 2.4), "on" requires it, "off" uses the
    multi-tensor path. The groups, their members and settings are recorded in every manifest.
    """

    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    no_decay: tuple[str, ...] = ("bias", "norm", "temperature")
    fused: str = "auto"
    groups: tuple[GroupSettings, ...] = ()

    def __post_init__(self) -> None:
        _check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "train.optimizer.betas",
               "must be two numbers in [0, 1)")
        _check(self.eps > 0, "train.optimizer.eps", "must be positive")
        unknown = sorted(set(self.no_decay) - set(PARAMETER_CATEGORIES))
        _check(not unknown, "train.optimizer.no_decay", f"unknown categories {unknown}; valid: {list(PARAMETER_CATEGORIES)}")
        _check(self.fused in FUSED_MODES, "train.optimizer.fused", f"{self.fused!r}; valid: {list(FUSED_MODES)}")
        named = [g.category for g in self.groups]
        _check(len(set(named)) == len(named), "train.optimizer.groups", f"a category appears twice: {named}")


PRECISIONS = ("auto", "fp32", "bf16")
COMPILE_MODES = ("auto", "on", "off")
# What a FLOPs budget counts: this trial's own training ("phase"), or the whole lineage's
# ("lineage": a trial that starts from its parent's weights is charged the parent's training).
BUDGET_SCOPES = ("phase", "lineage")


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The compute a trial trains to; a study holds one and stamps it on every arm.

    `tokens` counts consumed non-padding input tokens summed over all workers (phase 1);
    `pairs` consumed positive pairs (phases 2 and 3). `flops` > 0 makes the budget measured
    training FLOPs instead, `device_seconds` > 0 device time summed over the workers; a
    trial trains to one of them, and stops at the first step that reaches it (`unit`).
    The data figures stay with a FLOPs or device-time budget: they size the data schedule.

    `scope` (BUDGET_SCOPES): "phase" counts this trial's own training FLOPs against `flops`;
    "lineage" (phases 2-3, a FLOPs budget) makes `flops` the total over the lineage, so a
    trial that starts from its parent's weights is charged the parent's measured training
    FLOPs and trains the rest, and one that starts from a random initialisation trains all
    of it (`embedlab.train.budget.split_lineage_budget`).
    """

    tokens: int
    pairs: int
    flops: float = 0.0
    device_seconds: float = 0.0
    scope: str = "phase"

    def __post_init__(self) -> None:
        _check_positive(self, "train.budget", "tokens", "pairs")
        _check(self.flops >= 0, "train.budget.flops", "must be >= 0 (0: budget in tokens or pairs)")
        _check(self.device_seconds >= 0, "train.budget.device_seconds",
               "must be >= 0 (0: budget in tokens, pairs or FLOPs)")
        _check(not (self.flops > 0 and self.device_seconds > 0), "train.budget.device_seconds",
               "a trial trains to one budget: set flops or device_seconds, not both")
        _check(self.scope in BUDGET_SCOPES, "train.budget.scope", f"{self.scope!r}; valid: {list(BUDGET_SCOPES)}")
        _check(self.scope == "phase" or self.flops > 0, "train.budget.scope",
               "'lineage' adds a parent's training FLOPs to a child's, so it needs a train.budget.flops budget")

    def unit(self, phase: int) -> str:
        """What a trial of `phase` trains to: measured FLOPs or device seconds when set, else
        its phase's data (tokens in phase 1, pairs in phases 2-3)."""
        _check(phase in (1, 2, 3), "phase", "must be 1, 2 or 3")
        return budget_unit_of(dataclasses.asdict(self), phase)

    def amount(self, phase: int) -> float:
        """The budget in its unit for a trial of `phase`."""
        return getattr(self, self.unit(phase))

    def data(self, phase: int) -> int:
        """The phase's data figure: tokens in phase 1, pairs in phases 2-3."""
        return self.tokens if phase == 1 else self.pairs

    def declared(self, phase: int) -> dict[str, float]:
        """The amount in each unit the budget declares for a trial of `phase`: tokens (phase
        1's data, and the record's figure in phases 2-3), pairs in phases 2-3 only (a phase-1
        trial reads none), FLOPs and device seconds when set."""
        return declared_amounts(dataclasses.asdict(self), phase)


def budget_unit_of(amounts: dict[str, Any], phase: int) -> str:
    """`Budget.unit` of a budget's mapping (`Budget`'s fields; one absent counts as 0), so a
    recorded study's unit reads the same whether or not it holds every field."""
    if (amounts.get("flops") or 0) > 0:
        return "flops"
    if (amounts.get("device_seconds") or 0) > 0:
        return "device_seconds"
    return "tokens" if phase == 1 else "pairs"


def declared_amounts(amounts: dict[str, Any], phase: int) -> dict[str, float]:
    """`Budget.declared` of a budget's mapping (one absent field counts as 0)."""
    declared = {unit: amounts.get(unit) or 0 for unit in ("tokens", "pairs", "flops", "device_seconds")}
    if phase == 1:
        declared["pairs"] = 0
    return {unit: amount for unit, amount in declared.items() if amount > 0}


# TrainConfig's budget when none is given: a demo-sized phase 1, 2,000 pairs in phases 2-3.
DEFAULT_BUDGET = Budget(tokens=100_000, pairs=2_000)
@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Phase-1 optimisation and the compute budget.

    `budget` (`Budget`) is what the trial trains to; training stops at the first step that
    reaches it. `batch_rows` is rows per worker per microbatch; a step is `microbatches` of
    them on every worker.

    Reliability (`embedlab.checkpoints.state`, `embedlab.train.nonfinite`): every
    `checkpoint_every_steps` steps (0: only the final checkpoint) a checkpoint holds the
    complete training state, and a run resumes from it exactly; Ray Train restarts a failed
    worker group up to `max_failures` times from the latest one. A step whose loss or
    gradient is not finite is rejected (no update); `max_rejected_steps` rejections in a
    row stop the trial with `NonFiniteError`.

    Optimisation: AdamW (`optimizer`) at peak `learning_rate` on the `schedule`; gradients
    clipped to global norm `max_grad_norm` (the pre-clip norm is reported). `precision`:
    "fp32" everywhere, or "bf16" autocast for the forward passes with fp32 master weights,
    fp32 optimizer state and fp32 loss reductions; "auto" is bf16 with GPUs and fp32 on
    CPUs (resolved value recorded in the manifest). `compile`: "on" compiles all of each
    block but the attention kernel with `torch.compile` (`embedlab.train.compiling`), "off" runs
    eager, "auto" compiles on GPUs only (on CPU it measured no faster).

    Length schedule (phase 1): `length_schedule` lists (budget fraction, sequence length)
    stages, e.g. ((0.9, 128), (0.1, 512)) for BERT's 90%/10%; lengths must divide
    `data.sequence_length`, at which rows are packed (usually the last stage's). A stage at a shorter length
    cuts each packed row into `data.sequence_length / length` rows (the step's tokens stay the
    same), so a stage switch changes what a step attends over, not the data order or budget.
    Empty: the whole phase at `data.sequence_length`.
    """

    budget: Budget = DEFAULT_BUDGET
    batch_rows: int = 16
    microbatches: int = 1
    learning_rate: float = 1e-3  # the peak; the schedule scales it
    weight_decay: float = 0.01
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    max_grad_norm: float = 1.0
    precision: str = "auto"
    compile: str = "auto"
    length_schedule: tuple[tuple[float, int], ...] = ()
    seed: int = 0
    num_workers: int = 2
    cpus_per_worker: float = 0.5
    use_gpu: bool = False
    report_every_steps: int = 10
    torch_threads: int = 1
    checkpoint_every_steps: int = 200
    max_failures: int = 2
    max_rejected_steps: int = 8

    def __post_init__(self) -> None:
        _check_positive(
            self, "train", "batch_rows", "microbatches", "learning_rate",
            "max_grad_norm", "num_workers", "cpus_per_worker", "report_every_steps", "torch_threads",
        )
        _check(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        _check(self.precision in PRECISIONS, "train.precision", f"{self.precision!r}; valid: {list(PRECISIONS)}")
        _check(self.compile in COMPILE_MODES, "train.compile", f"{self.compile!r}; valid: {list(COMPILE_MODES)}")
        if self.length_schedule:
            fractions = [fraction for fraction, _ in self.length_schedule]
            _check(all(f > 0 for f in fractions) and abs(sum(fractions) - 1.0) < 1e-6, "train.length_schedule",
                   f"budget fractions must be positive and sum to 1, got {fractions}")
            lengths = [length for _, length in self.length_schedule]
            _check(lengths == sorted(lengths) and all(length >= 8 for length in lengths), "train.length_schedule",
                   f"lengths must be >= 8 and non-decreasing, got {lengths}")
        _check(isinstance(self.budget, Budget), "train.budget", f"must be a Budget, got {type(self.budget).__name__}")
        _check(self.checkpoint_every_steps >= 0, "train.checkpoint_every_steps",
               "must be >= 0 (0: only the final checkpoint)")
        _check(self.max_failures >= 0, "train.max_failures", "must be >= 0 (0: no restart)")
        _check(self.max_rejected_steps >= 1, "train.max_rejected_steps", "must be >= 1")


# Promotion's retention margin when a study or tour stage names none: absolute, in metric
# points (0.10 lets a retention score end 0.10 below the parent's, not 10% below it).
DEFAULT_MAX_RETENTION_DROP = 0.05

POOLING_METHODS = ("mean", "cls")
GIVEN_MARGIN_WORDS = ("mining_margin", "off")
# Teachers whose scores phase 3 can distil (`embedlab.teacher.labels`); "" is none.
TEACHERS = ("all-MiniLM-L6-v2",)
# How a phase-2/3 batch draws its pairs: "mixed" (every batch mixes the builders by share) or
# "one-source" (every batch comes from one builder, batches scheduled so the shares hold).
BATCH_COMPOSITIONS = ("mixed", "one-source")
# Where a phase-2/3 encoder starts: the parent checkpoint's weights, or a fresh random
# initialisation of the same architecture (the parent then supplies only the tokenizer).
INITIALISATIONS = ("parent", "random")


@dataclass(frozen=True, kw_only=True)
class ContrastiveConfig:
    """Phases 2 and 3: contrastive training from a parent checkpoint.

    `pairs` gives shares of consumed *positive pairs* per pair builder (embedlab.pairs.builders).
    The loss is the multi-positive InfoNCE at `temperature` (a temperature: logits are
    divided by it), optionally learnable and optionally symmetric; candidates are gathered
    across workers when `gather_across_workers`. `gradcache_chunk` > 0 turns on GradCache
    with that many pairs per chunk (the same gradient, with or without a joint MLM term).
    `mlm_weight` > 0 makes the phase joint:
    mlm_weight * L_MLM + (1 - mlm_weight) * L_contrastive, with MLM on separately corrupted
    copies of the same texts. `hard_negatives` > 0 (phase 3) adds that many mined negatives
    per query, searched among the `mining_top_k` nearest training documents, dropping any
    that scores within `mining_margin` of (or above) the positive. A pair of a user source
    (`data.pair_files` ...) that carries negatives of its own gets those first, then mined ones
    fill its `hard_negatives` slots (`mine_negatives` False: given ones only). A given negative
    scoring above (positive score - `given_negative_margin`) under the parent encoder is
    dropped and counted, as a mined one would be: "mining_margin" (the default) uses
    `mining_margin`, a number >= 0 its own margin, "off" keeps every given negative. `query_prefix` / `passage_prefix` are prepended to the two sides and recorded.
    `batch_composition` (BATCH_COMPOSITIONS) says whether a batch mixes the builders or holds
    one builder's pairs; `init` (INITIALISATIONS) whether the encoder starts from the parent's
    weights or from a random initialisation of the same architecture.
    `matryoshka_dims` (increasing widths, each at most `model.width`) trains the contrastive
    loss at each listed width of the truncated, re-normalised embedding, weighted by
    `matryoshka_weights` (default 1 each; `embedlab.objectives.matryoshka`); empty: the full
    width alone. Only the listed widths are trained: list `model.width` to keep the full one.
    Distillation (phase 3 with negatives; `embedlab.objectives.distillation`): `teacher`
    (TEACHERS) scores every (query, candidate) of the scheduled pairs once, offline, with
    `teacher_query_prefix` / `teacher_passage_prefix`; `kl_weight` weighs KL distillation over
    each query's own positive and negatives (teacher scores / `kl_teacher_temperature`,
    student cosines / `kl_student_temperature`) and `margin_mse_weight` MarginMSE over its
    (positive, negative) margins. The InfoNCE keeps weight 1 - kl_weight - margin_mse_weight
    (0: distillation only). Rows whose teacher margin (positive minus best negative) is below
    `teacher_min_confidence` get no distillation label (None: every row keeps its label).
    `embedding_mse_weight` (phase 2 or 3) regresses the student's unit embedding of one
    unlabelled training-split document per scheduled pair onto the teacher's embedding of the
    same text, projected to the student's width by a fixed orthonormal projection when the
    widths differ (`embedlab.teacher.embeddings`); it too takes its weight from the
    InfoNCE's share.
    """

    pairs: tuple[tuple[str, float], ...] = (
        ("same-source-spans", 0.5), ("title-body", 0.3), ("term-definition", 0.2),
    )
    pair_length: int = 64
    temperature: float = 0.05
    learnable_temperature: bool = False
    symmetric: bool = False
    gather_across_workers: bool = True
    gradcache_chunk: int = 0
    mlm_weight: float = 0.0
    hard_negatives: int = 0
    mining_top_k: int = 100  # candidates searched per query when mining
    mining_margin: float = 0.05  # drop candidates scoring above (positive score - margin): likely false negatives
    mine_negatives: bool = True  # phase 3 with hard_negatives: mine from the corpus (else given negatives only)
    given_negative_margin: float | str = "mining_margin"  # a margin >= 0, "mining_margin" or "off"
    pooling: str = "mean"
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    continue_optimizer: bool = False
    batch_composition: str = "mixed"
    init: str = "parent"
    matryoshka_dims: tuple[int, ...] = ()
    matryoshka_weights: tuple[float, ...] = ()
    teacher: str = ""
    teacher_query_prefix: str = ""
    teacher_passage_prefix: str = ""
    kl_weight: float = 0.0
    margin_mse_weight: float = 0.0
    embedding_mse_weight: float = 0.0
    kl_student_temperature: float = 0.05
    kl_teacher_temperature: float = 0.05
    teacher_min_confidence: float | None = None

    def __post_init__(self) -> None:
        _check(self.teacher in ("", *TEACHERS), "contrastive.teacher", f"{self.teacher!r}; valid: {['', *TEACHERS]}")
        for name in ("kl_weight", "margin_mse_weight", "embedding_mse_weight"):
            _check(0.0 <= getattr(self, name) <= 1.0, f"contrastive.{name}", f"{getattr(self, name)}: must be in [0, 1]")
        _check(self.distillation_weight <= 1.0 + 1e-9, "contrastive.kl_weight",
               f"kl_weight + margin_mse_weight + embedding_mse_weight = {self.distillation_weight:g}: "
               "must be at most 1 (the InfoNCE keeps the rest)")
        if self.distillation_weight > 0:
            _check(bool(self.teacher), "contrastive.teacher",
                   "kl_weight / margin_mse_weight / embedding_mse_weight > 0 need a teacher to distil; "
                   f"valid: {list(TEACHERS)}")
        if self.score_distillation_weight > 0:
            _check(self.hard_negatives >= 1, "contrastive.hard_negatives",
                   "distillation scores each query's own positive and negatives: needs hard_negatives >= 1")
        _check(self.kl_student_temperature > 0 and self.kl_teacher_temperature > 0,
               "contrastive.kl_student_temperature", "both KL temperatures must be positive")
        _check(self.teacher_min_confidence is None or -2.0 <= self.teacher_min_confidence <= 2.0,
               "contrastive.teacher_min_confidence",
               f"{self.teacher_min_confidence}: a margin of cosines, in [-2, 2], or None")
        dims, weights = tuple(self.matryoshka_dims), tuple(self.matryoshka_weights)
        _check(all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
               and list(dims) == sorted(set(dims)), "contrastive.matryoshka_dims",
               f"{list(dims)}: positive integer widths in increasing order, each once")
        _check(not weights or (len(weights) == len(dims) and all(w > 0 for w in weights)),
               "contrastive.matryoshka_weights",
               f"{list(weights)}: one positive weight per width of matryoshka_dims {list(dims)} (or none: 1 each)")
        # JSON round trips give lists: the config's own form is a tuple.
        object.__setattr__(self, "matryoshka_dims", dims)
        object.__setattr__(self, "matryoshka_weights", weights)
        _check(self.batch_composition in BATCH_COMPOSITIONS, "contrastive.batch_composition",
               f"{self.batch_composition!r}; valid: {list(BATCH_COMPOSITIONS)}")
        _check(self.init in INITIALISATIONS, "contrastive.init", f"{self.init!r}; valid: {list(INITIALISATIONS)}")
        _check(bool(self.pairs), "contrastive.pairs", "needs at least one pair builder")
        total = sum(share for _, share in self.pairs)
        _check(abs(total - 1.0) < 1e-6, "contrastive.pairs", f"shares must sum to 1, got {total:.6f}")
        _check(self.pair_length >= 8, "contrastive.pair_length", "must be >= 8")
        _check(self.temperature > 0, "contrastive.temperature", "must be positive")
        _check(self.gradcache_chunk >= 0, "contrastive.gradcache_chunk", "must be >= 0")
        _check(0.0 <= self.mlm_weight < 1.0, "contrastive.mlm_weight", "must be in [0, 1)")
        _check(self.hard_negatives >= 0, "contrastive.hard_negatives", "must be >= 0")
        _check(self.mining_top_k >= max(self.hard_negatives, 1), "contrastive.mining_top_k",
               "must be at least hard_negatives")
        _check(self.mining_margin >= 0, "contrastive.mining_margin", "must be >= 0")
        margin = self.given_negative_margin
        _check(margin in GIVEN_MARGIN_WORDS or (isinstance(margin, int | float) and not isinstance(margin, bool)
                                                and margin >= 0), "contrastive.given_negative_margin",
               f"{margin!r}; valid: a number >= 0 or one of {list(GIVEN_MARGIN_WORDS)}")
        _check(self.pooling in POOLING_METHODS, "contrastive.pooling",
               f"{self.pooling!r}; valid: {list(POOLING_METHODS)}")
        _check(not self.continue_optimizer, "contrastive.continue_optimizer",
               "a changed objective is not an exact resume: optimizer state and schedule clocks reset")

    def trained_widths(self, width: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The widths the contrastive loss is computed at and their weights, for an encoder of
        `width`: `matryoshka_dims` (weights default 1), or the full width alone."""
        if not self.matryoshka_dims:
            return (width,), (1.0,)
        return self.matryoshka_dims, self.matryoshka_weights or (1.0,) * len(self.matryoshka_dims)

    @property
    def distillation_weight(self) -> float:
        """The distillation terms' total weight; the InfoNCE keeps 1 minus it."""
        return self.kl_weight + self.margin_mse_weight + self.embedding_mse_weight

    @property
    def score_distillation_weight(self) -> float:
        """The weight of the terms that read teacher labels (KL and MarginMSE: phase 3 with negatives)."""
        return self.kl_weight + self.margin_mse_weight

    @property
    def given_margin(self) -> float | None:
        """The false-negative margin applied to given negatives; None: they are kept as given."""
        margin = self.given_negative_margin
        if margin == "off":
            return None
        return self.mining_margin if margin == "mining_margin" else float(margin)


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How a trial is scored: the built-in retrieval task, on recipe-dev qrels only.

    `task` is the main task: a built-in task name or a BEIR directory, scored into the row's
    plain `<split>/...` columns. `tasks` (built-in names or BEIR directories) and `hub_tasks`
    (`embedlab.tasks.hub_tasks.HubTask`: a BEIR/MTEB-layout dataset pinned by revision)
    add a panel: every trial is then scored on the main task and each of these too, into
    `<task name>/<split>/...` columns for every task (the main one included) and their
    unweighted means `mean/<split>/...` (`embedlab.evaluate.panel`). Empty (the default): a
    single task, and rows, tables and records exactly as without panels. Task names (a
    directory's folder name, a built-in's or a Hub task's `name`) must be distinct, without
    "/", and not "mean". `dims` (increasing widths, each below `model.width`) scores the main
    task at each width too, on embeddings truncated to it and re-normalised, into
    `<split>/dim<width>/<metric>` columns and per-query values (a study metric can name one).
    """

    task: str = "python-docstrings"
    tasks: tuple[str, ...] = ()
    hub_tasks: tuple[HubTask, ...] = ()
    split: str = "dev"
    batch_size: int = 64
    max_length: int = 128
    index: str = "flat"  # Faiss index: exact "flat", or approximate "ivf" / "hnsw" for large corpora
    dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        dims = tuple(self.dims)
        _check(all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
               and list(dims) == sorted(set(dims)), "eval.dims",
               f"{list(dims)}: positive integer widths in increasing order, each once")
        object.__setattr__(self, "dims", dims)
        _check(self.split in ("dev", "test"), "eval.split", "must be 'dev' or 'test'")
        _check(self.index in ("flat", "ivf", "hnsw"), "eval.index", f"{self.index!r}; valid: flat, ivf, hnsw")
        _check_positive(self, "eval", "batch_size")
        _check(self.max_length >= 8, "eval.max_length", "must be >= 8")
        _check(isinstance(self.tasks, tuple) and all(isinstance(t, str) and t for t in self.tasks), "eval.tasks",
               f"must be a tuple of task names or BEIR directories, got {self.tasks!r}")
        _check(isinstance(self.hub_tasks, tuple) and all(isinstance(t, HubTask) for t in self.hub_tasks),
               "eval.hub_tasks", "must be a tuple of HubTask")
        if self.panel:
            try:
                check_task_names(self.task_names)
            except PanelError as error:
                raise ConfigError(f"eval.tasks: {error} (names: {list(self.task_names)})") from None

    @classmethod
    def from_file(cls, path: str | Path) -> EvalConfig:
        """An EvalConfig from a TOML or JSON file of its fields (a panel's tasks and Hub tasks)."""
        return build_config(cls, read_mapping_file(path), "eval")

    @property
    def panel(self) -> bool:
        """Whether the trial is scored on a panel of tasks (`tasks` or `hub_tasks` set)."""
        return bool(self.tasks or self.hub_tasks)

    @property
    def task_names(self) -> tuple[str, ...]:
        """The name of every task scored, the main task first, then `tasks`, then `hub_tasks`."""
        return (*map(task_name, (self.task, *self.tasks)), *(spec.name for spec in self.hub_tasks))


def task_name(task: str) -> str:
    """The name a task is loaded under (`beir.load_task`): a built-in's name, a BEIR directory's
    folder name (of its resolved path, so "." names the current folder)."""
    path = Path(task)
    return path.resolve().name if path.is_dir() else path.name


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
        _check(self.phase in (1, 2, 3), "phase", "must be 1, 2 or 3")
        # Phases 2-3 need a parent before they train; a study may supply it at sweep time.
        _check(self.parent is None or self.phase > 1 or self.extension, "parent",
               "phase 1 starts from scratch; continuing from a parent is an extension (extension=True)")
        _check(not self.extension or self.phase == 1, "extension", "continues phase 1 (MLM); phases 2-3 always "
               "start from a parent")
        _check(not (self.extension and self.masking.head_per_ratio), "extension",
               "continues the parent's single MLM head; one head per ratio is a phase-1 arm from scratch")
        _check(self.phase > 1 or self.train.budget.scope == "phase", "train.budget.scope",
               "'lineage' charges a parent's training to a phase-2 or phase-3 child; phase 1 counts its own")
        _check(self.phase == 1 or not self.train.length_schedule, "train.length_schedule",
               "belongs to phase 1 (pair lengths are contrastive.pair_length)")
        if self.train.length_schedule:
            lengths = [length for _, length in self.train.length_schedule]
            _check(all(self.data.sequence_length % length == 0 for length in lengths), "train.length_schedule",
                   f"lengths {lengths} must divide data.sequence_length={self.data.sequence_length}, "
                   "the length rows are packed at")
        _check(self.phase == 3 or self.contrastive.hard_negatives == 0, "contrastive.hard_negatives",
               "mined hard negatives belong to phase 3")
        _check(not self.eval.dims or self.eval.dims[-1] < self.model.width, "eval.dims",
               f"widths must be below model.width={self.model.width} (the full width is always scored), got "
               f"{list(self.eval.dims)}")
        _check(not self.contrastive.matryoshka_dims or self.contrastive.matryoshka_dims[-1] <= self.model.width,
               "contrastive.matryoshka_dims", f"widths must be at most model.width={self.model.width}, got "
               f"{list(self.contrastive.matryoshka_dims)}")
        _check(self.contrastive.mlm_weight == 0 or self.masking.strategy == "token", "masking.strategy",
               "the joint phase-2 MLM term masks pair texts token by token (they carry no word starts)")
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
        """Inverse of `to_dict`, for a mapping of any schema (`embedlab.core.schema.upgrade`);
        unknown keys are errors that name them."""
        return build_config(cls, upgrade(raw, "config"), "trial")


def build_config(kind: type, raw: dict[str, Any], section: str) -> Any:
    """A config dataclass `kind` from plain JSON-like values (`section` names it in errors); nested
    configs are built recursively, and unknown or missing keys are ConfigErrors that name them."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{section}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(kind)
    names = {f.name for f in dataclasses.fields(kind)}
    unknown = set(raw) - names
    if unknown:
        raise ConfigError(f"{section}: unknown keys {sorted(unknown)}; valid: {sorted(names)}")
    values = {}
    for key, value in raw.items():
        hint = hints[key]
        item_kind = _tuple_item_dataclass(hint)
        if dataclasses.is_dataclass(hint):
            values[key] = build_config(hint, value, f"{section}.{key}")
        elif item_kind is not None:
            values[key] = tuple(build_config(item_kind, v, f"{section}.{key}[{i}]") for i, v in enumerate(value))
        else:
            values[key] = _freeze(value)
    missing = sorted(f.name for f in dataclasses.fields(kind) if f.name not in values
                     and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ConfigError(f"{section}: missing required keys {missing}")
    return kind(**values)


def read_mapping_file(path: str | Path) -> dict[str, Any]:
    """A TOML (.toml) or JSON (.json) file's top-level mapping; ConfigError naming the file otherwise."""
    import tomllib

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            raw = tomllib.loads(text)
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(f"{path}: unsupported file type {path.suffix!r}; use .toml or .json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(raw).__name__}")
    return raw


def _tuple_item_dataclass(hint: Any) -> type | None:
    """X for a `tuple[X, ...]` hint whose X is a dataclass, else None."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def _freeze(value: Any) -> Any:
    """JSON lists back to the tuples the frozen configs hold."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
