"""The length extension: phase 1 continued from a phase-1 checkpoint at 4x its sequence length
(the recipe's 2,048-token stage on the full profile; 128 -> 512 on the CPU profiles), against the
control that continues for the same tokens at the parent's length. It is a stage of its own:
the parent is scored by the same evaluator when the run starts, and both arms are evaluated
with texts cut at the extended length.

Both arms read the same rows, packed at the long length; the control cuts every row into
four at the parent's length (`train.length_schedule`), so the arms consume the same tokens
in the same order and differ only in what each token attends over. The study is therefore
data-matched, not compute-matched: attending over 4x longer rows costs the extension more
attention FLOPs, and every table of it says by how much. What is compared is a use of the
same data, which is the question a length extension asks.

Run:  embedlab sweep ablations/length_extension.py --parent CKPT_DIR
      embedlab sweep ablations/length_extension.py --profile demo --parent CKPT_DIR
"""

from dataclasses import replace

from embedlab import Study, recipes

FACTOR = 4  # the extension's length over the parent's


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)
    # The recipe's 2,048 tokens on a GPU cluster; 4x the parent's length on a CPU.
    short, long = p.sequence_length, 2048 if p.use_gpu else p.sequence_length * FACTOR
    base = replace(
        base, extension=True, model=replace(base.model, max_length=long), eval=replace(base.eval, max_length=long),
        data=replace(base.data, sequence_length=long),
        # The same tokens per step as the parent's rows: a quarter of the rows, each 4x longer.
        train=replace(base.train, batch_rows=max(1, base.train.batch_rows * short // long)),
    )
    phase1 = recipes.budget_for(p, phase=1)
    return Study(
        name="length-extension",
        factor="train.length_schedule",
        arms={
            "continue": replace(base, train=replace(base.train, length_schedule=((1.0, short),))),
            "extend-4x": base,
        },
        seeds=p.seeds,
        # An eighth of phase 1's budget, as the recipe's extension is a short final stage.
        budget=replace(phase1, tokens=phase1.tokens // 8),
        metric="dev/ndcg@10",
        profile=p.name,
        description="Does a short stage at 4x the length help retrieval over continuing at the parent's length?",
    )
