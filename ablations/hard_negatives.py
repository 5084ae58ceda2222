"""Phase 3: in-batch negatives only vs two mined hard negatives per query (mined with the
parent encoder among training documents, false negatives dropped by a margin), at an equal
budget of positive pairs.

Run:  embedlab sweep ablations/hard_negatives.py --parent PHASE2_CHECKPOINT_DIR [--profile demo]
"""

from dataclasses import replace

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase3_baseline(profile)
    return Study(
        name="hard-negatives",
        factor="contrastive.hard_negatives",
        arms={
            "in-batch": replace(base, contrastive=replace(base.contrastive, hard_negatives=0)),
            "mined-2": replace(base, contrastive=replace(base.contrastive, hard_negatives=2)),
        },
        seeds=p.seeds,
        **recipes.budget_for(p, phase=3),
        metric="dev/ndcg@10",
        profile=p.name,
        description="Do mined hard negatives improve target retrieval over in-batch negatives alone?",
    )
