"""Arm comparisons of a run directory: confidence intervals and paired differences against
scipy, the equal-compute refusal (between trials and against the declared budget), the
compute-match and tuning lines, and every rendering; synthetic run directories, no Ray."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from embedlab.stats.table import (
    NO_TRIALS, UnequalComputeError, budget_unit, check_equal_compute, compute_match_line, format_table, load_table,
    render, summarize, tuning_line,
)

ARMS = ("base", "wide", "deep")
METRICS = ("dev/ndcg@10", "dev/recall@100", "train/loss", "retention/probe_accuracy", "budget/tokens")
SEEDS = (0, 1, 2, 3, 4)
MISSING_SEED = ("deep", 2)  # one arm lacks one seed, so pairing must go by seed, not by position


def write_run(root: Path, rows: list[dict], **study) -> Path:
    """A run directory with a study record and one trial file per row."""
    run_dir = root / "run"
    (run_dir / "trials").mkdir(parents=True)
    record = {
        "study": {
            "name": "toy-width", "factor": "model.width", "arms": {arm: {"phase": 1} for arm in ARMS},
            "seeds": list(SEEDS), "budget_tokens": 1000, "budget_pairs": 0, "metric": "dev/ndcg@10",
            "description": "synthetic", "disclosed_overlap": None, **study,
        },
        "arm_order": list(ARMS), "parent": None, "final_eval_overlap": [],
    }
    (run_dir / "study.json").write_text(json.dumps(record))
    for row in rows:
        (run_dir / "trials" / f"{row['trial_id']}.json").write_text(json.dumps(row))
    return run_dir


def trial_row(rng: np.random.Generator, trial_id: str, arm: str, seed: int) -> dict:
    """A finished final trial with random metrics; the seed shifts every arm alike."""
    return {
        "trial_id": trial_id, "arm": arm, "seed": seed, "status": "finished", "stage": "final",
        "factor": "model.width", "factor_value": ARMS.index(arm), "phase": 1,
        "config_hash": "c" * 8, "parent": None, "parent_hash": None,
        "budget/tokens": 1000 + int(rng.integers(0, 9)), "budget/flops": 1e12 * (1 + rng.uniform(0, 0.005)),
        "compute/wall_seconds": rng.uniform(10, 20), "compute/device_seconds": rng.uniform(5, 10),
        "train/loss": rng.uniform(2, 3), "dev/ndcg@10": 0.1 * seed + rng.uniform(0, 0.05),
        "dev/recall@100": rng.uniform(0.4, 0.6), "dev/mrr@10": rng.uniform(0.1, 0.3),
        "dev/map": rng.uniform(0.1, 0.3), "retention/probe_accuracy": rng.uniform(0.5, 0.7),
        "retention/similarity_spearman": rng.uniform(0.3, 0.5), "retention/mlm_accuracy": rng.uniform(0, 0.1),
        "checkpoint": f"/ckpt/{trial_id}", "checkpoint_hash": "h" * 8,
    }


def old_format(row: dict) -> dict:
    """The same trial as an older writer recorded it: no stage, no device seconds, a flops estimate."""
    row = {k: v for k, v in row.items() if k not in ("stage", "compute/device_seconds", "budget/flops")}
    return {**row, "budget/flops_estimate": 1e12}


def synthetic_rows(seed: int = 0) -> list[dict]:
    """3 arms x up to 5 seeds (deep lacks seed 2) in shuffled trial-id order, one old-format row,
    one failed and one tuning trial whose values would distort any statistic they entered."""
    rng = np.random.default_rng(seed)
    pairs = [(arm, s) for arm in ARMS for s in SEEDS if (arm, s) != MISSING_SEED]
    ids = rng.permutation(len(pairs))  # file order (sorted trial ids) unrelated to arm and seed
    rows = [trial_row(rng, f"t{ids[i]:03d}", arm, s) for i, (arm, s) in enumerate(pairs)]
    rows[4] = old_format(rows[4])
    rows.append({"trial_id": "failed0", "arm": "wide", "seed": 5, "status": "failed", "stage": "final",
                 "budget/tokens": 17})
    tune = trial_row(rng, "tune0", "base", 9)
    rows.append({**tune, "stage": "tune", "budget/tokens": 10, "dev/ndcg@10": 100.0})
    return rows


def finished(rows: list[dict], arm: str) -> dict[int, dict]:
    return {r["seed"]: r for r in rows
            if r["arm"] == arm and r["status"] == "finished" and r.get("stage", "final") == "final"}


@pytest.fixture
def run(tmp_path):
    rows = synthetic_rows()
    return write_run(tmp_path, rows), rows


def test_confidence_intervals_match_scipy(run):
    """Each arm's mean and 95% half-width equal scipy's Student's t interval over its seeds."""
    run_dir, rows = run
    summary = summarize(load_table(run_dir), METRICS).set_index("arm")
    assert list(summary.index) == list(ARMS)
    for arm in ARMS:
        trials = finished(rows, arm)
        assert summary.loc[arm, "seeds"] == len(trials)
        for metric in METRICS:
            values = np.array([trials[s][metric] for s in sorted(trials)], dtype=float)
            low, high = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
            np.testing.assert_allclose(summary.loc[arm, f"{metric}:mean"], values.mean(), rtol=1e-12)
            np.testing.assert_allclose(summary.loc[arm, f"{metric}:ci95"], (high - low) / 2, rtol=1e-12)


