"""The crossed seeds x queries model of a paired comparison, and a t test whose size holds
at the few seeds a study runs.

Model. Arm a and the control c were trained at the same S seeds and scored on the same Q
queries; their paired differences D[s, q] = value_a[s, q] - value_c[s, q] follow

    D[s, q] = delta + A[s] + B[q] + E[s, q],

A[s] ~ (0, var_seed) the seed x arm term (what one training seed does to this arm's
difference, shared by every query of that seed), B[q] ~ (0, var_query) the query term (some
queries favour the arm at every seed), E[s, q] ~ (0, var_noise) the rest, all independent.
The statistic is the mean difference Dbar; over new seeds and new queries

    Var(Dbar) = var_seed / S + var_query / Q + var_noise / (S Q).

Estimate. The two-way ANOVA of D without replication has mean squares

    MS_seed  = Q sum_s (Dbar_s - Dbar)^2 / (S - 1),                   E = Q var_seed + var_noise
    MS_query = S sum_q (Dbar_q - Dbar)^2 / (Q - 1),                   E = S var_query + var_noise
    MS_error = sum_sq (D - Dbar_s - Dbar_q + Dbar)^2 / ((S-1)(Q-1)),  E = var_noise

so V = X_seed + X_query, X_seed = MS_seed / (S Q) and X_query = max(0, MS_query - MS_error) /
(S Q), estimates Var(Dbar) (the truncation only ever makes V larger). X_seed carries the
seed x arm term and has only k = S - 1 degrees of freedom; X_query is estimated from many
queries and is taken as known.

Test. t = Dbar / sqrt(V). Satterthwaite's degrees of freedom for V are k / r^2, r = X_seed / V
the seed part's share, and "Satterthwaite's p" p_S = 2 P(t_{k/r^2} > |t|). Read as it is,
p_S is too small at few seeds: when the one seed degree of freedom of S = 2 happens to come
out small, r is small, the degrees of freedom large and a heavy-tailed t passes as normal
(a 13% false-positive rate at alpha 0.05 for the worst seed share, 8% at S = 3). The p-value
here is therefore the worst case over the unknown true seed share rho in [0, 1]:

    p = max_rho P_rho(p_S' <= p_S),

the probability, were the null true with seed share rho, that a study like this one gives a
Satterthwaite p as small as the observed (`worst_case_size`: an integral over the chi-square
law of X_seed, on a grid of rho). p <= alpha holds exactly when p_S <= `calibrated_level(k,
alpha)`, the nominal level whose worst-case size is alpha; intervals and power use that level.
At S = 2 it is about 0.0004 (two seeds can show only a very large difference), at S = 3 0.022,
at S = 5 0.041, and it tends to alpha as seeds grow.

A panel mean. For the unweighted mean over T tasks, Dbar = (1/T) sum_t Dbar_t; the same S
seeds (one trained model each) are scored on every task, so their terms are correlated
across tasks. With P_s = (1/T) sum_t Dbar_{t,s} the panel mean of seed s and s2_P its sample
variance over seeds (k = S - 1 degrees of freedom),

    X_seed = s2_P / S,   X_query = (1/T^2) sum_t max(0, MS_query,t - MS_error,t) / (S Q_t),

and the test is the same. With one task these are the single-task terms exactly.

One seed. With S = 1 the seed term cannot be told from the effect: there is no test.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

MODEL = "D[s,q] = effect + seed×arm + query + noise (crossed random effects)"
METHOD = ("t test on the crossed seeds x queries model (two-way ANOVA mean squares, Satterthwaite degrees "
          "of freedom), p the worst case over the seed share")
# The integral over X_seed's chi-square law (its quantiles) and the grid of true seed shares.
CHI2_POINTS = 1_000
SHARE_POINTS = 101
SHARE_TABLE_POINTS = 1_001
# The smallest Satterthwaite p the worst case is computed at. Below about 1e-130 the integral
# loses its accuracy (at 2 seeds it rises again, at 3 it turns NaN), so a smaller p_S is read
# as this one: never a smaller p than the numerics support (W is increasing, so it is
# conservative), and every level with a worst case below 1 is reachable down to here.
P_S_FLOOR = 1e-100


@dataclass(frozen=True)
class MeanSquares:
    """The two-way ANOVA (no replication) of one task's (S, Q) differences."""

    seeds: int
    queries: int
    mean: float
    seed: float  # MS_seed, S - 1 degrees of freedom
    query: float  # MS_query, Q - 1
    error: float  # MS_error, (S - 1)(Q - 1)


