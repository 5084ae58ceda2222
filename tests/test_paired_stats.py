"""The paired per-query test: the crossed model's mean squares against statsmodels' ANOVA, the
test against a plain-numpy reference written here, Holm against hand-computed cases, interval
and verdict agreeing, a clear effect found and a null one not, one seed refused, and the test
in every table format; synthetic run directories, no Ray. Its size and power by simulation:
test_calibration.py."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from embedlab.report import html as html_page
from embedlab.report.collect import read_run
from embedlab.stats import crossed
from embedlab.stats.paired import (
    ONE_SEED, PER_QUERY_DIR, cells, compare_to_control, holm_adjust, holm_levels, load_per_query, p_text, paired_tests,
)
from embedlab.stats.table import load_table, render

ARMS = ("control", "better", "same")
SEEDS = (0, 1, 2)
QUERIES = tuple(f"q{i:02d}" for i in range(40))
METRIC = "dev/ndcg@10"
EFFECT = {"control": 0.0, "better": 0.2, "same": 0.0}
TASK_HASH = "t" * 64


def per_query_values(seed: int = 0) -> dict[tuple[str, int], np.ndarray]:
    """(arm, seed) -> (Q,) values: a query difficulty shared by every trial, a seed shift shared
    by the arms of a seed, a seed x arm shift (what one seed does to one arm: the term the
    seed-level variance must carry), the arm's effect and noise of its own."""
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(0.2, 0.7, size=len(QUERIES))
    shift = {s: rng.normal(0, 0.03) for s in SEEDS}
    return {(arm, s): difficulty + shift[s] + rng.normal(0, 0.005) + EFFECT[arm] + rng.normal(0, 0.05, size=len(QUERIES))
            for arm in ARMS for s in SEEDS}


def write_run(root: Path, values: dict[tuple[str, int], np.ndarray], *, per_query: bool = True,
              skip: tuple[tuple[str, int], ...] = (), name: str = "toy") -> Path:
    """A run directory of study `name`: study record (the arms of `values`, first the control),
    one finished trial row per (arm, seed), and (unless not `per_query`) one per-query file per
    trial except those in `skip`; a tuning trial's file too."""
    run_dir = root / "run"
    (run_dir / "trials").mkdir(parents=True)
    arms = list(dict.fromkeys(arm for arm, _ in values))
    record = {"study": {"name": name, "factor": "model.width", "arms": {a: {} for a in arms}, "seeds": list(SEEDS),
                        "budget_tokens": 1000, "budget_pairs": 0, "budget_unit": "tokens", "metric": METRIC},
              "arm_order": arms}
    (run_dir / "study.json").write_text(json.dumps(record))
    if per_query:
        (run_dir / PER_QUERY_DIR).mkdir()
    for (arm, seed), array in values.items():
        trial_id = f"{arm}-{seed}"
        row = {"trial_id": trial_id, "arm": arm, "seed": seed, "stage": "final", "status": "finished",
               "budget/tokens": 1000, "budget/flops": 1e12, METRIC: float(array.mean()), "eval/task_hash": TASK_HASH}
        (run_dir / "trials" / f"{trial_id}.json").write_text(json.dumps(row))
        if per_query and (arm, seed) not in skip:
            write_per_query(run_dir, trial_id, arm, seed, array)
    # a tuning trial's values never enter the test (they would swamp it if they did)
    write_per_query(run_dir, "tune-0", arms[0], 9, np.full(len(QUERIES), 100.0), stage="tune") if per_query else None
    return run_dir


def write_per_query(run_dir: Path, trial_id: str, arm: str, seed: int, array: np.ndarray, *, stage: str = "final",
                    queries: tuple[str, ...] = QUERIES, task_hash: str = TASK_HASH) -> None:
    values = {METRIC: dict(zip(queries, map(float, array))),
              "dev/recall@100": dict(zip(queries, map(float, np.clip(array + 0.3, 0, 1))))}
    record = {"trial_id": trial_id, "arm": arm, "seed": seed, "stage": stage, "split": "dev", "task_hash": task_hash,
              "values": values}
    (run_dir / PER_QUERY_DIR / f"{trial_id}.json").write_text(json.dumps(record))


