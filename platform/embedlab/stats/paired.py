"""The paired per-query test of each arm against the control: a t test on the crossed
seeds x queries model of the study metric, Holm-Bonferroni across the arms, the smallest
effect the study's seeds and queries could detect, and the seeds a rerun would need.

Data. Every finished final trial (arm a, seed s) scored the same Q dev queries, and its
driver wrote `per_query/<trial_id>.json` with each query's value of every metric. For arm a
against the control c (the first arm), over the S seeds both finished and the Q query ids
they share, the paired differences are D[s, q] = value_a[s, q] - value_c[s, q], shape (S, Q),
and the statistic is their mean (the arm's mean minus the control's).

Test. `embedlab.stats.crossed`: D = effect + seed x arm + query + noise, the standard error
of the mean from the two-way ANOVA's mean squares, Satterthwaite's degrees of freedom, and a
p-value that is the worst case over the unknown share of the seed x arm term, so its size
holds at 2 seeds (where it can show only large differences) and up. A panel mean
(``mean/dev/ndcg@10``, the unweighted mean over T tasks) uses each seed's panel mean for the
seed term and each task's query mean squares for the query term. One paired seed: no test.

Correction. Holm-Bonferroni across the m arms tested, family-wise alpha (0.05): with the raw
p sorted, p_(1) <= ... <= p_(m), the adjusted p_(i) = max over k <= i of min(1, (m - k + 1)
p_(k)), and an arm is "significant" exactly when its adjusted p <= alpha. Its corrected
interval is at level 1 - alpha / (m - r + 1), r = min(its rank, k*), k* the first rank Holm
does not reject (m + 1 when it rejects all): the level the step-down tested the arm at, or
the one at which it stopped. That interval excludes 0 exactly when the arm is significant.

Minimum detectable effect and seeds needed. From the arm's variance components, the true
difference the test detects with 80% power at Holm's strictest per-arm level alpha/m and the
study's seeds and queries; for an arm that is not significant, the fewest seeds (and, where
the query term is the larger part of the variance, queries) at which its observed difference
would be detected with 80% power. A smaller difference that is "not significant" is not
evidence of no effect.

The earlier percentile bootstrap over seeds and queries (`paired_bootstrap`,
`stratified_paired_bootstrap`) is kept for comparison: `embedlab stats calibrate` shows its
false-positive rate at few seeds beside the test's (resampling S seed rows gives the seed term
a variance of (S - 1)/S^2 of the truth, half of it at S = 2).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from embedlab.core import store
from embedlab.core.config.tasks import MEAN
from embedlab.records.rundir import PER_QUERY_DIR
from embedlab.stats import crossed

BOOTSTRAP_SEED = 20_240_601
RESAMPLES = 10_000
ALPHA = 0.05  # family-wise, across the study's non-control arms
POWER = 0.80  # of the minimum detectable effect
ONE_SEED = "one seed: no test"
P_FLOOR = 1e-16  # below it a printed p says only "smaller than this" (`p_text`)
# Every per-query metric lies in [0, 1] (evaluate.metrics.METRIC_NAMES), so a mean difference
# lies in [-1, 1]: the display cuts an interval there and calls a larger MDE out of range (at
# two seeds a t reference with one or two degrees of freedom can give either).
DIFF_RANGE = 1.0
COLUMNS = ("arm", "seeds", "queries", "diff", "ci_low", "ci_high", "ci_level", "p", "p_holm", "significant",
           "se", "df", "mde", "seeds_needed", "queries_needed", "note")
# A study that declares an equivalence margin (`Study.equivalence_margin`) also gets the two
# one-sided tests, Holm across its arms as a second family: their p's, the 1 - 2a interval at
# each arm's Holm level a, and whether it lies inside the margin.
EQUIVALENCE_COLUMNS = ("p_equivalence", "p_equivalence_holm", "eq_low", "eq_high", "eq_level", "equivalent")


@dataclass(frozen=True)
class PerQuery:
    """Per-query values of a run's finished final trials.

    `values[metric][(arm, seed)]` is a (Q,) float array aligned with `query_ids[metric]`
    (sorted query ids, the same for every trial of that metric). `missing` names the final
    trials that have no per-query file (e.g. finished before a resume that added them)."""

    split: str
    task_hash: str
    query_ids: dict[str, tuple[str, ...]]
    values: dict[str, dict[tuple[str, int], np.ndarray]]
    missing: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()  # a panel's task names, in panel order (values under "<task>/<metric>")


def final_trials(table: pd.DataFrame) -> pd.DataFrame:
    """The rows statistics are computed over: finished grid trials."""
    keep = pd.Series(True, index=table.index)
    # Rows read from records have both (`embedlab.core.schema.upgrade`); a row of a table built
    # by hand without one is, as a record without one, a finished final trial.
    if "status" in table:
        keep &= table["status"].fillna("finished") == "finished"
    if "stage" in table:
        keep &= table["stage"].fillna("final") == "final"
    return table[keep]


def load_per_query(run_dir: str | Path, table: pd.DataFrame) -> PerQuery | None:
    """The per-query values of `table`'s finished final trials, read from
    `<run_dir>/per_query/<trial_id>.json` (a local path or a pyarrow filesystem URI); None when
    the run has no per_query/ directory (runs written before per-query values existed).

    Files of tuning, failed or duplicate trials are skipped. A file whose arm, seed or stage
    disagrees with its trial row, a task or split other than the other trials', query ids
    other than the other trials' or a non-finite value raises ValueError naming it: values of
    different queries cannot be paired."""
    directory = store.join(run_dir, PER_QUERY_DIR)
    if not store.exists(directory):
        return None
    rows = {str(row["trial_id"]): row for row in final_trials(table).to_dict("records")}
    split = task_hash = reference = None
    tasks: tuple[str, ...] = ()
    query_ids: dict[str, tuple[str, ...]] = {}
    first_trial: dict[str, str] = {}
    values: dict[str, dict[tuple[str, int], np.ndarray]] = {}
    found = set()
    for location in store.list_files(directory, ".json"):
        try:
            record = json.loads(store.read_text(location))
        except json.JSONDecodeError as error:
            raise ValueError(f"{location}: not a JSON per-query record ({error})") from None
        trial_id = str(record.get("trial_id"))
        if trial_id not in rows:  # not a finished final trial: never part of a comparison
            continue
        row = rows[trial_id]
        for key in ("arm", "seed"):
            if record.get(key) != row[key]:
                raise ValueError(f"{location}: {key} {record.get(key)!r}, but the trial table has "
                                 f"{row[key]!r} for trial {trial_id}")
        if record.get("stage", "final") != "final":
            raise ValueError(f"{location}: stage {record.get('stage')!r}, but trial {trial_id} is a final trial")
        scored_on = (record.get("split"), record.get("task_hash"), tuple(record.get("tasks") or ()))
        if reference is None:
            split, task_hash, tasks, reference = *scored_on, trial_id
        elif scored_on != (split, task_hash, tasks):
            raise ValueError(
                f"{location}: trial {trial_id} was scored on split {scored_on[0]!r} of task {str(scored_on[1])[:12]}, "
                f"trial {reference} on split {split!r} of task {str(task_hash)[:12]}; values of different "
                "queries cannot be paired")
        row_hash = row.get("eval/task_hash")
        if isinstance(row_hash, str) and row_hash != record.get("task_hash"):
            raise ValueError(f"{location}: task hash {str(record.get('task_hash'))[:12]}, but trial {trial_id}'s "
                             f"row was scored on task {row_hash[:12]}")
        if not isinstance(record.get("values"), dict):
            raise ValueError(f"{location}: no 'values' object (metric -> query id -> value)")
        for metric, by_query in record["values"].items():
            ids = tuple(sorted(by_query))
            if metric not in query_ids:
                query_ids[metric], first_trial[metric] = ids, trial_id
            elif ids != query_ids[metric]:
                differ = len(set(ids) ^ set(query_ids[metric]))
                raise ValueError(
                    f"{location}: {metric} of trial {trial_id} covers {len(ids)} queries, trial "
                    f"{first_trial[metric]}'s {len(query_ids[metric])} ({differ} ids in only one of them); "
                    "per-query values must cover the same queries to be paired")
            array = np.array([by_query[q] for q in ids], dtype=float)
            bad = np.flatnonzero(~np.isfinite(array))
            if bad.size:
                raise ValueError(f"{location}: {metric} of query {ids[bad[0]]!r} is {array[bad[0]]}, not a finite number")
            values.setdefault(metric, {})[(row["arm"], int(row["seed"]))] = array
        found.add(trial_id)
    return PerQuery(split=split or "", task_hash=task_hash or "", query_ids=query_ids, values=values,
                    missing=tuple(t for t in rows if t not in found), tasks=tasks)


def arm_generator(arm: str, seed: int = BOOTSTRAP_SEED) -> np.random.Generator:
    """The Generator of `arm`'s bootstrap: default_rng([seed, crc32(arm name)])."""
    return np.random.default_rng([seed, zlib.crc32(arm.encode())])


