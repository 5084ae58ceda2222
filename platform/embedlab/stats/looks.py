"""A study run until decided, read from its run directory: which trials each round needs, each
look's crossed estimates, the family's state after each look (`embedlab.stats.sequential`),
and the record the sweep keeps of them (`sequential.json`) and a table prints.

Every look is a pure function of the design and the trials' per-query values, so the record
can always be recomputed: a resumed sweep replays every look from the data and refuses a run
whose recorded looks differ from the data's (a changed per-query value, a changed design), and
a look is never taken on an incomplete round.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from embedlab.core import store
from embedlab.records.rundir import SEQUENTIAL_FILE, read_record
from embedlab.stats import calibration, crossed, paired, sequential
from embedlab.stats.paired import PerQuery
from embedlab.stats.sequential import Design, State
from embedlab.studies.study import Study

SCHEMA = 1  # of sequential.json
OPERATING_STUDIES = 1_000  # simulated studies behind each arm's "fixed seeds of equal power"
EQUAL_POWER_FROM = 0.5  # below this power at the observed difference the comparison says nothing


def design_for(study: Study, alpha: float = paired.ALPHA) -> Design:
    """The design of a study run until decided: its seeds first, to its max seeds, its arms but
    the first tested against the first, its equivalence margin."""
    return sequential.make_design(study.seeds, study.max_seeds, len(study.arms) - 1, taken=study.tuning_seeds,
                                  alpha=alpha, margin=study.equivalence_margin)


@dataclass(frozen=True)
class Look:
    """One look: its index (0-based), the seeds it read and each open arm's crossed estimate on
    the study metric against the control."""

    index: int
    seeds: tuple[int, ...]
    estimates: dict[str, crossed.CrossedEstimate]


def open_arms(state: State, arms: Sequence[str]) -> list[str]:
    """The non-control arms still trained (`arms[0]` is the control)."""
    return [arm for arm, is_open in zip(arms[1:], state.open[0]) if is_open]


def round_trials(design: Design, state: State, arms: Sequence[str]) -> list[tuple[str, int]]:
    """(arm, seed) of every trial the next round's look reads: the control and each open arm at
    the first seeds of the design's order; [] when the study is decided."""
    if state.looks_taken >= len(design.looks) or not state.open.any():
        return []
    seeds = design.seed_order[:design.looks[state.looks_taken]]
    return [(arm, seed) for arm in (arms[0], *open_arms(state, arms)) for seed in seeds]


def available(per_query: PerQuery | None, metric: str) -> set[tuple[str, int]]:
    """(arm, seed) of the finished final trials with per-query values of `metric` (every task
    of a panel mean)."""
    if per_query is None:
        return set()
    keys = paired.panel_strata(per_query, metric) or [metric]
    return set.intersection(*(set(per_query.values.get(key, {})) for key in keys))


def read_look(per_query: PerQuery, metric: str, arms: Sequence[str], state: State, design: Design) -> Look:
    """The next look's estimates: each open arm against the control on the look's seeds."""
    seeds = design.seed_order[:design.looks[state.looks_taken]]
    kept = {key: {trial: values for trial, values in by_trial.items() if trial[1] in seeds}
            for key, by_trial in per_query.values.items()}
    on_seeds = replace(per_query, values=kept)
    estimates = {row["arm"]: estimate for row, estimate in
                 paired.arm_estimates(on_seeds, metric, [arms[0], *open_arms(state, arms)])}
    missing = [arm for arm, estimate in estimates.items() if estimate is None]
    if missing:
        raise ValueError(f"look at {len(seeds)} seeds: arms {missing} have fewer than 2 paired seeds")
    return Look(index=state.looks_taken, seeds=tuple(seeds), estimates=estimates)


