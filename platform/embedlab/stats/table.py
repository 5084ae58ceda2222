"""Trial tables: one row per trial, read from a run directory, and the comparison of its arms.

Each trial driver writes `trials/<trial_id>.json` when it ends; the table is those rows, in
the study's arm order and then by seed. Nothing is parsed out of logs.

A comparison is computed over finished grid ("final") trials only: failed, stopped and tuning
trials are listed but never averaged. Each arm gets a mean and a Student's t confidence
interval across seeds, and a difference from the control arm (the first in arm order) paired
by seed, so seed-to-seed variance shared by both arms cancels. These seed-level intervals are
uncorrected for the number of arms and descriptive: the only test a table calls
"significant" is the paired per-query test (crossed seeds x queries model) with Holm's correction (`embedlab.stats.paired`),
shown beside them when the trials wrote per-query values. No comparison is computed unless
every trial consumed the same compute in the study's budget unit, within 1% of each other
and of the study's declared budget; one line says what the arms are matched in
(`compute_match_line`) and, for studies that tuned hyperparameters, one line says how
(`tuning_line`). A lineage-scoped study (`Budget.scope`) is matched on each trial's
total, `budget/total_flops`: the parent's training FLOPs it inherited with its weights
(`budget/inherited_flops`, 0 for a random initialisation) plus its own (`budget/flops`).

    embedlab.stats.table.render("runs/masking-ratio-...", fmt="markdown")
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

from embedlab.core import store
from embedlab.core.config import Budget, budget_unit_of, declared_amounts
from embedlab.core.schema import upgrade
from embedlab.core.errors import RunRecordError, UsageError, UserError
from embedlab.negatives.mining import MINING_COVERAGE, MINING_SAMPLE, MINING_SEARCH
from embedlab.records.rundir import last_error_line, read_record, trial_records
from embedlab.stats.paired import final_trials
from embedlab.stats import crossed, looks, paired, stage_times
from embedlab.stats.references import reference_line
from embedlab.teacher.embeddings import VECTORS_DISCLOSURE
from embedlab.teacher.false_negatives import DISCLOSURE as FALSE_NEGATIVE_DISCLOSURE, RATES as FALSE_NEGATIVE_RATES
from embedlab.teacher.labels import DISCLOSURE

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
    "device_seconds": ("compute/device_seconds",),
}
# The units a study's per-trial budget can declare (`declared_budget`; FLOPs and device
# seconds only in studies that set them, pairs only in phases 2-3).
STUDY_BUDGETS = ("tokens", "pairs", "flops", "device_seconds")
# Where a lineage-scoped FLOPs budget is consumed: inherited + this phase's FLOPs.
LINEAGE_COLUMNS = ("budget/total_flops",)
DATA_UNITS = ("tokens", "pairs")  # budgets of data: arms may still differ in FLOPs per unit
COMPUTE_TOLERANCE = 0.01  # relative: between trials, and between a trial and the declared budget
NAMED_TRIALS = 5  # trials an error names before it counts the rest
RETRIEVAL_METRICS = ("dev/ndcg@10", "dev/recall@100", "dev/mrr@10")
BUDGET_COLUMNS = ("budget/tokens", "budget/pairs", "budget/flops", "budget/flops_estimate", "budget/inherited_flops",
                  "budget/total_flops")
# Compute a trial spends outside its training budget, reported beside it: mining its hard
# negatives, screening a source's given ones, a teacher's labels, and judging a sample of the
# mined negatives (`compute_outside_line`).
OUTSIDE_BUDGET_FLOPS = ("compute/mining_flops", "compute/given_negatives_flops", "compute/teacher_flops",
                        "compute/false_negative_flops")
# Below this share of its queries given a mined negative, an arm is said to have trained
# mostly on in-batch negatives: what it measures is not the mined negatives it declares.
LOW_COVERAGE = 0.5
TOTAL_COMPUTE = "compute/total_flops"
NO_TRIALS = "(no finished trials)"
CONFIDENCE = 0.95  # of the intervals `render` shows


class UnequalComputeError(UserError, ValueError):
    """The arms' trials cannot be shown to have consumed equal compute, so their metrics are
    not compared: a difference could come from the budget rather than from the factor."""


def read_study_record(run_dir: str | Path) -> dict:
    """`study.json` of a run directory (a local path or a pyarrow filesystem URI)."""
    location = store.join(run_dir, STUDY_FILE)
    if not store.is_file(location):
        raise FileNotFoundError(f"{run_dir} is not an embedlab run directory (no {STUDY_FILE})")
    record = upgrade(read_record(location, "a study record", ("study",)), "record")
    study = record["study"]
    absent = [key for key in ("name", "metric", "arms") if not isinstance(study, dict) or key not in study]
    if absent:
        raise RunRecordError(f"{location}: not a study record: its study has no {', '.join(map(repr, absent))}")
    return record


def _phase(study: dict) -> int:
    """The phase a study record's arms train (configs without a phase predate phases 2-3)."""
    return max((arm.get("phase") or 1 for arm in study["arms"].values()), default=1)


def _budget(record: dict) -> tuple[dict, int, dict]:
    """A study record's budget mapping, its phase and its study, upgraded (`embedlab.core.schema`)."""
    study = upgrade(record, "record")["study"]
    return study.get("budget") or {}, _phase(study), study


