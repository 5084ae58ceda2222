"""Evaluation panels wired in: `EvalConfig.tasks` / `hub_tasks`, a trial scored on every task of a
panel, the study metric naming a task or the mean, the stratified paired bootstrap of a panel
mean, promotion's final eval on the same task(s), and the contamination pre-flight over every
task. In process and without Ray; the tasks are real text (standard-library docstrings, as in
test_hub_tasks), scored by BM25 or a checkpoint's evaluator stand-in."""

from __future__ import annotations

import dataclasses
import inspect
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from embedlab.core.beir import Task, write_task
from embedlab.core.config import ConfigError, DEFAULT_BUDGET, EvalConfig, TrialConfig, build_config
from embedlab.tasks.hub_tasks import HubTask, derive_dev_split, local_dataset_revision

from test_hub_tasks import docstring_records, docstring_task, write_hub_directory

PANEL_TOML = """\
task = "python-docstrings"
tasks = ["{beir}"]
split = "dev"

[[hub_tasks]]
name = "shell-utils"
dataset = "{hub}"
revision = "{revision}"
dev_fraction = 0.3
splits = ["train", "test"]
"""


@pytest.fixture(scope="module")
def shell_task() -> Task:
    return docstring_task("shell-utils", docstring_records(shutil, textwrap))


@pytest.fixture(scope="module")
def data_task() -> Task:
    return derive_dev_split(docstring_task("data-formats", docstring_records(json, inspect)), 0.3, seed=0)[0]


# ---------------------------------------------------------------------------------------------
# Config


def test_panel_config_round_trips_through_toml_and_json(tmp_path, shell_task, data_task):
    """A panel written as TOML builds the EvalConfig written by hand; its JSON (`to_dict`) builds it
    again, inside a TrialConfig too; the default config has no panel and its dict is unchanged."""
    beir = tmp_path / "data-formats"
    write_task(data_task, beir)
    hub = write_hub_directory(tmp_path / "hub", shell_task)
    path = tmp_path / "eval.toml"
    path.write_text(PANEL_TOML.format(beir=beir, hub=hub, revision=local_dataset_revision(hub)), encoding="utf-8")

    built = EvalConfig.from_file(path)

    spec = HubTask(name="shell-utils", dataset=str(hub), revision=local_dataset_revision(hub), dev_fraction=0.3,
                   splits=("train", "test"))
    assert built == EvalConfig(tasks=(str(beir),), hub_tasks=(spec,))
    assert built.panel and built.task_names == ("python-docstrings", "data-formats", "shell-utils")
    as_json = json.loads(json.dumps(dataclasses.asdict(built)))
    assert build_config(EvalConfig, as_json, "eval") == built
    trial = dataclasses.replace(TrialConfig(), eval=built)
    assert TrialConfig.from_dict(json.loads(trial.to_json())) == trial
    (tmp_path / "eval.json").write_text(json.dumps(as_json), encoding="utf-8")
    assert EvalConfig.from_file(tmp_path / "eval.json") == built

    default = EvalConfig()
    assert not default.panel and default.task_names == ("python-docstrings",)
    assert set(dataclasses.asdict(default)) == {"task", "tasks", "hub_tasks", "split", "batch_size", "max_length",
                                                "index", "dims"}


def test_panel_task_names_must_be_distinct_and_usable(tmp_path):
    """Names repeat (a directory named like the main task), or cannot prefix columns: refused naming them;
    a Hub task missing its revision names the missing key."""
    clash = tmp_path / "python-docstrings"
    clash.mkdir()
    with pytest.raises(ConfigError, match="eval.tasks: task names repeat in the panel: python-docstrings"):
        EvalConfig(tasks=(str(clash),))
    with pytest.raises(ConfigError, match="cannot name panel columns"):
        EvalConfig(hub_tasks=(HubTask(name="mean", dataset="mteb/scifact", revision="v1"),))
    with pytest.raises(ConfigError, match=r"eval.hub_tasks\[0\]: missing required keys \['revision'\]"):
        build_config(EvalConfig, {"hub_tasks": [{"name": "scifact", "dataset": "mteb/scifact"}]}, "eval")


# ---------------------------------------------------------------------------------------------
# A trial scored on a panel


