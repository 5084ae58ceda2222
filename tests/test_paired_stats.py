"""The paired per-query test: the bootstrap against a plain-numpy reference written here, Holm
against hand-computed cases, interval and verdict agreeing, a clear effect found and a null
one not, and the test in every table format; synthetic run directories, no Ray."""

from __future__ import annotations

import io
import json
import math
import re
import shutil
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from embedlab.report import html as html_page
from embedlab.report.collect import read_run
from embedlab.sweep.paired import (
    BOOTSTRAP_SEED, PER_QUERY_DIR, RESAMPLES, compare_to_control, holm_adjust, holm_levels, load_per_query,
    minimum_detectable_effect, paired_tests, percentile_interval,
)
from embedlab.sweep.table import load_table, render

ARMS = ("control", "better", "same")
SEEDS = (0, 1, 2)
QUERIES = tuple(f"q{i:02d}" for i in range(40))
METRIC = "dev/ndcg@10"
EFFECT = {"control": 0.0, "better": 0.08, "same": 0.0}
TASK_HASH = "t" * 64
B = 2_000  # resamples in the reference comparisons: enough to test, quick in a plain loop


def per_query_values(seed: int = 0) -> dict[tuple[str, int], np.ndarray]:
    """(arm, seed) -> (Q,) values: a query difficulty shared by every trial, a seed shift shared
    by the arms of a seed, the arm's effect and noise of its own."""
    rng = np.random.default_rng(seed)
    difficulty = rng.uniform(0.2, 0.7, size=len(QUERIES))
    shift = {s: rng.normal(0, 0.03) for s in SEEDS}
    return {(arm, s): difficulty + shift[s] + EFFECT[arm] + rng.normal(0, 0.05, size=len(QUERIES))
            for arm in ARMS for s in SEEDS}


def write_run(root: Path, values: dict[tuple[str, int], np.ndarray], *, per_query: bool = True,
              skip: tuple[tuple[str, int], ...] = ()) -> Path:
    """A run directory: study record, one finished trial row per (arm, seed), and (unless not
    `per_query`) one per-query file per trial except those in `skip`; a tuning trial's file too."""
    run_dir = root / "run"
    (run_dir / "trials").mkdir(parents=True)
    record = {"study": {"name": "toy", "factor": "model.width", "arms": {a: {} for a in ARMS}, "seeds": list(SEEDS),
                        "budget_tokens": 1000, "budget_pairs": 0, "budget_unit": "tokens", "metric": METRIC},
              "arm_order": list(ARMS)}
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
    write_per_query(run_dir, "tune-0", "control", 9, np.full(len(QUERIES), 100.0), stage="tune") if per_query else None
    return run_dir


def write_per_query(run_dir: Path, trial_id: str, arm: str, seed: int, array: np.ndarray, *, stage: str = "final",
                    queries: tuple[str, ...] = QUERIES, task_hash: str = TASK_HASH) -> None:
    values = {METRIC: dict(zip(queries, map(float, array))),
              "dev/recall@100": dict(zip(queries, map(float, np.clip(array + 0.3, 0, 1))))}
    record = {"trial_id": trial_id, "arm": arm, "seed": seed, "stage": stage, "split": "dev", "task_hash": task_hash,
              "values": values}
    (run_dir / PER_QUERY_DIR / f"{trial_id}.json").write_text(json.dumps(record))


