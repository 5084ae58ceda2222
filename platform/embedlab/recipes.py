"""Base recipes that study files derive their arms from.

Sizes fit a 2-core CPU (a `small` 2-layer, width-128 encoder, about 10^5 tokens a trial);
a cluster study replaces the model preset and budget, nothing else.
"""

from __future__ import annotations

from embedlab.config import MODEL_PRESETS, DataConfig, MaskingConfig, TrainConfig, TrialConfig


def phase1_baseline() -> TrialConfig:
    """Phase-1 MLM at the recipe's pilot setting: 15% selection, 80/10/10 replacement."""
    return TrialConfig(
        model=MODEL_PRESETS["small"],
        masking=MaskingConfig(ratio=0.15),
        data=DataConfig(sequence_length=128),
        train=TrainConfig(batch_rows=8, learning_rate=1e-3),
    )
