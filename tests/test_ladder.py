"""A study read across a ladder of budgets: per-rung paired tests equal the single-run test,
Holm across arms x rungs equals statsmodels', the trend equals statsmodels' least squares with
the rungs' own variances, its interval holds its size in simulation, the reading names the
sign and a crossing, a projection is labelled, and directories that are not one ladder are
refused."""

from __future__ import annotations

import json
from pathlib import Path
import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.regression.linear_model import OLS
from statsmodels.stats.multitest import multipletests

from embedlab.cli import main
from embedlab.core.errors import UsageError
from embedlab.stats.ladder import LadderError, fit_trend, ladder_tests, load_rungs, project, reading, render_ladder
from embedlab.stats.paired import load_per_query, paired_tests
from embedlab.stats.table import load_table

from test_paired_stats import ARMS, QUERIES, SEEDS, write_run

FLOPS = (1e12, 2e12, 4e12)
EFFECTS = {"better": (-0.06, 0.01, 0.08), "same": (0.03, 0.02, 0.01)}  # one crosses zero, one shrinks


def rung_values(rung: int) -> dict[tuple[str, int], np.ndarray]:
    rng = np.random.default_rng(100 + rung)
    difficulty = rng.uniform(0.2, 0.7, size=len(QUERIES))
    effect = {"control": 0.0, **{arm: values[rung] for arm, values in EFFECTS.items()}}
    return {(arm, s): difficulty + rng.normal(0, 0.01) + effect[arm] + rng.normal(0, 0.03, size=len(QUERIES))
            for arm in ARMS for s in SEEDS}


def write_ladder(root) -> list:
    """Three rungs: the same study at 1, 2 and 4 x 10^12 training FLOPs (every trial of a rung
    at its rung's FLOPs)."""
    dirs = []
    for rung, flops in enumerate(FLOPS):
        run_dir = write_run(root / f"rung{rung}", rung_values(rung))
        for path in (run_dir / "trials").glob("*.json"):
            path.write_text(json.dumps({**json.loads(path.read_text()), "budget/flops": flops}))
        dirs.append(run_dir)
    return dirs[::-1]  # in any order: the ladder sorts by compute


@pytest.fixture
def ladder(tmp_path):
    return write_ladder(tmp_path)


def test_each_rung_is_the_single_run_test_and_holm_spans_arms_and_rungs(ladder):
    rungs = load_rungs(ladder)
    assert [r.flops for r in rungs] == list(FLOPS)
    tests = ladder_tests(rungs)
    assert list(tests["rung"]) == [1, 1, 2, 2, 3, 3] and list(tests["arm"]) == ["better", "same"] * 3
    for index, rung in enumerate(rungs, start=1):
        alone = paired_tests(load_per_query(rung.run_dir, rung.table), rung.table.attrs["metric"], list(ARMS))
        mine = tests[tests["rung"] == index]
        np.testing.assert_allclose(mine["diff"], alone["diff"], rtol=1e-12)
        np.testing.assert_allclose(mine["se"], alone["se"], rtol=1e-12)
        np.testing.assert_allclose(mine["p"], alone["p"], rtol=1e-12)
    holm = multipletests(tests["p"], alpha=0.05, method="holm")
    np.testing.assert_allclose(tests["p_holm"], holm[1], rtol=1e-12)
    assert list(tests["significant"]) == list(holm[0])
    for row in tests.to_dict("records"):  # the corrected interval excludes 0 exactly when significant
        assert row["significant"] == (row["ci_low"] > 0 or row["ci_high"] < 0)


