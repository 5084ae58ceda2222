"""The report as one self-contained HTML page: the template and CSS of `dashboards/report/`,
run summaries, trial tables and figures (base64 PNG), nothing fetched from anywhere."""

from __future__ import annotations

import base64
import math
import struct
import time
from html import escape
from pathlib import Path
from string import Template

import pandas as pd

from embedlab.core.code_identity import VERSION
from embedlab.report.collect import Run
from embedlab.report.plotting import Figure
from embedlab.core import timing
from embedlab.stats import looks, paired, stage_times
from embedlab.stats.table import (
    CONFIDENCE, UnequalComputeError, check_equal_compute, ci_label, compute_match_line, summarize,
    tuning_line, unit_columns,
)

# The checkout's dashboards/report/ (platform/embedlab/report/html.py -> repository root).
TEMPLATES = Path(__file__).resolve().parents[3] / "dashboards" / "report"
CAPTION_PARTS = (("units", "Units and population."), ("observed", "Observed."), ("mechanism", "Mechanism."),
                 ("limitation", "Limitation."))
TABLE_METRICS = ("dev/recall@100", "train/loss", "retention/probe_accuracy", "retention/similarity_spearman",
                 "compute/wall_seconds")


def page(runs: list[Run], figures: list[Figure | tuple[str, str]], templates: Path = TEMPLATES) -> str:
    """The whole page. A `(title, reason)` entry in `figures` stands for a figure that could
    not be drawn and says why."""
    template_path, css_path = templates / "report.html", templates / "report.css"
    for path in (template_path, css_path):
        if not path.is_file():
            raise FileNotFoundError(f"report template {path} not found: pass templates= the directory holding "
                                    "report.html and report.css (dashboards/report in the embedlab checkout)")
    names = ", ".join(dict.fromkeys(r.name for r in runs))
    return Template(template_path.read_text()).substitute(
        title=escape(f"embedlab report: {names}"),
        css=css_path.read_text(),
        version=escape(VERSION),
        generated=escape(time.strftime("%Y-%m-%d %H:%M:%S %z")),
        run_count=len(runs),
        run_plural="y" if len(runs) == 1 else "ies",
        runs="\n".join(_run_summary(r) for r in runs),
        tables="\n".join(_trial_tables(r) for r in runs),
        figures="\n".join(_figure(f, n) if isinstance(f, Figure) else _missing(*f, n)
                          for n, f in enumerate(figures, start=1)),
    )


def _run_summary(run: Run) -> str:
    study = run.study
    unit = run.table.attrs["unit"]
    items = [
        ("question", study.get("description") or "-"),
        ("factor", study["factor"]),
        ("arms", ", ".join(run.arms) + f" (control: {run.arms[0]})"),
        ("seeds", ", ".join(map(str, study["seeds"]))),
        ("budget", f"{run.table.attrs.get('budget') or 0:,g} {unit} per trial"),
        ("matched in", compute_match_line(run.table) or "-"),
        ("metric", run.metric),
        ("trials", f"{len(run.final)} finished of {len(run.table)}"),
        ("parent", run.record.get("parent") or "none (phase 1 starts from scratch)"),
    ]
    if tuning_line(run.table):
        items.append(("tuning", tuning_line(run.table).removeprefix("tuning: ")))
    if run.promotion:
        winner = run.promotion["winner"]
        items.append(("promoted", f"{winner['arm']} seed {winner['seed']} ({run.metric} "
                                  f"{winner[run.metric]:.4f}) into {run.promotion.get('next_study') or '-'}"))
        final_eval = run.promotion.get("final_eval")
        if final_eval:
            value = final_eval.get("value")
            shown = f"{final_eval['metric']} {value:.4f}" if value is not None else \
                f"not scored: {final_eval.get('reason', '-')}"
            items.append(("final eval", f"{shown} ({final_eval.get('note', '')})"))
    rows = "".join(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in items)
    return (f'<div class="run"><h3>{escape(run.label)}</h3><p class="path">{escape(str(run.directory))}</p>'
            f"<dl>{rows}</dl></div>")