def _checked(differences) -> np.ndarray:
    d = np.asarray(differences, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 2:
        raise ValueError(f"differences of shape {d.shape}: need (seeds, queries) with at least 2 of each")
    return d


def _anova(d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(seed means, MS_seed, MS_query, MS_error) of (..., S, Q) differences, over the leading axes."""
    seeds, queries = d.shape[-2:]
    grand = d.mean(axis=(-2, -1))
    by_seed, by_query = d.mean(axis=-1), d.mean(axis=-2)
    residual = d - by_seed[..., :, None] - by_query[..., None, :] + grand[..., None, None]
    return (by_seed, queries * ((by_seed - grand[..., None]) ** 2).sum(axis=-1) / (seeds - 1),
            seeds * ((by_query - grand[..., None]) ** 2).sum(axis=-1) / (queries - 1),
            (residual ** 2).sum(axis=(-2, -1)) / ((seeds - 1) * (queries - 1)))


def _parts(anovas: Sequence[tuple], queries: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Dbar, X_seed, X_query) from each task's `_anova` and query count."""
    count = len(anovas)
    panel_by_seed = sum(by_seed for by_seed, *_ in anovas) / count  # P_s, (..., S)
    seeds = panel_by_seed.shape[-1]
    query_part = sum(np.maximum(0.0, ms_query - ms_error) / (seeds * q)
                     for (_, _, ms_query, ms_error), q in zip(anovas, queries))
    return panel_by_seed.mean(axis=-1), panel_by_seed.var(axis=-1, ddof=1) / seeds, query_part / count ** 2


def mean_squares(differences: np.ndarray) -> MeanSquares:
    """MS_seed, MS_query and MS_error of an (S, Q) array of paired differences (S, Q >= 2)."""
    d = _checked(differences)
    by_seed, seed, query, error = _anova(d)
    return MeanSquares(seeds=d.shape[0], queries=d.shape[1], mean=float(by_seed.mean()), seed=float(seed),
                       query=float(query), error=float(error))


@dataclass(frozen=True)
class CrossedEstimate:
    """Dbar, the two parts of its estimated variance, and the variance components (of the
    panel seed mean's seed x arm term; per task, query and noise) a rerun is sized from."""

    mean: float
    seed_part: float  # X_seed, k = seeds - 1 degrees of freedom
    query_part: float  # X_query, taken as known
    seeds: int
    queries: tuple[int, ...]  # per task
    var_seed: float
    var_query: tuple[float, ...]
    var_noise: tuple[float, ...]

    @property
    def variance(self) -> float:
        return self.seed_part + self.query_part

    @property
    def se(self) -> float:
        return math.sqrt(self.variance)

    @property
    def seed_share(self) -> float:
        """r = X_seed / V (1 when V is 0)."""
        return float(seed_share(self.seed_part, self.query_part))

    @property
    def df(self) -> float:
        """Satterthwaite's degrees of freedom of V, the query part taken as known: k / r^2."""
        return satterthwaite_df(self.seed_share, self.seeds - 1)


def variance_parts(tasks: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Dbar, X_seed, X_query) of a task's or a panel's differences, one (..., S, Q_t) array per
    task (leading axes: independent studies, as the calibration simulates them), in one pass."""
    arrays = [np.asarray(t, dtype=float) for t in tasks]
    return _parts([_anova(a) for a in arrays], [a.shape[-1] for a in arrays])


def crossed_estimate(tasks: Sequence[np.ndarray]) -> CrossedEstimate:
    """The crossed model's estimate for a task's (S, Q) differences, or a panel's: one (S, Q_t)
    array per task, rows the same S >= 2 seeds in every task (see the module docstring)."""
    arrays = [_checked(t) for t in tasks]
    if not arrays:
        raise ValueError("a crossed estimate needs at least one task")
    seeds = arrays[0].shape[0]
    if any(a.shape[0] != seeds for a in arrays):
        raise ValueError(f"tasks hold {[a.shape[0] for a in arrays]} seeds; every task needs the same seeds")
    queries = tuple(a.shape[1] for a in arrays)
    anovas = [_anova(a) for a in arrays]
    mean, seed_part, query_part = (float(x) for x in _parts(anovas, queries))
    var_noise = tuple(float(ms_error) for *_, ms_error in anovas)
    count = len(arrays)
    var_seed = max(0.0, seed_part * seeds - sum(e / q for e, q in zip(var_noise, queries)) / count ** 2)
    return CrossedEstimate(mean=mean, seed_part=seed_part, query_part=query_part, seeds=seeds, queries=queries,
                           var_seed=var_seed, var_noise=var_noise,
                           var_query=tuple(max(0.0, float(ms_query - ms_error) / seeds)
                                           for _, _, ms_query, ms_error in anovas))


def seed_share(seed_part, query_part):
    """r = X_seed / (X_seed + X_query), elementwise; 1 where both are 0."""
    seed_part, query_part = np.broadcast_arrays(np.asarray(seed_part, dtype=float), np.asarray(query_part, dtype=float))
    variance = seed_part + query_part
    return np.divide(seed_part, variance, out=np.ones_like(variance), where=variance > 0)


def satterthwaite_df(share: float | np.ndarray, seed_df: int) -> float | np.ndarray:
    """k / r^2: Satterthwaite's degrees of freedom of X_seed + X_query with X_query known (inf at r = 0)."""
    with np.errstate(divide="ignore"):
        return seed_df / np.square(share)


@functools.cache
def _chi2_over_k(seed_df: int) -> np.ndarray:
    """Equally likely values of X_seed / E[X_seed] ~ chi2_k / k (its quantiles at (i + 1/2) / N)."""
    return stats.chi2.ppf((np.arange(CHI2_POINTS) + 0.5) / CHI2_POINTS, seed_df) / seed_df


def _rejection(level: float, seed_df: int, noncentrality: float, shares: np.ndarray) -> np.ndarray:
    """P(p_S <= level) at each true seed share in `shares` when Dbar / sd(Dbar) ~ N(noncentrality, 1)."""
    w = _chi2_over_k(seed_df)[None, :]
    rho = np.asarray(shares, dtype=float)[:, None]
    scaled = rho * w + (1 - rho)  # V / Var(Dbar)
    share = np.divide(rho * w, scaled, out=np.ones_like(scaled), where=scaled > 0)
    # The t critical value depends on the share alone and smoothly (df = k / share^2): tabled
    # on a fine grid of shares and interpolated, a few hundred t quantiles instead of one per point.
    table = np.linspace(0, 1, SHARE_TABLE_POINTS)
    # isf, not ppf(1 - level / 2): below about 1e-16, 1 - level / 2 rounds to 1 and ppf to inf,
    # which would make a tiny p_S a p of 0.
    critical = np.interp(share, table, stats.t.isf(level / 2, satterthwaite_df(table, seed_df))) * np.sqrt(scaled)
    reject = stats.norm.sf(critical - noncentrality) + stats.norm.cdf(-critical - noncentrality)
    return reject.mean(axis=1)


def worst_case_size(level: float, seed_df: int) -> float:
    """max over the true seed share rho of P_rho(p_S <= level) under the null."""
    if level >= 1:
        return 1.0
    shares = np.linspace(0, 1, SHARE_POINTS)
    for _ in range(3):  # the grid, then twice a finer one around its largest value
        sizes = _rejection(level, seed_df, 0.0, shares)
        best = int(sizes.argmax())
        step = shares[1] - shares[0]
        shares = np.linspace(max(0.0, shares[best] - step), min(1.0, shares[best] + step), 21)
    return float(max(sizes.max(), _rejection(level, seed_df, 0.0, shares).max()))


@functools.cache
def calibrated_level(seed_df: int, alpha: float) -> float:
    """The nominal level a whose worst-case size is `alpha`: p_S <= a exactly when p <= alpha
    (to a relative 1e-9: Brent's method on log a, then the side whose size is at most alpha);
    0.0 when even `P_S_FLOOR` has a worst case above `alpha` (no p_S reaches that size: at 2
    seeds, alpha below about 0.003)."""
    def excess(log_level: float) -> float:
        return worst_case_size(math.exp(log_level), seed_df) - alpha

    high = math.log(alpha)  # worst_case_size(a) >= a: the level is never above alpha
    floor = math.log(P_S_FLOOR)
    low = high - 2.0
    while excess(low) > 0:
        if low <= floor:
            return 0.0
        low = max(low - 4.0, floor)
    root = optimize.brentq(excess, low, high, xtol=1e-9)
    while excess(root) > 0:
        root -= 1e-9
    return math.exp(root)


def satterthwaite_p(mean, seed_part, query_part, seed_df: int):
    """p_S = 2 P(t_df > |Dbar| / sqrt(V)), df = k / r^2 (elementwise over arrays of studies);
    1 when V is 0 and so is Dbar, 0 when only V is."""
    mean, seed_part, query_part = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (mean, seed_part, query_part)))
    variance = seed_part + query_part
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean) / np.sqrt(variance)
    p = 2 * stats.t.sf(t, satterthwaite_df(seed_share(seed_part, query_part), seed_df))
    return np.where(variance > 0, p, np.where(mean == 0, 1.0, 0.0))


