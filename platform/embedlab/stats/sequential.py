"""Seeds until a study decides: the crossed test (`embedlab.stats.crossed`) taken at planned
looks, alpha spent over the looks, Holm across arms, equivalence within a declared margin and
a futility stop.

Design (`Design`, fixed before any trial of a round runs). The seeds run in rounds: round j
trains every open arm and the control at the first S_j seeds of `seed_order` (the study's
seeds, then the smallest unused integers), S_1 < ... < S_K = max_seeds (`look_schedule`:
the study's seed count, then every `LOOK_STEP` more, the last at max_seeds). A look is the
crossed test of each open arm against the control on its S_j paired seeds.

Alpha spending: Bonferroni over the looks. Look j gets the weight w_j = f(t_j) - f(t_{j-1}),
f(t) = t^3, t = S / S_K (a power family close to O'Brien-Fleming's shape: little alpha early,
most at the end), and none below `EFFICACY_MIN_SEEDS` seeds, where the calibrated test can
only show enormous differences (at 2 seeds the whole alpha needs a Satterthwaite p below
0.0004): those rounds train but do not test. The weights sum to 1. Arm i's look j p-value is
the calibrated test's p_ij, and its sequential p is p*_i = min over its looks of p_ij / w_j.

Why it holds its size. Each look is the fixed calibrated test, whose worst case over the seed
share is its level (`embedlab stats calibrate`), so under the null P(p_ij <= w_j u) <= w_j u,
and by the union bound P(p*_i <= u) <= sum_j w_j u = u. That needs nothing about how the looks
are correlated (nested seeds, a shared query term, the degrees of freedom changing from look
to look) and holds under any stopping: an arm that stops early has a p* no smaller than it
would have had at every planned look. So futility stops, equivalence stops, stops caused by
other arms and failed trials cannot raise it. It inherits the fixed test's assumptions.

Holm across the m arms on p* (family-wise alpha): an arm is "better" or "worse" (the sign of
its difference at the look that decided it; every current study metric is higher-is-better)
when Holm rejects its p*. At look j arm i passes Holm's level L exactly when, at one of its
looks, its Satterthwaite p_S is at most `calibrated_level(S - 1, w L)`: the decisions here are
made in that threshold form, which needs no p-value and runs on arrays of simulated studies.
p* can only fall as looks are added, so a rejection is never taken back.

Equivalence (a study's `equivalence_margin` delta): two one-sided tests (`crossed.tost_p`), the
worst case of each one-sided test half the two-sided one, spent over the looks the same way
(p*_e = min p_e,ij / w_j) and Holm across arms at alpha as a second family. Equivalent at
level a exactly when the 1 - 2a calibrated interval lies inside (-delta, delta). Each family
is at most alpha wrong; one arm's two nulls (delta = 0; |delta| >= margin) are disjoint, so one
arm's wrong verdict is at most alpha, and any wrong verdict across arms at most 2 alpha.

Futility (non-binding: it only stops rejections, so it never raises a size): at a testing look
before the last, an arm is futile when, were the true difference the one observed, neither the
last look's difference test nor its equivalence test would succeed with probability
`FUTILITY_POWER` (a normal approximation at max seeds: the seed part shrinks with the seeds,
the query part stays).

Verdicts (`verdict`): "better", "worse", "equivalent within ±delta" (both: "better, equivalent
within ±delta"), "futile", and at max seeds undecided "not significant" (no margin) or
"undecided" (a margin declared, neither shown); while seeds remain, "undecided (next round: S
seeds)".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as distributions

from embedlab.stats import crossed

ALPHA = 0.05  # family-wise, as the fixed test's (`paired.ALPHA`)
EFFICACY_MIN_SEEDS = 4
SPENDING_POWER = 3.0
FUTILITY_POWER = 0.10
LOOK_STEP = 2
SPENDING = ("Bonferroni over the looks, weight of a look f(t) - f(t_previous), f(t) = t^3, t = seeds / max "
            f"seeds, none below {EFFICACY_MIN_SEEDS} seeds")


def look_schedule(first: int, max_seeds: int, step: int = LOOK_STEP) -> tuple[int, ...]:
    """Seeds at each look: `first`, then every `step` more, and `max_seeds` last; a look that
    would land fewer than `step` seeds below `max_seeds` is dropped."""
    if not 1 <= first < max_seeds:
        raise ValueError(f"looks from {first} to {max_seeds} seeds: need 1 <= first < max_seeds")
    looks = list(range(first, max_seeds - step + 1, step))
    return (*looks, max_seeds) if looks else (first, max_seeds)


def spending_weights(looks: Sequence[int], power: float = SPENDING_POWER,
                     min_seeds: int = EFFICACY_MIN_SEEDS) -> tuple[float, ...]:
    """Each look's share of alpha: f(S_j / S_K) - f(S_{j-1} / S_K), f(t) = t^power, with f
    taken as 0 below `min_seeds` seeds (those looks get nothing, the first testing look what
    f has reached). Sums to 1."""
    if looks[-1] < min_seeds:
        raise ValueError(f"max seeds {looks[-1]}: a look tests from {min_seeds} seeds on")
    spent = [0.0 if seeds < min_seeds else (seeds / looks[-1]) ** power for seeds in looks]
    return tuple(b - a for a, b in zip([0.0, *spent[:-1]], spent))


def extended_seeds(seeds: Sequence[int], count: int, taken: Sequence[int] = ()) -> tuple[int, ...]:
    """`count` seeds: `seeds` first, then the smallest unused non-negative integers outside
    `taken` (a study's tuning seeds)."""
    order, candidate = list(seeds[:count]), 0
    excluded = set(seeds) | set(taken)
    while len(order) < count:
        if candidate not in excluded:
            order.append(candidate)
        candidate += 1
    return tuple(order)


@dataclass(frozen=True, kw_only=True)
class Design:
    """A sequential study's plan, fixed before its first look: the seeds at each look, each
    look's share of alpha, the seed order, the family (`arms` tested against the control),
    the family-wise `alpha`, the equivalence `margin` (None: no equivalence question) and the
    futility threshold."""

    looks: tuple[int, ...]
    weights: tuple[float, ...]
    seed_order: tuple[int, ...]
    arms: int
    alpha: float = ALPHA
    margin: float | None = None
    futility_power: float = FUTILITY_POWER
    spending: str = SPENDING

    def __post_init__(self) -> None:
        if len(self.looks) != len(self.weights) or not math.isclose(sum(self.weights), 1.0):
            raise ValueError(f"looks {self.looks} and weights {self.weights}: one weight per look, summing to 1")
        if len(self.seed_order) != self.looks[-1] or self.arms < 1:
            raise ValueError(f"seed order {self.seed_order} for {self.looks[-1]} seeds, {self.arms} arm(s)")

    @property
    def max_seeds(self) -> int:
        return self.looks[-1]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "looks": list(self.looks), "weights": list(self.weights),
                "seed_order": list(self.seed_order)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Design:
        return cls(**{**raw, "looks": tuple(raw["looks"]), "weights": tuple(raw["weights"]),
                      "seed_order": tuple(raw["seed_order"])})


def make_design(seeds: Sequence[int], max_seeds: int, arms: int, *, taken: Sequence[int] = (),
                alpha: float = ALPHA, margin: float | None = None) -> Design:
    """The design of a study that starts at `seeds` and may run to `max_seeds`, testing `arms`
    arms against its control (`taken`: seeds it may not use, its tuning seeds)."""
    looks = look_schedule(len(seeds), max_seeds)
    return Design(looks=looks, weights=spending_weights(looks), seed_order=extended_seeds(seeds, max_seeds, taken),
                  arms=arms, alpha=alpha, margin=margin)


def holm_level(design: Design, rejected_before: int) -> float:
    """Holm's level for the next hypothesis once `rejected_before` are rejected: alpha / (m - r).
    Computed in one place, so that every caller asks `calibrated_level` the same float."""
    return design.alpha / (design.arms - rejected_before)


def difference_threshold(design: Design, look: int, rejected_before: int) -> float:
    """The Satterthwaite p an arm's look `look` must reach to pass Holm's level after
    `rejected_before` rejections: calibrated_level(S - 1, w L); 0 at a look with no weight."""
    weight = design.weights[look]
    if weight <= 0:
        return 0.0
    return crossed.calibrated_level(design.looks[look] - 1, weight * holm_level(design, rejected_before))


def equivalence_threshold(design: Design, look: int, rejected_before: int) -> float:
    """The Satterthwaite p each one-sided test's t must reach (as a two-sided p) for the TOST to
    pass Holm's level: calibrated_level(S - 1, 2 w L); 0 at a look with no weight."""
    weight = design.weights[look]
    if weight <= 0:
        return 0.0
    return crossed.calibrated_level(design.looks[look] - 1, 2 * weight * holm_level(design, rejected_before))


@dataclass(frozen=True)
class State:
    """The family after some looks, for n studies (one in a real run) of m arms: arrays
    (n, m) unless named otherwise. `passes[..., r]`: the arm has passed, at some look it took,
    the threshold of Holm's level after r rejections (`difference_threshold`); `sign[..., r]`
    the sign of its difference at the first look that did."""

    looks_taken: int
    open: np.ndarray  # bool: the arm is still trained
    seeds: np.ndarray  # int: seeds at the last look the arm took
    passes: np.ndarray  # bool (n, m, m)
    sign: np.ndarray  # float (n, m, m)
    passes_equivalence: np.ndarray  # bool (n, m, m)
    better_or_worse: np.ndarray  # bool: Holm rejects "no difference"
    equivalent: np.ndarray  # bool: Holm rejects "|difference| >= margin"
    futile: np.ndarray  # bool: stopped by futility

    @property
    def decided_sign(self) -> np.ndarray:
        """(n, m) the sign of each rejected arm's difference at the first look that passed the
        strictest level it passed (0 for an arm not rejected)."""
        strictest = np.argmax(self.passes, axis=2)
        chosen = np.take_along_axis(self.sign, strictest[..., None], 2)[..., 0]
        return np.where(self.better_or_worse, chosen, 0.0)


def start(design: Design, studies: int = 1) -> State:
    """The state before the first look: every arm open, nothing passed."""
    m = design.arms
    return State(looks_taken=0, open=np.ones((studies, m), bool), seeds=np.zeros((studies, m), int),
                 passes=np.zeros((studies, m, m), bool), sign=np.zeros((studies, m, m)),
                 passes_equivalence=np.zeros((studies, m, m), bool), better_or_worse=np.zeros((studies, m), bool),
                 equivalent=np.zeros((studies, m), bool), futile=np.zeros((studies, m), bool))


def holm(passes: np.ndarray) -> np.ndarray:
    """(n, m) Holm's rejections from `passes` (n, m, m): step down, the next level (after r
    rejections) applied to every arm not yet rejected, until a step rejects none (the same set
    as Holm's one-at-a-time order: an arm passing a level passes every later, larger one)."""
    studies, m, _ = passes.shape
    rejected = np.zeros((studies, m), bool)
    for _ in range(m):
        count = np.minimum(rejected.sum(axis=1), m - 1)
        now = np.take_along_axis(passes, count[:, None, None].repeat(m, axis=1), 2)[..., 0]
        grown = rejected | now
        if (grown == rejected).all():
            break
        rejected = grown
    return rejected


def step(design: Design, state: State, mean: np.ndarray, seed_part: np.ndarray, query_part: np.ndarray) -> State:
    """The family after its next look, given each arm's crossed estimate there ((n, m) arrays:
    Dbar, X_seed, X_query on the look's seeds; values of arms no longer open are ignored)."""
    look = state.looks_taken
    seeds, m = design.looks[look], design.arms
    open_ = state.open
    passes, sign, equivalence = state.passes.copy(), state.sign.copy(), state.passes_equivalence.copy()
    futile = state.futile.copy()
    if design.weights[look] > 0:
        with np.errstate(invalid="ignore", divide="ignore"):
            p_s = crossed.satterthwaite_p(mean, seed_part, query_part, seeds - 1)
            for r in range(m):
                new = open_ & _reaches(p_s, difference_threshold(design, look, r)) & ~passes[..., r]
                passes[..., r] |= new
                sign[..., r] = np.where(new, np.sign(mean), sign[..., r])
                if design.margin is not None:
                    equivalence[..., r] |= open_ & _tost_passes(mean, seed_part, query_part, seeds - 1, design.margin,
                                                                equivalence_threshold(design, look, r))
    better_or_worse, equivalent = holm(passes), holm(equivalence)
    last = look == len(design.looks) - 1
    if design.weights[look] > 0 and not last:
        power_d, power_e = projected_powers(design, look, mean, seed_part, query_part)
        futile |= open_ & ~better_or_worse & ~equivalent & (power_d < design.futility_power) & (
            power_e < design.futility_power)
    stays = open_ & ~better_or_worse & ~equivalent & ~futile & (not last)
    return State(looks_taken=look + 1, open=stays, seeds=np.where(open_, seeds, state.seeds), passes=passes,
                 sign=sign, passes_equivalence=equivalence, better_or_worse=better_or_worse, equivalent=equivalent,
                 futile=futile)


def _tost_passes(mean, seed_part, query_part, seed_df: int, margin: float, threshold: float) -> np.ndarray:
    """Both one-sided tests reach `threshold` (as two-sided Satterthwaite p's of (Dbar -/+
    margin) / SE), each on its own side."""
    below = crossed.satterthwaite_p(mean - margin, seed_part, query_part, seed_df)
    above = crossed.satterthwaite_p(mean + margin, seed_part, query_part, seed_df)
    return (mean - margin < 0) & (mean + margin > 0) & _reaches(below, threshold) & _reaches(above, threshold)


def _reaches(p_s: np.ndarray, threshold: float) -> np.ndarray:
    """p_S at most a threshold; never at a threshold of 0 (no p_S reaches that level: even a
    p_S of 0, a zero variance, reads as `crossed.P_S_FLOOR`)."""
    return (p_s <= threshold) if threshold > 0 else np.zeros(np.shape(p_s), bool)


def projected_powers(design: Design, look: int, mean, seed_part, query_part) -> tuple[np.ndarray, np.ndarray]:
    """(difference, equivalence) power of the last look at the full alpha, were the true
    difference the observed `mean` (normal approximation; the seed part scaled to max seeds,
    the query part as it is). Equivalence power is 0 without a margin."""
    seeds, last = design.looks[look], design.max_seeds
    with np.errstate(invalid="ignore", divide="ignore"):
        projected_seed = np.asarray(seed_part, float) * seeds / last
        sd = np.sqrt(projected_seed + np.asarray(query_part, float))
        df = crossed.satterthwaite_df(crossed.seed_share(projected_seed, query_part), last - 1)
        level_d = crossed.calibrated_level(last - 1, design.weights[-1] * design.alpha)
        power_d = distributions.norm.cdf(np.abs(mean) / sd - distributions.t.isf(level_d / 2, df))
        power_e = np.zeros_like(power_d)
        if design.margin is not None:
            level_e = crossed.calibrated_level(last - 1, 2 * design.weights[-1] * design.alpha)
            half = distributions.t.isf(level_e / 2, df) * sd
            power_e = np.maximum(0.0, distributions.norm.cdf((design.margin - half - mean) / sd)
                                 - distributions.norm.cdf((-design.margin + half - mean) / sd))
    return np.nan_to_num(power_d, nan=1.0), np.nan_to_num(power_e)


def simulate(design: Design, differences: np.ndarray) -> State:
    """The design run on simulated studies: `differences` (n, m, max_seeds, Q) holds each
    study's per-(seed, query) differences of every arm from the control, drawn once at max
    seeds, so that look j reads the first S_j seeds: nested looks sharing their queries, as a
    real study's are."""
    state = start(design, differences.shape[0])
    for seeds in design.looks:
        if not state.open.any():
            break
        state = step(design, state, *crossed.variance_parts([differences[..., :seeds, :]]))
    return state


def trials_used(design: Design, state: State) -> np.ndarray:
    """(n,) trials each study trained: every arm's seeds, and the control's, which runs as long
    as its longest-running arm."""
    return state.seeds.sum(axis=1) + state.seeds.max(axis=1)


def margin_text(margin: float) -> str:
    return f"±{margin:g}"


def verdict(*, better_or_worse: bool, equivalent: bool, sign: float, futile: bool, open_: bool,
            margin: float | None, next_seeds: int | None = None) -> str:
    """An arm's verdict in the words every table uses (module docstring)."""
    equivalence = f"equivalent within {margin_text(margin)}" if margin is not None else ""
    if better_or_worse:
        direction = "better" if sign > 0 else "worse"
        return f"{direction}, {equivalence}" if equivalent else direction
    if equivalent:
        return equivalence
    if futile:
        return "futile"
    if open_:
        return f"undecided (next round: {next_seeds} seeds)"
    return "not significant" if margin is None else "undecided"
