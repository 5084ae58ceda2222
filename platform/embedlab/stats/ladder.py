"""Does an answer hold as compute grows? One study's comparison read across a ladder of budgets.

A ladder is the same study run at several budgets, its rungs: each rung a full, independent
run directory whose arms were compute-matched within it (`table.check_equal_compute`, refused
otherwise). A rung's compute is the mean measured training FLOPs (`budget/flops`) of its
control's final trials.

Per rung r and non-control arm a: the paired per-query difference D_ar from the control, its
standard error and p under the crossed seeds x queries model (`embedlab.stats.crossed`, the
test `embedlab table` runs), Holm-Bonferroni across every (arm, rung) at family-wise 0.05,
and the corrected interval at each pair's Holm level.

Across rungs, per arm: the slope of D against log2(compute), an ordinary least-squares line
(every rung weighs the same). The slope is a linear combination sum_r c_r D_r whose
coefficients depend on the rungs' budgets only, so its variance is sum_r c_r^2 se_r^2 with
each se_r^2 the rung's own estimate, on its seeds - 1 degrees of freedom at most. The interval
is Student's t at Satterthwaite's degrees of freedom for that combination with every rung's
variance counted as seed variance (the smallest df the per-rung estimates allow, so the
widest interval; the per-rung test's worst case over the seed share, in the same spirit).
Weighting the rungs by 1/se_r^2 instead would let the estimated variances choose the
coefficients: simulated at 3 seeds with the seed term dominant, that interval excludes a
flat trend more often than 5% plus three Monte-Carlo standard errors; the equal-weight one
stays within it (`tests/test_ladder.py` simulates both). Then a one-line
reading ("same sign at every rung, shrinking by 0.012 per doubling", "crosses zero between
rungs 2 and 3"). With two rungs the line goes through both points and its interval is what
their standard errors allow. A projection to another budget evaluates the line there, with
its interval, and is labelled an extrapolation outside the measured range: never a result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from embedlab.core import store
from embedlab.core.errors import RunRecordError, UsageError
from embedlab.stats.paired import final_trials
from embedlab.stats import crossed
from embedlab.stats.paired import ALPHA, ONE_SEED, arm_estimates, holm_family, load_per_query, p_text
from embedlab.stats.table import STUDY_FILE, check_equal_compute, load_table, read_study_record
from embedlab.studies.study import is_rung_run_dir, rung_base

TREND_LEVEL = 0.95  # of the slope's and a projection's interval
COLUMNS = ("rung", "flops", "arm", "seeds", "diff", "se", "df", "p", "p_holm", "significant", "ci_low", "ci_high",
           "note")


class LadderError(UsageError):
    """Run directories that do not make one ladder (another study, metric or arms; one rung)."""


@dataclass(frozen=True)
class Rung:
    """One budget of the ladder: its run directory, trial table and measured compute."""

    run_dir: str
    table: pd.DataFrame = field(repr=False)
    flops: float


@dataclass(frozen=True)
class Trend:
    """An arm's least-squares line of D on log2(FLOPs): D = intercept + slope * log2(F)."""

    arm: str
    rungs: int
    slope: float
    slope_se: float
    intercept: float
    cov: tuple[tuple[float, float], tuple[float, float]]
    low: float
    high: float
    reading: str
    df: float = math.inf  # of the slope's t interval (conservative Satterthwaite)
    ses: tuple[float, ...] = ()  # per rung: what a projection's interval is built from
    seeds: tuple[int, ...] = ()
    flops: tuple[float, ...] = ()  # the rungs it was fitted on


