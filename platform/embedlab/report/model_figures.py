"""Figures about what the models learned: per-source MLM training-loss curves (from the
trials' metrics.jsonl), positive/negative similarity distributions and covariance spectrum
(measured on each arm's best checkpoint)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedlab.report import measure
from embedlab.report.collect import Probe, Run
from embedlab.report.plotting import Caption, Figure, color, grid, hide_unused, new_figure, to_png

SOURCE_LOSS = re.compile(r"^train/(?:mlm_)?loss/source/(.+)$")  # per-source training loss, when logged
# Why an arm's metrics.jsonl may hold no train/loss/source/<name>, by phase (1, or 2 and 3).
UNLOGGED_REASON = {1: "logged before per-source MLM loss was, or by an objective that logs other groups",
                   2: "a contrastive phase: its MLM term, if any, is logged pooled as train/mlm_loss"}
REFERENCE_RATIO = 0.15  # the held-out markers' masking ratio (BERT's)
AXIS_PERCENTILE = 0.5  # similarity axes start at this percentile of all pairs: outliers would squash the bulk
SPECTRUM_FLOOR = 1e-6  # smaller eigenvalue shares fall off the spectrum axis


def _short(probe: Probe) -> str:
    return probe.label.replace(" / ", "/")


def _each(probes: list[Probe], measure_one: Callable[[Probe], Any]) -> tuple[list[tuple[Probe, Any]], list[str]]:
    """`measure_one` of every probe whose files are still there; the others, with the reason.
    Raises when none can be measured, so the report says why the figure is missing."""
    done, skipped = [], []
    for probe in probes:
        try:
            done.append((probe, measure_one(probe)))
        except (OSError, ValueError) as error:  # a prepared directory or checkpoint removed since the run
            skipped.append(f"{_short(probe)} ({type(error).__name__}: {error})")
    if skipped and not done:
        raise FileNotFoundError("no checkpoint could be measured: " + "; ".join(skipped))
    return done, skipped


def _not_measured(skipped: list[str]) -> str:
    return f" Not measured: {'; '.join(skipped)}." if skipped else ""


@dataclass(frozen=True)
class SourceCurve:
    """One arm's logged training MLM loss on one source: each seed's series and their mean."""

    run_label: str
    arm: str
    source: str
    seeds: tuple[int, ...]  # the arm's finished seeds whose log holds this source's loss
    steps: np.ndarray  # (P,) training steps every one of those seeds logged a finite value at
    tokens: np.ndarray  # (P,) mean over seeds of budget/tokens at those steps
    loss: np.ndarray  # (P,) mean over seeds of train/loss/source/<source> (nats per selected token)
    per_seed: dict[int, tuple[np.ndarray, np.ndarray]]  # seed -> (budget/tokens, loss), every finite point
    selected: np.ndarray  # (P,) mean over seeds of the source's selected tokens per point (nan if not logged)


def source_curves(run: Run) -> tuple[list[SourceCurve], list[str]]:
    """The run's per-source training-loss curves, arm by arm (in arm order, sources sorted),
    read from each finished trial's metrics.jsonl; and the arms none of whose logs hold a
    per-source loss (older runs, or objectives that log other groups)."""
    curves, unlogged = [], []
    final = run.final
    for arm in run.arms:
        logs = {int(row["seed"]): _by_step(run.logs.get(row["trial_id"], []))
                for row in final[final["arm"] == arm].to_dict("records")}
        sources = sorted({match.group(1) for log in logs.values() for report in log.values()
                          for key in report if (match := SOURCE_LOSS.match(key))})
        if not sources:
            unlogged.append(arm)
            continue
        for source in sources:
            series = {seed: _source_series(log, source) for seed, log in sorted(logs.items())}
            series = {seed: points for seed, points in series.items() if points}
            if not series:
                continue
            steps = sorted(set.intersection(*(set(points) for points in series.values())))

            def mean(column: int) -> np.ndarray:
                return np.array([np.mean([points[step][column] for points in series.values()]) for step in steps],
                                dtype=float)

            curves.append(SourceCurve(
                run_label=run.label, arm=arm, source=source, seeds=tuple(series), steps=np.array(steps),
                tokens=mean(0), loss=mean(1), selected=mean(2),
                per_seed={seed: (np.array([points[s][0] for s in sorted(points)], dtype=float),
                                 np.array([points[s][1] for s in sorted(points)], dtype=float))
                          for seed, points in series.items()}))
    return curves, unlogged


def _by_step(log: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Reports by training step; a step reported twice (replayed after a restart restored an
    earlier checkpoint) keeps its last report, the one the run continued from."""
    return {int(report["train/step"]): report for report in log if "train/step" in report}


