"""Trial tables: one row per trial, read from a run directory, and the comparison of its arms.

Each trial driver writes `trials/<trial_id>.json` when it ends; the table is those rows, in
the study's arm order and then by seed. Nothing is parsed out of logs.

A comparison is computed over finished grid ("final") trials only: failed, stopped and tuning
trials are listed but never averaged. Each arm gets a mean and a Student's t confidence
interval across seeds, and a difference from the control arm (the first in arm order) paired
by seed, so seed-to-seed variance shared by both arms cancels. No comparison is rendered
unless every trial consumed the same compute in the study's budget unit.

    embedlab.sweep.table.render("runs/masking-ratio-...", fmt="markdown")
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from embedlab.sweep import store

TRIALS_DIR = "trials"
STUDY_FILE = "study.json"
SUMMARY_COLUMNS = (
    "arm", "seed", "factor_value", "budget/tokens", "train/loss",
    "dev/ndcg@10", "dev/recall@100", "dev/mrr@10", "compute/wall_seconds",
)
FORMATS = ("text", "csv", "markdown", "json")
# Where each budget unit is consumed in a trial row; runs before budget/flops wrote an estimate.
UNIT_COLUMNS = {
    "tokens": ("budget/tokens",),
    "pairs": ("budget/pairs",),
    "flops": ("budget/flops", "budget/flops_estimate"),
}
# The study's per-trial budget in each unit (budget_flops only in studies that declare it).
STUDY_BUDGETS = {"tokens": "budget_tokens", "pairs": "budget_pairs", "flops": "budget_flops"}
RETRIEVAL_METRICS = ("dev/ndcg@10", "dev/recall@100", "dev/mrr@10")
BUDGET_COLUMNS = ("budget/tokens", "budget/pairs", "budget/flops", "budget/flops_estimate")
NO_TRIALS = "(no finished trials)"
CONFIDENCE = 0.95  # of the intervals `render` shows


class UnequalComputeError(ValueError):
    """The arms' trials cannot be shown to have consumed equal compute, so their metrics are
    not compared: a difference could come from the budget rather than from the factor."""


def read_study_record(run_dir: str | Path) -> dict:
    """`study.json` of a run directory (a local path or a pyarrow filesystem URI)."""
    location = store.join(run_dir, STUDY_FILE)
    if not store.is_file(location):
        raise FileNotFoundError(f"{run_dir} is not an embedlab run directory (no {STUDY_FILE})")
    return json.loads(store.read_text(location))


def budget_unit(record: dict) -> str:
    """The unit the study's arms are held equal in: tokens, pairs or flops."""
    study = record["study"]
    if "budget_unit" in study:
        unit = study["budget_unit"]
    else:  # recorded before budget_unit existed: the unit the phase trained to (configs without
        # a phase predate phases 2-3)
        phase = max((arm.get("phase") or 1 for arm in study["arms"].values()), default=1)
        unit = "pairs" if study.get("budget_pairs", 0) > 0 and phase > 1 else "tokens"
    if unit not in UNIT_COLUMNS:
        raise ValueError(f"study.budget_unit: {unit!r} is not one of {', '.join(UNIT_COLUMNS)}")
    return unit


def load_table(run_dir: str | Path) -> pd.DataFrame:
    """The trial table of a run directory as a DataFrame, one row per trial file.

    `table.attrs` carries the study's name, metric, arm order and budget unit, so `summarize`
    needs nothing else."""
    record = read_study_record(run_dir)
    arms = list(record.get("arm_order", record["study"]["arms"]))
    rows = [json.loads(store.read_text(p)) for p in store.list_files(store.join(run_dir, TRIALS_DIR), ".json")]
    if rows:
        table = pd.DataFrame(rows)
        table["_arm_order"] = table["arm"].map({arm: i for i, arm in enumerate(arms)})
        table = table.sort_values(["_arm_order", "seed"], kind="stable").drop(columns="_arm_order")
        table = table.reset_index(drop=True)
    else:
        table = pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    table.attrs.update(study=record["study"]["name"], metric=record["study"]["metric"],
                       arm_order=arms, unit=budget_unit(record))
    return table


