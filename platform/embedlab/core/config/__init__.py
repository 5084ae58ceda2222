"""Typed, frozen configs. Every default in embedlab lives in this package.

A run is described by one `TrialConfig` (model, masking, data, training, evaluation, and
phases 2-3's contrastive section); a study varies it through `dataclasses.replace` (or
`embedlab.recipes.derive` for a nested field). Validation happens at construction and errors
name the field and the allowed values. One module per section:

    checks        the field check, and configs built from JSON-like values (`build_config`)
    phases        the phases a trial can train and what each reads (`PHASES`, `phase_spec`)
    model         the encoder's shape and presets, phase 1's masking
    data          sources, dedup, splits, tokenizer, mixture and packing
    train         the budget and phase 1's optimisation
    contrastive   phases 2-3: the loss and batch, negatives, distillation, Matryoshka, prefixes
    evaluation    how a trial is scored; promotion's default retention margin
    trial         `TrialConfig`, the whole of one trial
    sources       document and pair sources beyond the built-in corpus
    tasks         Hub retrieval tasks and the panel's task names

This module re-exports every public name, so `from embedlab.core.config import X` reads any of them.
"""

from embedlab.core.config.checks import (
    build_config, check, check_fields, check_positive, check_seed, ConfigError, MAX_INTEGER, read_mapping_file,
    SEED_LIMIT,
)
from embedlab.core.config.model import (
    ATTENTION_PATHS, BACKBONES, MASKING_STRATEGIES, MaskingConfig, model_preset, MODEL_PRESETS, ModelConfig,
    REPLACEMENT_POLICY,
)
from embedlab.core.config.data import (
    DataConfig, MixtureConfig, PAIR_SOURCE_FIELDS, PRETRAINED_TOKENIZER, SAMPLING_SCHEDULES, TOKENIZER_KINDS,
)
from embedlab.core.config.train import (
    Budget, BUDGET_SCOPES, budget_unit_of, COMPILE_MODES, declared_amounts, DEFAULT_BUDGET, FUSED_MODES,
    GroupSettings, OptimizerConfig, PARAMETER_CATEGORIES, PRECISIONS, SCHEDULE_KINDS, ScheduleConfig,
    TrainConfig,
)
from embedlab.core.config.contrastive import (
    BATCH_COMPOSITIONS, ContrastiveConfig, DistillationConfig, GIVEN_MARGIN_WORDS, INITIALISATIONS,
    MatryoshkaConfig, NegativesConfig, POOLING_METHODS, PrefixConfig, TEACHERS,
)
from embedlab.core.config.evaluation import DEFAULT_MAX_RETENTION_DROP, EvalConfig, task_name
from embedlab.core.config.phases import PHASES, PhaseSpec, phase_spec
from embedlab.core.config.trial import TrialConfig
from embedlab.core.config.sources import (
    BEIRPairs, BUILDER_NAMES, ColumnMapping, ExternalSource, HFDataset, HFPairs, LocalFiles, PairFiles,
    PairSource, SourceError,
)
from embedlab.core.config.tasks import (
    check_fraction, check_task_names, HubTask, HubTaskError, MEAN, PanelError,
)

__all__ = [
    "PHASES", "PhaseSpec", "phase_spec",
    "ATTENTION_PATHS", "BACKBONES", "BATCH_COMPOSITIONS", "BEIRPairs", "Budget", "BUDGET_SCOPES", "budget_unit_of",
    "build_config", "BUILDER_NAMES", "check", "check_fields", "check_fraction", "check_positive", "check_seed",
    "check_task_names",
    "ColumnMapping", "COMPILE_MODES", "ConfigError", "ContrastiveConfig", "DataConfig", "declared_amounts",
    "DEFAULT_BUDGET", "DEFAULT_MAX_RETENTION_DROP", "DistillationConfig", "EvalConfig", "ExternalSource",
    "FUSED_MODES", "GIVEN_MARGIN_WORDS", "GroupSettings", "HFDataset", "HFPairs", "HubTask", "HubTaskError",
    "INITIALISATIONS", "LocalFiles", "MASKING_STRATEGIES", "MaskingConfig", "MatryoshkaConfig", "MEAN",
    "MAX_INTEGER", "MixtureConfig", "model_preset", "MODEL_PRESETS", "ModelConfig", "NegativesConfig", "OptimizerConfig",
    "PAIR_SOURCE_FIELDS", "PairFiles", "PairSource", "PanelError", "PARAMETER_CATEGORIES", "POOLING_METHODS",
    "PRECISIONS", "PRETRAINED_TOKENIZER", "PrefixConfig", "read_mapping_file", "REPLACEMENT_POLICY",
    "SAMPLING_SCHEDULES", "SCHEDULE_KINDS", "ScheduleConfig", "SEED_LIMIT", "SourceError", "task_name", "TEACHERS",
    "TOKENIZER_KINDS",
    "TrainConfig", "TrialConfig",
]