def test_the_trend_is_statsmodels_least_squares_with_the_rungs_variances(ladder):
    tests = ladder_tests(load_rungs(ladder))
    for arm in ("better", "same"):
        rows = tests[tests["arm"] == arm]
        trend = fit_trend(arm, rows["flops"], rows["diff"], rows["se"], rows["seeds"])
        design = np.column_stack([np.ones(3), np.log2(rows["flops"].to_numpy())])
        se = rows["se"].to_numpy()
        oracle = OLS(rows["diff"].to_numpy(), design).fit()
        assert trend.intercept == pytest.approx(oracle.params[0], rel=1e-10)
        assert trend.slope == pytest.approx(oracle.params[1], rel=1e-10)
        # The slope's coefficients c_r on the rungs' differences: statsmodels' slope of each unit
        # vector. Its variance: sum c_r^2 se_r^2; Satterthwaite, each rung's variance on
        # k_r = seeds - 1 df.
        c = np.array([OLS(unit, design).fit().params[1] for unit in np.eye(3)])
        assert np.sum(c * rows["diff"].to_numpy()) == pytest.approx(trend.slope, rel=1e-10)
        assert trend.slope_se == pytest.approx(math.sqrt(np.sum(c**2 * se**2)), rel=1e-10)
        k = rows["seeds"].to_numpy() - 1
        df = np.sum(c**2 * se**2) ** 2 / np.sum((c**2 * se**2) ** 2 / k)
        assert trend.df == pytest.approx(df, rel=1e-10) and 2 <= trend.df <= 6  # between min k and sum k
        half = stats.t.ppf(0.975, df) * math.sqrt(np.sum(c**2 * se**2))
        assert (trend.low, trend.high) == pytest.approx((oracle.params[1] - half, oracle.params[1] + half), rel=1e-10)
    better = tests[tests["arm"] == "better"]
    assert fit_trend("better", better["flops"], better["diff"], better["se"], better["seeds"]).reading.startswith("crosses zero between rungs 1 and 2")


def test_readings_and_projections():
    assert reading([0.05, 0.03, 0.01], -0.02, -0.03, -0.01).startswith(
        "same sign at every rung (above the control), shrinking by 0.0200 per doubling")
    assert reading([-0.01, -0.03], -0.02, -0.05, 0.01).endswith("not distinguishable from flat")
    assert "growing" in reading([-0.01, -0.03], -0.02, -0.05, 0.01)
    trend = fit_trend("a", [1e12, 4e12], [0.01, 0.05], [0.01, 0.01], [3, 3])
    assert trend.slope == pytest.approx(0.02)  # two rungs: the line through both points
    at = project(trend, 16e12)
    assert at["diff"] == pytest.approx(0.09) and at["extrapolation"] and at["low"] < 0.09 < at["high"]
    inside = project(trend, 2e12)
    assert inside["diff"] == pytest.approx(0.03) and not inside["extrapolation"]
    assert math.isclose(inside["high"] - inside["diff"], inside["diff"] - inside["low"])


def test_the_command_prints_the_ladder_and_refuses_what_is_not_one(ladder, tmp_path, capsys):
    assert main(["stats", "ladder", *map(str, ladder), "--project-to", "6.4e13"]) == 0
    out = capsys.readouterr().out
    assert "3 rungs" in out and "Holm across 6 (arm, rung) pairs" in out
    assert "better vs control over 3 rungs: crosses zero between rungs 1 and 2" in out
    assert "EXTRAPOLATION beyond the measured range, not a result" in out
    # "better" is last at rung 1 (-0.06) and first at the top rung (+0.08): promotion takes the top rung
    assert f"top rung's winner on the study metric: better (promote {load_rungs(ladder)[-1].run_dir}); another arm " \
        "won rung 1 (same)" in out
    assert render_ladder(ladder) == render_ladder(ladder[::-1])
    # each arm's mean per rung: the trials' own metric averaged over seeds, by hand
    block = out[out.index("mean dev/ndcg@10 over each arm's seeds:"):].split("\n\n")[0].splitlines()
    header, rows = block[1].split(), [line.split() for line in block[2:]]
    for row, rung in zip(rows, load_rungs(ladder)):
        trials = [json.loads(path.read_text()) for path in (Path(rung.run_dir) / "trials").glob("*.json")]
        for arm, shown in zip(header[2:], row[2:]):
            values = [t["dev/ndcg@10"] for t in trials if t["arm"] == arm and t.get("stage", "final") == "final"]
            assert shown == f"{sum(values) / len(values):.4f}"
    assert len(rows) == 3 and header[:2] == ["rung", "FLOPs"]
    with pytest.raises(LadderError, match="at least two run directories"):
        load_rungs(ladder[:1])
    same = write_run(tmp_path / "same", rung_values(0))
    with pytest.raises(LadderError, match="within 1% of the same FLOPs"):
        load_rungs([same, write_run(tmp_path / "same2", rung_values(1))])
    other = write_run(tmp_path / "other", {k: v for k, v in rung_values(0).items() if k[0] != "same"})
    with pytest.raises(LadderError, match="not rungs of one ladder"):
        load_rungs([ladder[0], other])
    assert main(["stats", "ladder", str(ladder[0])]) == 2
    assert load_table(ladder[0]).attrs["metric"] == "dev/ndcg@10"


# --- running a ladder: rungs as scaled studies, finished rungs kept --------------------------------

