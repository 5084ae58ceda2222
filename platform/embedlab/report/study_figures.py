"""Figures over the trial tables: phase-by-phase retrieval and retention, quality vs runtime."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from embedlab.report.collect import Run
from embedlab.report.plotting import Caption, Figure, color, new_figure, to_png
from embedlab.stats.table import (
    CONFIDENCE, UnequalComputeError, check_equal_compute, ci_label, compute_match_line, summarize,
)

RETENTION = ("retention/probe_accuracy", "retention/similarity_spearman", "retention/mlm_accuracy")
MARKERS = "osD^vP*X"
FLOPS_COLUMNS = ("budget/flops", "budget/flops_estimate")  # older runs wrote an estimate under the second


def _metrics(runs: list[Run]) -> list[str]:
    """Each run's study metric, dev recall, and every retention score some trial or parent has."""
    wanted = list(dict.fromkeys([*(r.metric for r in runs), "dev/recall@100", *RETENTION]))

    def present(metric: str) -> bool:
        in_rows = any(metric in r.final and r.final[metric].notna().any() for r in runs)
        return in_rows or any((r.record.get("parent_scores") or {}).get(metric) is not None for r in runs)

    return [m for m in wanted if present(m)]


def _slots(runs: list[Run]) -> list[tuple[int, Run, str]]:
    """x position of every (run, "parent" or arm), runs left to right with a gap between them."""
    slots, x = [], 0
    for run in runs:
        if run.record.get("parent_scores"):
            slots.append((x, run, "parent"))
            x += 1
        for arm in run.arms:
            slots.append((x, run, arm))
            x += 1
        x += 1
    return slots


def phases_figure(runs: list[Run]) -> Figure | None:
    """Per metric: parent score, every seed, and the arm mean with its 95% interval, by phase."""
    runs = [r for r in runs if not r.final.empty]
    if not runs:
        return None
    metrics = _metrics(runs)
    # Each arm's own mean and interval are drawn whatever the compute; the caption names the
    # runs whose arms are not compute-equal, so their bars are not read as a comparison.
    summaries = {r.label: summarize(r.table, [m for m in metrics if m in r.table], confidence=CONFIDENCE,
                                    check_compute=False) for r in runs}
    unequal = _unequal_compute(runs)
    slots = _slots(runs)
    figure, axes = new_figure(len(metrics), 1, height=2.3)
    for ax, metric in zip(axes.flat, metrics):
        winners = []
        for x, run, arm in slots:
            if arm == "parent":
                value = run.record["parent_scores"].get(metric)
                if value is not None:
                    ax.scatter([x], [value], marker="D", color="black", zorder=3)
                continue
            values = run.final.loc[run.final["arm"] == arm, metric].astype(float) if metric in run.final else []
            ax.scatter([x] * len(values), values, s=12, color=color(run.arms.index(arm)), alpha=0.6)
            summary = summaries[run.label].set_index("arm")
            if arm in summary.index and f"{metric}:mean" in summary:
                mean, half = summary.loc[arm, f"{metric}:mean"], summary.loc[arm, f"{metric}:{ci_label(CONFIDENCE)}"]
                ax.errorbar([x], [mean], yerr=None if math.isnan(half) else [[half], [half]], fmt="_",
                            markersize=14, color=color(run.arms.index(arm)), capsize=3)
                if run.promotion and run.promotion["winner"]["arm"] == arm:
                    winners.append((x, mean))
        if len(winners) > 1:
            ax.plot(*zip(*winners), color="black", lw=0.8, ls=":", label="promoted arms' means")
            if ax is axes[0][0]:
                ax.legend(loc="best")
        ax.set_xticks([x for x, _, _ in slots], [arm for _, _, arm in slots], rotation=25, ha="right", fontsize=7)
        ax.set_xlim(-0.7, slots[-1][0] + 0.7)
        ax.set_ylabel(metric.replace("/", "/\n", 1), fontsize=8)
        if metric.startswith(("retention/", "dev/")):  # bounded scores: a wider interval is cut off
            low, high = ax.get_ylim()
            floor = -1.05 if "spearman" in metric else -0.05
            ax.set_ylim(max(low, floor), min(high, 1.05))
        for run in runs:
            xs = [x for x, r, _ in slots if r is run]
            ax.text(np.mean(xs), 1.01, run.label, transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=7)
    return Figure(
        key="phases", title="Phase-by-phase retrieval and retention", png=to_png(figure),
        caption=Caption(
            units=("Dev-split retrieval (nDCG@10, Recall@100; 0-1) on each study's task, and the fixed "
                   "retention panel from recipe-dev text: source-probe accuracy (fraction correct on held-out "
                   "passages), Spearman rho between cosine and graded pair relatedness, masked-token accuracy "
                   "(heads only). Dots: finished trials (one per seed); bars: arm mean with 95% Student-t "
                   "interval over seeds; diamonds: the run's parent under the same evaluator; runs in phase "
                   "order."),
            observed=_phase_observation(runs),
            mechanism=("Each phase starts from the previous phase's promoted checkpoint: contrastive phases "
                       "optimise the retrieval objective directly, and can overwrite what masked-language "
                       "modelling taught, which shows as retention below the parent's diamond (forgetting)."),
            limitation=("Few seeds make wide intervals (two seeds: t = 12.7 times the standard error), and these "
                        "seed-level intervals are uncorrected for the number of arms (the trial tables hold the "
                        "corrected paired test); the dev split chose the winners, so their dev scores are "
                        "optimistic; final-eval scores are not drawn; runs of different phases used different "
                        "budgets." + unequal),
        ),
    )