def test_paired_differences_match_ttest_rel_over_shared_seeds(run):
    """Differences from the control pair rows by seed (only seeds both arms finished), as ttest_rel does."""
    run_dir, rows = run
    summary = summarize(load_table(run_dir), METRICS).set_index("arm")
    control = finished(rows, "base")
    assert summary.loc["base", "control"] and np.isnan(summary.loc["base", "dev/ndcg@10:diff"])
    for arm in ("wide", "deep"):
        trials = finished(rows, arm)
        seeds = sorted(set(trials) & set(control))
        assert summary.loc[arm, "paired_seeds"] == len(seeds) == (4 if arm == "deep" else 5)
        for metric in METRICS:
            ours = np.array([trials[s][metric] for s in seeds], dtype=float)
            theirs = np.array([control[s][metric] for s in seeds], dtype=float)
            low, high = stats.ttest_rel(ours, theirs).confidence_interval(0.95)
            np.testing.assert_allclose(summary.loc[arm, f"{metric}:diff"], (ours - theirs).mean(), rtol=1e-12)
            np.testing.assert_allclose(summary.loc[arm, f"{metric}:diff_ci95"], (high - low) / 2, rtol=1e-12)


def test_pairing_ignores_row_order_and_follows_the_control(run):
    """Shuffled rows give the same summary, and a different control flips the sign of its difference."""
    run_dir, _ = run
    table = load_table(run_dir)
    summary = summarize(table)
    shuffled = table.sample(frac=1, random_state=3)
    pd.testing.assert_frame_equal(summarize(shuffled, arm_order=ARMS), summary, rtol=1e-12)
    against_wide = summarize(table, ["dev/ndcg@10"], control="wide").set_index("arm")
    assert np.isnan(against_wide.loc["wide", "dev/ndcg@10:diff"])
    np.testing.assert_allclose(against_wide.loc["base", "dev/ndcg@10:diff"],
                               -summary.set_index("arm").loc["wide", "dev/ndcg@10:diff"], rtol=1e-12)
    with pytest.raises(ValueError, match="no arm 'narrow'"):
        summarize(table, control="narrow")


def test_failed_and_tuning_trials_are_excluded(run):
    """A failed and a tuning trial are listed but neither counts nor moves a statistic."""
    run_dir, rows = run
    table = load_table(run_dir)
    assert len(table) == len(rows)
    summary = summarize(table, ["dev/ndcg@10"]).set_index("arm")
    assert summary["seeds"].to_dict() == {"base": 5, "wide": 5, "deep": 4}
    assert summary.loc["base", "dev/ndcg@10:mean"] < 1  # the tuning trial's 100.0 stayed out
    text = render(run_dir)
    assert "excluded from statistics: 1 failed, 1 tune" in text and "failed0" in text


def test_unequal_compute_is_refused_beyond_tolerance(tmp_path):
    """Within 1% the check passes; beyond it, it raises naming the unit and both extreme trials."""
    rng = np.random.default_rng(1)
    rows = [trial_row(rng, f"{arm}-{s}", arm, s) for arm in ARMS for s in (0, 1, 2)]
    for row in rows:
        row["budget/tokens"] = 1000
    rows[4]["budget/tokens"] = 1005
    table = pd.DataFrame(rows)
    assert check_equal_compute(table, "tokens") == pytest.approx(0.005)
    rows[4]["budget/tokens"] = 1020
    run_dir = write_run(tmp_path, rows)
    with pytest.raises(UnequalComputeError) as refused:
        check_equal_compute(pd.DataFrame(rows), "tokens")
    message = str(refused.value)
    assert "tokens" in message and "2.00%" in message and "refused" in message
    assert "arm wide seed 1 (trial wide-1)" in message and "(trial base-0)" in message
    for fmt in ("text", "csv", "markdown", "json"):
        with pytest.raises(UnequalComputeError):
            render(run_dir, fmt)