def load_rungs(run_dirs: Sequence[str | Path]) -> list[Rung]:
    """The rungs of `run_dirs` in increasing compute, each checked compute-matched within itself;
    LadderError unless they are at least two runs of one study's arms and metric at different budgets."""
    if len(run_dirs) < 2:
        raise LadderError(f"a ladder needs at least two run directories (rungs), got {len(run_dirs)}")
    rungs, first = [], None
    for run_dir in run_dirs:
        table = load_table(run_dir)
        check_equal_compute(table, table.attrs["unit"])
        identity = (table.attrs["arm_order"], table.attrs["metric"])
        if first is None:
            first = (identity, run_dir)
        elif identity != first[0]:
            raise LadderError(f"{run_dir}: arms {identity[0]} and metric {identity[1]}, but {first[1]} has "
                              f"arms {first[0][0]} and metric {first[0][1]}: not rungs of one ladder")
        final = final_trials(table)
        control = final[final["arm"] == table.attrs["arm_order"][0]]
        flops = pd.to_numeric(control.get("budget/flops", pd.Series(dtype=float)), errors="coerce").mean()
        if not flops > 0:
            raise LadderError(f"{run_dir}: its control has no measured training FLOPs (budget/flops)")
        rungs.append(Rung(str(run_dir), table, float(flops)))
    rungs.sort(key=lambda r: r.flops)
    for lower, upper in zip(rungs, rungs[1:]):
        if upper.flops <= lower.flops * 1.01:
            raise LadderError(f"{lower.run_dir} and {upper.run_dir} trained within 1% of the same FLOPs: "
                              "one budget, not two rungs")
    return rungs


def ladder_tests(rungs: Sequence[Rung], *, alpha: float = ALPHA) -> pd.DataFrame:
    """One row per (rung, non-control arm): `COLUMNS`, Holm across all of them (module docstring)."""
    pairs = []
    for index, rung in enumerate(rungs, start=1):
        per_query = load_per_query(rung.run_dir, rung.table)
        metric, arms = rung.table.attrs["metric"], rung.table.attrs["arm_order"]
        if per_query is None or not per_query.values.get(metric):
            raise LadderError(f"{rung.run_dir}: no per-query {metric} values to test")
        for row, estimate in arm_estimates(per_query, metric, arms):
            pairs.append((row | {"rung": index, "flops": rung.flops}, estimate))
    holm_family(pairs, alpha)
    rows = [{column: row.get(column, math.nan) for column in COLUMNS} for row, _ in pairs]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def fit_trend(arm: str, flops: Sequence[float], diffs: Sequence[float], ses: Sequence[float],
              seeds: Sequence[int], level: float = TREND_LEVEL) -> Trend:
    """The least-squares line of `diffs` on log2(`flops`), every rung weighing the same, its
    covariance from the rungs' standard errors `ses`, and the slope's t interval at the
    combination's conservative Satterthwaite df from each rung's `seeds` (module docstring),
    with its reading."""
    d, se = np.asarray(diffs, dtype=float), np.asarray(ses, dtype=float)
    if len(d) < 2 or not np.all(se > 0):
        raise ValueError(f"arm {arm}: a trend needs two or more rungs with a positive standard error")
    hat = _hat(flops)
    intercept, slope = hat @ d
    cov = hat @ np.diag(se**2) @ hat.T
    slope_se = math.sqrt(cov[1, 1])
    df = combination_df(hat[1], se, seeds)
    t = stats.t.ppf(0.5 + level / 2, df)
    low, high = slope - t * slope_se, slope + t * slope_se
    return Trend(arm=arm, rungs=len(d), slope=float(slope), slope_se=slope_se, intercept=float(intercept),
                 cov=((float(cov[0, 0]), float(cov[0, 1])), (float(cov[1, 0]), float(cov[1, 1]))),
                 low=float(low), high=float(high), reading=reading(d, float(slope), float(low), float(high)),
                 df=float(df), ses=tuple(map(float, se)), seeds=tuple(map(int, seeds)),
                 flops=tuple(map(float, flops)))


