"""Learning-rate schedule in phase 1: linear decay, cosine, and warmup-stable-decay (WSD) at
equal measured training FLOPs, each on the budget clock, with the peak learning rate and the
warmup share tuned per arm by Optuna (full profile).

Run:  embedlab sweep ablations/schedule.py                 (full: a GPU cluster)
      embedlab sweep ablations/schedule.py --profile demo  (linear vs WSD, two seeds, CPU)
"""

from dataclasses import replace

from embedlab import Search, Study, recipes

# Only the shape differs: every arm decays to 0 at the budget; WSD decays over the last 20%.
SCHEDULES = ("linear", "cosine", "wsd")
DEMO = ("linear", "wsd")


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)
    arms = {kind: replace(base, train=replace(base.train, schedule=replace(base.train.schedule, kind=kind)))
            for kind in SCHEDULES if p.all_arms or kind in DEMO}
    return Study(
        name="schedule",
        factor="train.schedule.kind",
        arms=arms,
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=1, control=next(iter(arms.values()))),
        # Each schedule has its own best peak and warmup; comparing them at one shared value
        # would measure the value, not the schedule.
        search=(
            Search("train.learning_rate", low=3e-4, high=3e-3, log=True),
            Search("train.schedule.warmup_fraction", low=0.02, high=0.2),
        ) if p.all_arms else (),
        search_trials=6 if p.all_arms else 0,
        metric="dev/ndcg@10",
        profile=p.name,
        description="Does the schedule's shape matter at equal tokens once each is tuned?",
    )