def budget_unit(record: dict) -> str:
    """The unit the study's arms are held equal in: tokens, pairs, flops or device_seconds; the
    unit its record names (`budget_unit`, which schema-1 studies recorded), else the one its
    budget's amounts give (`Budget.unit`)."""
    budget, phase, study = _budget(record)
    unit = study.get("budget_unit") or budget_unit_of(budget, phase)
    if unit not in UNIT_COLUMNS:
        raise UsageError(f"study.budget_unit: {unit!r} is not one of {', '.join(UNIT_COLUMNS)}")
    return unit


def declared_budget(record: dict, unit: str) -> float | None:
    """The study's per-trial budget in `unit` (`STUDY_BUDGETS`), or None when the record
    declares none (0 or absent, or a unit the study does not train to)."""
    budget, phase, _ = _budget(record)
    value = declared_amounts(budget, phase).get(unit)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def budget_scope(record: dict) -> str:
    """What the study's FLOPs budget counts (`Budget.scope`): "phase" or "lineage"."""
    budget, _, _ = _budget(record)
    return budget.get("scope") or Budget.scope


def load_table(run_dir: str | Path) -> pd.DataFrame:
    """The trial table of a run directory as a DataFrame, one row per trial file.

    `table.attrs` carries the study's name, metric, arm order, seeds, budget unit, declared
    budget in that unit (`budget`, None if undeclared; `budgets`: in every unit), budget scope
    (`scope`, "phase" or "lineage"), what a teacher made for its arms (`teacher_made`) and
    tuning record (`tuning`, None if it did not tune), so
    `summarize`, `check_equal_compute`, `compute_match_line` and `tuning_line` need nothing else.
    Rows of failed, stopped and tuning trials are kept (with NaN where they have no metric). A
    finished final trial without a finite study metric is a failed trial (`status` "failed",
    `error` saying why): no statistic counts a seed it does not have.

    Raises RunRecordError, naming the file, for a record that is empty, truncated, not a JSON
    object, without trial_id, arm or seed, of another study or arm, or a second finished final
    row for one arm and seed; FileNotFoundError for a directory without study.json."""
    record = read_study_record(run_dir)
    arms = list(record.get("arm_order", record["study"]["arms"]))
    rows = _checked_rows(run_dir, record, arms)
    if rows:
        table = pd.DataFrame(rows)
        table["_arm_order"] = table["arm"].map({arm: i for i, arm in enumerate(arms)})
        table = table.sort_values(["_arm_order", "seed"], kind="stable").drop(columns="_arm_order")
        table = table.reset_index(drop=True)
    else:
        table = pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    _add_total_compute(table, budget_scope(record))
    unit = budget_unit(record)
    table.attrs.update(study=record["study"]["name"], metric=record["study"]["metric"],
                       arm_order=arms, unit=unit, budget=declared_budget(record, unit),
                       budgets={u: declared_budget(record, u) for u in STUDY_BUDGETS},
                       seeds=list(record["study"].get("seeds", [])), tuning=record.get("tuning"),
                       scope=budget_scope(record), teacher_made=teacher_made(record["study"]["arms"]),
                       margin=record["study"].get("equivalence_margin"))
    return table


def teacher_made(arms: dict[str, Any]) -> tuple[str, ...]:
    """What a teacher made for the study's arms, read from their configs: "labels" (scores of
    each query's candidates, for KL or MarginMSE) and "documents" (vectors of unlabelled text,
    for embedding distillation), in that order; () for a study that distils nothing. `arms`
    are the configs of an upgraded study record (`embedlab.core.schema`)."""
    weights = [(arm.get("contrastive") or {}).get("distillation") or {} for arm in arms.values()
               if isinstance(arm, dict)]
    made = {"labels": any((w.get("kl_weight") or 0) > 0 or (w.get("margin_mse_weight") or 0) > 0 for w in weights),
            "documents": any((w.get("embedding_mse_weight") or 0) > 0 for w in weights)}
    return tuple(name for name, used in made.items() if used)


def _teacher_products(table: pd.DataFrame) -> tuple[str, ...]:
    """What the table's teacher made: what the study's arms declare, with what the trials'
    teacher counts show (a tuned weight is in the rows, not in the arms' configs)."""
    declared = set(table.attrs.get("teacher_made") or ())
    counted = {name for column, name in (("data/teacher_pairs", "labels"),
                                         ("data/teacher_embedding_texts", "documents"))
               if column in table and table[column].notna().any()}
    return tuple(name for name in ("labels", "documents") if name in declared | counted)


def _add_total_compute(table: pd.DataFrame, scope: str) -> None:
    """`compute/total_flops`: a row's training FLOPs (the lineage's in a lineage-scoped study)
    plus what it spent outside the budget (`OUTSIDE_BUDGET_FLOPS`), where it spent any."""
    outside = [c for c in OUTSIDE_BUDGET_FLOPS if c in table]
    training = "budget/total_flops" if scope == "lineage" and "budget/total_flops" in table else "budget/flops"
    if not outside or training not in table:
        return
    extra = table[outside].apply(pd.to_numeric, errors="coerce").fillna(0.0).sum(axis=1)
    table[TOTAL_COMPUTE] = pd.to_numeric(table[training], errors="coerce") + extra


