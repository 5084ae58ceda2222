"""The three-phase baseline recipe as a tour: phase-1 MLM (a masking study with dual LM heads),
phase-2 broad contrastive pretraining (joint MLM+contrastive vs contrastive-only) and phase-3
supervised fine-tuning (mined hard negatives vs in-batch only). Each stage's winner on
recipe-dev is promoted into the next stage under a retention margin against its parent.

Run:  embedlab tour ablations/recipe.py                 (full: a GPU cluster)
      embedlab tour ablations/recipe.py --profile demo  (what `make demo` runs, on 2 CPU cores)
"""

from embedlab import Stage, Tour, recipes


def tour(profile: str = recipes.DEFAULT_PROFILE) -> Tour:
    return Tour(
        name="recipe",
        profile=recipes.profile(profile).name,
        stages=(
            Stage("dual_heads.py"),  # phase 1 starts from scratch: no parent to retain
            # Retention panel (source probe, graded-pair Spearman, masked-token accuracy)
            # may fall at most this far below the parent's, in absolute units.
            Stage("joint_vs_contrastive.py", max_retention_drop=0.10),
            Stage("hard_negatives.py", max_retention_drop=0.10),
        ),
        description="The recipe's three phases, each ablated once, winners promoted with lineage.",
    )