def paired_bootstrap(arm: np.ndarray, control: np.ndarray, *, rng: np.random.Generator,
                     resamples: int = RESAMPLES) -> np.ndarray:
    """(B,) bootstrap replicates of the mean paired difference of two (S, Q) arrays.

    Rows are seeds (row s of `arm` pairs with row s of `control`), columns query ids. Replicate
    b draws seed rows i = rng.integers(0, S, size=S), then query columns j =
    rng.integers(0, Q, size=Q), and is mean(D[i][:, j]) with D = arm - control, computed as
    (counts_i @ D @ counts_j) / (S Q) where counts are how often each row / column was drawn."""
    arm, control = np.asarray(arm, dtype=float), np.asarray(control, dtype=float)
    if arm.ndim != 2 or arm.shape != control.shape or 0 in arm.shape:
        raise ValueError(f"arm {arm.shape} and control {control.shape}: need two equal (seeds, queries) "
                         "shapes with at least one seed and one query")
    if resamples < 2:
        raise ValueError(f"resamples: {resamples}; a standard error needs at least 2")
    differences = arm - control
    seeds, queries = differences.shape
    replicates = np.empty(resamples)
    for b in range(resamples):
        seed_counts = np.bincount(rng.integers(0, seeds, size=seeds), minlength=seeds)
        query_counts = np.bincount(rng.integers(0, queries, size=queries), minlength=queries)
        replicates[b] = seed_counts @ differences @ query_counts
    return replicates / (seeds * queries)