STUDY_FILE = '''
from dataclasses import replace

from embedlab import Budget, Study
from conftest import tiny_trial


def study():
    base = tiny_trial()
    return Study(name="lad", factor="masking.ratio",
                 arms={"r15": base, "r30": replace(base, masking=replace(base.masking, ratio=0.3))},
                 seeds=(0, 1), budget=Budget(tokens=64_000, pairs=1_000, flops=8e11))
'''


def test_a_rung_is_the_study_at_a_multiple_of_its_budget(tmp_path):
    from embedlab.core.config import ConfigError
    from embedlab.studies.study import load_study

    path = tmp_path / "lad.py"
    path.write_text(STUDY_FILE)
    whole, half = load_study(path), load_study(path, budget_scale=0.5)
    assert half.name == "lad-x0p5" and half.arms == whole.arms and half.seeds == whole.seeds
    assert (half.budget.tokens, half.budget.flops) == (32_000, 4e11) and half.hash != whole.hash
    assert half.trial_config("r30", 1).train.budget == half.budget  # every arm trains to the rung's budget
    assert load_study(path, budget_scale=1.0) == whole
    with pytest.raises(ConfigError, match="budget scale 0.0001: .*less than one step"):
        load_study(path, budget_scale=1e-4)


def test_a_ladder_keeps_finished_rungs_and_resumes_a_cut_one(tmp_path):
    """Rung x0.5 finished, rung x1 cut short (one trial of four), rung x0.25 never started, and
    an unrelated run: the plan keeps, resumes and starts them, reading run directories only."""
    from embedlab.studies.study import load_study
    from embedlab.sweep.ladder_run import ladder_plan, parse_scales

    path = tmp_path / "lad.py"
    path.write_text(STUDY_FILE)
    storage = tmp_path / "runs"

    def write(scale: float, trials: int, suffix: str, name: str | None = None) -> str:
        study = load_study(path, budget_scale=scale)
        run_dir = storage / f"{name or study.name}-{suffix}"
        (run_dir / "trials").mkdir(parents=True)
        (run_dir / "study.json").write_text(json.dumps({"study": study.to_dict(), "arm_order": list(study.arms),
                                                        "study_hash": study.hash}))
        for i, (arm, seed) in enumerate([(a, s) for a in study.arms for s in study.seeds][:trials]):
            (run_dir / "trials" / f"t{i}.json").write_text(json.dumps(
                {"trial_id": f"t{i}", "arm": arm, "seed": seed, "status": "finished", "stage": "final",
                 "dev/ndcg@10": 0.5, "budget/tokens": study.budget.tokens, "budget/flops": study.budget.flops}))
        return str(run_dir)

    done = write(0.5, 4, "20261204-000000")
    cut = write(1, 1, "20261204-010000")
    write(0.3, 4, "20261204-020000", name="lad-x0p25")  # this rung's name, another study's hash: not it
    scales = parse_scales("1,0.25,0.5")
    assert scales == (0.25, 0.5, 1.0)
    plan = ladder_plan(path, scales, profile=None, storage=storage)
    assert [(f, action) for f, action, _ in plan] == [(0.25, "run"), (0.5, "done"), (1.0, "resume")]
    assert [d for _, _, d in plan] == [None, done, cut]
    for bad in ("1", "0.5,0.5", "0,1", "a,b"):
        with pytest.raises(UsageError, match="--ladder"):
            parse_scales(bad)
    assert main(["sweep", str(path), "--ladder", "0.5,1", "--dry-run", "--storage", str(storage)]) == 0
    assert main(["sweep", str(path), "--ladder", "0.5,1", "--resume", cut]) == 2


def test_rung_base_undoes_rung_name():
    from embedlab.studies.study import rung_base, rung_name

    for factor in (0.125, 0.25, 0.5, 2, 1e-05):
        assert rung_base(rung_name("hard-negatives-4-seeds", factor)) == "hard-negatives-4-seeds"
    assert rung_base("dual-heads") == "dual-heads" and rung_base("box-x") == "box-x"