def reference_test(differences: np.ndarray, alpha: float) -> dict:
    """The documented test of one (S, Q) difference array, written directly: the seed part from
    the seed means' sample variance, the query part from the ANOVA's query and error mean
    squares, Satterthwaite's df, and the worst case over the seed share of the rejection
    probability of the observed Satterthwaite p, integrated here on its own fine grid."""
    seeds, queries = differences.shape
    grand = differences.mean()
    seed_part = differences.mean(axis=1).var(ddof=1) / seeds
    ms_query = seeds * np.sum((differences.mean(axis=0) - grand) ** 2) / (queries - 1)
    residual = differences - differences.mean(axis=1, keepdims=True) - differences.mean(axis=0, keepdims=True) + grand
    ms_error = np.sum(residual ** 2) / ((seeds - 1) * (queries - 1))
    query_part = max(0.0, ms_query - ms_error) / (seeds * queries)
    variance = seed_part + query_part
    k = seeds - 1
    share = seed_part / variance
    p_s = 2 * stats.t.sf(abs(grand) / math.sqrt(variance), k / share ** 2)
    w = stats.chi2.ppf((np.arange(2_000) + 0.5) / 2_000, k) / k

    def size(level: float, rho: float) -> float:
        scaled = rho * w + 1 - rho
        critical = stats.t.isf(level / 2, k / (rho * w / scaled) ** 2) * np.sqrt(scaled)
        return float(np.mean(2 * stats.norm.sf(critical)))

    rhos = np.linspace(0, 1, 201)
    p = max(size(p_s, rho) for rho in rhos[1:])  # rho = 0 gives exactly p_s, never the largest
    levels = [size(alpha, rho) for rho in rhos[1:]]
    return {"diff": grand, "se": math.sqrt(variance), "df": k / share ** 2, "p": max(p, p_s), "p_s": p_s,
            "worst_size_at_alpha": max(levels)}


@pytest.fixture
def run(tmp_path):
    values = per_query_values()
    return write_run(tmp_path, values), values


def test_mean_squares_equal_statsmodels_two_way_anova(run):
    """MS_seed, MS_query and MS_error of a (3, 40) difference array are statsmodels' additive
    two-way ANOVA (sum of squares over degrees of freedom) to 1e-12."""
    import statsmodels.api as sm
    from statsmodels.formula.api import ols

    _, values = run
    differences = np.stack([values[("better", s)] - values[("control", s)] for s in SEEDS])
    frame = pd.DataFrame([{"d": differences[i, j], "seed": i, "query": j} for i in range(len(SEEDS))
                          for j in range(len(QUERIES))])
    anova = sm.stats.anova_lm(ols("d ~ C(seed) + C(query)", data=frame).fit(), typ=2)
    mean_square = anova["sum_sq"] / anova["df"]
    ours = crossed.mean_squares(differences)
    np.testing.assert_allclose([ours.seed, ours.query, ours.error],
                               [mean_square["C(seed)"], mean_square["C(query)"], mean_square["Residual"]], rtol=1e-12)
    # The seed part is MS_seed / (S Q): the seed means' variance over S.
    estimate = crossed.crossed_estimate([differences])
    assert estimate.seed_part == pytest.approx(ours.seed / differences.size, rel=1e-12)
    assert estimate.query_part == pytest.approx(max(0.0, ours.query - ours.error) / differences.size, rel=1e-12)


