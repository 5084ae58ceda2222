"""Probe of the cpu profile (recipe-dev only, one seed, no corrected test): phase-3 pairs cut
at 64 tokens (the profile) vs 128 (what evaluation encodes), at equal pairs (the 128-token arm
costs about twice the FLOPs a pair), from the tour's phase-2 winner.

Run:  embedlab sweep ablations/probes/phase3_pair_length.py --profile cpu --parent PHASE2_WINNER
"""
from dataclasses import replace
from embedlab import Budget, Study, recipes

def study(profile: str = "cpu") -> Study:
    base = recipes.phase3_baseline(profile)
    control = recipes.derive(base, {"contrastive.negatives.count": 0})
    lr = lambda v: replace(control, train=replace(control.train, learning_rate=v))
    return Study(
        name="phase3-probe-len", factor="contrastive.pair_length",
        arms={"len-64": control, "len-128": replace(control, contrastive=replace(control.contrastive, pair_length=128))},
        seeds=(0,), budget=Budget(tokens=3_000_000, pairs=50_000), metric="dev/ndcg@10", profile="cpu")
