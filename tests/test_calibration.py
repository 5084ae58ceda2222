"""The paired test's size and power, by simulating studies under the crossed model: the
false-positive rate holds at alpha in every cell of the grid studies meet (2-5 seeds, a seed x
arm term from none to larger than the query term, 50 and 200 queries), the earlier bootstrap
fails the same check, power matches its formula, and the seeds-needed figure is what a
simulated rerun at that many seeds achieves."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embedlab.cli import main
from embedlab.stats import calibration, crossed
from embedlab.stats.calibration import Setting

ALPHA = 0.05


def _bound(studies: int, alpha: float = ALPHA) -> float:
    """alpha plus three Monte Carlo standard errors of a rate near alpha."""
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / studies)


def test_the_false_positive_rate_is_at_most_alpha_in_every_cell():
    sizes = calibration.size_table(calibration.grid(), studies=calibration.STUDIES)
    assert len(sizes) == 48
    over = [r for r in sizes if r.rate > _bound(r.studies)]
    assert not over, [(r.setting, r.rate) for r in over]
    stress = next(r for r in sizes if r.setting == Setting(**calibration.STRESS))
    assert stress.rate <= 0.065  # the earlier bootstrap: about 32% here


def test_the_earlier_bootstrap_fails_the_same_check():
    """Today's seed resampling swapped back in: the check above catches it in the stress setting."""
    studies = 300
    rejected = calibration.bootstrap_rejections(Setting(**calibration.STRESS), studies, np.random.default_rng(7),
                                                resamples=400)
    assert rejected.mean() > _bound(studies)


def test_power_matches_its_formula():
    """One alternative at 5 seeds: the simulated rejection rate is the analytic power within
    three Monte Carlo standard errors (the formula takes the query part as known)."""
    setting = Setting(seeds=5, queries=200, sd_seed=0.02, sd_query=0.05, sd_noise=0.05, effect=0.02)
    expected = calibration.analytic_power(setting)
    assert 0.3 < expected < 0.9  # a setting where a wrong power would show
    studies = 4_000
    rate = calibration.rejections(setting, studies, np.random.default_rng(11)).mean()
    assert abs(rate - expected) <= 3 * math.sqrt(expected * (1 - expected) / studies)


def test_seeds_needed_reach_the_target_power_in_a_simulated_rerun():
    """From one 2-seed study's estimate: a rerun at the seeds it names reaches 80% power (within
    three Monte Carlo standard errors), and one seed fewer does not."""
    truth = Setting(seeds=2, queries=200, sd_seed=0.01, sd_query=0.05, sd_noise=0.10, effect=0.02)
    rng = np.random.default_rng(13)
    # the rerun sized at the true components
    seeds = crossed.seeds_needed(truth.components(), truth.effect, ALPHA)
    assert seeds is not None and 3 <= seeds <= 20
    studies = 3_000
    se = 3 * math.sqrt(0.8 * 0.2 / studies)
    at = calibration.rejections(Setting(**{**truth.__dict__, "seeds": seeds}), studies, rng).mean()
    below = calibration.rejections(Setting(**{**truth.__dict__, "seeds": seeds - 1}), studies, rng).mean()
    assert at >= 0.8 - se and below < 0.8 + se
    with pytest.raises(ValueError, match="at least 2 of each"):
        crossed.mean_squares(np.zeros((1, 10)))


def test_the_command_prints_the_table(capsys):
    assert main(["stats", "calibrate", "--studies", "200", "--bootstrap-studies", "0"]) == 0
    out = capsys.readouterr().out
    assert "| seeds | seed×arm SD | queries | query / noise SD | false-positive rate |" in out
    assert out.count("\n| 2 |") == 16 and crossed.MODEL in out
    assert main(["stats", "calibrate", "--studies", "10"]) == 2
    assert "at least 100 studies" in capsys.readouterr().err