def _source_series(log: dict[int, dict[str, Any]], source: str) -> dict[int, tuple[float, float, float]]:
    """step -> (tokens consumed, loss, selected tokens) where the source's loss is finite (a
    report window that selected none of the source's tokens logs nan)."""
    out = {}
    for step, report in log.items():
        key = next((k for k in (f"train/loss/source/{source}", f"train/mlm_loss/source/{source}") if k in report), None)
        if key is None or "budget/tokens" not in report or not np.isfinite(report[key]):
            continue
        selected = report.get(key.replace("loss/source/", "selected/source/"), np.nan)
        out[step] = (float(report["budget/tokens"]), float(report[key]), float(selected))
    return out


def mlm_figure(runs: list[Run], probes: list[Probe]) -> Figure | None:
    """Per-source training MLM loss against tokens consumed (one panel per run and source, one
    line per arm: mean over seeds, seeds thin), with each arm's best checkpoint's held-out
    loss on the source's dev documents as a marker at its final token count."""
    curves, unlogged = [], []
    for run in runs:
        found, missing = source_curves(run)
        curves += found
        if missing:
            unlogged.append(f"{run.label} / {', '.join(missing)} ({UNLOGGED_REASON[min(run.phase, 2)]})")
    if not curves:
        raise ValueError("no reported run logs a per-source MLM training loss (train/loss/source/<name> in "
                         "metrics.jsonl): " + "; ".join(unlogged))
    drawn = {curve.run_label for curve in curves}

    def score(probe: Probe):
        record = _prepared_record(runs, probe)
        sources = tuple(record["mixture"]["shares"]) if record and "mixture" in record else ()
        if not sources:
            return None
        rows = measure.heldout_rows(probe.prepared_dir, sources, record["sequence_length"])
        return measure.heldout_mlm_loss(probe.checkpoint, rows, probe.masking, ratios=(REFERENCE_RATIO,))

    try:
        done, skipped = _each([p for p in probes if p.run_label in drawn and p.row is not None], score)
    except FileNotFoundError as error:  # the curves come from the logs and still stand
        done, skipped = [], [str(error)]
    heldout = {(probe.run_label, probe.arm): (probe, losses[REFERENCE_RATIO]) for probe, losses in done
               if losses is not None}
    panels = list(dict.fromkeys((curve.run_label, curve.source) for curve in curves))
    rows_, cols = grid(len(panels), 4)
    figure, axes = new_figure(rows_, cols, height=2.6)
    arm_colors = {(run.label, arm): color(index) for run in runs for index, arm in enumerate(run.arms)}
    for ax, (run_label, source) in zip(axes.flat, panels):
        for curve in (c for c in curves if (c.run_label, c.source) == (run_label, source)):
            tint = arm_colors[(curve.run_label, curve.arm)]
            for tokens, loss in curve.per_seed.values():
                ax.plot(tokens, loss, color=tint, lw=0.6, alpha=0.35)
            ax.plot(curve.tokens, curve.loss, color=tint, lw=1.8, label=f"{curve.arm} (mean of {len(curve.seeds)})")
            marked = heldout.get((curve.run_label, curve.arm))
            if marked is not None and source in marked[1] and np.isfinite(marked[1][source].nats):
                probe, by_source = marked
                ax.plot([probe.row["budget/tokens"]], [by_source[source].nats], marker="D", ms=5, ls="none",
                        color=tint, markeredgecolor="black", label=f"{curve.arm} held-out")
        ax.set_title(f"{run_label}: {source}", fontsize=8)
        ax.set_xlabel("non-padding tokens consumed")
        ax.set_ylabel("nats/selected token")
        ax.legend(fontsize=5.5, loc="best")
    hide_unused(axes, len(panels))
    return Figure(
        key="mlm", title="Per-source MLM loss", png=to_png(figure),
        caption=Caption(
            units=("Cross-entropy in nats per selected (masked) token against non-padding training tokens "
                   "consumed (budget/tokens). Population: the selected tokens of each source in the steps between "
                   "two consecutive reports of every finished trial, as its metrics.jsonl logs them "
                   "(train/loss/source/<name>); one panel per run and source, one colour per arm: bold, the mean "
                   "over the arm's seeds at each step every seed logged; thin, each seed. Diamonds: each arm's best "
                   f"checkpoint on recipe-dev documents of that source, cut and packed like training text, "
                   f"{REFERENCE_RATIO:.0%} of ~{measure.HELDOUT_TARGETS / REFERENCE_RATIO:,.0f} tokens masked with "
                   "the arm's strategy (one seeded draw shared by every checkpoint; a dual-head checkpoint read "
                   "through its head trained nearest that ratio), at the trial's final token count."),
            observed=_curve_observation(curves, heldout),
            mechanism=("Each source's loss falls as the model learns the statistics it shares with the rest of the "
                       "mixture and those of its own text; sources whose text is more predictable (repeated "
                       "formats, boilerplate) sit lower, and a larger mixture share feeds a source more tokens. "
                       "A held-out diamond above the curve's end is text the model has not trained on; at a "
                       "masking ratio other than the arm's own, the context hidden differs as well."),
            limitation=("A point averages one report window, over a model that changed within it, and a small "
                        "source contributes few selected tokens per window, so its curve is noisy; the mean over "
                        "seeds keeps only the steps every seed logged. Training loss is on text being trained on, "
                        "not held out. "
                        + (f"No curve for arms whose logs hold no per-source loss: {'; '.join(unlogged)}. "
                           if unlogged else "")
                        + "Held-out diamonds are each arm's best seed only." + _not_measured(skipped)),
        ),
    )


