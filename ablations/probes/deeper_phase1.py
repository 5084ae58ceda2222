"""Probe of the cpu profile (recipe-dev only, one seed): a 4-layer encoder (width 128) against
the same 2-layer shape, phase 1 at the profile's 3x10^6 tokens. Phase 2 follows in
`deeper_phase2.py` from the 4-layer checkpoint.

Run:  embedlab sweep ablations/probes/deeper_phase1.py --profile cpu
"""
from dataclasses import replace
from embedlab import Study, recipes
from embedlab.core.config import DEFAULT_BUDGET, ModelConfig
MODEL = ModelConfig(preset="custom", layers=4, width=128, heads=4, ffn_width=256, vocab_size=4096)

def study(profile: str = "cpu") -> Study:
    base = replace(recipes.phase1_baseline(profile), model=MODEL)
    return Study(name="p1-4l", factor="model.layers", arms={"4l": base, "2l": replace(base, model=replace(MODEL, layers=2))}, seeds=(1,),
                 budget=replace(DEFAULT_BUDGET, tokens=3_000_000), metric="dev/ndcg@10", profile="cpu")