def _arrays(look: Look, arms: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(1, m) Dbar, X_seed, X_query of every non-control arm (NaN where the arm took no look)."""
    def column(name: str) -> np.ndarray:
        return np.array([[getattr(look.estimates[arm], name) if arm in look.estimates else math.nan
                          for arm in arms[1:]]])
    return column("mean"), column("seed_part"), column("query_part")


def replay(design: Design, per_query: PerQuery | None, metric: str, arms: Sequence[str]
           ) -> tuple[list[Look], list[State]]:
    """Every look the run's trials allow, in order, and the state after each (the start state
    first): a look is taken only when every trial of its round has per-query values."""
    states = [sequential.start(design)]
    looks: list[Look] = []
    have = available(per_query, metric)
    while True:
        needed = round_trials(design, states[-1], arms)
        if not needed or not set(needed) <= have:
            return looks, states
        look = read_look(per_query, metric, arms, states[-1], design)
        looks.append(look)
        states.append(sequential.step(design, states[-1], *_arrays(look, arms)))


def _look_p(design: Design, look: Look) -> dict[str, dict[str, float]]:
    """Each arm's p (difference) and TOST p at a look with a share of alpha."""
    if design.weights[look.index] <= 0:
        return {}
    return {arm: {"p": crossed.p_value(estimate),
                  **({"tost_p": crossed.tost_p(estimate, design.margin)} if design.margin is not None else {})}
            for arm, estimate in look.estimates.items()}


def sequential_p(design: Design, looks: Sequence[Look], ps: Sequence[dict], arm: str, key: str
                 ) -> tuple[float, int | None]:
    """An arm's sequential p over the looks it took, min of p / weight (capped at 1), and the
    index of the look that gives it (None before its first testing look)."""
    best, where = 1.0, None
    for look, by_arm in zip(looks, ps):
        if arm in by_arm:
            value = by_arm[arm][key] / design.weights[look.index]
            if where is None or value < best:
                best, where = min(1.0, value), look.index
    return best, where


def boundaries(design: Design, look: int) -> dict[str, dict[str, float]]:
    """The Satterthwaite-p thresholds of a look at each of Holm's levels (`alpha / m` ...
    `alpha`): what an arm's p_S (each one-sided test's, for equivalence) had to reach."""
    levels = {f"{sequential.holm_level(design, r):.6g}": r for r in range(design.arms)}
    found = {"difference": {level: sequential.difference_threshold(design, look, r) for level, r in levels.items()}}
    if design.margin is not None:
        found["equivalence"] = {level: sequential.equivalence_threshold(design, look, r) for level, r in levels.items()}
    return found


def summarize(design: Design, looks: Sequence[Look], states: Sequence[State], arms: Sequence[str],
              operating: bool = True) -> dict[str, Any]:
    """The record of a run's looks: the design, one entry per look (its seeds, weight,
    boundaries and each open arm's estimate, p and verdict then) and each arm's result after the
    last: seeds, deciding look, difference, the corrected interval at its deciding look and Holm
    level, sequential and Holm p in each family, the verdict, the MDE at max seeds and (with
    `operating`, once no arm is open) the fixed seeds of equal power at the observed difference.
    Raises AssertionError if the threshold decisions and the p-values disagree (a bug)."""
    ps = [_look_p(design, look) for look in looks]
    entries = [_look_entry(design, look, by_arm, states[i + 1], arms) for i, (look, by_arm) in enumerate(zip(looks, ps))]
    final = states[-1]
    results = _arm_results(design, looks, ps, final, arms)
    if operating and looks and not final.open.any():
        for arm, result in results.items():
            result.update(_equal_power(design, looks, arm, result["seeds"]))
    return {"schema": SCHEMA, "design": design.to_dict(), "looks": entries, "arms": results,
            "open": open_arms(final, arms), "finished": bool(looks) and not final.open.any()}


def _verdicts(design: Design, state: State, arms: Sequence[str]) -> dict[str, str]:
    following = design.looks[state.looks_taken] if state.looks_taken < len(design.looks) else None
    sign = state.decided_sign[0]
    return {arm: sequential.verdict(better_or_worse=bool(state.better_or_worse[0, i]),
                                    equivalent=bool(state.equivalent[0, i]), sign=float(sign[i]),
                                    futile=bool(state.futile[0, i]), open_=bool(state.open[0, i]),
                                    margin=design.margin, next_seeds=following)
            for i, arm in enumerate(arms[1:])}