def test_the_test_equals_the_plain_numpy_reference(run):
    """diff, SE, df and p of every arm equal the reference written above (p to the accuracy of
    the two integrations), p_holm is Holm's, and at S = 3 the calibrated level's worst-case
    size is alpha."""
    run_dir, values = run
    table = load_table(run_dir)
    ours = paired_tests(load_per_query(run_dir, table), METRIC, ARMS).set_index("arm")
    reference = {arm: reference_test(np.stack([values[(arm, s)] - values[("control", s)] for s in SEEDS]), 0.05)
                 for arm in ARMS[1:]}
    for arm, expected in reference.items():
        got = ours.loc[arm]
        assert got["seeds"] == len(SEEDS) and got["queries"] == len(QUERIES) and got["note"] == ""
        for column in ("diff", "se", "df"):
            np.testing.assert_allclose(got[column], expected[column], rtol=1e-10, err_msg=f"{arm} {column}")
        assert got["p"] == pytest.approx(expected["p"], rel=0.01, abs=1e-6)
        assert got["p"] >= expected["p_s"]  # the worst case is never below Satterthwaite's own p
    np.testing.assert_allclose(ours["p_holm"], holm_adjust(list(ours["p"])), rtol=1e-12)
    assert reference["same"]["worst_size_at_alpha"] > 0.05  # Satterthwaite's p read as it is: too small
    k = len(SEEDS) - 1
    assert crossed.worst_case_size(crossed.calibrated_level(k, 0.05), k) == pytest.approx(0.05, abs=1e-6)
    again = paired_tests(load_per_query(run_dir, table), METRIC, ARMS)
    pd.testing.assert_frame_equal(again, ours.reset_index())


def _size_by_quadrature(level: float, seed_df: int, rho: float) -> float:
    """P(p_S <= level) under the null at true seed share `rho`, integrated by scipy's adaptive
    quadrature over W = chi2_k / k (in log W, where the mass of a tiny level sits)."""
    from scipy import integrate

    def integrand(log_w: float) -> float:
        w = math.exp(log_w)
        scaled = rho * w + (1 - rho)  # (1 - rho) first: rho * w + 1 - rho is 0 at rho = 1, w < 1e-16
        share = rho * w / scaled
        critical = stats.t.isf(level / 2, seed_df / share ** 2) * math.sqrt(scaled)
        return 2 * stats.norm.sf(critical) * stats.chi2.pdf(w * seed_df, seed_df) * seed_df * w

    return integrate.quad(integrand, -80, 6, limit=500, points=[-40, -20, -10, 0])[0]


@pytest.mark.parametrize("level", [1e-3, 1e-17, 1e-20])
def test_a_tiny_satterthwaite_p_keeps_its_worst_case_p(level):
    """At 2 seeds the worst-case p of a p_S is the quadrature's maximum over the seed share (to
    1e-3), never below p_S: `1 - level / 2` rounding to 1 once made every p_S under about 1e-16
    a p of 0 (the quadrature gives 0.0126 at 1e-17)."""
    from scipy import optimize

    grid = np.linspace(0.9, 1, 41)  # the worst share sits near 1 at 2 seeds
    best = int(np.argmax([_size_by_quadrature(level, 1, rho) for rho in grid]))
    found = optimize.minimize_scalar(lambda rho: -_size_by_quadrature(level, 1, rho), method="bounded",
                                     bounds=(grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]))
    ours = crossed.worst_case_size(level, 1)
    assert ours >= level
    assert ours == pytest.approx(-found.fun, rel=1e-3)