def stratified_paired_bootstrap(arms: Sequence[np.ndarray], controls: Sequence[np.ndarray], *,
                                rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray:
    """(B,) bootstrap replicates of a panel mean's paired difference, stratified by task.

    `arms[t]` and `controls[t]` are task t's (S, Q_t) values: rows are the same S seeds in every
    task (row s of a task's arm pairs with row s of its control), columns that task's queries.
    Replicate b draws seed rows i = rng.integers(0, S, size=S) once, then for each task t in
    order query columns j_t = rng.integers(0, Q_t, size=Q_t), and is the unweighted mean over
    tasks of the task means, (1/T) sum_t mean(D_t[i][:, j_t]) with D_t = arms[t] - controls[t]:
    queries are resampled within their own task, and the T task means are averaged (summed in
    task order, then divided by T). Each task mean is computed as (counts_i @ D_t @ counts_j_t)
    / (S Q_t), counts being how often each row / column was drawn. With one task this is
    `paired_bootstrap`, draw for draw."""
    differences = []
    for t, (arm, control) in enumerate(zip(arms, controls, strict=True)):
        arm, control = np.asarray(arm, dtype=float), np.asarray(control, dtype=float)
        if arm.ndim != 2 or arm.shape != control.shape or 0 in arm.shape:
            raise ValueError(f"task {t}: arm {arm.shape} and control {control.shape}: need two equal (seeds, "
                             "queries) shapes with at least one seed and one query")
        differences.append(arm - control)
    if not differences:
        raise ValueError("a stratified bootstrap needs at least one task")
    seeds = differences[0].shape[0]
    if any(d.shape[0] != seeds for d in differences):
        raise ValueError(f"tasks hold {[d.shape[0] for d in differences]} seeds; every task needs the same seeds")
    if resamples < 2:
        raise ValueError(f"resamples: {resamples}; a standard error needs at least 2")
    replicates = np.empty(resamples)
    for b in range(resamples):
        seed_counts = np.bincount(rng.integers(0, seeds, size=seeds), minlength=seeds)
        means = []
        for d in differences:
            queries = d.shape[1]
            query_counts = np.bincount(rng.integers(0, queries, size=queries), minlength=queries)
            means.append((seed_counts @ d @ query_counts) / (seeds * queries))
        replicates[b] = sum(means) / len(means)
    return replicates


def panel_strata(per_query: PerQuery, metric: str) -> list[str] | None:
    """The per-query keys a panel mean `metric` ("mean/<m>") averages, "<task>/<m>" in panel
    order; None when `metric` is not a panel mean of `per_query`'s panel."""
    prefix, _, measure = metric.partition("/")
    if prefix != MEAN or not per_query.tasks:
        return None
    return [f"{task}/{measure}" for task in per_query.tasks]


def bootstrap_p(replicates: np.ndarray) -> Fraction:
    """Two-sided p = min(1, 2 min(#{r <= 0}, #{r >= 0}) / B), exact: the smallest a whose
    level 1 - a percentile interval (`percentile_interval`) excludes 0."""
    below, above = int((replicates <= 0).sum()), int((replicates >= 0).sum())
    return min(Fraction(1), Fraction(2 * min(below, above), len(replicates)))


def percentile_interval(replicates: np.ndarray, alpha: float | Fraction) -> tuple[float, float]:
    """The level 1 - alpha percentile interval of (B,) replicates: the (c+1)-th smallest and
    the (c+1)-th largest, c = floor(B alpha / 2) (exact arithmetic, so integer boundaries
    round the same way as `bootstrap_p`)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: {alpha} is not between 0 and 1")
    ordered = np.sort(replicates)
    c = math.floor(Fraction(alpha) * len(ordered) / 2)
    return float(ordered[c]), float(ordered[len(ordered) - c - 1])


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in input order: with p sorted ascending (ties keep
    input order), adjusted_(i) = max over k <= i of min(1, (m - k + 1) p_(k))."""
    for p in p_values:
        if not 0 <= p <= 1:
            raise ValueError(f"p-value {p} is not between 0 and 1")
    m = len(p_values)
    adjusted: list = [None] * m
    running = 0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def holm_levels(p_values: Sequence[float], alpha: float) -> tuple[list, list, list[bool]]:
    """(adjusted p, per-hypothesis level, rejected) of Holm's step-down at family-wise `alpha`.

    The level of the hypothesis of rank r (1-based, ascending p) is alpha / (m - r + 1) while
    the step-down still rejects, and the level at which it stopped for every later rank; so
    `p <= level` holds exactly when Holm rejects, which is exactly when adjusted p <= alpha."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: {alpha} is not between 0 and 1")
    m = len(p_values)
    levels: list = [None] * m
    rejected = [False] * m
    stopped = None
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        level = alpha / (m - rank)
        if stopped is None and p_values[index] <= level:
            rejected[index], levels[index] = True, level
        else:
            stopped = level if stopped is None else stopped
            levels[index] = stopped
    return holm_adjust(p_values), levels, rejected


def full_width(metric: str) -> str:
    """The full width's name of a metric at a truncated width (`<split>/dim<d>/<m>` ->
    `<split>/<m>`); any other metric as it is."""
    return re.sub(r"^([^/]+)/dim\d+/([^/]+)$", r"\1/\2", metric)


def width_family(per_query: PerQuery, metric: str) -> list[str]:
    """The study metric at every width the trials were scored at (`eval.dims`): the full width's
    `<split>/<m>` first, then `<split>/dim<d>/<m>` by width, when `metric` is one of them and
    the run holds more than one; else `[metric]` alone."""
    match = re.fullmatch(r"([^/]+)/(?:dim\d+/)?([^/]+)", metric)
    if not match:
        return [metric]
    split, measure = match.groups()
    widths = sorted((int(found.group(1)), key) for key in per_query.values
                    if (found := re.fullmatch(rf"{re.escape(split)}/dim(\d+)/{re.escape(measure)}", key)))
    full = full_width(metric)
    family = ([full] if full in per_query.values else []) + [key for _, key in widths]
    return family if len(family) > 1 and metric in family else [metric]


def paired_tests(per_query: PerQuery, metric: str, arms: Sequence[str], *, alpha: float = ALPHA,
                 family: Sequence[str] | None = None, margin: float | None = None) -> pd.DataFrame:
    """One row per non-control arm (`arms[0]` is the control) on `metric`: `COLUMNS`.

    `family`: the metrics tested together (the study metric at every scored width,
    `width_family`); Holm then runs across every (arm, metric) and the result has one row per
    pair, metric by metric, with a `metric` column. Default: `metric` alone, no `metric` column.

    seeds / queries: the paired seeds and query ids tested; diff: Dbar; se, df: its standard
    error and Satterthwaite degrees of freedom under the crossed model (`embedlab.stats.crossed`);
    ci_low, ci_high at ci_level: the Holm-corrected interval; p, p_holm: raw and Holm-adjusted
    two-sided p (never 0); significant: p_holm <= alpha; mde: the difference the test detects
    with 80% power at these seeds and queries; seeds_needed: for an arm that is not
    significant, the seeds (at these queries) that would detect its observed difference with
    80% power, at Holm's strictest level (NaN beyond `crossed.MAX_SEEDS`); queries_needed: where
    queries dominate the variance, the queries (at these seeds) that would. An arm with one
    paired seed is listed with `note` "one seed: no test", one with none "no paired seeds";
    either is left out of the family (m counts the arms tested).

    `margin` (an equivalence margin, metric units) adds `EQUIVALENCE_COLUMNS`: the two one-sided
    tests of |delta| >= margin (`crossed.tost_p`) with Holm across the same pairs as a second
    family at `alpha`; an arm shown equivalent needs no rerun size."""
    if len(arms) < 2:
        raise ValueError(f"arms: {list(arms)}; a paired test needs a control and at least one other arm")
    metrics = list(family or [metric])
    if metric not in metrics:
        raise ValueError(f"family {metrics} does not hold the study metric {metric}")
    pairs = []
    for member in metrics:
        for row, estimate in arm_estimates(per_query, member, arms):
            row["metric"] = member
            pairs.append((row, estimate))
    rows = [row for row, _ in pairs]
    tested = holm_family(pairs, alpha)
    if margin is not None:
        equivalence_family(pairs, alpha, margin)
    strictest = alpha / len(tested) if tested else alpha
    for row, estimate in tested:
        row.update(mde=crossed.minimum_detectable_effect(estimate, strictest, POWER))
        if not row["significant"] and not row.get("equivalent"):
            row.update(_rerun_size(estimate, strictest))
    columns = list(COLUMNS) + (list(EQUIVALENCE_COLUMNS) if margin is not None else []) + (
        ["metric"] if family is not None and len(metrics) > 1 else [])
    return pd.DataFrame(rows, columns=columns)


def equivalence_family(pairs: Sequence[tuple[dict, crossed.CrossedEstimate | None]], alpha: float,
                       margin: float) -> None:
    """Holm across every (row, estimate) with an estimate on the TOST p of |delta| >= `margin`:
    each row gets `EQUIVALENCE_COLUMNS` (a row without a test: not equivalent)."""
    for row, _ in pairs:
        row.update({column: math.nan for column in EQUIVALENCE_COLUMNS} | {"equivalent": False})
    tested = [(row, estimate) for row, estimate in pairs if estimate is not None]
    raw = [crossed.tost_p(estimate, margin) for _, estimate in tested]
    adjusted, levels, rejected = holm_levels(raw, alpha)
    for (row, estimate), p, p_holm, level, equivalent in zip(tested, raw, adjusted, levels, rejected):
        low, high = crossed.equivalence_interval(estimate, level)
        if equivalent != (-margin < low and high < margin):  # the module's contract; a failure is a bug
            raise AssertionError(f"{row.get('arm')}: TOST says {equivalent} but the interval is [{low}, {high}]")
        row.update(p_equivalence=p, p_equivalence_holm=p_holm, eq_low=low, eq_high=high, eq_level=1 - 2 * level,
                   equivalent=equivalent)


def holm_family(pairs: Sequence[tuple[dict, crossed.CrossedEstimate | None]], alpha: float = ALPHA
                ) -> list[tuple[dict, crossed.CrossedEstimate]]:
    """Holm across every (row, estimate) with an estimate: each such row gets its raw `p`,
    `p_holm`, `significant` and the interval at its Holm level (`ci_low`, `ci_high`,
    `ci_level`); returns those pairs, in order."""
    tested = [(row, estimate) for row, estimate in pairs if estimate is not None]
    raw = [crossed.p_value(estimate) for _, estimate in tested]
    adjusted, levels, rejected = holm_levels(raw, alpha)
    for (row, estimate), p, p_holm, level, significant in zip(tested, raw, adjusted, levels, rejected):
        low, high = crossed.interval(estimate, level)
        if significant != (low > 0 or high < 0):  # the module's contract; a failure here is a bug
            raise AssertionError(f"{row.get('arm')}: Holm says {significant} but the interval is [{low}, {high}]")
        row.update(p=p, p_holm=p_holm, ci_low=low, ci_high=high, ci_level=1 - level, significant=significant)
    return tested


def arm_estimates(per_query: PerQuery, metric: str, arms: Sequence[str]) -> list[tuple[dict, object]]:
    """Each non-control arm's row (counts, difference, note) and crossed estimate (None: no test)
    on one metric."""
    control = arms[0]
    strata = panel_strata(per_query, metric)
    keys = strata or [metric]  # a panel mean: one stratum per task; else the metric itself
    by_key = [per_query.values.get(key, {}) for key in keys]
    queries = sum(len(per_query.query_ids.get(key, ())) for key in keys)

    def seeds_of(arm: str) -> set[int]:  # seeds with values in every stratum
        return set.intersection(*({s for a, s in by_trial if a == arm} for by_trial in by_key))

    control_seeds = seeds_of(control)
    rows = []
    for arm in arms[1:]:
        estimate = None
        seeds = sorted(seeds_of(arm) & control_seeds)
        row = {column: math.nan for column in COLUMNS} | {"arm": arm, "seeds": len(seeds), "queries": queries,
                                                          "significant": False, "note": ""}
        if len(seeds) == 1:
            row.update(note=ONE_SEED, diff=sum(float((by_trial[(arm, seeds[0])] - by_trial[(control, seeds[0])]).mean())
                                               for by_trial in by_key) / len(by_key))
        elif not seeds:
            row.update(note="no paired seeds")
        else:
            differences = [np.stack([by_trial[(arm, s)] - by_trial[(control, s)] for s in seeds])
                           for by_trial in by_key]
            estimate = crossed.crossed_estimate(differences)
            row.update(diff=estimate.mean, se=estimate.se, df=estimate.df)
        rows.append((row, estimate))
    return rows


def _rerun_size(estimate: crossed.CrossedEstimate, alpha: float) -> dict:
    """seeds_needed, and queries_needed where the query part is the larger, for the observed difference."""
    seeds = crossed.seeds_needed(estimate, estimate.mean, alpha, POWER)
    sizes = {"seeds_needed": math.nan if seeds is None else seeds}
    if estimate.query_part > estimate.seed_part:
        queries = crossed.queries_needed(estimate, estimate.mean, alpha, POWER)
        if queries is not None:
            sizes["queries_needed"] = queries
    return sizes


@dataclass(frozen=True)
class PairedComparison:
    """The paired per-query test of a run, or why there is none (`unavailable`)."""

    metric: str
    control: str | None
    alpha: float = ALPHA
    tests: pd.DataFrame | None = field(default=None, repr=False)
    unavailable: str = ""
    missing: tuple[str, ...] = ()
    strata: tuple[str, ...] = ()  # a panel mean's tasks: their seed means are averaged before the seed term
    # The study metric at the run's other scored widths (`width_family`), tested in one Holm
    # family with `tests`: a row per (arm, width), with a `metric` column.
    other_widths: pd.DataFrame | None = field(default=None, repr=False)
    margin: float | None = None  # the study's equivalence margin: the tests carry EQUIVALENCE_COLUMNS

    @property
    def test(self) -> str:
        """The test's name: `crossed.METHOD`, and for a panel mean the tasks it averages."""
        if not self.strata:
            return crossed.METHOD
        return f"{crossed.METHOD}; panel mean of {', '.join(self.strata)}, seeds shared across its tasks"

    @property
    def header(self) -> str:
        """What "significant" means, in three lines (or the one line saying why there is no test)."""
        if self.tests is None:
            return f"paired per-query test: unavailable: {self.unavailable}"
        m = int(self.tests["p"].notna().sum())
        tested = f"{m} tested arm(s)"
        if self.other_widths is not None:
            widths = 1 + self.other_widths["metric"].nunique()
            m += int(self.other_widths["p"].notna().sum())
            tested = f"{m} tested (arm, width) pairs over {widths} widths"
        missing = f"; {len(self.missing)} final trial(s) without per-query values left out" if self.missing else ""
        lines = [f"paired per-query test of {self.metric} vs control {self.control}: {self.test}{missing}",
                 f"model: {crossed.MODEL}; size shown by simulation (`embedlab stats calibrate`)"]
        if self.margin is None:
            return "\n".join([*lines, (
                f'"significant" = Holm-adjusted p <= {self.alpha:g} across {tested} (family-wise alpha '
                f"{self.alpha:g} under the model), i.e. the corrected interval excludes 0; one seed: no test; "
                f"MDE and seeds needed: {POWER:.0%} power at Holm's strictest level")])
        margin = f"±{self.margin:g}"
        return "\n".join([*lines, (
            f'"better"/"worse" = Holm-adjusted p <= {self.alpha:g} across {tested}, i.e. the corrected interval '
            f'excludes 0; "equivalent within {margin}" = two one-sided tests of |difference| >= {self.margin:g} '
            f"(the same calibration), Holm across the same arms at {self.alpha:g} as a second family, i.e. the "
            f"equivalence interval (1 - 2 x the Holm level) lies inside {margin}; one seed: no test; "
            f"MDE and seeds needed: {POWER:.0%} power at Holm's strictest level")])


