"""Seeds until decided and equivalence: the sequential procedure's false-positive rate holds at
alpha in every cell of the calibrate grid, its equivalence verdict at the margin likewise, Holm
across arms sharing a control holds each family, it spends fewer seeds than the fixed design of
equal power; its threshold decisions are Holm on the sequential p-values; a run's looks replay
from its per-query values and a changed design or value is refused; the fixed test's
equivalence family and the tables. Synthetic studies and run directories, no Ray (the real
sweep, killed and resumed: test_reuse_and_rounds_on_ray.py)."""

from __future__ import annotations

import io
import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from embedlab.cli import main
from embedlab.core.errors import ConfigError, UsageError
from embedlab.records.rundir import SEQUENTIAL_FILE
from embedlab.report import html as html_page
from embedlab.report.collect import read_run
from embedlab.stats import calibration, crossed, looks, sequential
from embedlab.stats.calibration import Setting
from embedlab.stats.paired import load_per_query, paired_tests
from embedlab.stats.rerun import rerun_size, with_seeds
from embedlab.stats.table import load_table, render
from embedlab.studies.study import MIN_MAX_SEEDS, Study
from embedlab.sweep.rounds import current

from conftest import tiny_budget, tiny_trial
from test_paired_stats import METRIC, QUERIES, write_per_query, write_run

ALPHA = 0.05


def _bound(studies: int, alpha: float = ALPHA) -> float:
    """alpha plus three Monte Carlo standard errors of a rate near alpha."""
    return alpha + 3 * math.sqrt(alpha * (1 - alpha) / studies)


def test_looks_weights_and_seed_order():
    """Looks every 2 seeds to max seeds (a look under 2 below it dropped); the weights are t^3
    increments with nothing below 4 seeds and sum to 1; the seed order is the study's seeds,
    then the smallest unused outside the tuning seeds (as a rerun extends them)."""
    assert sequential.look_schedule(2, 8) == (2, 4, 6, 8)
    assert sequential.look_schedule(3, 8) == (3, 5, 8)
    assert sequential.look_schedule(2, 5) == (2, 5) and sequential.look_schedule(2, 4) == (2, 4)
    weights = sequential.spending_weights((2, 4, 6, 8))
    assert weights == pytest.approx((0.0, 0.125, 0.421875 - 0.125, 1 - 0.421875), abs=1e-15)
    assert sequential.spending_weights((3, 5, 8)) == pytest.approx((0.0, (5 / 8) ** 3, 1 - (5 / 8) ** 3))
    assert sum(sequential.spending_weights((3, 4, 7, 9))) == pytest.approx(1.0)
    assert MIN_MAX_SEEDS == sequential.EFFICACY_MIN_SEEDS
    assert sequential.extended_seeds((5, 0), 5, taken=(1,)) == (5, 0, 2, 3, 4)
    with pytest.raises(ValueError, match="tests from 4 seeds"):
        sequential.spending_weights((2, 3))


def test_the_sequential_false_positive_rate_is_at_most_alpha_in_every_cell():
    """Both designs (2 to 8 seeds, looks 2/4/6/8; 3 to 8, looks 3/5/8), every cell of the
    grid's seed x arm, query and noise terms: at most alpha + 3 Monte Carlo SE."""
    studies = 2_000
    sizes = calibration.sequential_size_table(studies=studies)
    assert len(sizes) == 32 and {r.looks for r in sizes} == {(2, 4, 6, 8), (3, 5, 8)}
    over = [(r.looks, r.setting, r.rate) for r in sizes if r.rate > _bound(studies)]
    assert not over, over
    assert all(r.seeds < 6.6 for r in sizes)  # stopping early for futility saves seeds under the null


def test_the_equivalence_verdict_is_wrong_at_most_alpha_at_the_margin():
    """A true difference of exactly +margin or -margin is called equivalent at most alpha + 3
    Monte Carlo SE of the time, in every cell."""
    studies = 1_000
    rows = calibration.equivalence_table(studies=studies)
    assert len(rows) == 32 and {round(abs(r.setting.effect) / r.margin, 12) for r in rows} == {1.0}
    over = [(r.setting, r.rate) for r in rows if r.rate > _bound(studies)]
    assert not over, over


def _family_studies(effects: tuple[float, ...], setting: Setting, studies: int, rng: np.random.Generator
                    ) -> np.ndarray:
    """(n, m, S, Q) differences of m arms from one shared control: each arm and the control its
    own seed, query and noise terms at 1/sqrt(2) of the setting's (so each difference has the
    setting's), the control's subtracted from every arm."""
    def draw(effect: float) -> np.ndarray:
        return replace(setting, sd_seed=setting.sd_seed / math.sqrt(2), sd_query=setting.sd_query / math.sqrt(2),
                       sd_noise=setting.sd_noise / math.sqrt(2), effect=effect).draw(studies, rng)

    control = draw(0.0)
    return np.stack([draw(effect) - control for effect in effects], axis=1)