def _prepared_record(runs: list[Run], probe: Probe) -> dict | None:
    for run in runs:
        if run.label == probe.run_label:
            return run.prepared.get(probe.arm if probe.arm in run.prepared else run.arms[0])
    return None


def _curve_observation(curves: list[SourceCurve], heldout: dict) -> str:
    """Per arm: its sources' mean curve from start to end, the sources it ends lowest and
    highest on, the points' selected-token counts, and the held-out range."""
    parts = []
    arms = dict.fromkeys((curve.run_label, curve.arm) for curve in curves)
    for run_label, arm in arms:
        mine = [curve for curve in curves if (curve.run_label, curve.arm) == (run_label, arm)]
        low = min(mine, key=lambda curve: curve.loss[-1])
        high = max(mine, key=lambda curve: curve.loss[-1])
        text = (f"{run_label} / {arm}, {len(mine)} sources: mean {np.mean([c.loss[0] for c in mine]):.2f} -> "
                f"{np.mean([c.loss[-1] for c in mine]):.2f} nats from {mine[0].tokens[0]:,.0f} to "
                f"{mine[0].tokens[-1]:,.0f} tokens ({len(mine[0].seeds)} seeds), ending lowest on {low.source} "
                f"({low.loss[-1]:.2f}) and highest on {high.source} ({high.loss[-1]:.2f})")
        selected = np.concatenate([curve.selected for curve in mine])
        if np.isfinite(selected).any():
            text += f"; {np.nanmedian(selected):,.0f} selected tokens per source and point (median)"
        marked = heldout.get((run_label, arm))
        if marked is not None:
            values = [marked[1][c.source] for c in mine if c.source in marked[1] and np.isfinite(marked[1][c.source].nats)]
            if values:
                text += (f"; held-out {min(v.nats for v in values):.2f}-{max(v.nats for v in values):.2f} nats "
                         f"(standard errors up to {max(v.standard_error for v in values):.2f})")
        parts.append(text)
    return "; ".join(parts) + "."


def similarity_figure(probes: list[Probe]) -> Figure | None:
    """Histograms of positive and negative query-document cosines, one panel per checkpoint."""
    if not probes:
        return None
    done, skipped = _each(probes, lambda probe: measure.pair_similarities(measure.probe_embeddings(probe)))
    measured = [(probe, *values) for probe, values in done]
    rows, cols = grid(len(measured), 4)
    figure, axes = new_figure(rows, cols, height=2.4)
    parts, drift = [], 0.0
    for ax, (probe, positive, negative, summary) in zip(axes.flat, measured):
        low = float(np.percentile(np.concatenate([positive, negative]), AXIS_PERCENTILE))
        bins = np.linspace(low, 1.0, 50)
        ax.hist(negative, bins=bins, density=True, color="#888888", alpha=0.6, label="negative")
        ax.hist(positive, bins=bins, density=True, histtype="step", lw=1.6, color=color(probe.phase), label="positive")
        pos, neg = summary["positive"]["mean"], summary["negative"]["mean"]
        ax.axvline(pos, color=color(probe.phase), lw=0.8)
        ax.axvline(neg, color="#444444", lw=0.8, ls="--")
        ax.set_title(f"{probe.run_label}\n{probe.label.rsplit(' / ', 1)[-1]}: pos {pos:.3f} / neg {neg:.3f}",
                     fontsize=7)
        ax.set_xlabel("cosine similarity")
        parts.append(f"{_short(probe)} positive {pos:.3f} vs negative {neg:.3f} (gap {pos - neg:+.3f})")
        if probe.row is not None and probe.row.get("dev/health/positive_similarity_mean") is not None:
            drift = max(drift, abs(pos - probe.row["dev/health/positive_similarity_mean"]))
    axes[0][0].set_ylabel("density")
    axes[0][0].legend(loc="upper left")
    hide_unused(axes, len(measured))
    first = measure.probe_embeddings(measured[0][0])
    positives = sum(len(p) for p in first.positives)
    return Figure(
        key="similarity", title="Positive vs negative similarity", png=to_png(figure),
        caption=Caption(
            units=(f"Cosine similarity (dimensionless, -1 to 1) of L2-normalised embeddings, as density "
                   f"histograms. Population: the {first.split} split of task {first.task}: "
                   f"{len(first.queries)} queries against {len(first.documents)} documents, {positives} "
                   f"judged-relevant (positive) pairs and all other pairs as negatives (at most "
                   f"{measure.PLOT_NEGATIVES:,} drawn); each arm's best checkpoint (and a run's parent). Each "
                   f"axis starts at the {AXIS_PERCENTILE}th percentile of that checkpoint's pairs; means use all."),
            observed="; ".join(parts) + f". Recomputed means match the trial rows within {drift:.1e}.",
            mechanism=("Contrastive training raises a positive's similarity relative to the other candidates "
                       "in the softmax, at the temperature's scale; ranking depends on the gap and overlap, not "
                       "on absolute level, so a high shared level (all pairs near 1) signals an anisotropic "
                       "cone in which small gaps decide the ranking."),
            limitation=("Unjudged pairs are counted as negatives although some are relevant (false negatives); "
                        "one task and the best seed per arm only; dev queries also drove selection, so the "
                        "winners' gaps are optimistic." + _not_measured(skipped)),
        ),
    )