def compare_to_control(run_dir: str | Path, table: pd.DataFrame, *, alpha: float = ALPHA) -> PairedComparison:
    """The paired per-query test of the study metric (`table.attrs`, set by load_table) for
    every non-control arm, read from the run's per_query/ files."""
    metric, arms = table.attrs.get("metric"), list(table.attrs.get("arm_order") or [])
    margin = table.attrs.get("margin")
    base = dict(metric=metric, control=arms[0] if arms else None, alpha=alpha, margin=margin)
    per_query = load_per_query(run_dir, table)
    if per_query is None:
        return PairedComparison(**base, unavailable=f"the run has no {PER_QUERY_DIR}/ directory (written before "
                                                    "trials recorded per-query values); seed-level intervals only")
    if len(arms) < 2:
        return PairedComparison(**base, unavailable="the study has fewer than two arms")
    strata = panel_strata(per_query, metric)
    if not all(per_query.values.get(key) for key in strata or [metric]):
        return PairedComparison(**base, missing=per_query.missing,
                                unavailable=f"no per-query {metric} values for the finished final trials")
    family = width_family(per_query, metric)
    if len(family) > 1:  # every scored width of the metric, in one Holm family
        everything = paired_tests(per_query, metric, arms, alpha=alpha, family=family, margin=margin)
        study = everything["metric"] == metric
        return PairedComparison(**base, tests=everything[study].drop(columns="metric").reset_index(drop=True),
                                missing=per_query.missing,
                                other_widths=everything[~study].reset_index(drop=True))
    tests = paired_tests(per_query, metric, arms, alpha=alpha, margin=margin)
    return PairedComparison(**base, tests=tests, missing=per_query.missing,
                            strata=per_query.tasks if strata else ())