@pytest.mark.parametrize("case", ["all null", "all null with a margin", "all at the margin", "mixed"])
def test_holm_across_arms_sharing_a_control_holds_each_family(case):
    """Three arms against one control, seeds 2 to 8: the chance of any wrong "better"/"worse"
    (an arm with no difference) and of any wrong "equivalent" (an arm at or beyond the margin)
    is each at most alpha + 3 Monte Carlo SE."""
    setting = Setting(seeds=8, **calibration.REALISTIC)
    margin = calibration.margin_at(setting, 8)
    effects, with_margin = {"all null": ((0.0,) * 3, False), "all null with a margin": ((0.0,) * 3, True),
                            "all at the margin": ((margin, -margin, margin), True),
                            "mixed": ((0.0, margin, 2 * margin), True)}[case]
    studies = 1_000
    design = calibration.design_of(2, 8, arms=3, margin=margin if with_margin else None)
    rng = np.random.default_rng([calibration.SIMULATION_SEED, 63, 40, len(case)])
    state = sequential.simulate(design, _family_studies(effects, setting, studies, rng))
    null = np.array(effects) == 0
    beyond = np.abs(np.array(effects)) >= margin
    wrong_difference = (state.better_or_worse & null).any(axis=1).mean()
    wrong_equivalence = (state.equivalent & beyond).any(axis=1).mean()
    assert wrong_difference <= _bound(studies) and wrong_equivalence <= _bound(studies), (
        wrong_difference, wrong_equivalence)
    trials = sequential.trials_used(design, state)
    assert trials.max() <= 4 * 8 and trials.min() >= 4 * 2


def test_it_spends_fewer_seeds_than_the_fixed_design_of_equal_power():
    """The realistic setting, one arm: with no difference it runs about 5.3 of 8 seeds; at 3 and
    4 sd of the mean difference at 8 seeds it gives up at most 8 and 5 points of the fixed
    8-seed design's power, and runs fewer seeds on average than the fewest a fixed design of
    its power needs."""
    rows = {round(r.setting.effect / r.setting.sd, 6): r
            for r in calibration.seeds_table(studies=1_000) if r.name == "realistic"}
    assert rows[0.0].seeds <= 5.6 and rows[0.0].power <= _bound(1_000) and rows[0.0].fixed_seeds is None
    for units, cost in ((3.0, 0.08), (4.0, 0.05)):
        row = rows[units]
        assert row.power >= row.fixed_power[8] - cost, (units, row.power, row.fixed_power)
        assert row.fixed_seeds is not None and row.seeds < row.fixed_seeds <= 8, (units, row.seeds, row.fixed_seeds)


def _random_looks(design: sequential.Design, arms: list[str], rng: np.random.Generator, effects: dict[str, float]):
    """Looks of a family drawn from the crossed model (40 queries), taken as a run takes them:
    every open arm at each look's seeds, the state stepped after each."""
    queries = 40
    values = {arm: effects.get(arm, 0.0) + rng.normal(0, 0.01, (design.max_seeds, 1))
              + rng.normal(0, 0.03, (1, queries)) + rng.normal(0, 0.05, (design.max_seeds, queries)) for arm in arms}
    states, taken = [sequential.start(design)], []
    while states[-1].looks_taken < len(design.looks) and states[-1].open.any():
        seeds = design.looks[states[-1].looks_taken]
        estimates = {arm: crossed.crossed_estimate([values[arm][:seeds] - values[arms[0]][:seeds]])
                     for arm in looks.open_arms(states[-1], arms)}
        look = looks.Look(index=states[-1].looks_taken, seeds=tuple(range(seeds)), estimates=estimates)
        taken.append(look)
        states.append(sequential.step(design, states[-1], *looks._arrays(look, arms)))
    return taken, states