def _unequal_compute(runs: list[Run]) -> str:
    """A sentence naming the runs whose arms fail the equal-compute check ("" when none do)."""
    refused = []
    for run in runs:
        try:
            check_equal_compute(run.table, run.table.attrs["unit"])
        except UnequalComputeError as error:
            refused.append(f"{run.label} ({error})")
    return f" Not compute-equal, so not a comparison: {'; '.join(refused)}." if refused else ""


def _phase_observation(runs: list[Run]) -> str:
    parts = []
    for run in runs:
        means = run.final.groupby("arm")[run.metric].mean()
        best = means.idxmax()
        text = f"{run.label}: best arm {best} {run.metric} {means[best]:.3f}"
        parent = run.record.get("parent_scores") or {}
        if parent.get(run.metric) is not None:
            text += f" (parent {parent[run.metric]:.3f})"
        probe = "retention/probe_accuracy"
        if probe in run.final and parent.get(probe) is not None:
            text += (f", probe accuracy {run.final.loc[run.final['arm'] == best, probe].mean():.2f} vs parent "
                     f"{parent[probe]:.2f}")
        parts.append(text)
    return "; ".join(parts) + "."


def runtime_figure(runs: list[Run]) -> Figure | None:
    """Dev metric of every finished trial against its training wall seconds and FLOPs."""
    runs = [r for r in runs if not r.final.empty and "compute/wall_seconds" in r.final]
    if not runs:
        return None
    metric = runs[0].metric
    figure, axes = new_figure(1, 2, height=3.4)
    seconds_ax, flops_ax = axes[0]
    parts = []
    for index, run in enumerate(runs):
        final = run.final
        flops = _flops(final)
        for arm_index, arm in enumerate(run.arms):
            rows = final[final["arm"] == arm]
            if rows.empty:
                continue
            style = dict(color=color(index), marker=MARKERS[arm_index % len(MARKERS)], s=28,
                         label=f"{run.label} / {arm}")
            seconds_ax.scatter(rows["compute/wall_seconds"], rows[metric], **style)
            flops_ax.scatter(flops[rows.index], rows[metric], **style)
            parts.append(f"{run.label}/{arm} {rows[metric].mean():.3f} in {rows['compute/wall_seconds'].mean():.1f} s"
                         f" and {flops[rows.index].mean():.2g} FLOPs")
    seconds_ax.set_xlabel("training wall-clock seconds per trial")
    flops_ax.set_xlabel("measured training FLOPs per trial")
    flops_ax.set_xscale("log")
    flops_ax.xaxis.set_minor_formatter(NullFormatter())  # unlabelled minor ticks: no overlapping labels
    for ax in (seconds_ax, flops_ax):
        ax.set_ylabel(metric)
    flops_ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    matched = "; ".join(f"{run.label}: {line}" for run in runs if (line := compute_match_line(run.table)))
    return Figure(
        key="runtime", title="Quality vs runtime", png=to_png(figure),
        caption=Caption(
            units=(f"{metric} on the dev split (0-1) of every finished trial (one point per seed; colour: run, "
                   "marker: arm) against its measured training wall-clock seconds (left) and its measured "
                   "training FLOPs (right, log axis)."),
            observed="Arm means: " + "; ".join(parts) + "." + (f" Matched in: {matched}." if matched else ""),
            mechanism=("Within a study every arm consumes the same budget (measured FLOPs, or a declared data "
                       "unit), so at equal FLOPs an arm that computes more per pair or token (mined negatives "
                       "encoded alongside each pair, a joint MLM term, more masked positions) reads less data, "
                       "and wall-clock differences come from contention between trials running side by side "
                       "and from work the FLOPs leave out; FLOPs are every pass's matrix products at the shapes "
                       "it ran (embedlab.model.flops)."),
            limitation=("Wall seconds exclude evaluation and data preparation and are inflated by whatever else "
                        "shared the machine; FLOPs leave out element-wise work (norms, softmax, the optimizer) "
                        "and the evaluation's and mining's encodes; phases used different budgets, so "
                        "cross-phase points are not an equal-compute comparison."),
        ),
    )


def _flops(final: pd.DataFrame) -> pd.Series:
    values = pd.Series(np.nan, index=final.index)
    for column in FLOPS_COLUMNS:
        if column in final:
            values = values.fillna(final[column].astype(float))
    return values
