"""Figures about the training data: source mixture, document lengths, corruption and
attention masks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.patches import Patch

from embedlab.artifacts.sync import local_directory
from embedlab.core.config import phase_spec
from embedlab.report import measure
from embedlab.report.collect import Run
from embedlab.report.plotting import Caption, Figure, color, grid, hide_unused, new_figure, new_mosaic, to_png

STATE_COLORS = ("#eeeeee", "#555555", "#cfe3f3", "#d62728", "#ff7f0e", "#2ca02c")  # measure.STATE_NAMES


def _shares(run: Run, kind: str) -> dict[str, dict[str, float]]:
    """Per arm: mean over finished trials of `data/<kind>/<source>` columns."""
    prefix = f"data/{kind}/"
    columns = [c for c in run.final if c.startswith(prefix)]
    out = {}
    for arm, rows in run.final.groupby("arm", sort=False):
        values = rows[columns].astype(float).mean()
        out[arm] = {c.removeprefix(prefix): float(v) for c, v in values.items() if np.isfinite(v)}
    return out


def mixture_figure(runs: list[Run]) -> Figure | None:
    """Intended vs observed shares of every source (phase 1) or pair family (phases 2-3)."""
    runs = [r for r in runs if not r.final.empty]
    if not runs:
        return None
    rows, cols = grid(len(runs), 2)
    figure, axes = new_figure(rows, cols, height=3.0)
    observations, notes = [], set()
    for ax, run in zip(axes.flat, runs):
        pairs = phase_spec(run.phase).reads_pairs
        intended = _shares(run, "intended_share")
        observed = _shares(run, "observed_pair_share" if pairs else "observed_share")
        tokens = _shares(run, "observed_token_share") if pairs else {}
        sources = sorted({s for shares in intended.values() for s in shares})
        first = next(iter(intended.values()), {})
        bars = [("intended", first, "#bbbbbb", None)]
        for index, arm in enumerate(observed):
            bars.append((f"{arm}: {'pairs' if pairs else 'tokens'}", observed[arm], color(index), None))
            if arm in tokens:
                bars.append((f"{arm}: tokens", tokens[arm], color(index), "//"))
        height = 0.8 / len(bars)
        y = np.arange(len(sources))
        for k, (label, shares, face, hatch) in enumerate(bars):
            ax.barh(y + k * height, [shares.get(s, 0.0) for s in sources], height, label=label,
                    color="none" if hatch else face, edgecolor=face, hatch=hatch)
        ax.set_yticks(y + 0.4 - height / 2, sources)
        ax.invert_yaxis()
        unit = "positive pairs (solid) / tokens (hatched)" if pairs else "non-padding tokens"
        ax.set_xlabel(f"share of consumed {unit}")
        ax.set_title(run.label)
        ax.legend(loc="best", fontsize=7)
        gaps = [(abs(observed[a][s] - intended.get(a, {}).get(s, np.nan)), s, a) for a in observed
                for s in observed[a] if s in intended.get(a, {})]
        if gaps:
            gap, source, arm = max(gaps)
            text = (f"{run.label}: observed {'pair' if pairs else 'token'} shares within {gap:.4f} of intended "
                    f"(largest gap {source}: {observed[arm][source]:.4f} vs {intended[arm][source]:.4f})")
            if tokens:
                spread = max((abs(tokens[a][s] - observed[a][s]), s, a) for a in tokens for s in tokens[a]
                             if s in observed[a])
                text += (f", while {spread[1]} is {observed[spread[2]][spread[1]]:.0%} of pairs but "
                         f"{tokens[spread[2]][spread[1]]:.0%} of tokens")
            observations.append(text)
        for arm in run.arms:
            notes.update(run.prepared.get(arm, {}).get("mixture", {}).get("notes", []))
    hide_unused(axes, len(runs))
    trials = sum(len(r.final) for r in runs)
    return Figure(
        key="mixture", title="Source mixture: intended vs observed shares", png=to_png(figure),
        caption=Caption(
            units=("Share (0-1) of the units each trial consumed: non-padding training tokens per source in "
                   "phase 1, positive pairs per pair family in phases 2-3 (hatched: the same trials' token "
                   f"shares); mean over the finished trials of each arm ({trials} trials in all); intended "
                   "shares are the resolved mixture of the arm."),
            observed=("; ".join(observations) + "." if observations
                      else "No trial row of these runs records intended and observed shares."),
            mechanism=("The deficit/1 schedule picks, before every draw, the source whose consumption lags its "
                       "intended share the most, so after any prefix each source is within one item (a piece "
                       "of at most L tokens, or one pair) of its share. Pair families are balanced by pair "
                       "count, so their token shares follow how long each family's texts are."),
            limitation=("Shares say what was consumed, not how often a source was repeated (max_epochs) or how "
                        "good its text is; pair families are not sources. "
                        + (" ".join(f"{n}." for n in sorted(notes)) if notes else "No mixture notes were recorded.")),
        ),
    )


def prepared_directories(runs: list[Run]) -> dict[str, list[str]]:
    """Prepared data directories still on disk -> labels of the runs that used them; raises
    when every directory the runs name is gone (deleted cache, another machine)."""
    used: dict[str, list[str]] = {}
    for run in runs:
        for record in run.prepared.values():
            labels = used.setdefault(str(local_directory(record)), [])  # published data: this machine's copy
            if run.label not in labels:
                labels.append(run.label)
    present = {d: labels for d, labels in used.items() if Path(d).is_dir()}
    if used and not present:
        raise FileNotFoundError(f"prepared data not found: {', '.join(used)}")
    return present


def length_figures(runs: list[Run]) -> list[Figure]:
    """One histogram panel per source of training-document lengths, per prepared directory."""
    records = {str(local_directory(r)): r for run in runs for r in run.prepared.values()}
    return [_length_figure(Path(directory), records[directory], labels, number)
            for number, (directory, labels) in enumerate(prepared_directories(runs).items())]


def _length_figure(directory: Path, record: dict, labels: list[str], number: int) -> Figure:
    lengths = measure.document_lengths(directory)
    limit = record["sequence_length"]
    rows, cols = grid(len(lengths), 5)
    figure, axes = new_figure(rows, cols, height=1.9, sharey=False)
    longest = max(int(v.max()) for v in lengths.values())
    bins = np.unique(np.geomspace(1, longest + 1, 40).astype(int))
    over = {}
    for index, (ax, (source, values)) in enumerate(zip(axes.flat, lengths.items())):
        over[source] = float((values > limit).mean())
        ax.hist(values, bins=bins, color=color(index))
        ax.axvline(limit, color="black", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{source}\nn={len(values):,}, {over[source]:.0%} > L", fontsize=8)
        ax.set_xlabel("tokens per document")
    axes[0][0].set_ylabel("documents")
    hide_unused(axes, len(lengths))
    medians = {s: float(np.median(v)) for s, v in lengths.items()}
    ranked = sorted(over, key=over.get, reverse=True)
    return Figure(
        key=f"lengths-{number}", title=f"Document length per source (prepared data {directory.name})",
        png=to_png(figure),
        caption=Caption(
            units=(f"Tokens per document (frozen tokenizer, content plus one SEP; log axis) against the number "
                   f"of documents (log axis); population: every training-split document of each source in "
                   f"{directory.name} ({sum(len(v) for v in lengths.values()):,} documents), used by "
                   f"{', '.join(labels)}. Dashed line: sequence length L = {limit}."),
            observed=(f"Documents longer than L: {_extremes(ranked, over)}; median length from "
                      f"{min(medians.values()):.0f} tokens ({min(medians, key=medians.get)}) to "
                      f"{max(medians.values()):.0f} ({max(medians, key=medians.get)})."),
            mechanism=("A document longer than L is never truncated: it is cut into consecutive pieces of at "
                       "most L tokens, each its own attention segment, so long-document sources contribute many "
                       "full pieces whose context stops at L, while short sources fill a packed row with many "
                       "separate segments."),
            limitation=("Counts documents, not what a trial consumed: the schedule draws pieces by token share, "
                        "so a histogram is not weighted by how often its pieces were drawn. Phases 2-3 train on "
                        "pair texts truncated to contrastive.pair_length, which are not shown."),
        ),
    )


def _extremes(ranked: list[str], values: dict[str, float]) -> str:
    """'a 99.7%, b 84.0% ... z 2.1%' (all of them when there are four or fewer)."""
    shown = ranked if len(ranked) <= 4 else [*ranked[:2], None, ranked[-1]]
    return ", ".join("..." if s is None else f"{s} {values[s]:.1%}" for s in shown).replace(", ...,", " ...")


def mask_figure(runs: list[Run]) -> Figure | None:
    """A packed row as each MLM arm corrupts it, and the row's block-diagonal attention mask."""
    variants = _masking_variants(runs)
    if not variants:
        return None
    directory, limit = variants[0][2], variants[0][3]
    tokenizer = measure.prepared_tokenizer(directory)
    ids = tokenizer.pad_id, tokenizer.cls_id
    row = measure.sample_rows(directory, limit, *ids, rows=1, short=True)
    many = measure.sample_rows(directory, limit, *ids, rows=-(-measure.MASK_STATISTIC_TOKENS // limit))
    figure, axes = new_mosaic([["strip", "mask"], ["tokens", "mask"]], height=4.6,
                              width_ratios=[2.3, 1], height_ratios=[1.2, 1])
    strip, attention, listing = axes["strip"], axes["mask"], axes["tokens"]
    colormap = ListedColormap(STATE_COLORS)
    states, statistics = [], []
    for label, config, _, _ in variants:
        states.append(measure.token_states(row, measure.corrupt(row, config, tokenizer), tokenizer)[0].numpy())
        counted = measure.token_states(many, measure.corrupt(many, config, tokenizer), tokenizer).flatten()
        counts = np.bincount(counted.numpy(), minlength=len(measure.STATE_NAMES))
        eligible = counts[measure.VISIBLE:].sum()
        selected = counts[measure.MASKED:].sum()
        statistics.append((label, config.ratio, selected / max(eligible, 1), eligible,
                           counts[measure.MASKED:] / max(selected, 1)))
    strip.imshow(np.stack(states), cmap=colormap, vmin=0, vmax=len(STATE_COLORS) - 1, aspect="auto",
                 interpolation="nearest")
    for between in np.arange(len(variants) - 1) + 0.5:
        strip.axhline(between, color="white", lw=4)
    segments = row.segment_ids[0].numpy()
    for boundary in np.flatnonzero(np.diff(segments)) + 0.5:
        strip.axvline(boundary, color="black", lw=1.2)
    strip.set_yticks(range(len(variants)), [v[0] for v in variants])
    strip.set_xlabel(f"position in one packed row of L = {limit} tokens (black lines: document boundaries)")
    strip.set_title("what the encoder sees at each position")
    _token_listing(listing, row, variants[0], tokenizer)
    listing.legend(handles=[Patch(facecolor=c, edgecolor="#999999", label=n)
                            for c, n in zip(STATE_COLORS, measure.STATE_NAMES)],
                   loc="upper right", fontsize=7)
    allowed = measure.segment_mask(row)
    palette = np.array([to_rgb(STATE_COLORS[measure.PAD])] + [to_rgb(color(i)) for i in range(segments.max())])
    shown = np.where(allowed[:, :, None], palette[np.broadcast_to(segments[:, None], allowed.shape)], 1.0)
    attention.imshow(shown, interpolation="nearest")
    attention.set_xlabel("key position")
    attention.set_ylabel("query position")
    attention.set_title("segment attention mask\n(colour: may attend; grey: padding)")
    documents = len(set(segments[segments > 0].tolist()))
    real = allowed[segments > 0][:, segments > 0]
    observed = "; ".join(
        f"{label}: {share:.1%} of {eligible:,} eligible tokens selected, of which "
        f"{split[0]:.0%} [MASK] / {split[1]:.0%} random / {split[2]:.0%} kept"
        for label, _, share, eligible, split in statistics)
    return Figure(
        key="masks", title="Corruption and attention masks", png=to_png(figure),
        caption=Caption(
            units=(f"Left: one packed row of {limit} token positions from {directory.name} (pieces of "
                   f"{', '.join(dict.fromkeys(row.sources))}), coloured by what the encoder sees, one line per "
                   f"masking setting of the reported MLM arms. Right: the row's {limit} x {limit} attention "
                   f"mask. Shares below are counted over {len(many.input_ids):,} rows ({many.input_ids.numel():,} "
                   "positions) packed from randomly drawn training pieces (seed 0)."),
            observed=(f"{observed}. The sample row holds {documents} documents, so only "
                      f"{real.mean():.0%} of its query-key pairs between real tokens may attend."),
            mechanism=("Eligible tokens (not PAD, CLS, SEP, MASK or UNK) are selected at the arm's ratio "
                       "(token, whole-word or span units); each selected unit becomes [MASK] with "
                       "mask_fraction, a random ordinary token with random_fraction, or stays unchanged, and "
                       "the loss is computed on every selected position. segment_ids make attention "
                       "block-diagonal: a token sees only its own document, and RoPE positions restart at "
                       "each document start, so packing changes no document's computation."),
            limitation=("The rows are drawn by the report (seed 0), not the trial's own schedule and masking "
                        "RNG stream; a random replacement that draws the original token counts as kept. The "
                        "dense mask is what the CPU attention path builds; the CUDA variable-length path "
                        "computes the same attention without forming it. Phase-2 joint MLM masks pair texts, "
                        "not packed rows."),
        ),
    )


def _token_listing(ax, row: measure.PackedSample, variant, tokenizer, lines: int = 8, columns: int = 2) -> None:
    """The first selected positions of the sample row under `variant`: original -> what is seen."""
    label, config = variant[0], variant[1]
    masked = measure.corrupt(row, config, tokenizer)
    vocabulary = tokenizer.tokenizer
    entries = [f"{p:>3}  {vocabulary.id_to_token(int(row.input_ids[0, p]))[:10]:<10} -> "
               f"{vocabulary.id_to_token(int(masked.inputs[0, p]))[:10]}"
               for p in masked.selected[0].nonzero().flatten().tolist()[: lines * columns]]
    ax.axis("off")
    ax.set_title(f"selected positions of the row, {label}: original -> seen", fontsize=8, loc="left")
    for column in range(columns):
        ax.text(column * 0.3, 0.95, "\n".join(entries[column * lines : (column + 1) * lines]),
                family="monospace", fontsize=7.5, va="top", transform=ax.transAxes)


def _masking_variants(runs: list[Run]) -> list[tuple[str, object, Path, int]]:
    """(label, MaskingConfig at one ratio, prepared dir, L) for each distinct masking setting of
    arms that train an MLM term; mixed-ratio arms give one entry per ratio."""
    arms_by_setting: dict[str, list[str]] = {}
    where: dict[str, tuple[Path, int]] = {}
    present = prepared_directories(runs)
    for run in runs:
        for arm in run.arms:
            config = run.arm_config(arm)
            mlm = (config.get("phase") or 1) == 1 or config.get("contrastive", {}).get("mlm_weight", 0) > 0
            record = run.prepared.get(arm)
            if not mlm or not record or record["directory"] not in present:
                continue
            key = json.dumps(config["masking"], sort_keys=True)
            arms_by_setting.setdefault(key, []).append(arm)
            where.setdefault(key, (Path(record["directory"]), record["sequence_length"]))
    variants = []
    for key, arms in arms_by_setting.items():
        raw = json.loads(key)
        name = ", ".join(dict.fromkeys(arms))
        ratios = [r for r, _ in raw.get("mixed_ratios") or []] or [raw["ratio"]]
        for ratio in ratios:
            config = measure.masking_config(raw, ratio=ratio, mixed_ratios=(), head_per_ratio=False)
            variants.append((f"{name} @ {ratio:.0%}", config, *where[key]))
    return variants