def _trial_tables(run: Run) -> str:
    """Per-arm mean and CI (and seed-level paired difference from the control), the paired
    per-query test with Holm's correction, all refused at unequal compute; what the arms are
    matched in, how they were tuned; every trial's row below."""
    table, unit = run.table, run.table.attrs["unit"]
    head = f"<h3>{escape(run.label)}</h3>"
    metrics = [m for m in dict.fromkeys((run.metric, *TABLE_METRICS)) if m in table]
    budget = next((c for c in unit_columns(table, unit) if c in table), None)
    if budget is not None:
        metrics.append(budget)
    notes = "".join(f'<p class="meta">{escape(line)}</p>' for line in (compute_match_line(table), tuning_line(table))
                    if line)
    try:
        check_equal_compute(table, unit)
        comparison = _comparison(summarize(table, metrics, confidence=CONFIDENCE, check_compute=False), metrics)
    except (UnequalComputeError, ValueError) as error:
        comparison = f'<p class="warning">No arm comparison: {escape(str(error))}</p>'
    else:
        record = looks.read_sequential(run.directory)
        try:
            comparison += (_paired(paired.compare_to_control(run.directory, table)) if record is None
                           else _sequential(record, table))
        except ValueError as error:  # unreadable per-query files: the seed-level table still stands
            comparison += f'<p class="warning">No paired per-query test: {escape(str(error))}</p>'
    comparison = notes + comparison + _identical_seeds(run)
    columns = [c for c in ("trial_id", "arm", "seed", "status", *metrics) if c in table]
    trials = _html_table(table[columns], numeric=metrics)
    return (f"{head}{comparison}<details><summary>every trial ({len(table)})</summary>{trials}</details>"
            f"{_stage_times(run)}")


def _stage_times(run: Run) -> str:
    """The run's wall time by stage and training's share, the study's beside its trials' mean
    (`embedlab.stats.stage_times`); nothing for a run recorded before runs were timed."""
    line = stage_times.header(run.record, run.table)
    if line is None:
        return ""
    frame = stage_times.frame(timing.study_breakdown(run.record), stage_times.trial_mean(run.table))
    return f'<p class="meta">{escape(line)}</p>' + _html_table(frame, numeric=[])


def _identical_seeds(run: Run) -> str:
    """A warning per arm whose seeds trained the same checkpoint: its interval is no evidence."""
    if "checkpoint_hash" not in run.final:
        return ""
    warnings = []
    for (arm, digest), rows in run.final.groupby(["arm", "checkpoint_hash"], sort=False):
        if len(rows) > 1:
            warnings.append(f"arm {arm}: seeds {', '.join(map(str, rows['seed']))} produced the same checkpoint "
                            f"(content hash {digest[:12]}), so its interval says nothing about seed variance")
    return "".join(f'<p class="warning">{escape(w)}.</p>' for w in warnings)


def _paired(comparison: paired.PairedComparison) -> str:
    """The paired per-query test: what "significant" means, then one row per non-control arm
    (difference, corrected interval, raw and Holm p, the verdict, MDE); or why there is none."""
    header = "".join(f'<p class="meta">{escape(line)}</p>' for line in comparison.header.splitlines())
    if comparison.tests is None:
        return header
    cells = paired.cells(comparison.tests, comparison.margin)
    widths = ""
    if comparison.other_widths is not None:
        widths = ('<p class="meta">the same test at the other scored widths (one Holm family with the above)</p>'
                  + _html_table(paired.cells(comparison.other_widths, comparison.margin), numeric=[]))
    return header + _html_table(cells, numeric=[]) + widths


def _sequential(record: dict, table: pd.DataFrame) -> str:
    """A study run until decided: what its verdicts mean, one row per arm, a line per round and
    the seeds it used (`embedlab.stats.looks`)."""
    arms = table.attrs["arm_order"]

    def meta(lines: list[str]) -> str:
        return "".join(f'<p class="meta">{escape(line)}</p>' for line in lines)

    return (meta(looks.header(record, table.attrs["metric"], arms[0]).splitlines())
            + _html_table(looks.result_cells(record, arms), numeric=[])
            + meta([*looks.look_lines(record), looks.seeds_line(record, arms)]))