def _hat(flops: Sequence[float]) -> np.ndarray:
    """(2, R): the least-squares (intercept, slope) of any rungs' values y on log2(`flops`) is `_hat(flops) @ y`."""
    x = np.log2(np.asarray(flops, dtype=float))
    design = np.column_stack([np.ones_like(x), x])
    return np.linalg.inv(design.T @ design) @ design.T


def combination_df(coefficients, ses, seeds) -> float:
    """Satterthwaite's degrees of freedom of sum_r c_r D_r with each rung's variance se_r^2
    estimated on k_r = seeds_r - 1 df: (sum c^2 se^2)^2 / sum (c^2 se^2)^2 / k_r."""
    a = np.asarray(coefficients, dtype=float) ** 2 * np.asarray(ses, dtype=float) ** 2
    k = np.asarray(seeds, dtype=float) - 1
    return float(np.sum(a)) ** 2 / float(np.sum(a**2 / k))


def reading(diffs: Sequence[float], slope: float, low: float, high: float) -> str:
    """One line: the sign across rungs (or where it crosses zero) and what the slope says."""
    signs = np.sign(np.asarray(diffs, dtype=float))
    trend = (f"{slope:+.4f} per doubling of compute, 95% interval [{low:+.4f}, {high:+.4f}]"
             + (": not distinguishable from flat" if low <= 0 <= high else ""))
    changes = [i for i in range(1, len(signs)) if signs[i] != signs[i - 1]]
    if changes:
        i = changes[0]
        return f"crosses zero between rungs {i} and {i + 1}; {trend}"
    direction = "above" if signs[0] > 0 else "below"
    moving = "growing" if slope * signs[0] > 0 else "shrinking"
    return f"same sign at every rung ({direction} the control), {moving} by {abs(slope):.4f} per doubling; {trend}"


def trends(tests: pd.DataFrame, level: float = TREND_LEVEL) -> list[Trend]:
    """Each non-control arm's trend over the rungs where it was tested (two or more needed)."""
    found = []
    for arm, rows in tests.groupby("arm", sort=False):
        rows = rows[rows["se"].notna() & (rows["se"] > 0)]
        if len(rows) >= 2:
            found.append(fit_trend(str(arm), rows["flops"], rows["diff"], rows["se"], rows["seeds"], level))
    return found


def project(trend: Trend, flops: float, level: float = TREND_LEVEL) -> dict:
    """The trend evaluated at `flops`, its interval, and whether that is beyond the range of the
    rungs it was fitted on."""
    measured = trend.flops
    x = math.log2(flops)
    (c00, c01), (_, c11) = trend.cov
    value = trend.intercept + trend.slope * x
    se = math.sqrt(c00 + 2 * x * c01 + x * x * c11)
    # The projection is the combination (1, x) . beta of the rungs' differences: its own df.
    coefficients = np.array([1.0, x]) @ _hat(measured)
    t = stats.t.ppf(0.5 + level / 2, combination_df(coefficients, trend.ses, trend.seeds))
    outside = not min(measured) <= flops <= max(measured)
    return {"arm": trend.arm, "flops": flops, "diff": value, "low": value - t * se, "high": value + t * se,
            "extrapolation": outside}


def rung_means(rung: Rung) -> pd.Series:
    """Each arm's mean study metric over its final trials on one rung, in the study's arm order."""
    final = final_trials(rung.table)
    means = pd.to_numeric(final[rung.table.attrs["metric"]], errors="coerce").groupby(final["arm"]).mean()
    return means.reindex([arm for arm in rung.table.attrs["arm_order"] if arm in means.index])


def rung_winners(rungs: Sequence[Rung]) -> list[str]:
    """Each rung's arm with the highest mean study metric over its final trials (the arm
    `embedlab promote` would rank first on that rung), rung by rung."""
    return [str(rung_means(rung).idxmax()) for rung in rungs]


