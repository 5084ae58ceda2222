"""Probe of the cpu profile (recipe-dev only, one seed): phase 2 of the 4-layer encoder at half
the profile's pairs (it costs about twice a pair, so about the profile's phase-2 time), 64 vs
128 pairs a step.

Run:  embedlab sweep ablations/probes/deeper_phase2.py --profile cpu --parent DEEPER_PHASE1_CHECKPOINT
"""
from dataclasses import replace
from embedlab import Budget, Study, recipes
from embedlab.core.config import ModelConfig
MODEL = ModelConfig(preset="custom", layers=4, width=128, heads=4, ffn_width=256, vocab_size=4096)

def study(profile: str = "cpu") -> Study:
    base = replace(recipes.phase2_baseline(profile), model=MODEL)
    return Study(name="p2-4l", factor="train.batch_rows", arms={"b64": base, "b128": replace(base, train=replace(base.train, batch_rows=128))}, seeds=(1,),
                 budget=Budget(tokens=3_000_000, pairs=50_000), metric="dev/ndcg@10", profile="cpu")
