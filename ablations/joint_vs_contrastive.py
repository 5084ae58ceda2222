"""Phase 2: contrastive-only continuation vs joint MLM + contrastive (weights 0.3 / 0.7, MLM on
separately corrupted copies, contrastive on clean views), at an equal budget of positive pairs.

Run:  embedlab sweep ablations/joint_vs_contrastive.py --parent PHASE1_CHECKPOINT_DIR
"""

from dataclasses import replace

from embedlab import Study, recipes


def study() -> Study:
    base = recipes.phase2_baseline()
    return Study(
        name="joint-vs-contrastive",
        factor="contrastive.mlm_weight",
        arms={
            "contrastive-only": base,
            "joint-mlm-30": replace(base, contrastive=replace(base.contrastive, mlm_weight=0.3)),
        },
        seeds=(0, 1),
        budget_tokens=300_000,
        budget_pairs=2_000,
        metric="dev/ndcg@10",
        description="Does keeping an MLM term during contrastive pretraining help retrieval or retention?",
    )