def _look_entry(design: Design, look: Look, by_arm: dict, state: State, arms: Sequence[str]) -> dict[str, Any]:
    verdicts = _verdicts(design, state, arms)
    return {
        "round": look.index + 1, "seeds": len(look.seeds), "seed_ids": list(look.seeds),
        "weight": design.weights[look.index], "boundaries": boundaries(design, look.index),
        "arms": {arm: {"diff": e.mean, "se": e.se, "df": e.df, "queries": sum(e.queries),
                       "p_s": float(crossed.satterthwaite_p(e.mean, e.seed_part, e.query_part, e.seeds - 1)),
                       **by_arm.get(arm, {}), "verdict": verdicts[arm]}
                 for arm, e in look.estimates.items()},
    }


def _arm_results(design: Design, looks: Sequence[Look], ps: Sequence[dict], state: State, arms: Sequence[str]
                 ) -> dict[str, dict[str, Any]]:
    tested = list(arms[1:])
    verdicts = _verdicts(design, state, arms)
    seq = {arm: sequential_p(design, looks, ps, arm, "p") for arm in tested}
    adjusted, levels, rejected = paired.holm_levels([seq[a][0] for a in tested], design.alpha)
    _agree("better/worse", rejected, state.better_or_worse[0], tested)
    results = {}
    for i, arm in enumerate(tested):
        taken = [look for look in looks if arm in look.estimates]
        last = taken[-1].estimates[arm] if taken else None
        deciding = seq[arm][1]
        result = {"seeds": int(state.seeds[0, i]), "diff": None if last is None else last.mean,
                  "p_seq": seq[arm][0], "p_holm": adjusted[i], "holm_level": levels[i], "verdict": verdicts[arm],
                  "futile": bool(state.futile[0, i]), "open": bool(state.open[0, i]),
                  "decided_at": None, "interval": None, "interval_level": None}
        if deciding is not None:
            estimate, level = looks[deciding].estimates[arm], design.weights[deciding] * levels[i]
            result.update(interval=list(crossed.interval(estimate, level)), interval_level=1 - level,
                          decided_at=design.looks[deciding] if rejected[i] else None)
        if state.futile[0, i] and not rejected[i]:
            result["decided_at"] = int(state.seeds[0, i])
        if last is not None:
            result["mde"] = crossed.minimum_detectable_effect(
                replace(last, seeds=design.max_seeds), design.weights[-1] * design.alpha / design.arms)
        results[arm] = result
    if design.margin is not None:
        _equivalence_results(design, looks, ps, state, tested, results)
    return results


def _equivalence_results(design: Design, looks: Sequence[Look], ps: Sequence[dict], state: State,
                         tested: list[str], results: dict[str, dict]) -> None:
    seq = {arm: sequential_p(design, looks, ps, arm, "tost_p") for arm in tested}
    adjusted, levels, rejected = paired.holm_levels([seq[a][0] for a in tested], design.alpha)
    _agree("equivalent", rejected, state.equivalent[0], tested)
    for i, arm in enumerate(tested):
        result, deciding = results[arm], seq[arm][1]
        result.update(p_seq_equivalence=seq[arm][0], p_holm_equivalence=adjusted[i], equivalence_interval=None)
        if deciding is not None:
            level = design.weights[deciding] * levels[i]
            low, high = crossed.equivalence_interval(looks[deciding].estimates[arm], level)
            if rejected[i] != (-design.margin < low and high < design.margin):
                raise AssertionError(f"{arm}: TOST says {rejected[i]} but its interval is [{low}, {high}]")
            result.update(equivalence_interval=[low, high], equivalence_level=1 - 2 * level)
            if rejected[i] and result["decided_at"] is None:
                result["decided_at"] = design.looks[deciding]


def _agree(family: str, from_p: Sequence[bool], from_thresholds: np.ndarray, arms: Sequence[str]) -> None:
    """The module's contract: Holm on the sequential p's rejects exactly what the thresholds did."""
    if list(from_p) != [bool(x) for x in from_thresholds]:
        raise AssertionError(f"{family}: Holm on the sequential p's rejects {list(from_p)}, the thresholds "
                             f"{list(from_thresholds)} (arms {list(arms)})")


