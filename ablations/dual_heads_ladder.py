"""Phase 1, a single 15% ratio vs 5% and 50% mixed 4:1 with a head per ratio (`dual_heads.py`),
with four seeds: the study sized for a budget ladder. The tour's answer at the `cpu` profile
(single 15% ahead) comes from two seeds; four give the calibrated test a chance to say
something at each rung. Rungs of 0.125, 0.25 and 0.5 of the budget span 4x compute and, with
four seeds, cost what the tour's two seeds at 0.25, 0.5 and 1 would; the top rung's winner is a
phase-1 parent at half the tour's budget.

Run:  embedlab sweep ablations/dual_heads_ladder.py --profile cpu --ladder 0.125,0.25,0.5
"""

from dataclasses import replace
from pathlib import Path

from embedlab import Study, recipes
from embedlab.sweep.study import load_study

SEEDS = (0, 1, 2, 3)


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    base = load_study(Path(__file__).with_name("dual_heads.py"), profile)
    return replace(base, name="dual-heads-4-seeds", seeds=SEEDS,
                   description=f"{base.description} ({len(SEEDS)} seeds, for a budget ladder)")