def final_trials(table: pd.DataFrame) -> pd.DataFrame:
    """The rows statistics are computed over: finished grid trials."""
    keep = pd.Series(True, index=table.index)
    if "status" in table:  # rows without one were written before unfinished trials were recorded
        keep &= table["status"].fillna("finished") == "finished"
    if "stage" in table:  # rows without one were written before tuning trials existed
        keep &= table["stage"].fillna("final") == "final"
    return table[keep]


def consumption(table: pd.DataFrame, unit: str) -> pd.Series:
    """Each row's consumption of the budget unit, as floats."""
    if unit not in UNIT_COLUMNS:
        raise ValueError(f"budget unit {unit!r} is not one of {', '.join(UNIT_COLUMNS)}")
    columns = [c for c in UNIT_COLUMNS[unit] if c in table]
    if not columns:
        raise UnequalComputeError(
            f"budget unit {unit}: the trial table has no {' or '.join(UNIT_COLUMNS[unit])} column, "
            "so equal compute cannot be checked; the comparison is refused")
    used = table[columns[0]].astype(float)
    for fallback in columns[1:]:
        used = used.fillna(table[fallback].astype(float))
    if used.isna().any():
        missing = ", ".join(str(t) for t in table.loc[used.isna(), "trial_id"])
        raise UnequalComputeError(
            f"budget unit {unit}: trials {missing} report no {' or '.join(columns)}, "
            "so equal compute cannot be checked; the comparison is refused")
    return used


def check_equal_compute(table: pd.DataFrame, unit: str, tolerance: float = 0.01) -> float:
    """Raise UnequalComputeError unless every finished final trial consumed the same amount of
    `unit` within `tolerance` (largest / smallest - 1); returns that relative difference."""
    if tolerance < 0:
        raise ValueError(f"tolerance: {tolerance} is negative")
    final = final_trials(table)
    if final.empty:
        return 0.0
    used = consumption(final, unit)
    low, high = used.min(), used.max()
    relative = high / low - 1 if low > 0 else (0.0 if high == low else math.inf)
    if relative > tolerance:
        raise UnequalComputeError(
            f"unequal compute in {unit}: smallest {low:,.0f} by {_trial_name(final.loc[used.idxmin()])}, "
            f"largest {high:,.0f} by {_trial_name(final.loc[used.idxmax()])}; {relative:.2%} apart, "
            f"over the {tolerance:.2%} tolerance; the comparison is refused")
    return relative


def _trial_name(row: pd.Series) -> str:
    return f"arm {row['arm']} seed {row['seed']} (trial {row['trial_id']})"


def default_metrics(table: pd.DataFrame, study_metric: str | None = None) -> list[str]:
    """The study metric, retrieval, loss, retention, wall-clock and budget columns present."""
    candidates = [study_metric, *RETRIEVAL_METRICS, "train/loss",
                  *sorted(c for c in table if c.startswith("retention/")),
                  "compute/wall_seconds", *BUDGET_COLUMNS]
    return list(dict.fromkeys(c for c in candidates if c is not None and c in table))


def ci_label(confidence: float) -> str:
    return f"ci{confidence * 100:g}"


