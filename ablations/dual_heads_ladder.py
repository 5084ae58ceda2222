"""Phase 1, a single 15% ratio vs 5% and 50% mixed 4:1 with a head per ratio (`dual_heads.py`),
with four seeds: the study sized for a budget ladder. The tour's answer at the `cpu` profile
(single 15% ahead) comes from two seeds; four give the calibrated test a chance to say
something at each rung. Rungs of 0.125, 0.25, 0.5 and 1 of the budget span 8x compute; the
top rung is the tour's own budget, so its winner is a phase-1 parent like the tour's. The
three lower rungs alone (`--ladder 0.125,0.25,0.5`, 4x) cost less than half as much.

Run:  embedlab sweep ablations/dual_heads_ladder.py --profile cpu --ladder 0.125,0.25,0.5,1
"""

from dataclasses import replace
from pathlib import Path

from embedlab import Study, recipes
from embedlab.studies.study import load_study

SEEDS = (0, 1, 2, 3)


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    base = load_study(Path(__file__).with_name("dual_heads.py"), profile)
    return replace(base, name="dual-heads-4-seeds", seeds=SEEDS,
                   description=f"{base.description} ({len(SEEDS)} seeds, for a budget ladder)")
