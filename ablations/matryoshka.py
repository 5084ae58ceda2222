"""Matryoshka widths in phase 2: the InfoNCE term at the full width only, at nested widths
(a quarter, a half and the full width, weighted equally), or at a quarter of the width alone,
at equal measured training FLOPs (the nested arm's extra score matrices cost it a fraction of
a percent of its pairs). Every arm is scored at a quarter of the width too (`eval.dims`), and
that is the study metric: does training for a small embedding need the small width in the
loss, and what does it cost the full width (its nDCG@10 is reported beside)?

Run:  embedlab sweep ablations/matryoshka.py --parent PHASE1_CHECKPOINT_DIR [--profile cpu]
"""

from dataclasses import replace

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase2_baseline(profile)
    width = base.model.width
    quarter = width // 4
    base = replace(base, eval=replace(base.eval, dims=(quarter,)))
    control = recipes.derive(base, {"contrastive.matryoshka.dims": ()})
    return Study(
        name="matryoshka",
        factor="contrastive.matryoshka.dims",
        arms={
            "full": control,
            "nested": recipes.derive(base, {"contrastive.matryoshka.dims": (quarter, width // 2, width)}),
            "quarter": recipes.derive(base, {"contrastive.matryoshka.dims": (quarter,)}),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=2, control=control),
        metric=f"dev/dim{quarter}/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Does a small embedding need its width in the loss, and what does the full width pay?",
    )