def test_a_rung_that_ends_short_stops_the_ladder(tmp_path, monkeypatch, capsys):
    """A rung's sweep that returns with trials missing (Ctrl-C: Tune stops in order and the
    sweep returns its run directory) stops the ladder there, in one line that says how to
    resume; the next rung is never started."""
    import embedlab.sweep.run
    from embedlab.studies.study import load_study

    path = tmp_path / "lad.py"
    path.write_text(STUDY_FILE)
    storage = tmp_path / "runs"
    started = []

    def interrupted_sweep(study_path, *, storage, profile, budget_scale, resume, progress, **_):
        study = load_study(study_path, profile, budget_scale)
        started.append(budget_scale)
        run_dir = Path(storage) / f"{study.name}-20261206-000000"
        (run_dir / "trials").mkdir(parents=True)
        (run_dir / "study.json").write_text(json.dumps({"study": study.to_dict(), "arm_order": list(study.arms),
                                                        "study_hash": study.hash}))
        (run_dir / "trials" / "t0.json").write_text(json.dumps(  # one trial of four, then the interrupt
            {"trial_id": "t0", "arm": next(iter(study.arms)), "seed": study.seeds[0], "status": "finished",
             "stage": "final", "dev/ndcg@10": 0.5, "budget/tokens": study.budget.tokens,
             "budget/flops": study.budget.flops}))
        return run_dir

    monkeypatch.setattr(embedlab.sweep.run, "run_sweep", interrupted_sweep)
    assert main(["sweep", str(path), "--ladder", "0.5,1", "--storage", str(storage)]) == 2
    assert started == [0.5]
    err = capsys.readouterr().err
    assert "ladder: rung x0.5 ended with 1 of 4 trials" in err and "run the same command again to resume it" in err


def test_the_report_draws_the_ladder(ladder, tmp_path):
    """The report's ladder figure: a PNG whose caption names each rung's best arm and each arm's
    reading, and none for runs that are not one study's rungs."""
    from embedlab.report.collect import read_runs
    from embedlab.report.ladder_figure import ladder_figure

    figure = ladder_figure(read_runs(ladder))
    assert figure.png.startswith(b"\x89PNG") and figure.title == "Answers across budgets"
    assert figure.caption.observed.startswith("Best arm per rung, in budget order: same, same, better.")
    assert "better: crosses zero between rungs 1 and 2" in figure.caption.observed
    assert ladder_figure(read_runs(ladder[:1])) is None


def test_report_figures_are_the_images_the_page_embeds(ladder, tmp_path, capsys):
    """`embedlab report --figures DIR` writes each drawn figure as DIR/<id>.png, byte for byte the
    image the page embeds under that figure's id."""
    import base64
    import re

    page, figures = tmp_path / "report.html", tmp_path / "figures"
    # Kept as docs/results/runs keeps records: trials and the study name checkpoints that exist,
    # but there is no prepared.json to measure them with; the report draws what it can.
    (tmp_path / "ckpt").mkdir()
    for run_dir in ladder:
        record = json.loads((run_dir / "study.json").read_text())
        (run_dir / "study.json").write_text(json.dumps({**record, "parent": str(tmp_path / "ckpt")}))
        for path in (run_dir / "trials").glob("*.json"):
            path.write_text(json.dumps({**json.loads(path.read_text()), "checkpoint": str(tmp_path / "ckpt")}))
    assert main(["report", *map(str, ladder), "--out", str(page), "--figures", str(figures)]) == 0
    embedded = dict(re.findall(r'<figure class="report-figure" id="figure-([^"]+)">.*?'
                               r'<img src="data:image/png;base64,([^"]+)"', page.read_text(), re.S))
    assert "ladder" in embedded
    assert {path.stem: path.read_bytes() for path in figures.glob("*.png")} == {
        key: base64.b64decode(data) for key, data in embedded.items()}
    assert f"figures: {figures}/<figure id>.png" in capsys.readouterr().out


def simulated_ladders(seeds: int, seed_sd: float, ladders: int, rng: np.random.Generator):
    """Per ladder: three rungs' crossed estimates (1, 2 and 4 x 10^12 FLOPs) of a difference
    that is the same at every rung (slope 0): `seeds` seeds x 200 queries of differences =
    0.02 + seed x arm term (SD `seed_sd`) + query term (SD 0.05) + noise (SD 0.05), every rung
    independent."""
    from embedlab.stats.crossed import crossed_estimate

    for _ in range(ladders):
        yield [crossed_estimate([0.02 + rng.normal(0, seed_sd, (seeds, 1)) + rng.normal(0, 0.05, (1, 200))
                                 + rng.normal(0, 0.05, (seeds, 200))]) for _ in FLOPS]


def bound(ladders: int, alpha: float = 0.05) -> float:
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / ladders)


