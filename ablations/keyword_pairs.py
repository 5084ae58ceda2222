"""Phase 3: the profile's pair mixture vs the same mixture with a fifth of its pairs taken
from the keyword builder (one distinctive word of a training document -> the document's
opening), at equal measured training FLOPs, both on in-batch negatives.

Every other builder's query is a phrase: a heading, a lead, a span, a headword's synonyms.
A keyword query is what a search box gets, and what BM25 answers by the word alone. The
question is whether a lone term teaches the student to find the text that uses it, and at
what cost on the target task. `embedlab heldout score RUN/release` shows both sides per
held-out task, split into the queries whose words are in their document and the others.
The control is the in-batch arm of `hard_negatives.py` (the cpu tour's phase-3 winner).

Run:  embedlab sweep ablations/keyword_pairs.py --parent PHASE2_CHECKPOINT_DIR [--profile cpu]
"""

from dataclasses import replace

from embedlab import Study, recipes

KEYWORD_SHARE = 0.2


def with_keywords(pairs: tuple[tuple[str, float], ...], share: float) -> tuple[tuple[str, float], ...]:
    """The mixture with `share` of its pairs from the keyword builder, the others scaled down."""
    return (*((name, round(weight * (1.0 - share), 6)) for name, weight in pairs), ("keyword", share))


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase3_baseline(profile)
    control = recipes.derive(base, {"contrastive.negatives.count": 0})
    keywords = replace(control, contrastive=replace(
        control.contrastive, pairs=with_keywords(control.contrastive.pairs, KEYWORD_SHARE)))
    return Study(
        name="keyword-pairs",
        factor="contrastive.pairs",
        arms={"mixture": control, "with-keywords": keywords},
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=3, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Do single-word queries (a document's keyword -> the document) help beside the phrase pairs?",
    )