def p_value(estimate: CrossedEstimate) -> float:
    """The test's two-sided p: `worst_case_size` of the observed Satterthwaite p, read at no
    less than `P_S_FLOOR` (never 0: floored at the smallest positive float)."""
    k = estimate.seeds - 1
    p_s = float(satterthwaite_p(estimate.mean, estimate.seed_part, estimate.query_part, k))
    return max(worst_case_size(max(p_s, P_S_FLOOR), k), math.ulp(0.0))


def interval(estimate: CrossedEstimate, alpha: float) -> tuple[float, float]:
    """The differences the level-`alpha` test would not reject: Dbar -/+ t_{1 - a/2, df} SE,
    a = calibrated_level(k, alpha); it excludes 0 exactly when p <= alpha. (-inf, inf) when no
    p_S reaches `alpha` (`calibrated_level` 0)."""
    level = calibrated_level(estimate.seeds - 1, alpha)
    if level <= 0:
        return -math.inf, math.inf
    half = float(stats.t.ppf(1 - level / 2, estimate.df)) * estimate.se
    return estimate.mean - half, estimate.mean + half


def shifted(estimate: CrossedEstimate, bound: float) -> CrossedEstimate:
    """The estimate of D - `bound`: the same variance, the mean moved (a one-sided test of
    delta against `bound` is the test of this estimate's mean against 0)."""
    return dataclasses.replace(estimate, mean=estimate.mean - bound)