def rung_record(rungs: Sequence[Rung], winner: str | None = None) -> dict[str, Any]:
    """Each rung's winner on the study metric and the rungs (1-based, below the top) that
    `winner` (default: the top rung's) did not win: what `winner_line` prints and promotion
    records."""
    winners = rung_winners(rungs)
    winner = winners[-1] if winner is None else winner
    lost = [(i, arm, rung.run_dir) for i, (arm, rung) in enumerate(zip(winners[:-1], rungs), start=1) if arm != winner]
    return {"winner": winner, "won_every_rung": not lost, "lost": lost,
            "rungs": [{"run_dir": rung.run_dir, "flops": rung.flops, "winner": arm} for rung, arm in zip(rungs, winners)]}


def winner_line(rungs: Sequence[Rung]) -> str:
    """Whether the top rung's winner (what promotion would take: promote the top rung's run)
    also won every lower rung."""
    record = rung_record(rungs)
    return (f"top rung's winner on the study metric: {record['winner']} (promote {rungs[-1].run_dir}); "
            + ("it also won every lower rung" if record["won_every_rung"] else
               "another arm won " + ", ".join(f"rung {i} ({arm})" for i, arm, _ in record["lost"])))


_SAME_STUDY = ("factor", "arms", "seeds", "metric", "profile")  # what rungs of one ladder share


def ladder_of(run_dir: str | Path) -> list[str]:
    """The rungs of the budget ladder that `run_dir` is one rung of: beside it (the same storage
    folder), the latest run directory of each other budget of its study (named `<study>` or
    `<study>-x<F>`, with the same factor, arms, seeds, metric, profile and parent) that has
    finished trials, and `run_dir` itself; `[run_dir]` alone when it is no rung of a ladder.

    Only a sibling whose directory name makes it a run of this study or one of its rungs
    (`is_rung_run_dir`) is read: an unrelated run beside it, readable or not, is never opened.
    One that is read and cannot be is a RunRecordError naming its file and why it was read."""
    run_dir = store.resolve(run_dir)
    record = read_study_record(run_dir)
    base = rung_base(record["study"]["name"])
    identity = ({k: record["study"].get(k) for k in _SAME_STUDY}, record.get("parent"))
    latest: dict[str, str] = {}
    for other in sorted(store.list_dirs(store.parent(run_dir))):
        if (store.resolve(other) == run_dir or not is_rung_run_dir(store.name(other), base)
                or not store.exists(store.join(other, STUDY_FILE))):
            continue
        try:
            theirs = read_study_record(other)
            name = theirs["study"]["name"]
            if (name == record["study"]["name"] or rung_base(name) != base
                    or ({k: theirs["study"].get(k) for k in _SAME_STUDY}, theirs.get("parent")) != identity):
                continue
            finished = len(final_trials(load_table(other)))
        except RunRecordError as error:
            raise RunRecordError(f"{error} (read because {store.name(other)}, beside {store.name(run_dir)}, is named "
                                 f"as a run of study {base} or of one of its budget rungs, which a ladder compares; "
                                 "repair or move it)") from None
        if finished:
            latest[name] = other  # sorted: the timestamped names put the latest last
    return [run_dir, *latest.values()]


