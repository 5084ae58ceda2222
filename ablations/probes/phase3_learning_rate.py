"""Probe of the cpu profile (recipe-dev only, one seed, no corrected test): phase 3's peak
learning rate, 2e-4 (the profile) vs 5e-4, at equal pairs, from the tour's phase-2 winner.

Run:  embedlab sweep ablations/probes/phase3_learning_rate.py --profile cpu --parent PHASE2_WINNER
"""
from dataclasses import replace
from embedlab import Budget, Study, recipes

def study(profile: str = "cpu") -> Study:
    base = recipes.phase3_baseline(profile)
    control = recipes.derive(base, {"contrastive.negatives.count": 0})
    lr = lambda v: replace(control, train=replace(control.train, learning_rate=v))
    return Study(
        name="phase3-probe", factor="train.learning_rate",
        arms={"lr-2e-4": control, "lr-5e-4": lr(5e-4)},
        seeds=(0,), budget=Budget(tokens=3_000_000, pairs=50_000), metric="dev/ndcg@10", profile="cpu")