def reference_bootstrap(arm: str, ours: np.ndarray, theirs: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The documented protocol, written directly: per resample, seed rows then query columns
    from the arm's generator, and the mean of the resampled difference matrix."""
    rng = np.random.default_rng([seed, zlib.crc32(arm.encode())])
    differences = ours - theirs
    replicates = []
    for _ in range(resamples):
        rows = rng.integers(0, differences.shape[0], size=differences.shape[0])
        columns = rng.integers(0, differences.shape[1], size=differences.shape[1])
        replicates.append(differences[np.ix_(rows, columns)].mean())
    return np.array(replicates)


def reference_tests(values: dict, seeds: dict[str, list[int]], resamples: int, seed: int = BOOTSTRAP_SEED) -> dict:
    """Per non-control arm: diff, p, Holm p, level, interval, verdict and MDE, by hand (alpha 0.05)."""
    out = {}
    for arm in ARMS[1:]:
        ours = np.stack([values[(arm, s)] for s in seeds[arm]])
        theirs = np.stack([values[("control", s)] for s in seeds[arm]])
        replicates = reference_bootstrap(arm, ours, theirs, resamples, seed)
        p = min(1.0, 2 * min((replicates <= 0).sum(), (replicates >= 0).sum()) / resamples)
        out[arm] = {"diff": (ours - theirs).mean(), "p": p, "replicates": np.sort(replicates),
                    "se": replicates.std(ddof=1)}
    m = len(out)
    ranked = sorted(out, key=lambda a: (out[a]["p"], ARMS.index(a)))
    running, stopped = 0.0, None
    for rank, arm in enumerate(ranked, start=1):
        running = max(running, min(1.0, (m - rank + 1) * out[arm]["p"]))
        divisor = m - rank + 1
        if stopped is None and out[arm]["p"] <= 0.05 / divisor:
            out[arm]["significant"] = True
        else:
            stopped = divisor if stopped is None else stopped
            divisor = stopped
            out[arm]["significant"] = False
        c = (resamples * 5) // (100 * 2 * divisor)  # floor(B x 0.05 / (2 x divisor)) in integers
        ordered = out[arm]["replicates"]
        out[arm].update(p_holm=running, level=1 - 0.05 / divisor, low=ordered[c], high=ordered[resamples - c - 1],
                        mde=(stats.norm.ppf(1 - 0.05 / (2 * m)) + stats.norm.ppf(0.8)) * out[arm]["se"])
    return out


@pytest.fixture
def run(tmp_path):
    values = per_query_values()
    return write_run(tmp_path, values), values


def test_bootstrap_equals_the_plain_numpy_reference(run):
    """Every number of the test equals the reference written above to 1e-12; the same seed
    gives identical numbers twice, another seed different replicates."""
    run_dir, values = run
    table = load_table(run_dir)
    ours = paired_tests(load_per_query(run_dir, table), METRIC, ARMS, resamples=B).set_index("arm")
    reference = reference_tests(values, {arm: list(SEEDS) for arm in ARMS}, B)
    for arm, expected in reference.items():
        got = ours.loc[arm]
        assert got["seeds"] == len(SEEDS) and got["queries"] == len(QUERIES)
        for column, key in (("diff", "diff"), ("p", "p"), ("p_holm", "p_holm"), ("ci_level", "level"),
                            ("ci_low", "low"), ("ci_high", "high"), ("se", "se"), ("mde", "mde")):
            np.testing.assert_allclose(got[column], expected[key], rtol=0, atol=1e-12, err_msg=f"{arm} {column}")
        assert bool(got["significant"]) == expected["significant"]
    again = paired_tests(load_per_query(run_dir, table), METRIC, ARMS, resamples=B)
    pd.testing.assert_frame_equal(again, ours.reset_index())
    other = paired_tests(load_per_query(run_dir, table), METRIC, ARMS, resamples=B, seed=1).set_index("arm")
    assert other.loc["same", "ci_low"] != ours.loc["same", "ci_low"]


def test_a_clear_effect_is_significant_and_a_null_one_is_not(run):
    """+0.08 on every query is found (interval above zero at its Holm level, adjusted p tiny);
    no effect is not, and its interval covers zero; the MDE lies between the two."""
    run_dir, _ = run
    tests = compare_to_control(run_dir, load_table(run_dir), resamples=B).tests.set_index("arm")
    better, same = tests.loc["better"], tests.loc["same"]
    assert better["significant"] and better["ci_low"] > 0 and better["p_holm"] <= 0.05
    assert better["diff"] == pytest.approx(0.08, abs=0.03)
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
    """Over many random families: Holm rejects exactly when adjusted p <= alpha, and the
    interval at the arm's level excludes zero exactly then (the p-value inverts the interval)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        m = int(rng.integers(1, 6))
        replicates = [rng.normal(rng.normal(0, 2), 1, size=400) for _ in range(m)]
        raw = [min(1.0, 2 * min((r <= 0).sum(), (r >= 0).sum()) / 400) for r in replicates]
        adjusted, levels, rejected = holm_levels(raw, 0.05)
        for r, p_holm, level, reject in zip(replicates, adjusted, levels, rejected):
            low, high = percentile_interval(r, level)
            assert reject == (p_holm <= 0.05) == (low > 0 or high < 0)


def test_missing_per_query_files_and_seeds(tmp_path):
    """A trial without a per-query file is left out and named; an arm paired over fewer seeds
    says so; a run without per_query/ has no test and every format says so in one line."""
    values = per_query_values()
    run_dir = write_run(tmp_path / "a", values, skip=(("same", 1),))
    comparison = compare_to_control(run_dir, load_table(run_dir), resamples=B)
    assert comparison.missing == ("same-1",) and "1 final trial(s) without per-query values" in comparison.header
    tests = comparison.tests.set_index("arm")
    assert tests.loc["same", "seeds"] == 2 and tests.loc["better", "seeds"] == 3
    reference = reference_tests(values, {"better": [0, 1, 2], "same": [0, 2]}, B)
    ours = paired_tests(load_per_query(run_dir, load_table(run_dir)), METRIC, ARMS, resamples=B).set_index("arm")
    np.testing.assert_allclose(ours.loc["same", "ci_low"], reference["same"]["low"], atol=1e-12)
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
    assert "paired bootstrap over seeds and queries (10,000 resamples" in text
    assert '"significant" = Holm-Bonferroni-adjusted p <= 0.05 across 2 non-control arm(s)' in text
    assert "seed-level paired difference from control" in text and "uncorrected" in text
    verdicts = [line.split() for line in text.splitlines() if line.startswith(("better ", "same "))
                and "significant" in line]
    assert [v[0] for v in verdicts] == ["better", "same"]
    assert "significant" in verdicts[0] and "not" not in verdicts[0] and "not" in verdicts[1]
    assert f"{expected.loc['better', 'diff']:+.4f}" in text and f"{expected.loc['better', 'mde']:.4f}" in text
    assert "| arm | seeds | queries | diff | corrected interval |" in render(run_dir, "markdown")
    csv = pd.read_csv(io.StringIO(render(run_dir, "csv")), comment="#").set_index("arm")
    for column in ("diff", "ci_low", "ci_high", "p_holm", "mde"):
        np.testing.assert_allclose(csv.loc["better", f"{METRIC}:paired_{column}"], expected.loc["better", column],
                                   rtol=1e-12)
    assert math.isnan(csv.loc["control", f"{METRIC}:paired_diff"])
    assert render(run_dir, "csv").startswith("# seed-level:")
    parsed = json.loads(render(run_dir, "json"))["paired"]
    assert parsed["correction"] == "holm-bonferroni" and parsed["alpha"] == 0.05 and parsed["resamples"] == RESAMPLES
    assert [(a["arm"], a["significant"]) for a in parsed["arms"]] == [("better", True), ("same", False)]


def test_minimum_detectable_effect_formula():
    """(z_{1-alpha/2} + z_power) x SE, against scipy's normal quantiles."""
    expected = (stats.norm.ppf(1 - 0.025 / 2) + stats.norm.ppf(0.8)) * 0.01
    assert minimum_detectable_effect(0.01, 0.025) == pytest.approx(expected, rel=1e-12)


def test_the_report_shows_the_test_beside_the_seed_level_table(run):
    """The report's trial tables carry the same header, verdicts and numbers as the text table,
    and label the Student's t differences as seed-level and uncorrected."""
    run_dir, _ = run
    expected = compare_to_control(run_dir, load_table(run_dir)).tests.set_index("arm")
    tables = html_page._trial_tables(read_run(run_dir))
    assert "Holm-Bonferroni-adjusted p &lt;= 0.05 across 2 non-control arm(s)" in tables
    assert "seed-level 95% t, uncorrected" in tables and "data-matched (equal tokens per trial)" in tables
    for arm, verdict in (("better", "significant"), ("same", "not significant")):
        row = re.search(rf"<tr><td>{arm}</td>(.*?)</tr>", tables).group(1)
        assert f"<td>{verdict}</td>" in row and f"{expected.loc[arm, 'diff']:+.4f}" in row
    old = run_dir.parent / "old"
    shutil.copytree(run_dir, old, ignore=shutil.ignore_patterns(PER_QUERY_DIR))
    assert "paired per-query test: unavailable" in html_page._trial_tables(read_run(old))