def test_a_panel_of_one_task_is_the_task_and_a_panel_shares_its_seeds():
    """The panel estimate with one task is the single-task estimate term for term; with two
    tasks its seed part is the variance of each seed's panel mean over S, not the sum of the
    tasks' own seed parts (the tasks' seed terms are one model's, correlated)."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 0.1, (3, 30)), rng.normal(0, 0.1, (3, 50))
    single, panel_of_one = crossed.crossed_estimate([a]), crossed.crossed_estimate([a])
    assert single == panel_of_one
    panel = crossed.crossed_estimate([a, b])
    assert panel.mean == pytest.approx((a.mean() + b.mean()) / 2, rel=1e-12)
    assert panel.seed_part == pytest.approx(((a.mean(axis=1) + b.mean(axis=1)) / 2).var(ddof=1) / 3, rel=1e-12)
    parts = [crossed.crossed_estimate([t]).query_part for t in (a, b)]
    assert panel.query_part == pytest.approx(sum(parts) / 4, rel=1e-12)
    with pytest.raises(ValueError, match="every task needs the same seeds"):
        crossed.crossed_estimate([a, b[:2]])


def test_a_clear_effect_is_significant_and_a_null_one_is_not(run):
    """+0.2 on every query is found (interval above zero at its Holm level, adjusted p tiny);
    no effect is not, and its interval covers zero; the MDE lies between the two."""
    run_dir, _ = run
    tests = compare_to_control(run_dir, load_table(run_dir)).tests.set_index("arm")
    better, same = tests.loc["better"], tests.loc["same"]
    assert better["significant"] and better["ci_low"] > 0 and better["p_holm"] <= 0.05
    assert better["diff"] == pytest.approx(0.2, abs=0.03)
    assert not same["significant"] and same["ci_low"] <= 0 <= same["ci_high"] and same["p_holm"] > 0.05
    assert abs(same["diff"]) < same["mde"] < better["diff"]
    # the better arm is rank 1 (alpha/2); the null arm is tested at the full alpha
    assert better["ci_level"] == pytest.approx(1 - 0.05 / 2) and same["ci_level"] == pytest.approx(0.95)


def test_holm_matches_hand_computed_cases():
    """p = [0.01, 0.04, 0.03]: adjusted [0.03, 0.06, 0.06]; the step-down stops at 0.03 > 0.025,
    so the later arm is tested at that level too and neither is rejected."""
    np.testing.assert_allclose(holm_adjust([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06], rtol=1e-12)
    adjusted, levels, rejected = holm_levels([0.01, 0.04, 0.03], 0.05)
    assert rejected == [True, False, False]
    np.testing.assert_allclose(levels, [0.05 / 3, 0.05 / 2, 0.05 / 2], rtol=1e-12)
    np.testing.assert_allclose(holm_adjust([0.5, 0.001, 0.9, 0.02]), [1.0, 0.004, 1.0, 0.06], rtol=1e-12)
    assert holm_levels([0.001, 0.02, 0.04], 0.05)[2] == [True, True, True]  # 0.04 <= 0.05 / 1 at the last step
    with pytest.raises(ValueError, match="p-value 1.5"):
        holm_adjust([0.1, 1.5])


def test_verdict_interval_and_adjusted_p_always_agree():
    """Over random families of estimates at 2, 3 and 5 seeds: Holm rejects exactly when
    adjusted p <= alpha, and the interval at the arm's level excludes zero exactly then."""
    rng = np.random.default_rng(5)
    for _ in range(40):
        m = int(rng.integers(1, 5))
        seeds = int(rng.choice([2, 3, 5]))
        estimates = [crossed.crossed_estimate([rng.normal(rng.normal(0, 0.05), 0.1, (seeds, 30))
                                               + rng.normal(0, 0.02, (seeds, 1))]) for _ in range(m)]
        raw = [crossed.p_value(e) for e in estimates]
        assert all(0 < p <= 1 for p in raw)
        adjusted, levels, rejected = holm_levels(raw, 0.05)
        for estimate, p_holm, level, reject in zip(estimates, adjusted, levels, rejected):
            low, high = crossed.interval(estimate, level)
            assert reject == (p_holm <= 0.05) == (low > 0 or high < 0)


def test_missing_per_query_files_and_seeds(tmp_path):
    """A trial without a per-query file is left out and named; an arm paired over fewer seeds
    says so; a run without per_query/ has no test and every format says so in one line."""
    values = per_query_values()
    run_dir = write_run(tmp_path / "a", values, skip=(("same", 1),))
    comparison = compare_to_control(run_dir, load_table(run_dir))
    assert comparison.missing == ("same-1",) and "1 final trial(s) without per-query values" in comparison.header
    tests = comparison.tests.set_index("arm")
    assert tests.loc["same", "seeds"] == 2 and tests.loc["better", "seeds"] == 3
    reference = reference_test(np.stack([values[("same", s)] - values[("control", s)] for s in (0, 2)]), 0.05)
    assert tests.loc["same", "se"] == pytest.approx(reference["se"], rel=1e-10)
    assert tests.loc["same", "p"] == pytest.approx(reference["p"], rel=0.01, abs=1e-6)
    old = write_run(tmp_path / "b", values, per_query=False)
    assert load_per_query(old, load_table(old)) is None
    text = render(old)
    assert text.count("paired per-query test: unavailable") == 1 and "no per_query/ directory" in text
    assert "significant" not in text.replace("not a significance test", "")
    assert json.loads(render(old, "json"))["paired"]["unavailable"].startswith("the run has no per_query/")