def compute_outside_line(table: pd.DataFrame) -> str:
    """How the table's total compute is made, for a study whose trials spent compute outside the
    training budget; "" otherwise."""
    if TOTAL_COMPUTE not in table:
        return ""
    # The teacher's FLOPs are its labels' (queries and candidates) and its documents' (embedding
    # distillation), whichever the trials used.
    teacher = " and ".join(_teacher_products(table))
    parts = {"compute/mining_flops": "mining", "compute/given_negatives_flops": "given-negative screening",
             "compute/teacher_flops": f"teacher {teacher or 'labels'}",
             "compute/false_negative_flops": "false-negative judging"}
    spent = ", ".join(name for column, name in parts.items() if column in table)
    return (f"{TOTAL_COMPUTE} = training FLOPs (the budget) + {spent}, outside the budget; a set shared by "
            "several trials is counted in each of their rows")


def mining_cost(table: pd.DataFrame) -> dict[str, float]:
    """What the table's mining cost in all, each search counted once however many trials read
    it (a row's `compute/mining_*` is its search's whole cost): searches, trials that read one,
    trials that made one here (`compute/mining_built`), FLOPs, CPU and wall seconds."""
    if MINING_SEARCH not in table:
        return {}
    rows = table[table[MINING_SEARCH].notna()]
    searches = rows.drop_duplicates(MINING_SEARCH)
    built = pd.to_numeric(rows.get("compute/mining_built", pd.Series(dtype=float)), errors="coerce")

    def total(column: str) -> float:
        return float(pd.to_numeric(searches[column], errors="coerce").sum()) if column in searches else math.nan

    return {"searches": float(len(searches)), "trials": float(len(rows)), "built": float(built.fillna(0).sum()),
            "flops": total("compute/mining_flops"), "seconds": total("compute/mining_seconds"),
            "wall_seconds": total("compute/mining_wall_seconds")}


def mining_line(table: pd.DataFrame) -> str:
    """How the table counts mining, for trials that record the search they read; "" otherwise."""
    cost = mining_cost(table)
    if not cost:
        return ""
    line = (f"mining: {cost['searches']:.0f} search(es) read by {cost['trials']:.0f} trials ({cost['built']:.0f} "
            f"made here, the rest reused), {cost['flops']:.3g} encode FLOPs and {cost['seconds']:.1f} CPU s in all, "
            "each search counted once: a row's compute/mining_* is the whole cost of the search it read, and "
            "compute/mining_built marks the trial that made it")
    sampled = pd.to_numeric(table.get(MINING_SAMPLE, pd.Series(dtype=float)), errors="coerce").dropna()
    if len(sampled):
        sizes = " / ".join(f"{size:,.0f}" for size in sorted(sampled.unique()))
        line += (f"; searched a fixed sample of {sizes} training documents, not all of them "
                 "(contrastive.negatives.corpus_sample): its negatives are easier than a full search would find")
    return line


def mining_coverage_line(table: pd.DataFrame) -> str:
    """A warning for the mining arms whose rule left most queries without a negative (a parent
    that ranks most documents above the positives: every candidate looks like a false
    negative), with each arm's mean share; "" when every arm's negatives cover most queries."""
    if MINING_COVERAGE not in table:
        return ""
    final = final_trials(table)
    share = pd.to_numeric(final[MINING_COVERAGE], errors="coerce").groupby(final["arm"]).mean().dropna()
    low = share[share < LOW_COVERAGE]
    if low.empty:
        return ""
    arms = ", ".join(f"{arm} {value:.1%}" for arm, value in low.items())
    return (f"warning: mined negatives for under {LOW_COVERAGE:.0%} of the queries ({arms} of its queries, "
            f"{MINING_COVERAGE}): the rule dropped the rest as likely false negatives, so these arms trained "
            "mostly on in-batch negatives and do not measure mined ones; a stronger parent, or another rule "
            "(contrastive.negatives.rule), gives them negatives")


def false_negative_line(table: pd.DataFrame) -> str:
    """What the false-negative columns measure, for a table that has them; "" otherwise."""
    if FALSE_NEGATIVE_RATES[0] not in table:
        return ""
    return (f"{FALSE_NEGATIVE_RATES[0]}: the share of a fixed sample of each arm's mined negatives scored at or "
            f"above the pair's positive; {FALSE_NEGATIVE_RATES[1]}: the share in the query's own source group or "
            f"near-duplicate cluster; {FALSE_NEGATIVE_DISCLOSURE}")


def teacher_line(table: pd.DataFrame) -> str:
    """The disclosure a table of distilling trials carries: the labels are a model's, and what
    that model was trained on is beyond the audit (its vectors, for a study that distils only
    embeddings)."""
    if "compute/teacher_flops" not in table:
        return ""
    return VECTORS_DISCLOSURE if _teacher_products(table) == ("documents",) else DISCLOSURE


def pretrained_line(record: dict) -> str:
    """The disclosure a table of trials from a pretrained parent carries: what the parent is,
    pinned, and what the contamination audit cannot reach (its pretraining data and its
    tokenizer's, so the audit's tokenizer-sample stage does not apply)."""
    parent = record.get("pretrained_parent")
    if not parent:
        return ""
    pinned = f"@{parent['revision']}" if parent.get("revision") else f" (weights sha256 {parent['weights_sha256'][:16]})"
    name = parent["repo_id"] + pinned if parent.get("repo_id") else f"{parent['spec']}{pinned}"
    return (f"pretrained parent {name}: its tokenizer and the data it was pretrained on are its own and cannot be "
            "audited here; the audit's tokenizer-sample stage does not apply (no tokenizer was trained)")