def test_threshold_decisions_are_holm_on_the_sequential_p_values():
    """On random families (some arms clearly better, worse or equivalent, some near the
    boundaries): Holm on min(p / weight) rejects exactly the arms the thresholds rejected, in
    both families, each corrected interval excludes 0 exactly when its arm is better or worse and
    each equivalence interval lies inside the margin exactly when its arm is equivalent
    (`looks.summarize` raises if not), and every verdict is one of the words."""
    arms = ["control", "a", "b"]
    design = sequential.make_design((0, 1), 6, 2, margin=0.03)
    words = {"better", "worse", "equivalent within ±0.03", "better, equivalent within ±0.03",
             "worse, equivalent within ±0.03", "futile", "undecided"}
    rng = np.random.default_rng(20261208)
    seen = set()
    for effects in ({"a": 0.06, "b": 0.0}, {"a": -0.04, "b": 0.01}, {"a": 0.02, "b": -0.02}, {"a": 0.0, "b": 0.0}):
        taken, states = _random_looks(design, arms, rng, effects)
        record = looks.summarize(design, taken, states, arms, operating=False)
        for arm, result in record["arms"].items():
            assert result["verdict"] in words, result["verdict"]
            seen.add(result["verdict"].split(",")[0])
            low, high = result["interval"]
            assert (low > 0 or high < 0) == result["verdict"].startswith(("better", "worse"))
            assert (result["p_holm"] <= ALPHA) == result["verdict"].startswith(("better", "worse"))
    assert {"better", "worse"} <= seen


def test_sequential_looks_are_nested_and_the_simulation_is_the_run():
    """The vectorised simulation of one family is the scalar step-by-step run of the same data:
    the same decisions, seeds and signs."""
    rng = np.random.default_rng(11)
    design = sequential.make_design((0, 1), 8, 2, margin=0.02)
    differences = rng.normal(0, 0.05, (6, 2, 8, 30)) + np.array([0.0, 0.03])[None, :, None, None]
    together = sequential.simulate(design, differences)
    for i in range(differences.shape[0]):
        one = sequential.simulate(design, differences[i:i + 1])
        for field in ("open", "seeds", "better_or_worse", "equivalent", "futile"):
            np.testing.assert_array_equal(getattr(one, field)[0], getattr(together, field)[i], err_msg=field)


def test_no_level_below_what_two_seeds_can_reach_and_no_p_below_what_the_integral_supports():
    """At 2 seeds a level under the worst case of p_S = 1e-100 is 0 (no p_S reaches it), not an
    error; its interval is the whole line, its power 0, its MDE infinite; a p_S that underflows
    to 0 reads as 1e-100, whose worst case (about 0.003) is the p, not 5e-324."""
    assert crossed.calibrated_level(1, 0.001) == 0.0
    assert crossed.calibrated_level(1, 0.05) == pytest.approx(3.9e-4, rel=0.01)  # unchanged above it
    # A difference of 500 standard errors, nearly all of its variance the query part's: p_S is a
    # normal tail far below the smallest float.
    huge = crossed.CrossedEstimate(mean=0.5, seed_part=1e-30, query_part=1e-6, seeds=2, queries=(30,), var_seed=0.0,
                                   var_query=(3e-5,), var_noise=(0.0,))
    assert crossed.satterthwaite_p(huge.mean, huge.seed_part, huge.query_part, 1) == 0.0
    assert crossed.p_value(huge) == pytest.approx(crossed.worst_case_size(crossed.P_S_FLOOR, 1)) and \
        crossed.p_value(huge) > 1e-3
    assert crossed.interval(huge, 0.001) == (-math.inf, math.inf)
    assert crossed.power(0.1, 0.01, 0.5, 1, 0.001) == 0.0
    assert crossed.minimum_detectable_effect(huge, 0.001) == math.inf


def test_tost_is_two_one_sided_worst_case_tests_and_its_interval_says_the_same():
    """Each one-sided p is half the worst case of the two-sided Satterthwaite p of the shifted
    mean (1 on the wrong side); the TOST p is the larger; p <= a exactly when the 1 - 2a
    interval lies inside the margin, on random estimates."""
    rng = np.random.default_rng(8)
    for _ in range(12):
        estimate = crossed.crossed_estimate([rng.normal(rng.uniform(-0.03, 0.03), 0.05, (4, 40))
                                             + rng.normal(0, 0.01, (4, 1))])
        margin = float(rng.uniform(0.01, 0.06))
        below = crossed.one_sided_p(estimate, margin, "below")
        moved = float(crossed.satterthwaite_p(estimate.mean - margin, estimate.seed_part, estimate.query_part, 3))
        assert below == (1.0 if estimate.mean >= margin else pytest.approx(crossed.worst_case_size(moved, 3) / 2))
        p = crossed.tost_p(estimate, margin)
        assert p == max(below, crossed.one_sided_p(estimate, -margin, "above"))
        for a in (0.01, 0.05):
            low, high = crossed.equivalence_interval(estimate, a)
            assert (p <= a) == (-margin < low and high < margin)