def test_compute_unit_columns_and_old_rows(run):
    """Flops fall back to an old row's estimate; a unit whose column is absent is refused by name."""
    run_dir, rows = run
    table = load_table(run_dir)
    assert check_equal_compute(table, "flops") < 0.01
    with pytest.raises(UnequalComputeError, match="no budget/pairs column"):
        check_equal_compute(table, "pairs")
    with pytest.raises(ValueError, match="tokens, pairs, flops, device_seconds"):
        check_equal_compute(table, "steps")
    old = next(r for r in rows if "budget/flops_estimate" in r)
    table.loc[table["trial_id"] == old["trial_id"], "budget/flops_estimate"] = 1.05e12
    with pytest.raises(UnequalComputeError, match=f"trial {old['trial_id']}"):
        check_equal_compute(table, "flops")


def test_budget_unit_of_new_and_old_studies():
    """A declared unit is used; without one, phase 1 holds tokens and phases 2-3 hold pairs."""
    phase = {"arms": {"a": {"phase": 2}}, "budget_pairs": 500}
    assert budget_unit({"study": {"arms": {"a": {"phase": 1}}, "budget_pairs": 0}}) == "tokens"
    assert budget_unit({"study": {"arms": {"a": {}}}}) == "tokens"
    assert budget_unit({"study": phase}) == "pairs"
    assert budget_unit({"study": {**phase, "budget_unit": "flops"}}) == "flops"
    with pytest.raises(ValueError, match="budget_unit: 'steps'"):
        budget_unit({"study": {**phase, "budget_unit": "steps"}})


def test_every_format_renders_and_parses_back(tmp_path):
    """text and markdown show both tables; csv and json parse back with every arm in order."""
    run_dir = write_run(tmp_path, synthetic_rows(), disclosed_overlap="reported, not removed")
    text = render(run_dir, "text")
    assert "1,000 tokens per trial" in text and "Student's t" in text and "(control)" in text
    assert "disclosed overlap (0 final-eval items in training data): reported, not removed" in text
    assert max(len(line) for line in text.splitlines()) < 200
    markdown = render(run_dir, "markdown")
    assert "| arm | seeds | dev/ndcg@10 |" in markdown and "| --- |" in markdown
    csv = pd.read_csv(io.StringIO(render(run_dir, "csv")), comment="#")
    assert list(csv["arm"]) == list(ARMS) and list(csv["control"]) == [True, False, False]
    assert {"dev/ndcg@10:mean", "dev/ndcg@10:ci95", "dev/ndcg@10:diff", "dev/ndcg@10:diff_ci95"} <= set(csv)
    parsed = json.loads(render(run_dir, "json"))
    assert parsed["study"] == "toy-width" and parsed["unit"] == "tokens" and parsed["control"] == "base"
    assert [a["arm"] for a in parsed["arms"]] == list(ARMS)
    assert parsed["arms"][0]["dev/ndcg@10:diff"] is None
    assert len(parsed["trials"]) == len(synthetic_rows())
    with pytest.raises(ValueError, match="text, csv, markdown, json"):
        render(run_dir, "html")


def test_render_with_chosen_metrics(run):
    """A chosen metric list replaces the key columns; an unknown metric is named in the error."""
    run_dir, _ = run
    assert "dev/mrr@10" in render(run_dir, metrics=["dev/mrr@10"])
    with pytest.raises(ValueError, match="dev/ndcg@1000"):
        render(run_dir, metrics=["dev/ndcg@1000"])


def test_empty_run_directory(tmp_path):
    """A run without finished trials renders every format without a comparison."""
    run_dir = write_run(tmp_path, [])
    assert NO_TRIALS in render(run_dir, "text") and NO_TRIALS in render(run_dir, "markdown")
    assert [a["seeds"] for a in json.loads(render(run_dir, "json"))["arms"]] == [0, 0, 0]
    assert list(pd.read_csv(io.StringIO(render(run_dir, "csv")), comment="#")["arm"]) == list(ARMS)
    assert format_table(load_table(run_dir), run_dir) == NO_TRIALS