def _checked_rows(run_dir: str | Path, record: dict, arms: list[str]) -> list[dict]:
    """The run's trial rows, each of this study and one of its arms, at most one finished final
    row per (arm, seed), and a finished final row without a finite study metric marked failed."""
    name, metric = record["study"]["name"], record["study"]["metric"]
    rows, finals = [], {}
    for location, row in trial_records(str(run_dir)):
        if row.get("study", name) != name:
            raise RunRecordError(f"{location}: a trial of study {row['study']!r}, not of this run's {name!r}")
        if row["arm"] not in arms:
            raise RunRecordError(f"{location}: arm {row['arm']!r} is not an arm of study {name!r} "
                                 f"({', '.join(map(str, arms))})")
        if row.get("status", "finished") == "finished" and row.get("stage", "final") == "final":
            other = finals.setdefault((row["arm"], row["seed"]), location)
            if other != location:
                raise RunRecordError(f"{location}: a second finished final trial of arm {row['arm']!r} seed "
                                     f"{row['seed']} (the first: {other}); seeds cannot be paired: move one away")
            value = row.get(metric)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                row = {**row, "status": "failed",
                       "error": f"study metric {metric} is " + ("missing" if value is None else f"{value!r}")}
        rows.append(row)
    return rows


def unit_columns(table: pd.DataFrame, unit: str) -> tuple[str, ...]:
    """The columns a row records its consumption of `unit` in, first found first: in a
    lineage-scoped table (`table.attrs["scope"]`) FLOPs are the lineage's total."""
    if unit not in UNIT_COLUMNS:
        raise ValueError(f"budget unit {unit!r} is not one of {', '.join(UNIT_COLUMNS)}")
    return LINEAGE_COLUMNS if unit == "flops" and table.attrs.get("scope") == "lineage" else UNIT_COLUMNS[unit]


def consumption(table: pd.DataFrame, unit: str) -> pd.Series:
    """Each row's consumption of the budget unit, as floats."""
    expected = unit_columns(table, unit)
    columns = [c for c in expected if c in table]
    if not columns:
        raise UnequalComputeError(
            f"budget unit {unit}: the trial table has no {' or '.join(expected)} column, "
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


def check_equal_compute(table: pd.DataFrame, unit: str, tolerance: float = COMPUTE_TOLERANCE, *,
                        budget: float | None = None) -> float:
    """Raise UnequalComputeError unless every finished final trial consumed the same amount of
    `unit` within `tolerance` (largest / smallest - 1) and, when the study declares a budget in
    that unit, each consumed within `tolerance` of it: |consumed - budget| <= tolerance x budget,
    so the last step's overshoot counts. `budget` defaults to `table.attrs["budget"]` (set by
    load_table; `table.attrs["budgets"][unit]` when `unit` is not the table's own); None
    there, or a table built by hand, skips the budget part. Returns the relative difference
    between the trials."""
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
            f"unequal compute in {unit}: smallest {_amount(low, unit)} by {_trial_name(final.loc[used.idxmin()])}, "
            f"largest {_amount(high, unit)} by {_trial_name(final.loc[used.idxmax()])}; {relative:.2%} apart, "
            f"over the {tolerance:.2%} tolerance; the comparison is refused")
    if budget is None:
        budget = (table.attrs.get("budgets") or {}).get(unit)
    if budget is not None and budget > 0:
        off = used - budget
        outside = off[off.abs() > tolerance * budget]
        if not outside.empty:
            worst = outside.abs().sort_values(ascending=False, kind="stable").index
            named = "; ".join(f"{_trial_name(final.loc[i])} consumed {_amount(used[i], unit)} "
                              f"({off[i] / budget:+.2%})" for i in worst[:NAMED_TRIALS])
            if len(worst) > NAMED_TRIALS:
                named += f"; {len(worst) - NAMED_TRIALS} more"
            raise UnequalComputeError(
                f"compute off the declared budget of {_amount(budget, unit)} {unit} per trial: {named}; beyond "
                f"the {tolerance:.2%} tolerance (the last step's overshoot counts); the comparison is refused")
    return relative


def _amount(value: float, unit: str) -> str:
    """A consumption as its unit is read: counts whole, FLOPs in 4 digits, seconds to 0.01."""
    return f"{value:.4g}" if unit == "flops" else f"{value:,.2f}" if unit == "device_seconds" else f"{value:,.0f}"