@pytest.mark.parametrize("seeds, seed_sd", [(2, 0.0), (2, 0.02), (3, 0.05), (4, 0.02), (4, 0.05)])
def test_the_slope_interval_holds_its_size_at_few_seeds(seeds, seed_sd):
    """The slope's 95% interval, sized by simulation (`simulated_ladders`): over 1,000 flat
    ladders it excludes 0 at most 5% plus three Monte-Carlo standard errors of the time."""
    rng = np.random.default_rng(20261206 + seeds * 100 + round(seed_sd * 1000))
    excluded = 0
    for estimates in simulated_ladders(seeds, seed_sd, 1_000, rng):
        trend = fit_trend("arm", FLOPS, [e.mean for e in estimates], [e.se for e in estimates], [seeds] * len(FLOPS))
        excluded += not trend.low <= 0 <= trend.high
    assert excluded / 1_000 <= bound(1_000), excluded / 1_000


def test_weighting_rungs_by_their_estimated_variances_would_fail_the_size_check():
    """Why the line weighs rungs equally: the same simulation (3 seeds, the seed term dominant)
    with weights 1/se^2, the interval otherwise built the same way, excludes a flat trend more
    often than the bound allows: the check can fail."""
    from embedlab.stats.ladder import combination_df

    rng = np.random.default_rng(20261206)
    x = np.log2(np.asarray(FLOPS))
    design = np.column_stack([np.ones(3), x])
    ladders, excluded = 2_000, 0
    for estimates in simulated_ladders(3, 0.05, ladders, rng):
        d, se = np.array([e.mean for e in estimates]), np.array([e.se for e in estimates])
        weights = 1 / se**2
        c = (np.linalg.inv(design.T @ (design * weights[:, None])) @ (design * weights[:, None]).T)[1]
        half = stats.t.ppf(0.975, combination_df(c, se, [3] * 3)) * math.sqrt(np.sum(c**2 * se**2))
        excluded += abs(c @ d) > half
    assert excluded / ladders > bound(ladders), excluded / ladders


def test_plan_projects_the_trend_to_a_studys_budget_labelled_as_extrapolation(ladder, tmp_path, capsys):
    """`embedlab plan STUDY --trend-from RUNG...`: no pilots; each arm's trend evaluated at the
    study's training FLOPs (as `project` computes it), labelled an extrapolation beyond the
    rungs; a study of other arms, or one not budgeted in FLOPs, is refused in one line."""
    from conftest import tiny_trial

    def study_file(name: str, arms: tuple[str, ...], budget: str) -> str:
        path = tmp_path / f"{name}.py"
        path.write_text(
            "from dataclasses import replace\nfrom embedlab import Budget, Study\nfrom embedlab.core.config import TrialConfig\n"
            f"def study(profile=None):\n    base = TrialConfig.from_dict({tiny_trial().to_dict()!r})\n"
            f"    return Study(name={name!r}, factor='masking.ratio', seeds=(0,), budget={budget},\n"
            "                 arms={" + ", ".join(f"{arm!r}: replace(base, masking=replace(base.masking, ratio={0.1 + i / 10}))"
                                         for i, arm in enumerate(arms)) + "})\n")
        return str(path)

    target = study_file("at-scale", ARMS, "Budget(tokens=4_000, pairs=64, flops=3.2e13)")
    assert main(["plan", target, "--trend-from", *map(str, ladder)]) == 0
    out = capsys.readouterr().out
    tests = ladder_tests(load_rungs(ladder))
    assert out.splitlines()[0] == ("projected from a 3-rung ladder measured at 1e+12 to 4e+12 training FLOPs, to "
                                   "study at-scale's 3.2e+13 (95% intervals):")
    for arm in ("better", "same"):
        rows = tests[tests["arm"] == arm]
        at = project(fit_trend(arm, rows["flops"], rows["diff"], rows["se"], rows["seeds"]), 3.2e13)
        assert (f"{arm} at 3.2e+13 FLOPs: {at['diff']:+.4f} [{at['low']:+.4f}, {at['high']:+.4f}] "
                "(EXTRAPOLATION beyond the measured range, not a result)") in out.splitlines()
    other = study_file("other", ("control", "better"), "Budget(tokens=4_000, pairs=64, flops=3.2e13)")
    assert main(["plan", other, "--trend-from", *map(str, ladder)]) == 2
    assert "are not study other's ['control', 'better']: a trend projects only to the same comparison" in (
        capsys.readouterr().err)
    tokens = study_file("tokens", ARMS, "Budget(tokens=4_000, pairs=64)")
    assert main(["plan", tokens, "--trend-from", *map(str, ladder)]) == 2
    assert "its budget is not in training FLOPs" in capsys.readouterr().err