@pytest.fixture(scope="module")
def panel_dirs(tmp_path_factory, shell_task, data_task) -> list[tuple[str, str]]:
    """Two BEIR folders with dev and test qrels: the main task (shell-utils) and data-formats."""
    root = tmp_path_factory.mktemp("panel")
    main = derive_dev_split(shell_task, 0.3, seed=1)[0]
    write_task(main, root / "shell-utils")
    write_task(data_task, root / "data-formats")
    return [("shell-utils", str(root / "shell-utils")), ("data-formats", str(root / "data-formats"))]


def checkpoint_evaluator(checkpoint: Path, split: str = "dev"):
    """`evaluate(task directory, retention directory)` as the sweep's evaluator answers it, in process."""
    from embedlab.core.beir import load_task
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint

    calls: list[tuple[str, str | None]] = []

    def evaluate(task_dir: str, retention_dir: str | None) -> dict:
        calls.append((task_dir, retention_dir))
        return evaluate_checkpoint(checkpoint, load_task(task_dir), split,
                                   retention_dir=None if retention_dir is None else Path(retention_dir))

    return evaluate, calls


def test_panel_scores_equal_single_task_evaluations_and_the_mean_is_the_hand_mean(parent, panel_dirs):
    """Scored on a panel, a trial's `<task>/dev/...` columns equal the plain columns a single-task
    trial on that task writes, exactly; the main task keeps its plain columns; `mean/dev/...` is
    the hand mean of the two; per-query values are keyed like the columns; the cost is summed."""
    from embedlab.records.scores import score_trial

    evaluate, calls = checkpoint_evaluator(parent)
    panel = score_trial(evaluate, panel_dirs, "dev", None)
    singles = {name: score_trial(evaluate, [(name, directory)], "dev", None) for name, directory in panel_dirs}

    assert calls[:2] == [(panel_dirs[0][1], None), (panel_dirs[1][1], None)]  # the main task is scored once
    assert panel.tasks == ("shell-utils", "data-formats")
    main = singles["shell-utils"].columns
    assert {k: v for k, v in panel.columns.items() if k in main and not k.startswith(("eval/seconds", "compute/"))} \
        == {k: v for k, v in main.items() if not k.startswith(("eval/seconds", "compute/"))}
    for name, single in singles.items():
        plain = {k: v for k, v in single.columns.items() if k.startswith("dev/")}
        assert {k.removeprefix(f"{name}/"): v for k, v in panel.columns.items() if k.startswith(f"{name}/dev/")} \
            == plain
        assert panel.columns[f"{name}/eval/task_hash"] == single.main["task_hash"]
        assert {k.removeprefix(f"{name}/"): v for k, v in panel.per_query.items() if k.startswith(f"{name}/")} \
            == single.per_query
    for metric in ("ndcg@10", "recall@100", "mrr@10", "map"):
        first, second = (singles[name].columns[f"dev/{metric}"] for name, _ in panel_dirs)
        assert panel.columns[f"mean/dev/{metric}"] == (first + second) / 2
    assert singles["shell-utils"].columns["dev/ndcg@10"] != singles["data-formats"].columns["dev/ndcg@10"]
    assert panel.per_query["dev/ndcg@10"] == singles["shell-utils"].per_query["dev/ndcg@10"]
    assert panel.columns["compute/eval_flops"] == sum(s.columns["compute/eval_flops"] for s in singles.values())
    assert not singles["shell-utils"].tasks and "mean/dev/ndcg@10" not in main  # no panel: no panel columns


# ---------------------------------------------------------------------------------------------
# The study metric


def panel_study(metric: str, panel_dirs, **fields):
    from embedlab import Study

    from conftest import tiny_trial

    base = dataclasses.replace(tiny_trial(), eval=EvalConfig(task=panel_dirs[0][1], tasks=(panel_dirs[1][1],)))
    wide = dataclasses.replace(base, masking=dataclasses.replace(base.masking, ratio=0.3))
    return Study(name="panel", factor="masking.ratio", arms={"mask-15": base, "mask-30": wide}, seeds=(0, 1),
                 budget=dataclasses.replace(DEFAULT_BUDGET, tokens=6_000), metric=metric, **fields)


