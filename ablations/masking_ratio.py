"""Masking ratio: 5, 15, 30 and 50% of eligible tokens selected (80/10/10 replacement), at an
equal measured training FLOPs (a higher ratio's MLM head runs at more positions, so it reads
fewer tokens), with the learning rate tuned per arm by Optuna.

Run:  embedlab sweep ablations/masking_ratio.py                 (full: a GPU cluster)
      embedlab sweep ablations/masking_ratio.py --profile demo  (15 vs 30%, two seeds, CPU)
"""

from dataclasses import replace

from embedlab import Search, Study, recipes

RATIOS = {"mask-5": 0.05, "mask-15": 0.15, "mask-30": 0.30, "mask-50": 0.50}
TOUR = ("mask-15", "mask-30")


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)
    arms = {name: replace(base, masking=replace(base.masking, ratio=ratio))
            for name, ratio in RATIOS.items() if p.all_arms or name in TOUR}
    return Study(
        name="masking-ratio",
        factor="masking.ratio",
        arms=arms,
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=1, control=next(iter(arms.values()))),
        # A higher ratio changes the gradient's scale; each arm gets its own tuned rate.
        search=(Search("train.learning_rate", low=3e-4, high=3e-3, log=True),) if p.all_arms else (),
        search_trials=4 if p.all_arms else 0,
        metric="dev/ndcg@10",
        profile=p.name,
        description="Which masking ratio in phase 1 gives the best frozen-encoder retrieval?",
    )