def compute_match_line(table: pd.DataFrame, unit: str | None = None, *,
                       tolerance: float = COMPUTE_TOLERANCE) -> str:
    """One line saying what the arms of the finished final trials are matched in ("" without any).

    flops: "compute-matched: equal measured training FLOPs (within 1%)"; device_seconds: matched
    in device time. A data unit (tokens, pairs) holds data equal, not arithmetic: each arm's
    mean `budget/flops` (an older row's `budget/flops_estimate` where it has no measurement) is
    compared with the control's (the first arm), and every arm more than `tolerance` away is
    named with its signed difference, e.g. "data-matched (equal pairs per trial); FLOPs differ
    from control contrastive-only by +43.2% in joint-mlm-30". `unit` defaults to
    `table.attrs["unit"]`; the control and arm order come from `table.attrs["arm_order"]`."""
    unit = unit or table.attrs.get("unit")
    final = final_trials(table)
    if final.empty or unit is None:
        return ""
    if unit == "flops" and table.attrs.get("scope") == "lineage":
        return (f"compute-matched: equal total measured training FLOPs (within {tolerance:.0%}), "
                "budget/total_flops = the parent's training inherited with its weights (budget/inherited_flops, "
                "0 for a random initialisation) + this phase's (budget/flops)")
    if unit == "flops":
        return f"compute-matched: equal measured training FLOPs (within {tolerance:.0%})"
    if unit == "device_seconds":
        return (f"device-time-matched: equal device seconds per trial (within {tolerance:.0%}); "
                "data consumed and FLOPs may differ between arms")
    if unit not in DATA_UNITS:
        raise ValueError(f"budget unit {unit!r} is not one of {', '.join(UNIT_COLUMNS)}")
    matched = f"data-matched (equal {unit} per trial)"
    measured = pd.to_numeric(final.get("budget/flops", pd.Series(np.nan, index=final.index)), errors="coerce")
    flops = measured.copy()
    if "budget/flops_estimate" in final:  # rows written before FLOPs were measured
        flops = flops.fillna(pd.to_numeric(final["budget/flops_estimate"], errors="coerce"))
    estimated = (" (partly the older estimate, budget/flops_estimate)"
                 if (measured.isna() & flops.notna()).any() else "")
    order = list(table.attrs.get("arm_order") or [])
    arms = order + [arm for arm in pd.unique(final["arm"]) if arm not in order]
    means = flops.groupby(final["arm"]).mean().dropna()
    control = arms[0]
    if means.empty:
        return f"{matched}; training FLOPs not recorded, so compute per trial may differ"
    if control not in means:
        return f"{matched}; control {control} has no recorded FLOPs to compare the arms' with"
    off = {arm: means[arm] / means[control] - 1 for arm in arms[1:] if arm in means}
    named = [f"{change:+.1%} in {arm}" for arm, change in off.items() if abs(change) > tolerance]
    if not named:
        return f"{matched}; FLOPs{estimated} within {tolerance:.0%} of control {control} in every arm"
    return f"{matched}; FLOPs{estimated} differ from control {control} by {', '.join(named)}"


def tuning_line(table: pd.DataFrame) -> str:
    """One line on the hyperparameter tuning the study ran ("" when it did not): the sampler,
    trials per arm, the tuning seeds and whether they are disjoint from the study's seeds, and
    the failed tuning trials per arm, from `table.attrs["tuning"]` (study.json's "tuning")."""
    tuning = table.attrs.get("tuning")
    if not tuning:
        return ""
    seeds = list(tuning.get("seeds") or [])
    study_seeds = list(table.attrs.get("seeds") or [])
    shared = sorted(set(seeds) & set(study_seeds))
    seed_list = ", ".join(map(str, seeds)) or "not recorded"
    disjoint = (f"NOT disjoint from the study seeds: {', '.join(map(str, shared))} also reported" if shared
                else "disjoint from the study seeds")
    failed = tuning.get("failed") or {}
    order = list(table.attrs.get("arm_order") or [])
    arms = order + [arm for arm in failed if arm not in order]

    def failures(arm: str) -> str:
        trials = failed.get(arm) or []
        statuses = pd.Series([t.get("status", "failed") for t in trials], dtype=object).value_counts()
        detail = ", ".join(f"{n} {status}" for status, n in statuses.items())
        return f"{arm} {len(trials)}" + (f" ({detail})" if trials else "")

    return (f"tuning: {tuning.get('sampler') or 'sampler not recorded'}, {tuning.get('trials_per_arm', '?')} "
            f"trials per arm at tuning seeds {seed_list} ({disjoint}); failed tuning trials: "
            + "; ".join(failures(arm) for arm in arms))


def _trial_name(row: pd.Series) -> str:
    return f"arm {row['arm']} seed {row['seed']} (trial {row['trial_id']})"