def test_study_metric_names_a_task_of_the_panel_or_the_mean(panel_dirs):
    """With a panel the study metric may be the main task's plain metric, one task's, or the mean;
    anything else is refused listing every valid name; without a panel only the plain ones."""
    from embedlab import Study

    for metric in ("dev/ndcg@10", "data-formats/dev/ndcg@10", "shell-utils/dev/map", "mean/dev/ndcg@10"):
        study = panel_study(metric, panel_dirs)
        assert Study.from_dict(json.loads(json.dumps(study.to_dict()))) == study
    with pytest.raises(ConfigError, match=r"study.metric: study metric 'scifact/dev/ndcg@10' is not a metric of "
                                          r"this panel \(tasks: shell-utils, data-formats\); valid names: "
                                          r"mean/dev/ndcg@10, .*data-formats/dev/map; or the main task's plain "
                                          r"dev/ndcg@10"):
        panel_study("scifact/dev/ndcg@10", panel_dirs)
    single = panel_study("dev/ndcg@10", panel_dirs)
    with pytest.raises(ConfigError, match=r"study.metric: 'mean/dev/ndcg@10'; valid: \['dev/ndcg@10'"):
        dataclasses.replace(single, metric="mean/dev/ndcg@10",
                            arms={arm: dataclasses.replace(config, eval=EvalConfig(task=panel_dirs[0][1]))
                                  for arm, config in single.arms.items()})
    mixed = dict(single.arms, **{"mask-30": dataclasses.replace(single.arms["mask-30"], eval=EvalConfig())})
    with pytest.raises(ConfigError, match="arms score different task panels"):
        dataclasses.replace(single, arms=mixed, factor="eval")


# ---------------------------------------------------------------------------------------------
# The paired test of a panel mean


def reference_stratified(arms, controls, seed_rng, resamples: int):
    """The documented protocol, written directly: per replicate the seed rows once, then each task's
    query columns in task order, and the mean over tasks of each resampled difference matrix's mean."""
    replicates = []
    for _ in range(resamples):
        rows = seed_rng.integers(0, arms[0].shape[0], size=arms[0].shape[0])
        means = []
        for arm, control in zip(arms, controls):
            columns = seed_rng.integers(0, arm.shape[1], size=arm.shape[1])
            means.append((arm - control)[np.ix_(rows, columns)].mean())
        replicates.append(sum(means) / len(means))
    return np.array(replicates)


def dyadic(rng, shape) -> np.ndarray:
    """Values in [0, 1] on a grid of 1/8: every sum below is exact, so the two computations agree bit for bit."""
    return rng.integers(0, 9, size=shape) / 8


def test_stratified_bootstrap_equals_its_direct_reference_exactly():
    """Fixed seed, three seeds, tasks of 7 and 12 queries: the replicates equal the reference's exactly;
    with one task they equal the unstratified `paired_bootstrap`'s, draw for draw."""
    from embedlab.stats.paired import arm_generator, paired_bootstrap, stratified_paired_bootstrap

    rng = np.random.default_rng(5)
    arms = [dyadic(rng, (3, 7)), dyadic(rng, (3, 12))]
    controls = [dyadic(rng, (3, 7)), dyadic(rng, (3, 12))]

    ours = stratified_paired_bootstrap(arms, controls, rng=arm_generator("wide"), resamples=500)

    expected = reference_stratified(arms, controls, arm_generator("wide"), 500)
    assert np.array_equal(ours, expected)
    assert len(set(ours.tolist())) > 50  # the replicates vary: the test compares real draws
    one = stratified_paired_bootstrap(arms[:1], controls[:1], rng=arm_generator("wide"), resamples=500)
    assert np.array_equal(one, paired_bootstrap(arms[0], controls[0], rng=arm_generator("wide"), resamples=500))
    with pytest.raises(ValueError, match="every task needs the same seeds"):
        stratified_paired_bootstrap([arms[0], arms[1][:2]], [controls[0], controls[1][:2]], rng=rng)