def one_sided_p(estimate: CrossedEstimate, bound: float, side: str) -> float:
    """The worst-case p of H0: delta >= bound (`side` "below": the estimate shows delta below
    it) or H0: delta <= bound ("above"). With t = (Dbar - bound) / SE on the test's side,
    p = W_k(p_S) / 2, p_S the two-sided Satterthwaite p of t: Dbar is symmetric about delta and
    independent of V, so at every seed share the one-sided size at u is half the two-sided
    size at 2u, and its worst case half of `worst_case_size`. 1 when Dbar is on the other side."""
    if side not in ("below", "above"):
        raise ValueError(f"side {side!r}: 'below' or 'above'")
    moved = estimate.mean - bound
    if (moved >= 0) if side == "below" else (moved <= 0):
        return 1.0
    return p_value(shifted(estimate, bound)) / 2


def tost_p(estimate: CrossedEstimate, margin: float) -> float:
    """The two one-sided tests' p of H0: |delta| >= margin: the larger of the p of delta below
    +margin and of delta above -margin (`one_sided_p`). p <= a exactly when
    `equivalence_interval(estimate, a)` lies inside (-margin, margin)."""
    if not margin > 0:
        raise ValueError(f"equivalence margin {margin}: must be positive")
    return max(one_sided_p(estimate, margin, "below"), one_sided_p(estimate, -margin, "above"))