def default_metrics(table: pd.DataFrame, study_metric: str | None = None) -> list[str]:
    """The study metric, retrieval, loss, retention, wall-clock and budget columns present."""
    candidates = [study_metric, *RETRIEVAL_METRICS, "train/loss",
                  *sorted(c for c in table if c.startswith("retention/")),
                  "compute/wall_seconds", *BUDGET_COLUMNS, *FALSE_NEGATIVE_RATES]
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
    check_compute: bool = True,
) -> pd.DataFrame:
    """One row per arm over finished final trials: mean and CI half-width of each metric across
    seeds, and the difference from `control` paired by seed (only seeds both arms finished).

    Columns: arm, control (bool), seeds, paired_seeds, then per metric `<metric>:mean`,
    `<metric>:ci95`, `<metric>:diff`, `<metric>:diff_ci95` (ci95 follows `confidence`). The
    control arm's diff columns are NaN. Arm order and study metric come from `table.attrs`
    (set by load_table) unless `arm_order` is given; `control` defaults to the first arm.
    The intervals are seed-level Student's t, uncorrected for the number of arms: descriptive,
    not a significance test (that is `embedlab.stats.paired`).

    Unless `check_compute=False`, the arms must first pass `check_equal_compute` in the
    table's budget unit (`table.attrs["unit"]`, within 1% of each other and of the declared
    budget): UnequalComputeError otherwise, and ValueError for a table that does not say its
    unit, so unequal arms are never compared silently."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: {confidence} is not between 0 and 1")
    if check_compute:
        unit = table.attrs.get("unit")
        if unit is None:
            raise ValueError("summarize: the table does not say its budget unit (table.attrs['unit'], set by "
                             "load_table), so equal compute cannot be checked; load it with load_table, or pass "
                             "check_compute=False to compare the arms unchecked")
        check_equal_compute(table, unit)
    final = final_trials(table)
    arms = list(arm_order or table.attrs.get("arm_order") or [])
    arms += [arm for arm in pd.unique(final["arm"]) if arm not in arms]
    metrics = list(metrics) if metrics is not None else default_metrics(table, table.attrs.get("metric"))
    unknown = [m for m in metrics if m not in table]
    if unknown:
        raise UsageError(f"metrics {unknown} are not columns of the trial table; it has "
                         f"{', '.join(c for c in table if '/' in c)}")
    duplicated = final[final.duplicated(["arm", "seed"], keep=False)]
    if not duplicated.empty:
        raise ValueError("more than one finished final trial for the same arm and seed, so seeds "
                         f"cannot be paired: trials {', '.join(map(str, duplicated['trial_id']))}")
    control = control if control is not None else (arms[0] if arms else None)
    if arms and control not in arms:
        raise UsageError(f"control: no arm {control!r}; arms: {arms}")
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


SEED_LEVEL = ("seed-level: mean ± {pct} CI half-width across seeds (Student's t, n-1 degrees of freedom), "
              "uncorrected for the number of arms, descriptive only")


def render(run_dir: str | Path, fmt: str = "text", metrics: Sequence[str] | None = None) -> str:
    """The run's comparison as text, csv, markdown or json, refused (UnequalComputeError) unless
    the arms consumed equal compute in the study's budget unit.

    Every format carries the compute-match line, the tuning line (studies that tuned), the
    seed-level summary and the paired per-query test of the study metric with Holm's
    correction (or one line saying why it is unavailable). csv starts with those lines as
    `# ` comments (`pd.read_csv(..., comment="#")`) and adds the test as
    `<metric>:paired_<column>` columns; json holds them under "compute_match", "tuning" and
    "paired". A run whose record has its wall time by stage ends with it (`stage_times`; csv:
    its first line, json: "time")."""
    if fmt not in FORMATS:
        raise UsageError(f"format {fmt!r}: choose one of {', '.join(FORMATS)}")
    record = read_study_record(run_dir)
    table = load_table(run_dir)
    unit = table.attrs["unit"]
    check_equal_compute(table, unit)
    final = final_trials(table)
    notes = [line for line in (compute_match_line(table), compute_outside_line(table), mining_line(table),
                               mining_coverage_line(table), tuning_line(table), teacher_line(table),
                               false_negative_line(table),
                               pretrained_line(record)) if line]
    notes += [line for line in (cost_line(table, record),) if line]
    control = table.attrs["arm_order"][0] if table.attrs["arm_order"] else None
    sequential_record = looks.read_sequential(run_dir)
    try:
        comparison = (paired.compare_to_control(run_dir, table) if sequential_record is None else
                      paired.PairedComparison(metric=table.attrs["metric"], control=control,
                                              unavailable=SEQUENTIAL_ONLY))
    except ValueError as error:  # unreadable per-query files: say so, keep the seed-level table
        comparison = paired.PairedComparison(metric=table.attrs["metric"], control=control,
                                             unavailable=f"per-query values unreadable: {error}")
    sequential_lines = [] if sequential_record is None else _sequential_lines(sequential_record, table)
    if fmt in ("csv", "json"):
        summary = summarize(table, metrics, confidence=CONFIDENCE, check_compute=False)  # checked above
        if fmt == "csv":
            time_line = stage_times.header(record, table)
            comments = [_seed_level_note(), *notes, *comparison.header.splitlines(), *sequential_lines,
                        *([time_line] if time_line else [])]
            frame = _with_paired(summary, comparison)
            if sequential_record is not None:
                frame = _with_sequential(frame, sequential_record, table.attrs["metric"])
            return "".join(f"# {line}\n" for line in comments) + frame.to_csv(index=False)
        return json.dumps({
            "study": record["study"]["name"], "factor": record["study"]["factor"],
            "metric": record["study"]["metric"], "unit": unit, "budget": table.attrs["budget"],
            "control": table.attrs["arm_order"][0] if table.attrs["arm_order"] else None,
            "confidence": CONFIDENCE, "seed_level": _seed_level_note(),
            "compute_match": compute_match_line(table) or None, "tuning": tuning_line(table) or None,
            "compute_outside": compute_outside_line(table) or None, "teacher": teacher_line(table) or None,
            **({"pretrained_parent": pretrained_line(record)} if pretrained_line(record) else {}),
            **({"mining": mining_cost(table), "false_negatives": false_negative_line(table),
                "mining_coverage": mining_coverage_line(table) or None}
               if MINING_SEARCH in table else {}),
            "references": {"parent": record.get("parent_scores"), "teacher": record.get("teacher_scores")},
            "paired": _paired_json(comparison), "sequential": sequential_record,
            "cost": cost_line(table, record) or None, "arms": _records(summary), "trials": _records(table),
            "time": stage_times.as_json(record, table),
        }, indent=2, default=_json_scalar)
    consumed_in = unit_columns(table, unit)
    unit_column = next((c for c in consumed_in if c in table), consumed_in[0])
    if metrics is None:  # a few key columns: this is printed to a terminal
        # The budget unit's column (a lineage total after its two parts), and beside FLOPs or
        # device time the data each arm read.
        parts = ("budget/inherited_flops", "budget/flops") if consumed_in == LINEAGE_COLUMNS else ()
        data_column = "budget/pairs" if "budget/pairs" in table else "budget/tokens"
        metric = record["study"]["metric"]  # at a truncated width: its full width's beside it
        metrics = [m for m in dict.fromkeys((metric, paired.full_width(metric), "dev/recall@100", "train/loss",
                                             "retention/probe_accuracy", *parts, unit_column, TOTAL_COMPUTE,
                                             data_column, "compute/wall_seconds", *FALSE_NEGATIVE_RATES))
                   if m in table]
    table_of = _text_table if fmt == "text" else _markdown_table
    reference = reference_line(record, list(metrics))
    blocks = ["\n".join([_header(record, unit), *notes, *([reference] if reference else [])])]
    if final.empty:
        blocks.append(NO_TRIALS)
    else:
        summary = summarize(table, metrics, confidence=CONFIDENCE, check_compute=False)  # checked above
        means, differences = _summary_cells(summary, metrics, ci_label(CONFIDENCE))
        blocks += [table_of(means),
                   f"seed-level paired difference from control (same seeds), mean ± {CONFIDENCE:.0%} Student's t "
                   f"half-width, uncorrected (descriptive, not a significance test):\n{table_of(differences)}"]
        if sequential_record is not None:
            header, *rest = sequential_lines
            cells = looks.result_cells(sequential_record, table.attrs["arm_order"])
            blocks.append("\n".join([header, table_of(cells), *rest]))
        elif comparison.tests is None:
            blocks.append(comparison.header)
        else:
            blocks.append(f"{comparison.header}\n{table_of(paired.cells(comparison.tests, comparison.margin))}")
            if comparison.other_widths is not None:
                blocks.append("the same test at the other scored widths (one Holm family with the above):\n"
                              f"{table_of(paired.cells(comparison.other_widths, comparison.margin))}")
        excluded = _excluded(table, final)
        if excluded:
            blocks.append("\n".join([f"excluded from statistics: {excluded}", *_failures(table)]))
        columns = ["arm", "seed", "trial_id", "factor_value", *metrics]
        if excluded:  # say which rows the statistics left out
            columns[3:3] = [c for c in ("status", "stage") if c in table]
        if REUSED_FROM in table and table[REUSED_FROM].notna().any():  # which rows another run trained
            columns.append(REUSED_FROM)
        trials = table[[c for c in dict.fromkeys(columns) if c in table]]
        blocks.append(f"trials:\n{table_of(trials.map(_cell))}")
    times = stage_times.block(record, table, table_of)
    if times:
        blocks.append(times)
    overlap = _overlap_line(record)
    if overlap:
        blocks.append(overlap)
    return "\n\n".join(blocks) + "\n"


SEQUENTIAL_ONLY = ("a study run until decided: its verdicts are the sequential test's (a fixed-seed test of seeds "
                   "that stopped by their own data would not hold its size)")
REUSED_FROM = "reused_from"  # a reused trial's row: "<run directory>/<trial id>" of the trial it copies


def _sequential_lines(record: dict, table: pd.DataFrame) -> list[str]:
    """A sequential run's header (first, one string), its per-round lines and its seeds line."""
    arms = table.attrs["arm_order"]
    return [looks.header(record, table.attrs["metric"], arms[0]), *looks.look_lines(record),
            looks.seeds_line(record, arms)]


