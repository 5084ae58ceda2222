"""Probe of the cpu profile (recipe-dev only, one seed, no corrected test): phase-2 loss
direction and temperature against the profile (query->document at 0.05, 0.5877 at seed 1 in
the tour): symmetric (document->query added) and temperature 0.03, at equal pairs, from the
tour's phase-1 winner.

Run:  embedlab sweep ablations/probes/phase2_loss.py --profile cpu --parent PHASE1_WINNER
"""
from dataclasses import replace
from embedlab import Budget, Study, recipes

def study(profile: str = "cpu") -> Study:
    base = recipes.phase2_baseline(profile)
    return Study(
        name="phase2-probe-loss", factor="contrastive",
        arms={"symmetric": replace(base, contrastive=replace(base.contrastive, symmetric=True)),
              "temperature-003": replace(base, contrastive=replace(base.contrastive, temperature=0.03))},
        seeds=(1,), budget=Budget(tokens=3_000_000, pairs=100_000), metric="dev/ndcg@10", profile="cpu")