def _comparison(summary: pd.DataFrame, metrics: list[str]) -> str:
    """Metrics down, arms across: each arm's mean ± CI, then each other arm's seed-level
    paired difference from the control (Student's t, uncorrected: descriptive only)."""
    label = ci_label(CONFIDENCE)
    records = summary.to_dict("records")
    control = next(r for r in records if r["control"])
    others = [r for r in records if not r["control"]]
    header = "<tr><th>metric</th>" + "".join(
        f"<th>{escape(r['arm'])}{' (control)' if r['control'] else ''}<br>{r['seeds']} seeds, "
        f"mean ± {label[2:]}% CI</th>" for r in records) + "".join(
        f"<th>{escape(r['arm'])} − {escape(control['arm'])}<br>paired over {r['paired_seeds']} seeds, "
        f"seed-level {label[2:]}% t, uncorrected</th>"
        for r in others) + "</tr>"
    body = "".join(
        f"<tr><td>{escape(metric)}</td>"
        + "".join(f"<td>{_plus_minus(r[f'{metric}:mean'], r[f'{metric}:{label}'])}</td>" for r in records)
        + "".join(f"<td>{_plus_minus(r[f'{metric}:diff'], r[f'{metric}:diff_{label}'], signed=True)}</td>"
                  for r in others)
        + "</tr>" for metric in metrics)
    return f'<div class="table-wrap"><table>{header}{body}</table></div>'


def _plus_minus(mean: float, half: float, signed: bool = False) -> str:
    """"mean ± half-width" at one precision, chosen by the larger of the two."""
    if mean is None or math.isnan(mean):
        return "-"
    if half is None or math.isnan(half):
        return _number(mean, signed)
    scale = max(abs(mean), abs(half))
    return f"{_number(mean, signed, scale)} ± {_number(half, scale=scale)}"


def _number(value: float, signed: bool = False, scale: float | None = None) -> str:
    """Four decimals below 1, two below 100, none above; 3 significant digits at the extremes."""
    scale = abs(value) if scale is None else scale
    sign = "+" if signed else ""
    if scale >= 1e7 or 0 < scale < 1e-3:
        return f"{value:{sign}.3g}"
    decimals = 4 if scale < 1 else 2 if scale < 100 else 0
    return f"{value:{sign},.{decimals}f}"


def _html_table(frame: pd.DataFrame, numeric: list[str]) -> str:
    header = "".join(f"<th>{escape(c)}</th>" for c in frame.columns)
    rows = []
    for record in frame.to_dict("records"):
        cells = [_number(float(v)) if c in numeric and isinstance(v, (int, float)) and not pd.isna(v)
                 else escape("-" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
                 for c, v in record.items()]
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f'<div class="table-wrap"><table><tr>{header}</tr>{"".join(rows)}</table></div>'


def _figure(figure: Figure, number: int) -> str:
    width, height = struct.unpack(">II", figure.png[16:24])  # the PNG header's IHDR size
    data = base64.b64encode(figure.png).decode("ascii")
    parts = "".join(f'<p class="caption-{key}"><span class="part">{escape(name)}</span> '
                    f"{escape(getattr(figure.caption, key))}</p>" for key, name in CAPTION_PARTS)
    return (f'<figure class="report-figure" id="figure-{escape(figure.key)}">'
            f"<h3>Figure {number}. {escape(figure.title)}</h3>"
            f'<img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
            f'alt="{escape(figure.title)}"><figcaption>{parts}</figcaption></figure>')


def _missing(title: str, reason: str, number: int) -> str:
    return (f'<figure class="missing" id="figure-missing-{number}"><h3>Figure {number}. {escape(title)}</h3>'
            f"<p>Not drawn: {escape(reason)}</p></figure>")