def test_per_query_files_that_cannot_be_paired_are_refused(run):
    """Other query ids, another task, or a row that disagrees with its trial is named."""
    run_dir, values = run
    table = load_table(run_dir)
    write_per_query(run_dir, "same-2", "same", 2, values[("same", 2)][:-1], queries=QUERIES[:-1])
    with pytest.raises(ValueError, match=r"same-2.json: dev/ndcg@10 of trial same-2 covers 39 queries"):
        load_per_query(run_dir, table)
    write_per_query(run_dir, "same-2", "same", 2, values[("same", 2)], task_hash="u" * 64)
    with pytest.raises(ValueError, match="trial same-2 was scored on split 'dev' of task uuuu"):
        load_per_query(run_dir, table)
    write_per_query(run_dir, "same-2", "same", 1, values[("same", 2)])
    with pytest.raises(ValueError, match="seed 1, but the trial table has 2 for trial same-2"):
        load_per_query(run_dir, table)
    assert "per-query values unreadable" in render(run_dir)  # the seed-level table still renders


def test_every_format_carries_the_test(run):
    """text and markdown show the header (test, correction, alpha) and one verdict per arm; csv
    and json hold the same numbers as the module, at its default resamples."""
    run_dir, _ = run
    expected = compare_to_control(run_dir, load_table(run_dir)).tests.set_index("arm")
    text = render(run_dir)
    assert crossed.METHOD in text and f"model: {crossed.MODEL}" in text
    assert '"significant" = Holm-adjusted p <= 0.05 across 2 tested arm(s)' in text
    assert "seed-level paired difference from control" in text and "uncorrected" in text
    verdicts = [line.split() for line in text.splitlines() if line.startswith(("better ", "same "))
                and "significant" in line]
    assert [v[0] for v in verdicts] == ["better", "same"]
    assert "significant" in verdicts[0] and "not" not in verdicts[0] and "not" in verdicts[1]
    assert f"{expected.loc['better', 'diff']:+.4f}" in text and f"{expected.loc['better', 'mde']:.4f}" in text
    assert "| arm | seeds | queries | diff | corrected interval |" in render(run_dir, "markdown")
    csv = pd.read_csv(io.StringIO(render(run_dir, "csv")), comment="#").set_index("arm")
    for column in ("diff", "ci_low", "ci_high", "p_holm", "mde", "se", "df"):
        np.testing.assert_allclose(csv.loc["better", f"{METRIC}:paired_{column}"], expected.loc["better", column],
                                   rtol=1e-12)
    assert math.isnan(csv.loc["control", f"{METRIC}:paired_diff"])
    assert render(run_dir, "csv").startswith("# seed-level:")
    parsed = json.loads(render(run_dir, "json"))["paired"]
    assert parsed["correction"] == "holm-bonferroni" and parsed["alpha"] == 0.05 and parsed["model"] == crossed.MODEL
    assert [(a["arm"], a["significant"]) for a in parsed["arms"]] == [("better", True), ("same", False)]