def test_single_seed_has_no_interval(tmp_path):
    """With one seed per arm the mean is shown and the half-width is NaN, not zero."""
    rng = np.random.default_rng(2)
    run_dir = write_run(tmp_path, [trial_row(rng, arm, arm, 0) for arm in ARMS])
    summary = summarize(load_table(run_dir), ["dev/ndcg@10"])
    assert summary["dev/ndcg@10:mean"].notna().all() and summary["dev/ndcg@10:ci95"].isna().all()
    assert "± n/a" in render(run_dir)


def test_consumption_must_match_the_declared_budget(tmp_path):
    """Equal trials 1.5% over (or under) the declared budget are refused naming the trial, the
    overshoot included; exactly 1% passes; a record without a budget in its unit skips the rule;
    summarize refuses too unless told not to check."""
    rng = np.random.default_rng(4)
    rows = [trial_row(rng, f"{arm}-{s}", arm, s) for arm in ARMS for s in (0, 1)]
    for used, worst, refused in ((1015, 1016, "+1.60%"), (985, 984, "-1.60%"), (1010, 1010, None),
                                 (990, 990, None)):
        for row in rows:
            row["budget/tokens"] = used
        rows[3]["budget/tokens"] = worst  # wide seed 1: named first, as the furthest off
        run_dir = write_run(tmp_path / str(used), rows)
        table = load_table(run_dir)
        assert table.attrs["budget"] == 1000
        if refused is None:  # exactly 1% over or under: within the tolerance
            assert check_equal_compute(table, "tokens") == 0
            continue
        with pytest.raises(UnequalComputeError) as error:
            check_equal_compute(table, "tokens")
        message = str(error.value)
        assert "declared budget of 1,000 tokens" in message and "overshoot" in message and refused in message
        assert message.index("(trial wide-1)") < message.index("(trial base-0)")
        with pytest.raises(UnequalComputeError):
            summarize(table)
        assert len(summarize(table, check_compute=False)) == len(ARMS)
        for fmt in ("text", "json"):
            with pytest.raises(UnequalComputeError, match="declared budget"):
                render(run_dir, fmt)
    for row in rows:
        row["budget/pairs"] = 70
    unbudgeted = load_table(write_run(tmp_path / "pairs", rows, budget_unit="pairs", budget_pairs=0))
    assert unbudgeted.attrs["budget"] is None and check_equal_compute(unbudgeted, "pairs") == 0


def test_summarize_refuses_a_table_that_does_not_say_its_unit(run):
    """A hand-built table cannot be compared silently: naming check_compute=False is the way."""
    _, rows = run
    table = pd.DataFrame(rows)
    with pytest.raises(ValueError, match="check_compute=False"):
        summarize(table, ["dev/ndcg@10"])
    unchecked = summarize(table, ["dev/ndcg@10"], arm_order=ARMS, check_compute=False).set_index("arm")
    assert unchecked["seeds"].to_dict() == {"base": 5, "wide": 5, "deep": 4}


def _flops_rows(flops: dict[str, float]) -> list[dict]:
    rng = np.random.default_rng(6)
    rows = [trial_row(rng, f"{arm}-{s}", arm, s) for arm in ARMS for s in (0, 1)]
    for row in rows:
        row["budget/tokens"], row["budget/flops"] = 1000, flops[row["arm"]] * (1 + 0.001 * row["seed"])
    return rows