def p_text(p: float) -> str:
    """A p-value as printed: 4 decimals, or 2 significant digits below 0.0001 (never "0"), and
    "< 1e-16" below double precision's resolution of 1 - p, where more digits mean nothing."""
    if math.isnan(p):
        return "n/a"
    if p < P_FLOOR:
        return f"< {P_FLOOR:.0e}"
    return f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}"


def verdict_of(row: dict, margin: float | None = None) -> str:
    """An arm's result in words: its note (no test), else without a margin "significant" or "not
    significant", and with one "better" / "worse" (by the difference's sign), "equivalent within
    ±margin" (both: "better, equivalent within ±margin") or "not significant"."""
    if row["note"]:
        return row["note"]
    if margin is None:
        return "significant" if row["significant"] else "not significant"
    equivalence = f"equivalent within ±{margin:g}"
    if row["significant"]:
        direction = "better" if row["diff"] > 0 else "worse"
        return f"{direction}, {equivalence}" if row["equivalent"] else direction
    return equivalence if row["equivalent"] else "not significant"


def interval_text(low: float, high: float, level: float) -> str:
    """An interval with its level, cut to [-DIFF_RANGE, DIFF_RANGE] (saying so; an infinite one
    too, as at 2 seeds and a small level); "n/a" for none."""
    if math.isnan(low):
        return "n/a"
    shown = f"[{max(low, -DIFF_RANGE):+.4f}, {min(high, DIFF_RANGE):+.4f}] at {level * 100:.4g}%"
    return shown + (" (cut to the metric's range)" if low < -DIFF_RANGE or high > DIFF_RANGE else "")