def _run(tmp_path, effects: dict[str, float], seeds=range(8), *, sequential_study: dict | None = None,
         margin: float | None = None):
    """A run directory of 3 arms at `seeds` (per-query values from the crossed model)."""
    rng = np.random.default_rng(3)
    difficulty = rng.uniform(0.2, 0.7, len(QUERIES))
    values = {(arm, s): difficulty + rng.normal(0, 0.005) + effect + rng.normal(0, 0.03, len(QUERIES))
              for arm, effect in effects.items() for s in seeds}
    run_dir = write_run(tmp_path, values)
    record = json.loads((run_dir / "study.json").read_text())
    record["study"]["seeds"] = [0, 1]
    record["study"].update(sequential_study or {})
    if margin is not None:
        record["study"]["equivalence_margin"] = margin
    (run_dir / "study.json").write_text(json.dumps(record))
    return run_dir, values


def _study(arms: list[str], max_seeds: int = 6, margin: float | None = None):
    """A real study of tiny arms named `arms` (each a masking ratio), run until decided."""
    base = tiny_trial()
    configs = {arm: replace(base, masking=replace(base.masking, ratio=0.15 + 0.05 * i)) for i, arm in enumerate(arms)}
    return Study(name="toy", factor="masking.ratio", arms=configs, seeds=(0, 1), budget=tiny_budget(),
                 until_decided=True, max_seeds=max_seeds, equivalence_margin=margin)


def test_a_run_replays_its_looks_and_refuses_changed_data(tmp_path):
    """Looks are taken only on whole rounds, from the per-query values: with seeds 0-3 of
    every arm, two looks (2 and 4 seeds) and the next round asks for the control and the open
    arms at 6 seeds; with a seed of one arm missing, the look at 4 seeds waits; a recorded look
    whose per-query value changed since is refused, naming the round."""
    arms = ["control", "better", "some"]
    run_dir, values = _run(tmp_path, {"control": 0.0, "better": 0.3, "some": 0.015}, seeds=range(4))
    study = _study(arms)
    design = looks.design_for(study)
    summary, needed = current(study, str(run_dir), design, None)
    assert [look["seeds"] for look in summary["looks"]] == [2, 4]
    assert summary["arms"]["better"]["verdict"] == "better" and summary["arms"]["better"]["decided_at"] == 4
    assert summary["arms"]["some"]["verdict"] == "undecided (next round: 6 seeds)"
    assert needed == [(arm, seed) for arm in ("control", "some") for seed in range(6)]
    (run_dir / "per_query" / "some-3.json").unlink()
    fewer, waiting = current(study, str(run_dir), design, None)
    assert len(fewer["looks"]) == 1 and ("some", 3) in waiting  # round 2 not whole: no look
    write_per_query(run_dir, "some-3", "some", 3, values[("some", 3)] + 0.01)
    with pytest.raises(UsageError, match="round 2, arm some: recorded diff"):
        current(study, str(run_dir), design, summary)


def test_the_table_of_a_sequential_run_says_what_it_decided_and_spent(tmp_path):
    """A finished sequential run's table: the sequential header, each arm's verdict in the
    words, the seeds each used against the fixed design, one line per round with its
    boundaries; its fixed-seed test is not printed (it would not hold its size); --seeds-from
    refuses it."""
    arms = ["control", "better", "same"]
    run_dir, _ = _run(tmp_path, {"control": 0.0, "better": 0.3, "same": 0.0}, seeds=range(4),
                      sequential_study={"until_decided": True, "max_seeds": 4})
    study = _study(arms, max_seeds=4)
    summary, needed = current(study, str(run_dir), looks.design_for(study), None)
    assert not needed and summary["finished"]
    rounds = [{"round": 1, "seeds": 2, "trials": [[a, s] for a in arms for s in range(2)]},
              {"round": 2, "seeds": 4, "trials": [[a, s] for a in arms for s in range(4)]}]
    (run_dir / SEQUENTIAL_FILE).write_text(json.dumps({**summary, "rounds": rounds}))
    text = render(run_dir)
    assert "sequential paired test of dev/ndcg@10 vs control control" in text
    assert "round 2 (4 seeds: 0, 1, 2, 3): weight 1; Satterthwaite-p boundaries" in text
    assert "seeds used (decided): control 4 (the control runs as long as its longest arm), better 4, same 4: 12 " \
           "trials, against 12 for the fixed design at 4 seeds" in text
    assert '"significant" = Holm' not in text and " better " in text
    assert json.loads(render(run_dir, "json"))["sequential"]["finished"] is True
    page = html_page._trial_tables(read_run(run_dir))
    assert "sequential paired test of dev/ndcg@10" in page and "seeds used (decided)" in page
    with pytest.raises(UsageError, match="chose its seeds round by round"):
        rerun_size(run_dir, study)


