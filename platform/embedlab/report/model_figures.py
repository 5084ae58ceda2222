"""Figures about what the checkpoints learned: per-source MLM loss, positive/negative
similarity distributions, covariance spectrum. Measured on each arm's best checkpoint."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from embedlab.report import measure
from embedlab.report.collect import Probe, Run
from embedlab.report.plotting import Caption, Figure, color, grid, hide_unused, new_figure, to_png

SOURCE_LOSS = re.compile(r"^train/(?:mlm_)?loss/source/(.+)$")  # per-source training loss, when logged
POOLED_LOSS = {1: "train/loss", 2: "train/mlm_loss", 3: "train/mlm_loss"}  # the MLM term per phase
REFERENCE_RATIO = 0.15
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


def mlm_figure(runs: list[Run], probes: list[Probe]) -> Figure | None:
    """Held-out MLM loss per source against masking ratio, and the logged training MLM loss."""

    def score(probe: Probe):
        record = _prepared_record(runs, probe)
        sources = tuple(record["mixture"]["shares"]) if record and "mixture" in record else ()
        if not sources:
            return None
        rows = measure.heldout_rows(probe.prepared_dir, sources, record["sequence_length"])
        return measure.heldout_mlm_loss(probe.checkpoint, rows, probe.masking)

    done, skipped = _each(probes, score)
    scored = [(probe, losses) for probe, losses in done if losses is not None]
    curves = _training_curves(runs)
    if not scored and not curves:
        return None
    sources = sorted({s for _, losses in scored for s in losses[measure.MLM_RATIOS[0]]})
    rows_, cols = grid(len(sources) + 1, 4)
    figure, axes = new_figure(rows_, cols, height=2.3)
    for ax, source in zip(axes.flat, sources):
        for index, (probe, losses) in enumerate(scored):
            ax.plot(measure.MLM_RATIOS, [losses[r][source].nats for r in measure.MLM_RATIOS], marker="o",
                    color=color(index), label=_short(probe))
        ax.set_title(source, fontsize=8)
        ax.set_xticks(measure.MLM_RATIOS, [f"{r:.0%}" for r in measure.MLM_RATIOS])
        ax.set_xlabel("masking ratio")
        ax.set_ylabel("held-out nats/token")
    training = axes.flat[len(sources)]
    per_source_logged = any(SOURCE_LOSS.match(key) for _, _, key, _ in curves)
    for index, (label, tokens, key, losses) in enumerate(curves):
        training.plot(tokens, losses, color=color(index), lw=1, label=label)
    training.set_title(f"training {', '.join(sorted({k for _, _, k, _ in curves})) or 'MLM loss'} "
                       "(metrics.jsonl)", fontsize=8)
    training.set_xlabel("non-padding tokens consumed")
    training.set_ylabel("nats/selected token")
    if curves:
        training.legend(fontsize=5.5, loc="best")
    else:
        training.text(0.5, 0.5, "no training log holds\nan MLM loss", ha="center", va="center",
                      transform=training.transAxes)
    hide_unused(axes, len(sources) + 1)
    if scored:
        figure.legend(*axes.flat[0].get_legend_handles_labels(), loc="outside upper center", ncol=3, fontsize=7)
    return Figure(
        key="mlm", title="Per-source MLM loss", png=to_png(figure),
        caption=Caption(
            units=("Cross-entropy in nats per selected (masked) token. Source panels: held-out loss on "
                   "recipe-dev documents of each source, cut and packed like training text; at ratio r the first "
                   f"~{measure.HELDOUT_TARGETS}/r tokens are masked with the arm's strategy (about "
                   f"{measure.HELDOUT_TARGETS} scored tokens per point, one seeded draw shared by every "
                   "checkpoint), for each reported checkpoint that carries an MLM head (each arm's best seed). "
                   "Last panel: the pooled training MLM loss of every logged report against tokens consumed."),
            observed=_mlm_observation(scored, curves),
            mechanism=("A higher ratio hides more of each token's context, so its prediction has less to go on; "
                       "sources differ in how predictable their text is (verse and dictionary formats repeat, "
                       "code and manuals are varied) and in how many of their tokens the mixture fed. A dual-head "
                       "checkpoint is read through the head trained nearest each ratio."),
            limitation=("Each trial keeps only its final checkpoint, so the per-source values are end points, "
                        "not training-time curves; the training panel pools all sources"
                        + (" (per-source training loss is logged and drawn there)." if per_source_logged else
                           ", because these runs log no per-source MLM loss.")
                        + " Checkpoints without an MLM head (contrastive-only phases) cannot be scored and are "
                          "absent. Only the gaps between checkpoints at one ratio are paired (same tokens, same "
                          "masks); different ratios score different amounts of text, so a curve's shape carries "
                          "the per-point standard error." + _not_measured(skipped)),
        ),
    )


def _prepared_record(runs: list[Run], probe: Probe) -> dict | None:
    for run in runs:
        if run.label == probe.run_label:
            return run.prepared.get(probe.arm if probe.arm in run.prepared else run.arms[0])
    return None


def _training_curves(runs: list[Run]) -> list[tuple[str, list[float], str, list[float]]]:
    """(trial label, tokens consumed, loss key, loss values) for every logged MLM loss series."""
    curves = []
    for run in runs:
        for row in run.final.to_dict("records"):
            log = run.logs.get(row["trial_id"], [])
            keys = sorted({k for report in log for k in report if SOURCE_LOSS.match(k)}) or [POOLED_LOSS[run.phase]]
            for key in keys:
                points = [(r["budget/tokens"], r[key]) for r in log if key in r and "budget/tokens" in r]
                if points:
                    curves.append((f"{run.label.split()[0]} {row['arm']} s{row['seed']}", [p[0] for p in points], key,
                                   [p[1] for p in points]))
    return curves


def _mlm_observation(scored, curves) -> str:
    parts = []
    ratio = min(measure.MLM_RATIOS, key=lambda r: abs(r - REFERENCE_RATIO))
    for probe, losses in scored:
        at = {s: v.nats for s, v in losses[ratio].items() if np.isfinite(v.nats)}
        low, high = min(at, key=at.get), max(at, key=at.get)
        spread = np.mean([losses[measure.MLM_RATIOS[-1]][s].nats - losses[measure.MLM_RATIOS[0]][s].nats for s in at])
        parts.append(f"{_short(probe)}: {np.mean(list(at.values())):.2f} nats at {ratio:.0%} averaged over sources "
                     f"({low} {at[low]:.2f} to {high} {at[high]:.2f}); {spread:+.2f} nats from "
                     f"{measure.MLM_RATIOS[0]:.0%} to {measure.MLM_RATIOS[-1]:.0%}")
    errors = [v.standard_error for _, losses in scored for by_source in losses.values() for v in by_source.values()
              if np.isfinite(v.standard_error)]
    if errors:
        parts.append(f"each point's standard error is {np.median(errors):.2f} nats (median; "
                     f"{min(errors):.2f}-{max(errors):.2f})")
    if curves:
        label, _, key, values = curves[0]
        parts.append(f"training {key} of {label} went from {values[0]:.2f} to {values[-1]:.2f}")
    return "; ".join(parts) + "." if parts else "No checkpoint with an MLM head and no logged MLM loss."


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
