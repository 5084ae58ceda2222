"""Phase 2: contrastive-only continuation vs joint MLM + contrastive (weights 0.3 / 0.7, MLM on
separately corrupted copies, contrastive on clean views), at equal measured training FLOPs: the
joint arm's MLM pass over corrupted copies of every pair costs about as much again, so it reads
fewer pairs than contrastive-only within the same compute.

Run:  embedlab sweep ablations/joint_vs_contrastive.py --parent PHASE1_CHECKPOINT_DIR [--profile demo]
"""

from dataclasses import replace

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase2_baseline(profile)
    control = base
    return Study(
        name="joint-vs-contrastive",
        factor="contrastive.mlm_weight",
        arms={
            "contrastive-only": control,
            "joint-mlm-30": replace(base, contrastive=replace(base.contrastive, mlm_weight=0.3)),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=2, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Does keeping an MLM term during contrastive pretraining help retrieval or retention?",
    )
