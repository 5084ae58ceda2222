"""Masking ratio: 15% vs 30% of eligible tokens selected, at an equal non-padding-token budget.

Run:  embedlab sweep ablations/masking_ratio.py
"""

from dataclasses import replace

from embedlab import Study, recipes


def study() -> Study:
    base = recipes.phase1_baseline()
    return Study(
        name="masking-ratio",
        factor="masking.ratio",
        arms={
            "mask-15": replace(base, masking=replace(base.masking, ratio=0.15)),
            "mask-30": replace(base, masking=replace(base.masking, ratio=0.30)),
        },
        seeds=(0, 1),
        budget_tokens=300_000,
        metric="dev/ndcg@10",
        description="Does a higher masking ratio in phase 1 give better frozen-encoder retrieval?",
    )