def render_ladder(run_dirs: Sequence[str | Path], *, project_to: float | None = None) -> str:
    """The ladder as text: the rungs, the per-rung tests (Holm across arms x rungs), each arm's
    trend with its reading, and (with `project_to`) the labelled projection."""
    rungs = load_rungs(run_dirs)
    tests = ladder_tests(rungs)
    first = rungs[0].table.attrs
    lines = [f"ladder of study {first['study']}: {len(rungs)} rungs, metric {first['metric']}, control "
             f"{first['arm_order'][0]}; each rung compute-matched within itself",
             f"test per rung: {crossed.METHOD}; Holm across {int(tests['p'].notna().sum())} (arm, rung) pairs "
             f"at family-wise {ALPHA:g}",
             "trend: least squares of the difference on log2(training FLOPs), rungs weighed equally, variance "
             "from the rungs' own; 95% interval Student's t at Satterthwaite's df, every rung's variance counted as "
             "seed variance (its size simulated in the test suite)", ""]
    for index, rung in enumerate(rungs, start=1):
        lines.append(f"rung {index}: {rung.flops:.4g} FLOPs  {rung.run_dir}")
    means = pd.DataFrame([{"rung": index, "FLOPs": f"{rung.flops:.4g}",
                           **{arm: f"{mean:.4f}" for arm, mean in rung_means(rung).items()}}
                          for index, rung in enumerate(rungs, start=1)])
    lines += ["", f"mean {first['metric']} over each arm's seeds:", means.to_string(index=False)]
    shown = pd.DataFrame({
        "rung": tests["rung"], "arm": tests["arm"], "seeds": tests["seeds"],
        "diff": [f"{d:+.4f}" if d == d else "n/a" for d in tests["diff"]],
        "corrected interval": [f"[{lo:+.4f}, {hi:+.4f}]" if lo == lo else "n/a"
                               for lo, hi in zip(tests["ci_low"], tests["ci_high"])],
        "p": [p_text(p) for p in tests["p"]],
        "Holm p": [p_text(p) for p in tests["p_holm"]],
        "result": [n or ("significant" if s else "not significant") for n, s in zip(tests["note"], tests["significant"])],
    })
    lines += ["", shown.to_string(index=False), ""]
    found = trends(tests)
    for trend in found:
        lines.append(f"{trend.arm} vs {first['arm_order'][0]} over {trend.rungs} rungs: {trend.reading} "
                     f"(df {trend.df:.1f})")
    lines.append(winner_line(rungs))
    missing = sorted(set(tests["arm"]) - {t.arm for t in found})
    for arm in missing:
        lines.append(f"{arm}: no trend (fewer than two rungs with a test: {ONE_SEED} or no paired seeds)")
    if project_to is not None:
        lines.append("")
        lines.extend(projection_line(project(trend, project_to)) for trend in found)
    return "\n".join(lines) + "\n"


def projection_line(at: dict) -> str:
    """One projection (`project`) as a line, labelled an extrapolation outside the measured rungs."""
    label = ("EXTRAPOLATION beyond the measured range, not a result" if at["extrapolation"]
             else "interpolated within the measured range")
    return (f"{at['arm']} at {at['flops']:.4g} FLOPs: {at['diff']:+.4f} [{at['low']:+.4f}, {at['high']:+.4f}] "
            f"({label})")


def project_study(run_dirs: Sequence[str | Path], arms: Sequence[str], flops: float, study: str) -> dict:
    """Each arm's ladder trend (from the rungs `run_dirs`) projected to `flops`, the training
    budget of `study` whose arms are `arms` (control first): what `embedlab plan --trend-from`
    prints. LadderError when the rungs hold other arms, or when the study's budget is not in FLOPs."""
    rungs = load_rungs(run_dirs)
    ladder_arms = list(rungs[0].table.attrs["arm_order"])
    if list(arms) != ladder_arms:
        raise LadderError(f"the ladder's arms {ladder_arms} are not study {study}'s {list(arms)}: "
                          "a trend projects only to the same comparison")
    if not flops > 0:
        raise LadderError(f"study {study}: its budget is not in training FLOPs, so there is no compute to "
                          "project the trend to")
    found = trends(ladder_tests(rungs))
    projections = [project(trend, flops) for trend in found]
    return {"study": study, "flops": flops, "rungs": [r.run_dir for r in rungs],
            "measured_flops": [rungs[0].flops, rungs[-1].flops], "projections": projections,
            "lines": [f"projected from a {len(rungs)}-rung ladder measured at {rungs[0].flops:.4g} to "
                      f"{rungs[-1].flops:.4g} training FLOPs, to study {study}'s {flops:.4g} (95% intervals):",
                      *(projection_line(at) for at in projections)]}
