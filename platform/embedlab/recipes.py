"""Base recipes that study files derive their arms from.

Sizes fit a 2-core CPU (a `small` 2-layer, width-128 encoder, about 10^5 tokens a trial);
a cluster study replaces the model preset and budget, nothing else.
"""

from __future__ import annotations

import dataclasses

from embedlab.config import MODEL_PRESETS, ContrastiveConfig, DataConfig, MaskingConfig, TrainConfig, TrialConfig


def phase1_baseline() -> TrialConfig:
    """Phase-1 MLM at the recipe's pilot setting: 15% selection, 80/10/10 replacement."""
    return TrialConfig(
        model=MODEL_PRESETS["small"],
        masking=MaskingConfig(ratio=0.15),
        data=DataConfig(sequence_length=128),
        train=TrainConfig(batch_rows=8, learning_rate=1e-3),
    )


def phase2_baseline() -> TrialConfig:
    """Phase-2 broad contrastive pretraining from a phase-1 checkpoint (given at sweep time):
    the recipe's pilot pair mixture mapped onto the built-in builders, mean pooling,
    temperature 0.05, candidates gathered across workers."""
    base = phase1_baseline()
    return dataclasses.replace(
        base,
        phase=2,
        contrastive=ContrastiveConfig(
            pairs=(("same-source-spans", 0.5), ("title-body", 0.3), ("term-definition", 0.2)),
            pair_length=64,
            temperature=0.05,
        ),
        train=dataclasses.replace(base.train, batch_rows=16, learning_rate=2e-4),
    )