@pytest.mark.parametrize("seed_df", [1, 2, 4])
def test_power_is_the_noncentral_t_when_seeds_are_all_and_the_normal_when_they_are_none(seed_df):
    """With the whole variance in the seed part the statistic is a noncentral t on k degrees of
    freedom (scipy's nct), with none of it a shifted normal; the MDE is where power reaches 80%."""
    level = crossed.calibrated_level(seed_df, 0.05)
    critical = stats.t.ppf(1 - level / 2, seed_df)
    for effect in (0.5, 2.0, 6.0):
        if seed_df > 1:  # (scipy's nct gives NaN this far into the tail of one degree of freedom)
            expected = stats.nct.sf(critical, seed_df, effect) + stats.nct.sf(critical, seed_df, -effect)
            assert crossed.power(effect, 1.0, 1.0, seed_df, 0.05) == pytest.approx(expected, abs=2e-3)
        z = stats.norm.ppf(1 - level / 2)
        assert crossed.power(effect, 1.0, 0.0, seed_df, 0.05) == pytest.approx(
            stats.norm.sf(z - effect) + stats.norm.cdf(-z - effect), rel=1e-9)
    estimate = crossed.crossed_estimate([np.random.default_rng(seed_df).normal(0, 0.1, (seed_df + 1, 60))])
    mde = crossed.minimum_detectable_effect(estimate, 0.05)
    # at the variance components' expected values (not the one draw of the seed part)
    sd, share = crossed.projected(estimate, estimate.seeds)
    seed_part = (estimate.var_seed + estimate.var_noise[0] / 60) / estimate.seeds
    assert sd ** 2 == pytest.approx(seed_part + estimate.var_query[0] / 60, rel=1e-12)
    assert crossed.power(mde, sd, share, seed_df, 0.05) == pytest.approx(0.8, abs=1e-6)


def test_one_seed_is_no_test_and_says_so(tmp_path):
    """Arms paired over one seed get no p, no verdict and no place in Holm's family: every
    format says "one seed: no test"."""
    values = {key: array for key, array in per_query_values().items() if key[1] == 0}
    run_dir = write_run(tmp_path, values)
    tests = compare_to_control(run_dir, load_table(run_dir)).tests.set_index("arm")
    for arm in ("better", "same"):
        assert tests.loc[arm, "note"] == ONE_SEED and math.isnan(tests.loc[arm, "p"]) and not tests.loc[arm, "significant"]
        assert tests.loc[arm, "diff"] == pytest.approx(float((values[(arm, 0)] - values[("control", 0)]).mean()))
    text = render(run_dir)
    assert text.count(ONE_SEED) >= 2 and "across 0 tested arm(s)" in text
    assert "significant" not in text.replace("not a significance test", "").replace('"significant" =', "")
    assert p_text(1e-7) == "1.0e-07" and p_text(0.01234) == "0.0123" and p_text(math.nan) == "n/a"
    assert p_text(5e-324) == "< 1e-16" and p_text(2e-16) == "2.0e-16"
    assert list(cells(compare_to_control(run_dir, load_table(run_dir)).tests)["to detect diff"]) == ["2+ seeds"] * 2


def test_the_report_shows_the_test_beside_the_seed_level_table(run):
    """The report's trial tables carry the same header, verdicts and numbers as the text table,
    and label the Student's t differences as seed-level and uncorrected."""
    run_dir, _ = run
    expected = compare_to_control(run_dir, load_table(run_dir)).tests.set_index("arm")
    tables = html_page._trial_tables(read_run(run_dir))
    assert "Holm-adjusted p &lt;= 0.05 across 2 tested arm(s)" in tables
    assert "seed-level 95% t, uncorrected" in tables and "data-matched (equal tokens per trial)" in tables
    for arm, verdict in (("better", "significant"), ("same", "not significant")):
        row = re.search(rf"<tr><td>{arm}</td>(.*?)</tr>", tables).group(1)
        assert f"<td>{verdict}</td>" in row and f"{expected.loc[arm, 'diff']:+.4f}" in row
    old = run_dir.parent / "old"
    shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns(PER_QUERY_DIR))
    assert "paired per-query test: unavailable" in html_page._trial_tables(read_run(old))


