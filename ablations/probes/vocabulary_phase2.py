"""Probe of the cpu profile (recipe-dev only, one seed): phase 2 after an 8,192-entry tokenizer
(PROBE_VOCAB, the phase-1 arm's vocabulary), at half the profile's pairs.

Run:  PROBE_VOCAB=8192 embedlab sweep ablations/probes/vocabulary_phase2.py --profile cpu --parent CKPT
"""
import os
from dataclasses import replace
from embedlab import Budget, Study, recipes
from embedlab.core.config import ModelConfig
MODEL = ModelConfig(preset="custom", layers=2, width=128, heads=4, ffn_width=256, vocab_size=16384)
VOCAB = int(os.environ.get("PROBE_VOCAB", "16384"))

def study(profile: str = "cpu") -> Study:
    base = recipes.phase2_baseline(profile)
    base = replace(base, model=MODEL, data=replace(base.data, tokenizer_vocab_size=VOCAB))
    return Study(name="p2-vocab", factor="contrastive.symmetric", seeds=(1,),
                 arms={"plain": base, "symmetric": replace(base, contrastive=replace(base.contrastive, symmetric=True))},
                 budget=Budget(tokens=3_000_000, pairs=50_000), metric="dev/ndcg@10", profile="cpu")