def _equal_power(design: Design, looks: Sequence[Look], arm: str, seeds: int) -> dict[str, Any]:
    """The arm's design at its observed difference and variance components (its last look's),
    one arm at Holm's strictest level: simulated power and expected seeds, and the fewest
    seeds of the fixed test at that level with the same power (None below `EQUAL_POWER_FROM`)."""
    last = [look for look in looks if arm in look.estimates][-1].estimates[arm]
    one = replace(design, arms=1, alpha=design.alpha / design.arms, margin=None)
    setting = calibration.Setting.from_estimate(last, design.max_seeds, last.mean)
    rng = np.random.default_rng([calibration.SIMULATION_SEED, zlib.crc32(arm.encode())])
    power, expected, fixed = calibration.operating_characteristics(one, setting, OPERATING_STUDIES, rng)
    return {"power": power, "expected_seeds": expected,
            "fixed_seeds": fixed if power >= EQUAL_POWER_FROM else None}


def same_looks(recorded: Sequence[dict], replayed: Sequence[dict]) -> str:
    """"" when every recorded look is the replayed one (its seeds, each arm's estimate and
    verdict); else what differs first."""
    for old, new in zip(recorded, replayed):
        if old["seed_ids"] != new["seed_ids"] or set(old["arms"]) != set(new["arms"]):
            return f"round {old['round']}: recorded on seeds {old['seed_ids']}, the data give {new['seed_ids']}"
        for arm, values in old["arms"].items():
            for key in ("diff", "se", "verdict"):
                if values[key] != new["arms"][arm][key] and not (
                        isinstance(values[key], float) and math.isclose(values[key], new["arms"][arm][key],
                                                                        rel_tol=1e-12, abs_tol=1e-15)):
                    return (f"round {old['round']}, arm {arm}: recorded {key} {values[key]!r}, the per-query values "
                            f"now give {new['arms'][arm][key]!r}")
    return ""


def read_sequential(run_dir) -> dict[str, Any] | None:
    """A run's `sequential.json`, None for a run of fixed seeds."""
    location = store.join(run_dir, SEQUENTIAL_FILE)
    if not store.exists(location):
        return None
    return read_record(location, "a sequential study's record", ("design", "looks", "arms", "rounds"))


def planned_trials(record: dict[str, Any]) -> set[tuple[str, int]]:
    """(arm, seed) of every trial the rounds so far asked for (the round in progress included)."""
    return {(arm, int(seed)) for entry in record["rounds"] for arm, seed in entry["trials"]}


def header(record: dict[str, Any], metric: str, control: str) -> str:
    """What the sequential verdicts mean, in four lines."""
    design = Design.from_dict(record["design"])
    m, alpha = design.arms, design.alpha
    weights = ", ".join(f"{w:.3g}" for w in design.weights)
    lines = [
        f"sequential paired test of {metric} vs control {control}: {crossed.METHOD}",
        f"looks at {', '.join(map(str, design.looks))} seeds (max {design.max_seeds}); alpha {alpha:g} spent over the "
        f"looks by Bonferroni, weights {weights} (f(t) = t^3, t = seeds / max seeds; no test below "
        f"{sequential.EFFICACY_MIN_SEEDS} seeds); an arm's sequential p = min over its looks of p / weight",
        f'"better"/"worse" = Holm across {m} arm(s) on the sequential p <= {alpha:g}, i.e. the corrected interval '
        "(at its deciding look and Holm level x the look's weight) excludes 0"
        + (f'; "equivalent within {sequential.margin_text(design.margin)}" = two one-sided tests, the same '
           f"calibration and spending, Holm across the arms at {alpha:g} as a second family, i.e. the equivalence "
           f"interval lies inside {sequential.margin_text(design.margin)}" if design.margin is not None else ""),
        f"futile = under {design.futility_power:.0%} power at {design.max_seeds} seeds for the observed difference "
        "(every test); decided arms train no further; size shown by simulation (`embedlab stats calibrate`); MDE: "
        f"{paired.POWER:.0%} power at the last look's level; fixed seeds of equal power: the fewest seeds a fixed "
        "design needs for the power this design has at the arm's observed difference (one arm, at Holm's strictest "
        "level)",
    ]
    return "\n".join(lines)


