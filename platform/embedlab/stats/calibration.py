"""The paired test's size and power, shown by simulating studies under the crossed model.

A simulated study has S seeds and Q queries; its per-(seed, query) differences are

    D[s, q] = effect + A[s] + B[q] + E[s, q],  A ~ N(0, sd_seed^2), B ~ N(0, sd_query^2), E ~ N(0, sd_noise^2),

drawn independently for each study from one numpy Generator. The test (`embedlab.stats.crossed`)
rejects at level alpha when Satterthwaite's p is at most `calibrated_level(S - 1, alpha)`,
which is exactly when its p-value is at most alpha; the rejection rate over the studies of a
setting is its false-positive rate when effect = 0 and its power otherwise, with the Monte
Carlo standard error sqrt(rate (1 - rate) / studies). `bootstrap_rejections` runs the earlier
percentile bootstrap (`paired.paired_bootstrap`) on the same kind of studies, for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np

from embedlab.stats import crossed, paired

SIMULATION_SEED = 20_261_203
STUDIES = 4_000
BOOTSTRAP_STUDIES = 400  # 1,000 resamples each: the earlier bootstrap is slow
# The grid the suite and `embedlab stats calibrate` check: the seed counts studies run, a
# seed x arm term from none to larger than the query term, few and many queries, and a quiet
# and a noisy metric (per-query nDCG@10 values of small models have SDs near 0.15-0.20).
GRID_SEEDS = (2, 3, 5)
GRID_SEED_SDS = (0.0, 0.02, 0.05, 0.15)
GRID_QUERIES = (50, 200)
GRID_QUERY_NOISE = ((0.05, 0.05), (0.15, 0.20))
# The setting the bootstrap was found to fail worst in, and a realistic one for power.
STRESS = dict(seeds=2, queries=200, sd_seed=0.02, sd_query=0.05, sd_noise=0.05)
REALISTIC = dict(queries=200, sd_seed=0.02, sd_query=0.15, sd_noise=0.20)


@dataclass(frozen=True)
class Setting:
    seeds: int
    queries: int
    sd_seed: float
    sd_query: float
    sd_noise: float
    effect: float = 0.0

    def draw(self, studies: int, rng: np.random.Generator) -> np.ndarray:
        """(studies, S, Q) differences of independent simulated studies."""
        shape = (studies, self.seeds, self.queries)
        return (self.effect + rng.normal(0, self.sd_seed, (studies, self.seeds, 1))
                + rng.normal(0, self.sd_query, (studies, 1, self.queries)) + rng.normal(0, self.sd_noise, shape))

    def components(self) -> crossed.CrossedEstimate:
        """The setting's true variance components, as an estimate the test's power functions read."""
        return crossed.CrossedEstimate(mean=self.effect, seed_part=0.0, query_part=0.0, seeds=self.seeds,
                                       queries=(self.queries,), var_seed=self.sd_seed ** 2,
                                       var_query=(self.sd_query ** 2,), var_noise=(self.sd_noise ** 2,))

    @property
    def sd(self) -> float:
        """The true standard deviation of a study's mean difference."""
        return crossed.projected(self.components(), self.seeds)[0]

    @property
    def seed_share(self) -> float:
        """The true share of Var(Dbar) in the test's seed part (X_seed's expectation over Var(Dbar))."""
        return crossed.projected(self.components(), self.seeds)[1]


def grid() -> list[Setting]:
    return [Setting(seeds, queries, sd_seed, sd_query, sd_noise) for seeds in GRID_SEEDS for sd_seed in GRID_SEED_SDS
            for queries in GRID_QUERIES for sd_query, sd_noise in GRID_QUERY_NOISE]


def rejections(setting: Setting, studies: int, rng: np.random.Generator, alpha: float = paired.ALPHA) -> np.ndarray:
    """(studies,) booleans: the test rejected at `alpha` in each simulated study."""
    mean, seed_part, query_part = crossed.variance_parts([setting.draw(studies, rng)])
    k = setting.seeds - 1
    return crossed.satterthwaite_p(mean, seed_part, query_part, k) <= crossed.calibrated_level(k, alpha)


def bootstrap_rejections(setting: Setting, studies: int, rng: np.random.Generator, resamples: int = 1_000,
                         alpha: float = paired.ALPHA) -> np.ndarray:
    """(studies,) booleans: the earlier percentile bootstrap's p <= `alpha` in each study."""
    data = setting.draw(studies, rng)
    zeros = np.zeros(data.shape[1:])
    return np.array([paired.bootstrap_p(paired.paired_bootstrap(d, zeros, rng=rng, resamples=resamples)) <= alpha
                     for d in data])


@dataclass(frozen=True)
class Rate:
    setting: Setting
    test: str
    studies: int
    rate: float

    @property
    def mc_se(self) -> float:
        return math.sqrt(max(self.rate * (1 - self.rate), 1e-12) / self.studies)

    def as_dict(self) -> dict:
        return {**asdict(self.setting), "test": self.test, "studies": self.studies, "rate": self.rate,
                "mc_se": self.mc_se}


def size_table(settings: Iterable[Setting], studies: int = STUDIES, seed: int = SIMULATION_SEED,
               alpha: float = paired.ALPHA) -> list[Rate]:
    """The test's false-positive rate in each null setting (each its own Generator, [seed, index])."""
    return [Rate(s, "crossed t", studies, float(rejections(s, studies, np.random.default_rng([seed, i]), alpha).mean()))
            for i, s in enumerate(settings)]


def comparison_rows(studies: int = STUDIES, bootstrap_studies: int = BOOTSTRAP_STUDIES, seed: int = SIMULATION_SEED,
                    alpha: float = paired.ALPHA, effect: float = 0.03) -> list[Rate]:
    """The test beside the earlier bootstrap: its size in the stress setting, and power at a
    true `effect` in the realistic setting at 2, 3, 5 and 8 seeds."""
    settings = [Setting(**STRESS), *(Setting(seeds=s, effect=effect, **REALISTIC) for s in (2, 3, 5, 8))]
    rows = []
    for i, setting in enumerate(settings):
        rng = np.random.default_rng([seed, 1_000 + i])
        rows.append(Rate(setting, "crossed t", studies, float(rejections(setting, studies, rng, alpha).mean())))
        rows.append(Rate(setting, "bootstrap (earlier)", bootstrap_studies,
                         float(bootstrap_rejections(setting, bootstrap_studies, rng, alpha=alpha).mean())))
    return rows


def analytic_power(setting: Setting, alpha: float = paired.ALPHA) -> float:
    """The test's power in `setting` from its formula (the query part taken as known)."""
    return crossed.power(setting.effect, setting.sd, setting.seed_share, setting.seeds - 1, alpha)