def write_panel_run(root: Path, metric: str, values: dict) -> Path:
    """A run directory scored on a two-task panel: study record, finished rows, per-query files as
    `score_trial` keys them (`values[(arm, seed)][task]` a (Q_task,) array)."""
    run_dir = root / "run"
    (run_dir / "trials").mkdir(parents=True)
    (run_dir / "per_query").mkdir()
    arms = sorted({arm for arm, _ in values})
    record = {"study": {"name": "panel", "factor": "masking.ratio", "arms": {a: {} for a in arms}, "seeds": [0, 1, 2],
                        "budget_tokens": 1000, "budget_unit": "tokens", "metric": metric}, "arm_order": arms}
    (run_dir / "study.json").write_text(json.dumps(record))
    for (arm, seed), by_task in values.items():
        trial_id = f"{arm}-{seed}"
        per_query = {f"{task}/dev/ndcg@10": {f"{task}-q{i:02d}": float(v) for i, v in enumerate(array)}
                     for task, array in by_task.items()}
        per_query["dev/ndcg@10"] = per_query["shell-utils/dev/ndcg@10"]
        row = {"trial_id": trial_id, "arm": arm, "seed": seed, "stage": "final", "status": "finished",
               "budget/tokens": 1000, "dev/ndcg@10": float(by_task["shell-utils"].mean()),
               metric: sum(float(a.mean()) for a in by_task.values()) / len(by_task)}
        (run_dir / "trials" / f"{trial_id}.json").write_text(json.dumps(row))
        (run_dir / "per_query" / f"{trial_id}.json").write_text(json.dumps({
            "trial_id": trial_id, "arm": arm, "seed": seed, "stage": "final", "split": "dev", "task_hash": "t" * 64,
            "values": per_query, "tasks": list(by_task), "task_hashes": {t: "t" * 64 for t in by_task}}))
    return run_dir


def test_the_table_tests_a_panel_mean_with_the_panel_model(tmp_path):
    """Study metric `mean/dev/ndcg@10`: the table's paired test is the crossed model's panel
    estimate (its diff the mean of the task means' differences, its SE and df the panel
    estimate's over both tasks' differences) and says which tasks it averages."""
    from embedlab.stats import crossed
    from embedlab.stats.paired import compare_to_control
    from embedlab.stats.table import load_table, render

    rng = np.random.default_rng(11)
    sizes = {"shell-utils": 9, "data-formats": 14}
    values = {(arm, seed): {task: np.clip(dyadic(rng, (q,)) + (0.25 if arm == "b-wide" else 0), 0, 2)
                            for task, q in sizes.items()}
              for arm in ("a-control", "b-wide") for seed in (0, 1, 2)}
    run_dir = write_panel_run(tmp_path, "mean/dev/ndcg@10", values)

    comparison = compare_to_control(run_dir, load_table(run_dir))

    assert comparison.strata == ("shell-utils", "data-formats")
    row = comparison.tests.set_index("arm").loc["b-wide"]
    differences = [np.stack([values[("b-wide", s)][t] - values[("a-control", s)][t] for s in (0, 1, 2)])
                   for t in sizes]
    expected = crossed.crossed_estimate(differences)
    assert row["diff"] == pytest.approx(sum(float(d.mean()) for d in differences) / 2, rel=1e-12)
    assert row["queries"] == 23 and row["seeds"] == 3
    assert (row["se"], row["df"], row["p"]) == (expected.se, expected.df, crossed.p_value(expected))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(crossed.interval(expected, 0.05), rel=1e-9)  # m = 1
    assert "panel mean of shell-utils, data-formats, seeds shared across its tasks" in render(run_dir)
    plain = compare_to_control(write_panel_run(tmp_path / "plain", "dev/ndcg@10", values), load_table(
        tmp_path / "plain" / "run"))
    assert plain.strata == () and plain.tests.set_index("arm").loc["b-wide", "queries"] == 9


# ---------------------------------------------------------------------------------------------
# The contamination pre-flight


