"""Phase 3: in-batch negatives only vs two mined hard negatives per query (mined with the
parent encoder among training documents, false negatives dropped by a margin), at equal
measured training FLOPs: encoding two negatives a pair costs the mined arm two more texts per
pair, so it reads fewer pairs than the in-batch arm.

Mining-cost policy: mining is reported beside the budget, not inside it. It is one no-grad
pass of the parent encoder over the training documents and the scheduled queries, done once
per parent and pair set and shared by every seed of the mined arm; each trial records it as
`compute/mining_flops` and `compute/mining_seconds`, next to its training FLOPs.

Run:  embedlab sweep ablations/hard_negatives.py --parent PHASE2_CHECKPOINT_DIR [--profile demo]
"""

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase3_baseline(profile)
    control = recipes.derive(base, {"contrastive.negatives.count": 0})
    return Study(
        name="hard-negatives",
        factor="contrastive.negatives.count",
        arms={
            "in-batch": control,
            "mined-2": recipes.derive(base, {"contrastive.negatives.count": 2}),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=3, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Do mined hard negatives improve target retrieval over in-batch negatives alone?",
    )
