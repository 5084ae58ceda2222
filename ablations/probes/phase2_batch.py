"""Probe of the cpu profile (recipe-dev only, one seed, no corrected test): phase-2 pairs a
step, 64 (the profile) vs 128 vs 256, at equal pairs, from the tour's phase-1 winner.

Run:  embedlab sweep ablations/probes/phase2_batch.py --profile cpu --parent PHASE1_WINNER
"""
from dataclasses import replace
from embedlab import Budget, Study, recipes

def study(profile: str = "cpu") -> Study:
    base = recipes.phase2_baseline(profile)
    rows = lambda v: replace(base, train=replace(base.train, batch_rows=v))
    return Study(
        name="phase2-probe-batch", factor="train.batch_rows",
        arms={"batch-64": base, "batch-128": rows(128), "batch-256": rows(256)},
        seeds=(1,), budget=Budget(tokens=3_000_000, pairs=100_000), metric="dev/ndcg@10", profile="cpu")