def _mean_and_half_width(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """Mean and Student's t interval half-width over seeds; the half-width is NaN below 2."""
    if len(values) == 0:
        return math.nan, math.nan
    if len(values) < 2:
        return float(values.mean()), math.nan
    quantile = stats.t.ppf((1 + confidence) / 2, len(values) - 1)
    return float(values.mean()), float(quantile * values.std(ddof=1) / math.sqrt(len(values)))


def summarize(
    table: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    control: str | None = None,
    confidence: float = 0.95,
    *,
    arm_order: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per arm over finished final trials: mean and CI half-width of each metric across
    seeds, and the difference from `control` paired by seed (only seeds both arms finished).

    Columns: arm, control (bool), seeds, paired_seeds, then per metric `<metric>:mean`,
    `<metric>:ci95`, `<metric>:diff`, `<metric>:diff_ci95` (ci95 follows `confidence`). The
    control arm's diff columns are NaN. Arm order and study metric come from `table.attrs`
    (set by load_table) unless `arm_order` is given; `control` defaults to the first arm."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: {confidence} is not between 0 and 1")
    final = final_trials(table)
    arms = list(arm_order or table.attrs.get("arm_order") or [])
    arms += [arm for arm in pd.unique(final["arm"]) if arm not in arms]
    metrics = list(metrics) if metrics is not None else default_metrics(table, table.attrs.get("metric"))
    unknown = [m for m in metrics if m not in table]
    if unknown:
        raise ValueError(f"metrics {unknown} are not columns of the trial table; it has "
                         f"{', '.join(c for c in table if '/' in c)}")
    duplicated = final[final.duplicated(["arm", "seed"], keep=False)]
    if not duplicated.empty:
        raise ValueError("more than one finished final trial for the same arm and seed, so seeds "
                         f"cannot be paired: trials {', '.join(map(str, duplicated['trial_id']))}")
    control = control if control is not None else (arms[0] if arms else None)
    if arms and control not in arms:
        raise ValueError(f"control: no arm {control!r}; arms: {arms}")
    label = ci_label(confidence)
    by_seed = {arm: final[final["arm"] == arm].set_index("seed") for arm in arms}
    records = []
    for arm in arms:
        rows, reference = by_seed[arm], by_seed[control]
        record: dict[str, Any] = {
            "arm": arm, "control": arm == control, "seeds": len(rows),
            "paired_seeds": len(rows.index.intersection(reference.index)),
        }
        for metric in metrics:
            values = rows[metric].astype(float).dropna()
            record[f"{metric}:mean"], record[f"{metric}:{label}"] = (
                _mean_and_half_width(values.to_numpy(), confidence))
            differences = (values - reference[metric].astype(float)).dropna()  # aligned on seed
            record[f"{metric}:diff"], record[f"{metric}:diff_{label}"] = (
                (math.nan, math.nan) if arm == control
                else _mean_and_half_width(differences.to_numpy(), confidence))
        records.append(record)
    columns = ["arm", "control", "seeds", "paired_seeds"] + [
        f"{m}:{stat}" for m in metrics for stat in ("mean", label, "diff", f"diff_{label}")]
    return pd.DataFrame(records, columns=columns)


def render(run_dir: str | Path, fmt: str = "text", metrics: Sequence[str] | None = None) -> str:
    """The run's comparison as text, csv, markdown or json, refused (UnequalComputeError) unless
    the arms consumed equal compute in the study's budget unit."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: choose one of {', '.join(FORMATS)}")
    record = read_study_record(run_dir)
    table = load_table(run_dir)
    unit = table.attrs["unit"]
    check_equal_compute(table, unit)
    if fmt in ("csv", "json"):
        summary = summarize(table, metrics, confidence=CONFIDENCE)
        if fmt == "csv":
            return summary.to_csv(index=False)
        return json.dumps({
            "study": record["study"]["name"], "factor": record["study"]["factor"],
            "metric": record["study"]["metric"], "unit": unit,
            "budget": record["study"].get(STUDY_BUDGETS[unit]),
            "control": table.attrs["arm_order"][0] if table.attrs["arm_order"] else None,
            "confidence": CONFIDENCE, "arms": _records(summary), "trials": _records(table),
        }, indent=2, default=_json_scalar)
    final = final_trials(table)
    unit_column = next((c for c in UNIT_COLUMNS[unit] if c in table), UNIT_COLUMNS[unit][0])
    if metrics is None:  # a few key columns: this is printed to a terminal
        metrics = [m for m in dict.fromkeys((record["study"]["metric"], "dev/recall@100", "train/loss",
                                             "retention/probe_accuracy", unit_column,
                                             "compute/wall_seconds")) if m in table]
    table_of = _text_table if fmt == "text" else _markdown_table
    blocks = [_header(record, unit)]
    if final.empty:
        blocks.append(NO_TRIALS)
    else:
        summary = summarize(table, metrics, confidence=CONFIDENCE)
        means, differences = _summary_cells(summary, metrics, ci_label(CONFIDENCE))
        blocks += [table_of(means), f"paired difference from control (same seeds), mean ± {CONFIDENCE:.0%} "
                   f"CI half-width:\n{table_of(differences)}"]
        excluded = _excluded(table, final)
        if excluded:
            blocks.append(f"excluded from statistics: {excluded}")
        columns = ["arm", "seed", "trial_id", "factor_value", *metrics]
        if excluded:  # say which rows the statistics left out
            columns[3:3] = [c for c in ("status", "stage") if c in table]
        trials = table[[c for c in dict.fromkeys(columns) if c in table]]
        blocks.append(f"trials:\n{table_of(trials.map(_cell))}")
    overlap = _overlap_line(record)
    if overlap:
        blocks.append(overlap)
    return "\n\n".join(blocks) + "\n"


def _header(record: dict, unit: str) -> str:
    study = record["study"]
    arms = list(record.get("arm_order", study["arms"]))
    budget = study.get(STUDY_BUDGETS[unit])
    budget_text = f"{budget:,} {unit}" if budget else unit
    control = f"; differences vs control {arms[0]}, paired by seed" if arms else ""
    return (f"study {study['name']} (factor {study['factor']}): {len(arms)} arms x {len(study['seeds'])} "
            f"seeds at an equal budget of {budget_text} per trial\n"
            f"mean ± {CONFIDENCE:.0%} CI half-width across seeds (Student's t, n-1 degrees of freedom)"
            f"{control}")


def _decimals(values: pd.Series) -> int:
    """Decimals that show a column's scale: 4 for scores and losses, fewer for counts."""
    largest = values.abs().max()
    return 0 if largest >= 1000 else 2 if largest >= 10 else 4


def _plus_minus(value: float, half: float, decimals: int, sign: str = "") -> str:
    if math.isnan(value):
        return "n/a"
    spread = "n/a" if math.isnan(half) else f"{half:,.{decimals}f}"
    return f"{value:{sign},.{decimals}f} ± {spread}"


def _summary_cells(
    summary: pd.DataFrame, metrics: Sequence[str], label: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The summary as 'mean ± half' strings, and the paired differences as '+diff ± half'."""
    means = summary[["arm", "seeds"]].astype(str)
    differences = summary[["arm", "paired_seeds"]].astype(str).rename(columns={"paired_seeds": "pairs"})
    for metric in metrics:
        decimals = _decimals(summary[f"{metric}:mean"])
        means[metric] = [_plus_minus(m, h, decimals) for m, h in
                         zip(summary[f"{metric}:mean"], summary[f"{metric}:{label}"])]
        differences[metric] = [
            "(control)" if control else _plus_minus(d, h, decimals, sign="+") for control, d, h in
            zip(summary["control"], summary[f"{metric}:diff"], summary[f"{metric}:diff_{label}"])]
    return means, differences


def _excluded(table: pd.DataFrame, final: pd.DataFrame) -> str:
    """How many trials of each kind the statistics left out, e.g. '1 failed, 4 tune'."""
    rest = table.drop(index=final.index)
    absent = [None] * len(rest)
    kinds = [stage if isinstance(stage, str) and stage != "final" else status
             for status, stage in zip(rest.get("status", absent), rest.get("stage", absent))]
    return ", ".join(f"{kinds.count(kind)} {kind}" for kind in sorted(set(kinds)))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}" if abs(value) >= 1e6 else f"{value:.4f}"
    return "" if value is None else str(value)


def _text_table(frame: pd.DataFrame) -> str:
    rows = [list(map(str, frame.columns)), *frame.astype(str).values.tolist()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _markdown_table(frame: pd.DataFrame) -> str:
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(frame.columns), line(["---"] * len(frame.columns)),
                      *(line(row) for row in frame.astype(str).values.tolist())])


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts: NaN becomes null."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _json_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _overlap_line(record: dict) -> str:
    policy = record["study"].get("disclosed_overlap")
    if not policy:
        return ""
    overlap = len(record.get("final_eval_overlap", []))
    return f"disclosed overlap ({overlap} final-eval items in training data): {policy}"


def format_table(table: pd.DataFrame, run_dir: str | Path | None = None) -> str:
    """The summary columns as aligned text, with the study's disclosed-overlap policy if any."""
    text = NO_TRIALS
    if not table.empty:
        columns = [c for c in SUMMARY_COLUMNS if c in table.columns]
        text = table[columns].to_string(index=False, float_format=lambda v: f"{v:.4f}")
    if run_dir is not None:
        overlap = _overlap_line(read_study_record(run_dir))
        if overlap:
            text += f"\n\n{overlap}"
    return text