def test_data_matched_arms_say_how_far_their_flops_differ(tmp_path):
    """At a data budget every arm over 1% from the control's mean FLOPs is named, signed, in one
    line of every format; within 1% none is; a FLOPs or device-time study says what it matched."""
    rows = _flops_rows({"base": 1e12, "wide": 1.432e12, "deep": 0.995e12})
    run_dir = write_run(tmp_path / "data", rows)
    line = "data-matched (equal tokens per trial); FLOPs differ from control base by +43.2% in wide"
    assert compute_match_line(load_table(run_dir)) == line
    for fmt in ("text", "markdown", "csv"):
        assert [text for text in render(run_dir, fmt).splitlines() if "data-matched" in text] == \
            [line if fmt != "csv" else f"# {line}"]
    assert json.loads(render(run_dir, "json"))["compute_match"] == line
    rows = _flops_rows({"base": 1e12, "wide": 0.9e12, "deep": 1.2e12})
    assert compute_match_line(load_table(write_run(tmp_path / "two", rows))).endswith(
        "by -10.0% in wide, +20.0% in deep")
    rows = _flops_rows({"base": 1e12, "wide": 1.004e12, "deep": 0.997e12})
    assert compute_match_line(load_table(write_run(tmp_path / "close", rows))) == (
        "data-matched (equal tokens per trial); FLOPs within 1% of control base in every arm")
    flops = load_table(write_run(tmp_path / "flops", rows, budget_unit="flops", budget_flops=1e12))
    assert compute_match_line(flops) == "compute-matched: equal measured training FLOPs (within 1%)"
    assert check_equal_compute(flops, "flops") < 0.01
    for row in rows:
        row["compute/device_seconds"] = 60.0 + 0.1 * row["seed"]
    timed_dir = write_run(tmp_path / "time", rows, budget_unit="device_seconds", budget_device_seconds=60.0)
    timed = load_table(timed_dir)
    assert timed.attrs["unit"] == "device_seconds" and timed.attrs["budget"] == 60.0
    assert compute_match_line(timed).startswith("device-time-matched: equal device seconds per trial (within 1%)")
    assert "60.0 device seconds per trial" in render(timed_dir)
    for row in rows:
        row["compute/device_seconds"] = 60.7  # equal to each other, +1.17% over the declared 60 s
    with pytest.raises(UnequalComputeError, match=r"trial base-0\) consumed 60.70 \(\+1.17%\)"):
        check_equal_compute(load_table(write_run(tmp_path / "late", rows, budget_unit="device_seconds",
                                                 budget_device_seconds=60.0)), "device_seconds")
    for row in rows:
        del row["budget/flops"]
    assert compute_match_line(load_table(write_run(tmp_path / "none", rows))).endswith(
        "training FLOPs not recorded, so compute per trial may differ")


TUNING = {"sampler": "TPESampler(n_startup_trials=3, seed=10000)", "trials_per_arm": 4, "seeds": [10000, 10001],
          "failed": {"wide": [{"trial_id": "tw1", "status": "nonfinite", "error": "8 steps non-finite"},
                              {"trial_id": "tw2", "status": "failed", "error": "OOM"}]}}


def test_tuning_line_and_tuning_trials_without_metrics(tmp_path):
    """A study that tuned prints sampler, trials per arm, its seeds (disjoint from the study's)
    and failures per arm once in every format; failed and non-finite tuning rows with no metric
    load, render and stay out of every statistic."""
    rows = synthetic_rows()
    rows += [{"trial_id": "tw1", "arm": "wide", "seed": 10000, "stage": "tune", "status": "nonfinite",
              "error": "8 steps non-finite", "param/train.learning_rate": 0.01},
             {"trial_id": "tw2", "arm": "wide", "seed": 10001, "stage": "tune", "status": "failed", "error": "OOM"}]
    run_dir = write_run(tmp_path, rows)
    record = json.loads((run_dir / "study.json").read_text())
    (run_dir / "study.json").write_text(json.dumps({**record, "tuning": TUNING}))
    table = load_table(run_dir)
    line = ("tuning: TPESampler(n_startup_trials=3, seed=10000), 4 trials per arm at tuning seeds 10000, 10001 "
            "(disjoint from the study seeds); failed tuning trials: base 0; wide 2 (1 nonfinite, 1 failed); deep 0")
    assert tuning_line(table) == line
    assert summarize(table, ["dev/ndcg@10"]).set_index("arm")["seeds"].to_dict() == {"base": 5, "wide": 5, "deep": 4}
    text = render(run_dir)
    assert text.count(line) == 1 and "excluded from statistics: 1 failed, 3 tune (1 failed, 1 nonfinite)" in text and "tw2" in text
    assert render(run_dir, "markdown").count(line) == 1 and render(run_dir, "csv").count(f"# {line}\n") == 1
    assert json.loads(render(run_dir, "json"))["tuning"] == line
    clash = {**TUNING, "seeds": [3, 10001]}
    (run_dir / "study.json").write_text(json.dumps({**record, "tuning": clash}))
    assert "(NOT disjoint from the study seeds: 3 also reported)" in tuning_line(load_table(run_dir))
    (run_dir / "study.json").write_text(json.dumps(record))
    assert tuning_line(load_table(run_dir)) == "" and "tuning:" not in render(run_dir)


