"""Phase 3, in-batch vs two mined hard negatives (`hard_negatives.py`), with four seeds: the
study sized for a budget ladder. At the `cpu` profile the tour's two seeds would need four to
detect its observed difference (its seeds-needed column), and a ladder's smaller rungs cost
less per trial, so rungs of 0.125, 0.25 and 0.5 of the budget with four seeds cost what rungs
of 0.25, 0.5 and 1 with two seeds do.

Run:  embedlab sweep ablations/hard_negatives_ladder.py --parent PHASE2_CHECKPOINT_DIR \\
          --profile cpu --ladder 0.125,0.25,0.5
"""

from dataclasses import replace
from pathlib import Path

from embedlab import Study, recipes
from embedlab.studies.study import load_study

SEEDS = (0, 1, 2, 3)


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    base = load_study(Path(__file__).with_name("hard_negatives.py"), profile)
    return replace(base, name="hard-negatives-4-seeds", seeds=SEEDS,
                   description=f"{base.description} ({len(SEEDS)} seeds, for a budget ladder)")
