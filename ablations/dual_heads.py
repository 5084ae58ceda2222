"""Dual LM heads: 5% and 50% masking mixed 4:1 in every batch, one shared head vs one head per
ratio, against a single 15% ratio, at equal measured training FLOPs (the arms' heads run at
different numbers of positions: 14% of them expected for the 4:1 mix, 15% for the single ratio).

Run:  embedlab sweep ablations/dual_heads.py [--profile demo]
"""

from dataclasses import replace

from embedlab import Study, recipes

MIXED = ((0.05, 4), (0.5, 1))
# The single-ratio reference: a fixed hypothesis, BERT's 15%, not a ratio promoted by the
# masking-ratio study (the tour does not run that study first).
BEST_SINGLE_RATIO = 0.15
TOUR = ("single-15", "mixed-dual-heads")


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)
    single = replace(base, masking=replace(base.masking, ratio=BEST_SINGLE_RATIO))
    arms = {
        f"single-{round(BEST_SINGLE_RATIO * 100)}": single,
        "mixed-shared-head": replace(base, masking=replace(base.masking, mixed_ratios=MIXED)),
        "mixed-dual-heads": replace(base, masking=replace(base.masking, mixed_ratios=MIXED, head_per_ratio=True)),
    }
    return Study(
        name="dual-heads",
        factor="masking",
        arms={name: config for name, config in arms.items() if p.all_arms or name in TOUR},
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=1, control=single),
        metric="dev/ndcg@10",
        profile=p.name,
        description="Do ratio-specific LM heads recover both regimes that a shared head mixes?",
    )
