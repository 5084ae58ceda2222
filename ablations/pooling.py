"""Pooling: mean over content tokens vs the CLS state, in phase-2 contrastive training at an
equal budget of positive pairs, from one phase-1 checkpoint.

Run:  embedlab sweep ablations/pooling.py --parent PHASE1_CHECKPOINT_DIR
"""

from dataclasses import replace

from embedlab import Study, recipes


def study() -> Study:
    base = recipes.phase2_baseline()
    return Study(
        name="pooling",
        factor="contrastive.pooling",
        arms={
            "mean": replace(base, contrastive=replace(base.contrastive, pooling="mean")),
            "cls": replace(base, contrastive=replace(base.contrastive, pooling="cls")),
        },
        seeds=(0, 1),
        budget_tokens=300_000,
        budget_pairs=2_000,
        metric="dev/ndcg@10",
        description="Is CLS pooling as good as mean pooling once the encoder is trained contrastively?",
    )