def cells(tests: pd.DataFrame, margin: float | None = None) -> pd.DataFrame:
    """The tests as display strings: difference, corrected interval with its level, p, Holm p,
    the verdict (`verdict_of`), MDE and the seeds (or queries) a rerun would need (4 decimals);
    with a `margin`, the equivalence interval and its Holm p beside them. An interval is cut to
    [-DIFF_RANGE, DIFF_RANGE] and says so; an MDE beyond it reads "none in range"."""
    def mde(value: float) -> str:
        if math.isnan(value):
            return "n/a"
        return f"{value:.4f}" if value <= DIFF_RANGE else f"over {DIFF_RANGE:g}: none in range"

    def needed(row: dict) -> str:
        if row["note"] == ONE_SEED:
            return "2+ seeds"
        if row["significant"] or math.isnan(row["diff"]) or row.get("equivalent"):
            return ""
        seeds = "over %d seeds" % crossed.MAX_SEEDS if math.isnan(row["seeds_needed"]) else f"{row['seeds_needed']:.0f} seeds"
        return seeds + ("" if math.isnan(row["queries_needed"]) else f" or {row['queries_needed']:.0f} queries")

    records = tests.to_dict("records")
    return pd.DataFrame({
        **({"metric": tests["metric"].to_list()} if "metric" in tests else {}),
        "arm": tests["arm"].to_list(),
        "seeds": tests["seeds"].astype(str).to_list(),
        "queries": tests["queries"].astype(str).to_list(),
        "diff": ["n/a" if math.isnan(d) else f"{d:+.4f}" for d in tests["diff"]],
        "corrected interval": [interval_text(*values)
                               for values in zip(tests["ci_low"], tests["ci_high"], tests["ci_level"])],
        "p": [p_text(p) for p in tests["p"]],
        "Holm p": [p_text(p) for p in tests["p_holm"]],
        **({"equivalence interval": [interval_text(*v) for v in zip(tests["eq_low"], tests["eq_high"],
                                                                   tests["eq_level"])],
            "Holm p (equivalence)": [p_text(p) for p in tests["p_equivalence_holm"]]} if margin is not None else {}),
        "result": [verdict_of(r, margin) for r in records],
        f"MDE ({POWER:.0%} power)": [mde(m) for m in tests["mde"]],
        "to detect diff": [needed(r) for r in records],
    })
