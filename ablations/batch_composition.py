"""Phase 2: batches that mix the pair builders by share (control) vs batches that each hold
one builder's pairs, as Contrastors and FlagEmbedding build them, at equal measured training
FLOPs. In a one-source batch the in-batch negatives come from the same builder as the
positive, so they are harder to tell apart than negatives of another kind of text; the
question is whether that helps retrieval. One-source steps are scheduled by the deficit rule
over whole steps, so both arms consume the same builder shares of pairs (to within a step)
and read each builder's pairs in the same order; only how they meet in a batch differs.
Pairs cost the same in both arms up to their text lengths, so the arms read about as many.

Run:  embedlab sweep ablations/batch_composition.py --parent PHASE1_CHECKPOINT_DIR [--profile cpu]
"""

from dataclasses import replace

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase2_baseline(profile)
    control = replace(base, contrastive=replace(base.contrastive, batch_composition="mixed"))
    return Study(
        name="batch-composition",
        factor="contrastive.batch_composition",
        arms={
            "mixed": control,
            "one-source": replace(base, contrastive=replace(base.contrastive, batch_composition="one-source")),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=2, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Do one-source batches (same-builder in-batch negatives) beat batches mixed by share?",
    )