def result_cells(record: dict[str, Any], arms: Sequence[str]) -> pd.DataFrame:
    """Each tested arm's result as display strings."""
    margin = record["design"].get("margin")
    rows = []
    for arm in arms[1:]:
        r = record["arms"].get(arm)
        if r is None:
            continue
        low, high = r["interval"] or (math.nan, math.nan)
        row = {"arm": arm, "seeds": str(r["seeds"]),
               "decided at": "" if r["decided_at"] is None else f"{r['decided_at']} seeds",
               "diff": "n/a" if r["diff"] is None else f"{r['diff']:+.4f}",
               "corrected interval": paired.interval_text(low, high, r["interval_level"] or math.nan),
               "seq p": paired.p_text(r["p_seq"]), "Holm p": paired.p_text(r["p_holm"])}
        if margin is not None:
            low, high = r.get("equivalence_interval") or (math.nan, math.nan)
            row.update({"equivalence interval": paired.interval_text(low, high, r.get("equivalence_level", math.nan)),
                        "Holm p (equivalence)": paired.p_text(r["p_holm_equivalence"])})
        row["result"] = r["verdict"]
        row["MDE at max seeds"] = _mde_text(r.get("mde"), r)
        row["fixed seeds of equal power"] = _equal_power_text(r)
        rows.append(row)
    return pd.DataFrame(rows)


def _mde_text(mde: float | None, result: dict) -> str:
    if mde is None or result["verdict"].startswith(("better", "worse")):  # a difference shown needs no MDE
        return ""
    return f"{mde:.4f}" if mde <= paired.DIFF_RANGE else f"over {paired.DIFF_RANGE:g}: none in range"


def _equal_power_text(result: dict) -> str:
    if "power" not in result:
        return "" if result["open"] else "n/a"
    if result["fixed_seeds"] is None:
        return f"n/a (power {result['power']:.2f} at the observed difference)"
    return (f"{result['fixed_seeds']} (power {result['power']:.2f}; this design: {result['expected_seeds']:.1f} "
            "seeds expected)")


def look_lines(record: dict[str, Any]) -> list[str]:
    """One line per round: its seeds, the boundaries its look held the arms to, and the verdicts then."""
    lines = []
    for look in record["looks"]:
        bounds = look["boundaries"]
        if look["weight"] <= 0:
            test = "no test (no alpha below this many seeds)"
        else:
            shown = ", ".join(f"{p:.3g} at Holm level {level}" for level, p in bounds["difference"].items())
            test = f"weight {look['weight']:.3g}; Satterthwaite-p boundaries {shown}"
            if "equivalence" in bounds:
                test += "; each one-sided test's " + ", ".join(f"{p:.3g} at {level}"
                                                              for level, p in bounds["equivalence"].items())
        verdicts = "; ".join(f"{arm} {values['verdict']}" for arm, values in look["arms"].items())
        lines.append(f"round {look['round']} ({look['seeds']} seeds: {', '.join(map(str, look['seed_ids']))}): "
                     f"{test}; {verdicts}")
    return lines


def seeds_line(record: dict[str, Any], arms: Sequence[str]) -> str:
    """The seeds each arm ran and the trials that made, against the fixed design at max seeds."""
    design = Design.from_dict(record["design"])
    seeds = {arm: r["seeds"] for arm, r in record["arms"].items()}
    control = max(seeds.values(), default=0)
    used = sum(seeds.values()) + control
    fixed = len(arms) * design.max_seeds
    state = "decided" if record["finished"] else f"in progress (open: {', '.join(record['open'])})"
    return (f"seeds used ({state}): {arms[0]} {control} (the control runs as long as its longest arm), "
            + ", ".join(f"{arm} {n}" for arm, n in seeds.items())
            + f": {used} trials, against {fixed} for the fixed design at {design.max_seeds} seeds")
