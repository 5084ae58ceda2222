"""The study report: one self-contained HTML page for one or more run directories.

    from embedlab.report import write_report
    write_report(["runs/dual-heads-...", "runs/joint-vs-contrastive-..."], Path("report.html"))

Several run directories make a tour: runs are ordered by phase, and retrieval and retention
are drawn phase by phase beside each run's parent. The page holds the trial tables (arm
means with 95% intervals, refused at unequal compute) and the recipe's required figures,
each captioned with its units and population, an observed value, a mechanism and a
limitation: source mixture, document lengths, corruption and attention masks, per-source
MLM training-loss curves (read from the trials' metrics.jsonl), positive/negative
similarities, covariance spectrum, phase-by-phase retrieval and retention, quality vs
runtime. Distributions are recomputed from the checkpoints and the prepared data with the
platform's own code (seeded), so they match the trial rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

from embedlab.core.errors import UsageError
from embedlab.report import collect, data_figures, html, ladder_figure, model_figures, plotting, study_figures

__all__ = ["write_report"]


def write_report(run_dirs: list[str | Path], out: Path, *, templates: Path = html.TEMPLATES, torch_threads: int = 1,
                 figures_dir: Path | None = None, progress: Callable[[str], None] = lambda message: print(message, file=sys.stderr)) -> Path:
    """Write the report of `run_dirs` to `out` (an .html file) and return its path.

    `torch_threads` is torch's intra-op thread count while checkpoints are scored (restored
    afterwards): one thread suits small models on a shared machine, where busy-waiting
    worker threads cost more than they gain. A figure that cannot be drawn (e.g. a prepared
    data directory deleted since the run) is replaced by a note saying why, and `progress`
    is told; the rest of the page stands. `figures_dir`, if given, also gets each drawn figure
    as `<key>.png` (the bytes the page embeds), for a paper or a docs page.
    """
    if not run_dirs:
        raise UsageError("write_report: no run directories given")
    if torch_threads < 1:
        raise UsageError(f"torch_threads: {torch_threads} must be >= 1")
    runs = collect.read_runs(list(run_dirs))
    probes = collect.probes(runs)
    builders = [
        ("Source mixture", lambda: data_figures.mixture_figure(runs)),
        ("Document length per source", lambda: data_figures.length_figures(runs)),
        ("Corruption and attention masks", lambda: data_figures.mask_figure(runs)),
        ("Per-source MLM loss", lambda: model_figures.mlm_figure(runs, probes)),
        ("Positive vs negative similarity", lambda: model_figures.similarity_figure(probes)),
        ("Covariance spectrum", lambda: model_figures.spectrum_figure(probes)),
        ("Phase-by-phase retrieval and retention", lambda: study_figures.phases_figure(runs)),
        ("Quality vs runtime", lambda: study_figures.runtime_figure(runs)),
    ]
    if ladder_figure.ladder_rungs(runs):  # only a report of one study's runs at several budgets has one
        builders.append(("Answers across budgets", lambda: ladder_figure.ladder_figure(runs)))
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        with plotting.style():
            figures = [figure for title, build in builders for figure in _draw(title, build, progress)]
    finally:
        torch.set_num_threads(threads)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html.page(runs, figures, templates), encoding="utf-8")
    if figures_dir is not None:
        figures_dir = Path(figures_dir)
        figures_dir.mkdir(parents=True, exist_ok=True)
        for figure in figures:
            if isinstance(figure, plotting.Figure):
                (figures_dir / f"{figure.key}.png").write_bytes(figure.png)
    return out


def _draw(title: str, build: Callable, progress: Callable[[str], None]) -> list[plotting.Figure | tuple[str, str]]:
    """The figure(s) `build` draws, or one (title, reason) entry saying why there is none."""
    progress(f"report: {title.lower()}")
    try:
        built = build()
    except (OSError, ValueError, KeyError) as error:  # missing files, unreadable records
        progress(f"report: {title.lower()} not drawn: {error}")
        return [(title, f"{type(error).__name__}: {error}")]
    if not built:
        return [(title, "the reported runs hold nothing this figure can show")]
    return built if isinstance(built, list) else [built]