def prepared_by_hand(root: Path, documents: list[tuple[str, str, str]]) -> dict:
    """A prepared data directory with only what the phase-1 audit reads: a corpus of training-split
    documents (doc id, title, text) of one source, and a tokenizer sample of all of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "corpus").mkdir(parents=True)
    (root / "corpus" / "manifest.json").write_text(json.dumps({"hash": "by-hand"}))
    ids, titles, texts = (list(column) for column in zip(*documents))
    pq.write_table(pa.table({"doc_id": ids, "title": titles, "text": texts, "split": ["train"] * len(ids),
                             "source": ["docs"] * len(ids)}), root / "corpus" / "documents.parquet")
    pq.write_table(pa.table({"doc_id": ids}), root / "tokenizer_sample.parquet")
    return {"mixture": {"shares": {"docs": 1.0}}, "config": {"near_duplicate_threshold": 0.8},
            "directory": str(root)}


def test_preflight_audit_finds_a_planted_query_of_the_second_task(tmp_path, panel_dirs, data_task):
    """The sweep's pre-flight audits the training data against every task of the panel: a test query
    of the second task quoted in a training document is found (and refused without a disclosed
    policy), though the main task is clean."""
    from embedlab.contamination.audit import ContaminationError
    from embedlab.sweep.gate import check_contamination

    query_id = next(q for q in sorted(data_task.qrels["test"]) if len(data_task.queries[q].split()) >= 8)
    background = [(f"os:{name}", name, body) for name, _, body in docstring_records(__import__("os"))][:20]
    planted = ("leak:1", "notes", f"As the manual puts it: {data_task.queries[query_id]} That is all there is.")
    clean = prepared_by_hand(tmp_path / "clean", background)
    leaky = prepared_by_hand(tmp_path / "leaky", [*background, planted])
    lines: list[str] = []

    assert check_contamination(panel_study("mean/dev/ndcg@10", panel_dirs), {"mask-15": clean, "mask-30": clean},
                                lines.append) == []
    with pytest.raises(ContaminationError, match=f"data-formats query {query_id} ~ pretraining leak:1"):
        check_contamination(panel_study("mean/dev/ndcg@10", panel_dirs), {"mask-15": leaky, "mask-30": leaky},
                             lines.append)
    findings = check_contamination(panel_study("mean/dev/ndcg@10", panel_dirs, disclosed_overlap="quoted once"),
                                    {"mask-15": leaky, "mask-30": leaky}, lines.append)
    assert {(f["task"], f["item_id"], f["stage"], f["stage_item_id"], f["match"]) for f in findings} == {
        ("data-formats", query_id, "pretraining", "leak:1", "contained"),
        ("data-formats", query_id, "tokenizer-sample", "leak:1", "contained"),
    }
    alone = panel_study("dev/ndcg@10", panel_dirs)  # the main task alone: nothing of it leaked
    alone = dataclasses.replace(alone, arms={arm: dataclasses.replace(config, eval=EvalConfig(task=panel_dirs[0][1]))
                                             for arm, config in alone.arms.items()})
    assert check_contamination(alone, {"mask-15": leaky, "mask-30": leaky}, lines.append) == []


# ---------------------------------------------------------------------------------------------
# `embedlab evaluate --task` with a Hub task and a derived dev split


def test_evaluate_command_takes_a_hub_task_and_a_derived_dev_split(tmp_path, monkeypatch, capsys, offline_hub,
                                                                   shell_task):
    """`--task hub:<dir>@<revision> --dev-fraction 0.3` scores the derived dev split exactly as BM25 scores
    `derive_dev_split` of the same task; a TOML spec file of HubTask fields does too; a BEIR folder
    without dev qrels gets the same split in memory; a malformed hub: argument is one error line."""
    from embedlab.cli import main
    from embedlab.tasks.baselines import evaluate_bm25

    monkeypatch.setenv("EMBEDLAB_CACHE", str(tmp_path / "cache"))
    hub = write_hub_directory(tmp_path / "shell-utils", shell_task)
    revision = local_dataset_revision(hub)
    expected = evaluate_bm25(derive_dev_split(shell_task, 0.3, seed=2)[0], "dev")
    spec = tmp_path / "shell.toml"
    spec.write_text(f'name = "shell-utils"\ndataset = "{hub}"\nrevision = "{revision}"\ndev_fraction = 0.3\n'
                    'dev_seed = 2\n', encoding="utf-8")
    beir = tmp_path / "beir" / "shell-utils"
    write_task(shell_task, beir)

    for task in (f"hub:{hub}@{revision}", str(spec), str(beir)):
        extra = [] if task == str(spec) else ["--dev-fraction", "0.3", "--dev-seed", "2"]
        assert main(["evaluate", "--encoder", "baseline:bm25", "--task", task, "--split", "dev", "--json", *extra]) == 0
        scores = json.loads(capsys.readouterr().out)
        assert {k: scores[k] for k in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "task_hash")} == \
            {k: expected[k] for k in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "task_hash")}, task
    assert main(["evaluate", "--encoder", "baseline:bm25", "--task", f"hub:{hub}", "--json"]) == 2
    assert "write a Hub task as hub:<dataset>@<revision>" in capsys.readouterr().err
