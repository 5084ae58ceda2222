"""Pooling: mean over content tokens vs the CLS state, in phase-2 contrastive training at
equal measured training FLOPs (both poolings cost the same, so the arms also read the same
pairs), from one phase-1 checkpoint.

Run:  embedlab sweep ablations/pooling.py --parent PHASE1_CHECKPOINT_DIR [--profile demo]
"""

from dataclasses import replace

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase2_baseline(profile)
    control = replace(base, contrastive=replace(base.contrastive, pooling="mean"))
    return Study(
        name="pooling",
        factor="contrastive.pooling",
        arms={
            "mean": control,
            "cls": replace(base, contrastive=replace(base.contrastive, pooling="cls")),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=2, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Is CLS pooling as good as mean pooling once the encoder is trained contrastively?",
    )
