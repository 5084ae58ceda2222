"""Probe of the cpu profile (recipe-dev only, one seed): tokenizer vocabularies of 8,192 and
16,384 entries (embedding table of 16,384 rows in both), phase 1 at the profile's tokens.
Phase 2 follows in `vocabulary_phase2.py`.

Run:  embedlab sweep ablations/probes/vocabulary_phase1.py --profile cpu
"""
from dataclasses import replace
from embedlab import Study, recipes
from embedlab.core.config import DEFAULT_BUDGET, ModelConfig
MODEL = ModelConfig(preset="custom", layers=2, width=128, heads=4, ffn_width=256, vocab_size=16384)

def study(profile: str = "cpu") -> Study:
    base = replace(recipes.phase1_baseline(profile), model=MODEL)
    vocab = lambda v: replace(base, data=replace(base.data, tokenizer_vocab_size=v))
    return Study(name="p1-vocab", factor="data.tokenizer_vocab_size", arms={"v8192": vocab(8192), "v16384": vocab(16384)},
                 seeds=(1,), budget=replace(DEFAULT_BUDGET, tokens=3_000_000), metric="dev/ndcg@10", profile="cpu")
