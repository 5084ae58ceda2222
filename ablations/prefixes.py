"""Phase 2: the recipe's `query: ` / `passage: ` prefixes vs no prefixes, at equal measured
training FLOPs.

Phase 2 is where a lineage first meets pairs, so the comparison starts from a parent that
has seen no prefix either way. A trial's prefixes are recorded in its checkpoint and used
again, exactly, when it is evaluated and released. The factor is the `contrastive` section;
the arms differ in `query_prefix` and `passage_prefix` only (the study's table names them).
The prefixed arm's texts are a few tokens longer, so at equal FLOPs it reads slightly fewer
pairs.

Run:  embedlab sweep ablations/prefixes.py --parent PHASE1_CHECKPOINT_DIR [--profile cpu]
"""

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase2_baseline(profile)
    control = recipes.derive(base, {"contrastive.prefixes.query": "query: ", "contrastive.prefixes.passage": "passage: "})
    return Study(
        name="prefixes",
        factor="contrastive",
        arms={
            "query-passage": control,
            "none": recipes.derive(base, {"contrastive.prefixes.query": "", "contrastive.prefixes.passage": ""}),
        },
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=2, control=control),
        metric="dev/ndcg@10",
        profile=p.name,
        disclosed_overlap=p.disclosed_overlap,  # what the audit finds in this profile's pairs, if anything
        description="Do the recipe's query/passage prefixes help on development data?",
    )