def test_display_cuts_intervals_and_mdes_to_the_range_a_difference_can_take():
    """Per-query metrics lie in [0, 1], so a mean difference lies in [-1, 1]: at two seeds a t
    reference with one degree of freedom can give an interval and an MDE far beyond it, which the
    display cuts (and says so) instead of printing impossible differences."""
    row = {"arm": "a", "seeds": 2, "queries": 200, "diff": -0.0166, "ci_low": -9.8342, "ci_high": 9.8011,
           "ci_level": 0.95, "p": 0.4595, "p_holm": 0.4595, "significant": False, "se": 0.77, "df": 1.0,
           "mde": 17.3981, "seeds_needed": 23.0, "queries_needed": math.nan, "note": ""}
    inside = {**row, "arm": "b", "ci_low": -0.0227, "ci_high": 0.0108, "mde": 0.6014}
    shown = cells(pd.DataFrame([row, inside])).set_index("arm")
    assert shown.loc["a", "corrected interval"] == "[-1.0000, +1.0000] at 95% (cut to the metric's range)"
    assert shown.loc["a", "MDE (80% power)"] == "over 1: none in range"
    assert shown.loc["b", "corrected interval"] == "[-0.0227, +0.0108] at 95%"
    assert shown.loc["b", "MDE (80% power)"] == "0.6014"
    assert shown.loc["a", "to detect diff"] == "23 seeds"


def test_every_scored_width_is_one_holm_family(tmp_path):
    """A study scored at the full width and at width 8 (`eval.dims`), its metric the width-8 one:
    each (arm, width) gets the test it would get alone (raw p), Holm runs over all four
    (statsmodels' multipletests as the oracle), the study metric's rows stay the main table and
    the full width's come beside them (in the seed-level table too), and the header counts the family."""
    from statsmodels.stats.multitest import multipletests

    from embedlab.stats.paired import width_family

    narrow = "dev/dim8/ndcg@10"
    full_values, narrow_values = per_query_values(1), per_query_values(2)
    run_dir = write_run(tmp_path, full_values)
    record = json.loads((run_dir / "study.json").read_text())
    record["study"]["metric"] = narrow
    (run_dir / "study.json").write_text(json.dumps(record))
    for (arm, seed), array in full_values.items():
        path = run_dir / PER_QUERY_DIR / f"{arm}-{seed}.json"
        per_query = json.loads(path.read_text())
        per_query["values"][narrow] = dict(zip(QUERIES, map(float, narrow_values[arm, seed])))
        path.write_text(json.dumps(per_query))
        trial = run_dir / "trials" / f"{arm}-{seed}.json"
        trial.write_text(json.dumps({**json.loads(trial.read_text()), narrow: float(narrow_values[arm, seed].mean())}))
    table = load_table(run_dir)
    loaded = load_per_query(run_dir, table)
    assert width_family(loaded, narrow) == [METRIC, narrow] == width_family(loaded, METRIC)
    assert width_family(loaded, "dev/recall@100") == ["dev/recall@100"]
    comparison = compare_to_control(run_dir, table)
    alone = {metric: paired_tests(loaded, metric, list(ARMS)) for metric in (METRIC, narrow)}
    np.testing.assert_allclose(comparison.tests["p"], alone[narrow]["p"], rtol=1e-12)
    np.testing.assert_allclose(comparison.other_widths["p"], alone[METRIC]["p"], rtol=1e-12)
    assert list(comparison.other_widths["metric"]) == [METRIC, METRIC]
    raw = [*comparison.other_widths["p"], *comparison.tests["p"]]
    holm = multipletests(raw, alpha=0.05, method="holm")
    np.testing.assert_allclose([*comparison.other_widths["p_holm"], *comparison.tests["p_holm"]], holm[1],
                               rtol=1e-12)
    assert [*comparison.other_widths["significant"], *comparison.tests["significant"]] == list(holm[0])
    assert "across 4 tested (arm, width) pairs over 2 widths" in comparison.header
    text = render(run_dir)
    assert "the same test at the other scored widths (one Holm family with the above):" in text
    header = next(line for line in text.splitlines() if line.startswith("arm ") and "seeds" in line)
    assert header.split()[2:4] == [narrow, METRIC]  # the study metric, its full width's beside it
    assert json.loads(render(run_dir, "json"))["paired"]["other_widths"][0]["metric"] == METRIC