def equivalence_interval(estimate: CrossedEstimate, alpha: float) -> tuple[float, float]:
    """The 1 - 2 alpha calibrated interval: inside (-margin, margin) exactly when the
    level-`alpha` TOST shows equivalence within the margin (`tost_p` <= alpha)."""
    return interval(estimate, 2 * alpha)


def power(effect: float, sd: float, seed_share: float, seed_df: int, alpha: float) -> float:
    """The probability that the level-`alpha` test rejects when the true difference is
    `effect`, Dbar's standard deviation `sd` and the true seed share `seed_share`."""
    if sd <= 0:
        return 1.0 if effect else alpha
    level = calibrated_level(seed_df, alpha)
    if level <= 0:
        return 0.0
    return float(_rejection(level, seed_df, abs(effect) / sd, np.array([seed_share]))[0])


def projected(estimate: CrossedEstimate, seeds: int, query_factor: float = 1.0) -> tuple[float, float]:
    """(sd of Dbar, seed share) the estimate's variance components give at `seeds` seeds and
    `query_factor` times each task's queries."""
    count = len(estimate.queries)
    queries = [q * query_factor for q in estimate.queries]
    seed_part = (estimate.var_seed + sum(e / q for e, q in zip(estimate.var_noise, queries)) / count ** 2) / seeds
    query_part = sum(v / q for v, q in zip(estimate.var_query, queries)) / count ** 2
    return math.sqrt(seed_part + query_part), float(seed_share(seed_part, query_part))


def minimum_detectable_effect(estimate: CrossedEstimate, alpha: float, target: float = 0.80) -> float:
    """The true difference the test detects with probability `target`, at the estimate's own
    seeds, queries and variance components (inf when no p_S reaches `alpha`)."""
    sd, share = projected(estimate, estimate.seeds)
    if sd <= 0:
        return 0.0
    k = estimate.seeds - 1
    if calibrated_level(k, alpha) <= 0:  # no p_S reaches alpha: no difference is detected
        return math.inf
    low, high = 0.0, sd
    while power(high, sd, share, k, alpha) < target:
        high *= 2
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if power(middle, sd, share, k, alpha) < target else (low, middle)
    return high


MAX_SEEDS = 64


def _detects(estimate: CrossedEstimate, effect: float, alpha: float, target: float, seeds: int,
             query_factor: float) -> bool:
    """The test's power at `seeds` seeds and `query_factor` times the queries reaches `target`."""
    sd, share = projected(estimate, seeds, query_factor)
    return power(effect, sd, share, seeds - 1, alpha) >= target


def seeds_needed(estimate: CrossedEstimate, effect: float, alpha: float, target: float = 0.80,
                 query_factor: float = 1.0) -> int | None:
    """The fewest seeds (at `query_factor` times the queries) at which the test detects a true
    difference `effect` with probability `target`; None when even `MAX_SEEDS` do not."""
    if effect == 0 or not _detects(estimate, effect, alpha, target, MAX_SEEDS, query_factor):
        return None
    low, high = 1, MAX_SEEDS  # power grows with seeds: the smallest that is enough, by bisection
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _detects(estimate, effect, alpha, target, middle, query_factor) else (middle, high)
    return high


QUERY_FACTORS = (2, 4, 8, 16, 32, 64)


def queries_needed(estimate: CrossedEstimate, effect: float, alpha: float, target: float = 0.80) -> int | None:
    """The fewest queries, in all tasks, at the estimate's own seeds (`QUERY_FACTORS` times
    today's) at which the test detects `effect` with probability `target`; None when none do."""
    for factor in QUERY_FACTORS if effect else ():
        if _detects(estimate, effect, alpha, target, estimate.seeds, factor):
            return factor * sum(estimate.queries)
    return None