def test_total_compute_adds_what_trials_spent_outside_the_budget(tmp_path):
    """Mining and a teacher's labels are outside the training budget: `compute/total_flops` is each
    row's training FLOPs plus them (a row without one adds nothing), every format says how it
    is made, and a table of distilling trials carries the teacher's disclosure."""
    from embedlab.stats.table import TOTAL_COMPUTE, compute_outside_line
    from embedlab.teacher.labels import DISCLOSURE

    rows = _flops_rows({"base": 1e12, "wide": 1e12, "deep": 1e12})
    for row in rows:
        if row["arm"] != "base":
            row["compute/mining_flops"] = 3e11 + row["seed"]
        if row["arm"] == "deep":
            row["compute/teacher_flops"] = 2e11
    run_dir = write_run(tmp_path, rows, budget_unit="flops", budget_flops=1e12)
    table = load_table(run_dir)
    want = [r["budget/flops"] + r.get("compute/mining_flops", 0) + r.get("compute/teacher_flops", 0) for r in rows]
    by_trial = dict(zip(table["trial_id"], table[TOTAL_COMPUTE]))
    assert [by_trial[r["trial_id"]] for r in rows] == want
    line = compute_outside_line(table)
    assert line.startswith(f"{TOTAL_COMPUTE} = training FLOPs (the budget) + mining, teacher labels, outside")
    text = render(run_dir)
    assert line in text and DISCLOSURE in text and TOTAL_COMPUTE in text.split("\n\n")[1].splitlines()[0]
    parsed = json.loads(render(run_dir, "json"))
    assert parsed["compute_outside"] == line and parsed["teacher"] == DISCLOSURE
    plain = load_table(write_run(tmp_path / "plain", _flops_rows({"base": 1e12, "wide": 1e12, "deep": 1e12}),
                                 budget_unit="flops", budget_flops=1e12))
    assert TOTAL_COMPUTE not in plain and compute_outside_line(plain) == ""
    for row in rows:  # a teacher that scored candidates and encoded documents: both named
        if row["arm"] == "deep":
            row.update({"data/teacher_pairs": 40, "data/teacher_embedding_texts": 40})
    both = load_table(write_run(tmp_path / "both", rows, budget_unit="flops", budget_flops=1e12))
    assert "mining, teacher labels and documents, outside" in compute_outside_line(both)


def test_what_the_teacher_made_is_read_from_the_study_arms(tmp_path):
    """A run's rows need not carry the teacher's counts (records written before rows kept
    them): the arms' configs say what the teacher made, so a study that distils only
    embeddings says "teacher documents" and discloses vectors, not judgments; KL or MarginMSE
    arms say labels; a study with both names both, as does one whose rows count labels its
    arms' configs do not declare (a tuned weight)."""
    from embedlab.stats.table import VECTORS_DISCLOSURE, compute_outside_line, teacher_line
    from embedlab.teacher.labels import DISCLOSURE

    rows = _flops_rows({"base": 1e12, "wide": 1e12, "deep": 1e12})
    for row in rows:
        if row["arm"] != "base":
            row["compute/teacher_flops"] = 2e11
    cases = {
        "embedding": ({"wide": {"embedding_mse_weight": 0.5}}, "+ teacher documents, outside", VECTORS_DISCLOSURE),
        "margin": ({"wide": {"margin_mse_weight": 1.0}}, "+ teacher labels, outside", DISCLOSURE),
        "both": ({"wide": {"kl_weight": 0.5}, "deep": {"embedding_mse_weight": 0.5, "margin_mse_weight": None}},
                 "+ teacher labels and documents, outside", DISCLOSURE),
        # a weight the study tuned is in the rows, not in the arms' configs: the counts add it
        "tuned": ({"wide": {"embedding_mse_weight": 0.5}}, "+ teacher labels and documents, outside", DISCLOSURE),
    }
    for name, (weights, phrase, disclosure) in cases.items():
        for row in rows:
            row.pop("data/teacher_pairs", None)
            if name == "tuned" and row["arm"] == "wide":
                row["data/teacher_pairs"] = 40
        arms = {arm: {"phase": 3, "contrastive": {"teacher": "all-MiniLM-L6-v2", "kl_weight": 0.0,
                                                  "margin_mse_weight": 0.0, "embedding_mse_weight": 0.0,
                                                  **weights.get(arm, {})}} for arm in ARMS}
        table = load_table(write_run(tmp_path / name, rows, arms=arms, budget_unit="flops", budget_flops=1e12))
        assert phrase in compute_outside_line(table), name
        assert teacher_line(table) == disclosure, name
        assert disclosure in render(tmp_path / name / "run"), name


