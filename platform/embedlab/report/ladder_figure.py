"""The report's figure for a ladder: runs of one study at several budgets (`embedlab.stats.ladder`)."""

from __future__ import annotations

import numpy as np

from embedlab.stats.paired import final_trials
from embedlab.report.collect import Run
from embedlab.report.plotting import Caption, Figure, color, new_figure, to_png
from embedlab.stats.ladder import LadderError, ladder_tests, load_rungs, project, rung_winners, trends


def ladder_runs(runs: list[Run]) -> list[Run]:
    """The largest group of runs sharing arms, factor and metric (one study's rungs), if it has two
    or more; else none."""
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault((tuple(run.arms), run.study.get("factor"), run.metric), []).append(run)
    best = max(groups.values(), key=len, default=[])
    return best if len(best) >= 2 else []


def ladder_rungs(runs: list[Run]):
    """The rungs (`embedlab.stats.ladder.load_rungs`) of the report's ladder runs, or [] when
    they make none."""
    group = ladder_runs(runs)
    try:
        return load_rungs([run.directory for run in group]) if group else []
    except LadderError:
        return []


def ladder_figure(runs: list[Run]) -> Figure | None:
    """Left: each arm's paired difference from the control against training FLOPs (Holm-corrected
    intervals across arms x rungs), with its fitted trend and 95% band; right: every arm's mean
    study metric per rung."""
    rungs = ladder_rungs(runs)
    if not rungs:
        return None
    tests = ladder_tests(rungs)
    found = {trend.arm: trend for trend in trends(tests)}
    metric, control = rungs[0].table.attrs["metric"], rungs[0].table.attrs["arm_order"][0]
    figure, axes = new_figure(1, 2, height=3.4)
    diff_ax, mean_ax = axes[0]
    flops = np.array([rung.flops for rung in rungs])
    grid = np.geomspace(flops.min(), flops.max(), 50)
    for index, (arm, rows) in enumerate(tests.groupby("arm", sort=False), start=1):
        shown = rows[rows["ci_low"].notna()]
        diff_ax.errorbar(shown["flops"], shown["diff"], yerr=[shown["diff"] - shown["ci_low"],
                                                             shown["ci_high"] - shown["diff"]],
                         fmt="o", color=color(index), capsize=3, label=f"{arm} − {control}")
        if arm in found:
            at = [project(found[arm], f) for f in grid]
            diff_ax.plot(grid, [a["diff"] for a in at], color=color(index), lw=1)
            diff_ax.fill_between(grid, [a["low"] for a in at], [a["high"] for a in at], color=color(index), alpha=0.15)
    diff_ax.axhline(0, color="grey", lw=0.8)
    for index, arm in enumerate(rungs[0].table.attrs["arm_order"]):
        means = []
        for rung in rungs:
            final = final_trials(rung.table)
            means.append(final.loc[final["arm"] == arm, metric].astype(float).mean())
        mean_ax.plot(flops, means, marker="o", color=color(index), label=arm)
    for ax in (diff_ax, mean_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("measured training FLOPs per trial (the rung's control mean)")
    diff_ax.set_ylabel(f"{metric}: arm − {control}")
    mean_ax.set_ylabel(f"{metric}, mean over seeds")
    diff_ax.legend(fontsize=7)
    mean_ax.legend(fontsize=7)
    winners = rung_winners(rungs)
    readings = "; ".join(f"{arm}: {trend.reading}" for arm, trend in found.items())
    return Figure(
        key="ladder", title="Answers across budgets", png=to_png(figure),
        caption=Caption(
            units=(f"{metric} on the dev split (0-1) of {len(rungs)} runs of one study at {flops.min():.3g} to "
                   f"{flops.max():.3g} training FLOPs per trial (log axis); left, each arm minus the control with "
                   "its Holm-corrected interval across arms x rungs and the fitted line with its 95% band; right, "
                   "each arm's mean over its seeds."),
            observed=f"Best arm per rung, in budget order: {', '.join(winners)}. {readings or 'No arm has a trend.'}",
            mechanism=("Each rung is a full run at its own budget, arms compute-matched within it; the trend is a "
                       "least-squares line on log2 FLOPs, every rung weighing the same, its band from the rungs' own "
                       "variances."),
            limitation=("Few rungs and few seeds: the slope's interval holds its size in simulation at 2-4 seeds "
                        "(tests/test_ladder.py), and a line through two or three budgets says nothing about "
                        "curvature beyond them."),
        ),
    )
