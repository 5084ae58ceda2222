"""Phase-1 data mixture: the recipe's pilot mixture vs one controlled change (the technical
family, where the target task lives, doubled from 20% to 40% of consumed non-padding tokens,
taken from general text), at equal measured training FLOPs.

Run:  embedlab sweep ablations/mixture.py [--profile demo]
"""

from dataclasses import replace

from embedlab import Study, recipes
from embedlab.sources.mixture import PHASE1_PILOT

MORE_TECHNICAL = {**PHASE1_PILOT, "general": 0.3, "technical": 0.4}


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)
    # The families mapped onto the profile's phase-1 sources (built-in, or its own documents).
    pilot = recipes.phase1_shares(p)
    changed = recipes.phase1_shares(p, MORE_TECHNICAL)

    def with_shares(shares: dict[str, float]):
        return replace(base, data=replace(base.data, mixture=replace(base.data.mixture, shares=tuple(sorted(shares.items())))))

    control = with_shares(pilot)
    return Study(
        name="mixture",
        factor="data.mixture.shares",
        arms={"pilot": control, "more-technical": with_shares(changed)},
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=1, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        description="Does extra technical text improve the target domain without damaging general probes?",
    )
