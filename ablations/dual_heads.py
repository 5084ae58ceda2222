"""Dual LM heads: 5% and 50% masking mixed 4:1 in every batch, one shared head vs one head per
ratio, against a single-ratio arm, at an equal non-padding-token budget.

Run:  embedlab sweep ablations/dual_heads.py
"""

from dataclasses import replace

from embedlab import Study, recipes

MIXED = ((0.05, 4), (0.5, 1))


def study() -> Study:
    base = recipes.phase1_baseline()
    return Study(
        name="dual-heads",
        factor="masking",
        arms={
            # The single-ratio reference: set it to the masking-ratio study's winner.
            "single-15": base,
            "mixed-shared-head": replace(base, masking=replace(base.masking, mixed_ratios=MIXED)),
            "mixed-dual-heads": replace(base, masking=replace(base.masking, mixed_ratios=MIXED, head_per_ratio=True)),
        },
        seeds=(0, 1),
        budget_tokens=300_000,
        metric="dev/ndcg@10",
        description="Do ratio-specific LM heads recover both regimes that a shared head mixes?",
    )
