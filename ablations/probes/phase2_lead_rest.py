"""Probe of the cpu profile (recipe-dev only, one seed, no corrected test): phase-2 pairs with
the lead-rest builder (a text's opening summary -> the rest of it) at a fifth and a tenth of the
mixture, taken from same-source-spans, against the profile's mixture (0.5877 at seed 1 in the tour),
at equal pairs, from the tour's phase-1 winner.

Run:  embedlab sweep ablations/probes/phase2_lead_rest.py --profile cpu --parent PHASE1_WINNER
"""
from dataclasses import replace
from embedlab import Budget, Study, recipes

LEAD_REST = (("same-source-spans", 0.3), ("title-body", 0.3), ("term-definition", 0.2), ("lead-rest", 0.2))


def study(profile: str = "cpu") -> Study:
    base = recipes.phase2_baseline(profile)
    pairs = lambda shares: replace(base, contrastive=replace(base.contrastive, pairs=shares))
    return Study(
        name="phase2-probe-lead-rest", factor="contrastive.pairs",
        arms={"lead-rest-20": pairs(LEAD_REST),
              "lead-rest-10": pairs((("same-source-spans", 0.4), ("title-body", 0.3), ("term-definition", 0.2),
                                     ("lead-rest", 0.1)))},
        # One final-eval document (email.parser.BytesParser.__init__) is a near-duplicate of a
        # lead-rest positive (Parser.__init__'s body); this probe reads recipe-dev only.
        disclosed_overlap="probe only: one final-eval document near a lead-rest positive; no test score is computed",
        seeds=(1,), budget=Budget(tokens=3_000_000, pairs=100_000), metric="dev/ndcg@10", profile="cpu")