def _with_sequential(frame: pd.DataFrame, record: dict, metric: str) -> pd.DataFrame:
    """The summary with each arm's sequential result, `<metric>:sequential_<key>` columns."""
    keys = ("seeds", "decided_at", "diff", "p_seq", "p_holm", "verdict", "p_holm_equivalence", "fixed_seeds")
    rows = [{"arm": arm, **{f"{metric}:sequential_{k}": result.get(k) for k in keys}}
            for arm, result in record["arms"].items()]
    return frame.merge(pd.DataFrame(rows), on="arm", how="left")


def spent_flops(table: pd.DataFrame) -> pd.Series:
    """Each row's FLOPs spent: its own training (`budget/flops`, an older row's estimate where
    it has none) and what it spent outside the budget; 0 where a row records none."""
    def column(name: str) -> pd.Series:
        return pd.to_numeric(table[name], errors="coerce") if name in table else pd.Series(np.nan, index=table.index)

    training = column("budget/flops").fillna(column("budget/flops_estimate"))
    return sum((column(c).fillna(0.0) for c in OUTSIDE_BUDGET_FLOPS), training.fillna(0.0))


def cost_line(table: pd.DataFrame, record: dict) -> str:
    """What the run spent and what reusing finished trials saved: trials, FLOPs and device
    seconds, its own and its reused rows' (a row copied from another run spent nothing here). ""
    for a run recorded before trials were reused (its record has no "reuse")."""
    if "reuse" not in record or table.empty:
        return ""
    reused = table[REUSED_FROM].notna() if REUSED_FROM in table else pd.Series(False, index=table.index)
    flops = spent_flops(table)
    device = pd.to_numeric(table.get("compute/device_seconds", pd.Series(np.nan, index=table.index)),
                           errors="coerce").fillna(0.0)
    return (f"compute spent: {int((~reused).sum())} trial(s) trained by this run, {flops[~reused].sum():.4g} FLOPs "
            f"(training and outside the budget), {device[~reused].sum():,.1f} device seconds; reuse "
            + (f"saved {int(reused.sum())} trial(s), {flops[reused].sum():.4g} FLOPs and {device[reused].sum():,.1f} "
               "device seconds, copied from earlier runs" if record["reuse"] else "off (--no-reuse)"))


