"""The length extension: phase 1 continued from a phase-1 checkpoint at 4x its sequence length
(the recipe's 2,048-token stage on the full profile; 128 -> 512 on the demo), against the
control that continues for the same tokens at the parent's length. It is a stage of its own:
the parent is scored by the same evaluator when the run starts, and both arms are evaluated
with texts cut at the extended length.

Run:  embedlab sweep ablations/length_extension.py --parent CKPT_DIR
      embedlab sweep ablations/length_extension.py --profile demo --parent CKPT_DIR
"""

from dataclasses import replace

from embedlab import Study, recipes

EXTENDED = {"demo": 512, "full": 2048}


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)
    long = EXTENDED[p.name]
    # Both arms may read long texts (model and evaluation limits); only the training length differs.
    base = replace(base, extension=True, model=replace(base.model, max_length=long),
                   eval=replace(base.eval, max_length=long))
    return Study(
        name="length-extension",
        factor="data.sequence_length",
        arms={
            "continue": base,
            "extend-4x": replace(base, data=replace(base.data, sequence_length=long)),
        },
        seeds=p.seeds,
        # An eighth of phase 1's budget, as the recipe's extension is a short final stage.
        budget_tokens=recipes.budget_for(p, phase=1)["budget_tokens"] // 8,
        metric="dev/ndcg@10",
        profile=p.name,
        description="Does a short stage at 4x the length help retrieval over continuing at the parent's length?",
    )