def test_a_trial_row_keeps_the_teacher_counts_beside_budget_and_compute():
    """The row `run_trial` writes keeps every budget and compute figure, the observed shares and
    the teacher's counts, and of the other training metrics only those the row names itself."""
    from embedlab.sweep.driver import kept_training_figures, trial_row

    train = {"budget/flops": 1e12, "compute/teacher_flops": 2e11, "data/observed_pair_share/a": 0.5,
             "data/teacher_pairs": 40, "data/teacher_pairs_without_negatives": 3, "data/teacher_embedding_texts": 40,
             "data/packing_efficiency": 0.9, "train/loss": 1.0, "train/step": 10, "train/skipped_steps": 0,
             "train/contrastive_loss": 0.8, "eval/seconds": 2.0}
    kept = ("budget/flops", "compute/teacher_flops", "data/observed_pair_share/a", "data/teacher_pairs",
            "data/teacher_pairs_without_negatives", "data/teacher_embedding_texts")
    assert kept_training_figures(train) == {k: train[k] for k in kept}
    row = trial_row({"arm": "a", "seed": 0}, train, {"a": 1.0}, {"dev/ndcg@10": 0.5}, checkpoint="ckpt",
                    checkpoint_hash="h", data_revision="rev")
    assert row == {"arm": "a", "seed": 0, **{k: train[k] for k in kept}, "data/intended_share/a": 1.0,
                   "train/loss": 1.0, "train/contrastive_loss": 0.8, "train/steps": 10, "train/skipped_steps": 0,
                   "dev/ndcg@10": 0.5,
                   "checkpoint": "ckpt", "checkpoint_hash": "h", "data_revision": "rev", "status": "finished"}


def test_a_search_read_by_many_trials_is_counted_once_and_the_rates_are_shown_per_arm(tmp_path):
    """Mined arms that read one stored search each record its whole cost; the table's mining
    line sums it once (not once per trial), says how many trials made or reused it, and the
    false-negative rates are columns of the table per arm with the judge's disclosure; the row
    keeps the search, the built flag, the drops and the rates."""
    from embedlab.stats.table import FALSE_NEGATIVE_DISCLOSURE, mining_cost, mining_line
    from embedlab.sweep.driver import kept_training_figures

    rows = _flops_rows({"base": 1e12, "wide": 1e12, "deep": 1e12})
    for row in rows:
        if row["arm"] != "base":
            made = row["arm"] == "wide" and row["seed"] == 0
            row.update({"compute/mining_flops": 3e11, "compute/mining_seconds": 40.0, "data/mining_candidates": "s1",
                        "compute/mining_built": float(made), "data/negatives_dropped/false-negative-margin": 7.0,
                        "data/false_negative_rate/teacher": 0.25 if row["arm"] == "wide" else 0.1,
                        "data/false_negative_rate/same_group": 0.05})
    run_dir = write_run(tmp_path, rows, budget_unit="flops", budget_flops=1e12)
    table = load_table(run_dir)
    mined = sum(row["arm"] != "base" for row in rows)
    cost = mining_cost(table)
    assert {key: cost[key] for key in ("searches", "trials", "built", "flops", "seconds")} == {
        "searches": 1, "trials": mined, "built": 1, "flops": 3e11, "seconds": 40.0}
    line = mining_line(table)
    assert line.startswith(f"mining: 1 search(es) read by {mined} trials (1 made here, the rest reused), 3e+11")
    text = render(run_dir)
    assert line in text and FALSE_NEGATIVE_DISCLOSURE in text
    header = text.split("\n\n")[1].splitlines()[0]
    assert "data/false_negative_rate/teacher" in header and "data/false_negative_rate/same_group" in header
    parsed = json.loads(render(run_dir, "json"))
    assert parsed["mining"]["flops"] == 3e11 and parsed["mining"]["searches"] == 1
    wide = next(arm for arm in parsed["arms"] if arm["arm"] == "wide")
    assert wide["data/false_negative_rate/teacher:mean"] == pytest.approx(0.25)
    train = {key: rows[-1][key] for key in rows[-1] if key.startswith(("compute/mining", "data/"))}
    assert kept_training_figures(train) == train