def test_a_fixed_study_with_a_margin_says_better_worse_or_equivalent(tmp_path):
    """A study of fixed seeds that declares a margin: TOST with Holm across its arms as a second
    family; an arm with no difference and small noise is "equivalent within ±0.05", a clearly
    better one "better", and the MDE and seeds-needed columns stay for what is not significant."""
    run_dir, _ = _run(tmp_path, {"control": 0.0, "better": 0.3, "same": 0.0}, seeds=range(4), margin=0.05)
    table = load_table(run_dir)
    tests = paired_tests(load_per_query(run_dir, table), METRIC, ["control", "better", "same"], margin=0.05)
    same = tests.set_index("arm").loc["same"]
    assert bool(same["equivalent"]) and not same["significant"] and -0.05 < same["eq_low"] < same["eq_high"] < 0.05
    text = render(run_dir)
    assert '"better"/"worse" = Holm-adjusted p' in text and "equivalence interval" in text
    tested = text[text.index("paired per-query test"):text.index("trials:")].splitlines()
    assert "equivalent within ±0.05" in next(line for line in tested if line.startswith("same "))
    assert " better " in next(line for line in tested if line.startswith("better "))
    frame = pd.read_csv(io.StringIO(render(run_dir, "csv")), comment="#")
    assert bool(frame.set_index("arm").loc["same", "dev/ndcg@10:paired_significant"]) is False


def test_a_study_declares_its_rounds_and_margin_and_keeps_its_hash_without_them(tmp_path):
    """until_decided needs max seeds of at least 4 and above its seeds; max seeds alone and a
    margin outside (0, 1) are refused naming the field; a study without them hashes as before."""
    base = tiny_trial()
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    study = Study(name="s", factor="masking.ratio", arms=arms, seeds=(0, 1), budget=tiny_budget())
    assert "until_decided" not in study.to_dict() and "equivalence_margin" not in study.to_dict()
    decided = replace(study, until_decided=True, max_seeds=8, equivalence_margin=0.01)
    assert decided.hash != study.hash and Study.from_dict(decided.to_dict()) == decided
    for bad, field in (({"until_decided": True, "max_seeds": 2}, "study.max_seeds"),
                       ({"until_decided": True}, "study.max_seeds"), ({"max_seeds": 8}, "study.max_seeds"),
                       ({"equivalence_margin": 0.0}, "study.equivalence_margin")):
        with pytest.raises(ConfigError, match=field):
            replace(study, **bad)
    assert with_seeds(study, 4).seeds == (0, 1, 2, 3)


def test_the_command_prints_the_sequential_tables(capsys):
    """`embedlab stats calibrate` prints the sequential false-positive rates, the equivalence
    error at the margin and the seeds against fixed designs of equal power."""
    assert main(["stats", "calibrate", "--studies", "100", "--bootstrap-studies", "0"]) == 0
    out = capsys.readouterr().out
    assert "| looks at seeds | seed×arm SD | queries | query / noise SD | false-positive rate | expected seeds |" in out
    assert out.count("\n| 2, 4, 6, 8 |") == 16 + 32 and out.count("\n| 3, 5, 8 |") == 16
    assert "| setting | seed×arm SD" in out and out.count("\n| realistic |") == len(calibration.SEEDS_EFFECTS)


def test_the_dry_run_prints_the_design_and_the_command_line_refuses_what_does_not_fit(capsys):
    """`--dry-run --until-decided` prints the rounds, seed order, weights and each look's
    boundary (and the margin); --max-seeds alone and --until-decided with --ladder are refused."""
    study = "ablations/masking_ratio.py"
    assert main(["sweep", study, "--profile", "demo", "--dry-run", "--until-decided", "--max-seeds", "6",
                 "--equivalence-margin", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "until decided: rounds at 2, 4, 6 seeds (max 6), seed order 0, 1, 2, 3, 4, 5" in out
    assert "weights 0, 0.296, 0.704" in out and "no test, " in out and "equivalence margin: ±0.01" in out
    assert main(["sweep", study, "--profile", "demo", "--dry-run", "--max-seeds", "6"]) == 2
    assert "--max-seeds: only with --until-decided" in capsys.readouterr().err
    assert main(["sweep", study, "--profile", "demo", "--until-decided", "--ladder", "0.5,1"]) == 2
    assert "does not take --until-decided" in capsys.readouterr().err
