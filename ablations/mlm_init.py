"""Phase 2 from the phase-1 MLM checkpoint vs from a random initialisation of the same
architecture, at equal total measured training FLOPs: does phase 1 pay for itself?

The budget is lineage-scoped: the total is the profile's phase-1 FLOPs budget plus 40% of its
phase-2 one (PHASE2_SHARE: the random-init arm reads phase 1's share in extra pairs, and the
share keeps them within the built-in corpus's repetition cap, data.mixture.max_epochs, which
the full phase-2 budget passed when the cpu profile's phase 2 was 100,000 pairs), and the
from-mlm arm is charged the parent's recorded phase-1 training FLOPs, so it trains the rest
in phase 2 while the random-init arm spends the whole total on phase 2. Tables match
the arms on budget/total_flops (inherited + phase-2) and show both parts. The parent supplies
only the tokenizer to the random-init arm; tokenizer training is not counted in either arm
(both share it). The random-init arm carries no MLM head, so its masked-token retention is
not measured.

Run:  embedlab sweep ablations/mlm_init.py --parent PHASE1_CHECKPOINT_DIR [--profile cpu]
"""

from dataclasses import replace

from embedlab import Study, recipes

PHASE2_SHARE = 0.4  # of the profile's phase-2 budget, for the from-mlm arm


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase2_baseline(profile)
    control = base  # contrastive.init = "parent"
    phase1 = recipes.budget_for(p, phase=1, control=recipes.phase1_baseline(profile)).flops
    phase2 = recipes.budget_for(p, phase=2, control=control)
    return Study(
        name="mlm-init",
        factor="contrastive.init",
        arms={
            "from-mlm": control,
            "random-init": replace(base, contrastive=replace(base.contrastive, init="random")),
        },
        seeds=p.seeds,
        budget=replace(phase2, pairs=round(PHASE2_SHARE * phase2.pairs), flops=phase1 + PHASE2_SHARE * phase2.flops,
                       scope="lineage"),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Does phase-1 MLM beat spending its compute on more phase-2 contrastive training from scratch?",
    )