def _seed_level_note() -> str:
    return SEED_LEVEL.format(pct=f"{CONFIDENCE:.0%}")


def _with_paired(summary: pd.DataFrame, comparison) -> pd.DataFrame:
    """The summary with the paired test's columns, `<metric>:paired_<column>`, NaN for the control."""
    columns = [c for c in paired.COLUMNS if c != "arm"]
    prefix = f"{comparison.metric}:paired_"
    if comparison.tests is None:
        tests = pd.DataFrame({"arm": summary["arm"], **{c: np.nan for c in columns}})
    else:
        tests = comparison.tests
        columns = [c for c in tests.columns if c != "arm"]  # with a margin, the equivalence family's too
    renamed = tests.rename(columns={c: prefix + c for c in columns})
    return summary.merge(renamed, on="arm", how="left")


def _paired_json(comparison) -> dict:
    """The paired test as JSON: how it was run, what "significant" means, each arm's result."""
    return {
        "metric": comparison.metric, "control": comparison.control, "test": comparison.test,
        "model": crossed.MODEL, "interval": "t, at the calibrated level of each arm's Holm step-down level",
        "correction": "holm-bonferroni", "alpha": comparison.alpha,
        "power": paired.POWER, "significant_means": comparison.header.splitlines()[-1],
        "unavailable": comparison.unavailable or None, "missing": list(comparison.missing),
        "arms": [] if comparison.tests is None else _records(comparison.tests),
        "other_widths": None if comparison.other_widths is None else _records(comparison.other_widths),
    }


def _budget_text(budget: float | None, unit: str) -> str:
    if not budget:
        return unit
    if unit == "flops":
        return f"{budget:.3g} FLOPs"
    if unit == "device_seconds":
        return f"{budget:,.1f} device seconds"
    return f"{budget:,.0f} {unit}"


def _header(record: dict, unit: str) -> str:
    study = record["study"]
    arms = list(record.get("arm_order", study["arms"]))
    control = f"; differences vs control {arms[0]}, paired by seed" if arms else ""
    lineage = " (a lineage total: the parent's training included)" if budget_scope(record) == "lineage" else ""
    seeds = f"{len(study['seeds'])}" + (f" to {study['max_seeds']} (until decided)" if study.get("until_decided") else "")
    return (f"study {study['name']} (factor {study['factor']}): {len(arms)} arms x {seeds} "
            f"seeds at an equal budget of {_budget_text(declared_budget(record, unit), unit)} per trial{lineage}\n"
            f"{_seed_level_note()}{control}")


SCIENTIFIC = -1  # `_decimals` for columns too large to print digit by digit (FLOPs)


def _decimals(values: pd.Series) -> int:
    """Decimals that show a column's scale: 4 for scores and losses, fewer for counts, and
    `SCIENTIFIC` from 10^7 (FLOPs)."""
    largest = values.abs().max()
    return SCIENTIFIC if largest >= 1e7 else 0 if largest >= 1000 else 2 if largest >= 10 else 4


def _plus_minus(value: float, half: float, decimals: int, sign: str = "") -> str:
    if math.isnan(value):
        return "n/a"
    if decimals == SCIENTIFIC:
        return f"{value:{sign}.4g} ± " + ("n/a" if math.isnan(half) else f"{half:.2g}")
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


def _failures(table: pd.DataFrame, width: int = 160) -> list[str]:
    """One line per failed final trial: its arm, seed and the end of its error's last line."""
    if "error" not in table or "status" not in table:
        return []
    failed = table[(table["status"] == "failed") & (table.get("stage", "final") == "final")]
    lines = []
    for row in failed.itertuples():
        last = last_error_line(row.error)
        lines.append(f"  {row.arm} seed {row.seed}: failed: " + (last if len(last) <= width else "..." + last[-width:]))
    return lines


def _excluded(table: pd.DataFrame, final: pd.DataFrame) -> str:
    """How many trials of each kind the statistics left out, e.g. '1 failed, 4 tune (1 nonfinite)':
    a stage other than final names the kind, with how many of those did not finish."""
    rest = table.drop(index=final.index)
    absent = [None] * len(rest)
    kinds: dict[str, list[str]] = {}
    for status, stage in zip(rest.get("status", absent), rest.get("stage", absent)):
        status = status if isinstance(status, str) else "finished"
        kind = stage if isinstance(stage, str) and stage != "final" else status
        kinds.setdefault(kind, []).append(status)
    parts = []
    for kind in sorted(kinds):
        unfinished = pd.Series([s for s in kinds[kind] if s not in ("finished", kind)], dtype=object).value_counts()
        detail = ", ".join(f"{n} {status}" for status, n in sorted(unfinished.items()))
        parts.append(f"{len(kinds[kind])} {kind}" + (f" ({detail})" if detail else ""))
    return ", ".join(parts)


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