def spectrum_figure(probes: list[Probe]) -> Figure | None:
    """Normalised eigenvalues of the document-embedding covariance, and its effective rank."""
    if not probes:
        return None
    done, skipped = _each(probes, lambda probe: measure.document_spectrum(measure.probe_embeddings(probe)))
    figure, axes = new_figure(1, 2, height=3.4, gridspec_kw={"width_ratios": [1.6, 1]})
    lines, bars = axes[0]
    ranks = {}
    for index, (probe, spectrum) in enumerate(done):
        spectrum = spectrum[spectrum > 0]
        ranks[_short(probe)] = (float(np.exp(-(spectrum * np.log(spectrum)).sum())), float(spectrum[0]))
        lines.plot(np.arange(1, len(spectrum) + 1), spectrum, color=color(index), label=_short(probe),
                   ls="-" if probe.row is not None else ":")
    lines.set_xscale("log")
    lines.set_yscale("log")
    lines.set_ylim(bottom=SPECTRUM_FLOOR)
    lines.set_xlabel("eigenvalue rank")
    lines.set_ylabel("share of total variance")
    lines.legend(fontsize=6)
    names = list(ranks)
    bars.barh(range(len(names)), [ranks[n][0] for n in names], color=[color(i) for i in range(len(names))])
    bars.set_yticks(range(len(names)), names, fontsize=7)
    bars.invert_yaxis()
    bars.set_xlabel("effective rank (exp of spectral entropy)")
    for y, name in enumerate(names):
        bars.text(ranks[name][0], y, f" {ranks[name][0]:.1f}", va="center", fontsize=7)
    dims = measure.probe_embeddings(done[0][0]).documents.shape
    low, high = min(names, key=lambda n: ranks[n][0]), max(names, key=lambda n: ranks[n][0])
    tops = [ranks[n][1] for n in names]
    return Figure(
        key="spectrum", title="Covariance spectrum of document embeddings", png=to_png(figure),
        caption=Caption(
            units=(f"Eigenvalues of the centred covariance of {dims[0]} dev-task document embeddings "
                   f"(d = {dims[1]}), each divided by their sum (share of variance, log axes), per reported "
                   "checkpoint (dotted: a parent); right, the effective rank exp(H) of that distribution."),
            observed=(f"Effective rank from {ranks[low][0]:.1f} ({low}) to {ranks[high][0]:.1f} ({high}) of "
                      f"{dims[1]} dimensions; the leading direction holds {min(tops):.0%} to {max(tops):.0%} "
                      "of the variance."),
            mechanism=("Objectives that reward spreading unrelated texts apart (uniformity in contrastive "
                       "training) flatten the spectrum; a representation dominated by a few shared directions "
                       "(frequency, length, source) shows a steep drop and a small effective rank, which limits "
                       "how many distinctions cosine ranking can make."),
            limitation=(f"With {dims[0]} documents at most min(N-1, d) eigenvalues are non-zero (shares below "
                        f"{SPECTRUM_FLOOR:g} fall off the axis), and one "
                        "task's documents are not a general corpus; centring removes the common direction, so "
                        "anisotropy (the shared offset) is reported by the similarity figure, not here."
                        + _not_measured(skipped)),
        ),
    )
