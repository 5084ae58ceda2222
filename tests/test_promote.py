"""Promotion: the dev-best arm wins, test numbers never decide, the winner alone is scored on
the final-eval split after selection, a retention break is refused, unequal compute (between
trials or against the declared budget) is refused, what the arms were matched in is recorded,
and the next phase's study starts from the winner's checkpoint."""

import json
from pathlib import Path

import pytest

from embedlab.core.beir import Task, load_task, write_task
from embedlab.core.config import EvalConfig, ModelConfig
from embedlab.model.encoder import MLMModel
from embedlab.sweep.promote import (
    FINAL_EVAL_NOTE, NEXT_STUDY_FILE, PROMOTION_FILE, PromotionError, RetentionMarginError, RetentionMetricMissing,
    promote,
)
from embedlab.checkpoints.io import save_checkpoint, verify_checkpoint
from embedlab.stats.table import UnequalComputeError
from embedlab.studies.study import load_study

ABLATIONS = Path(__file__).parent.parent / "ablations"
TINY = ModelConfig(preset="tiny", layers=1, width=32, heads=2, ffn_width=64, vocab_size=512, max_length=64)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    texts = [f"the quick brown fox {i} jumps over the lazy dog number {i * 7}" for i in range(200)]
    return save_tokenizer(train_tokenizer(texts, vocab_size=300), tmp_path_factory.mktemp("tokenizer"))


def _checkpoint(directory: Path, tokenizer, seed: int, phase: int = 1) -> str:
    import torch

    torch.manual_seed(seed)
    model = MLMModel(TINY)
    save_checkpoint(directory, model.encoder, head=model.mlm_head, tokenizer=tokenizer,
                    fields={"phase": phase, "seed": seed, "data_revision": "rev", "precision": "fp32"})
    return str(directory)


def _run_dir(tmp_path: Path, tokenizer, dev: dict[str, list[float]], *, test: dict[str, list[float]] | None = None,
             phase: int = 1, retention: dict[str, list[float]] | None = None, parent_scores: dict | None = None,
             tokens: dict[str, list[int]] | None = None, study_file: Path | None = None,
             flops: dict[str, float] | None = None, eval_config: dict | None = None,
             prepared: dict | None = None, arm_configs: dict[str, dict] | None = None) -> Path:
    """A finished run: arms x seeds rows with the given dev (and test) metrics, real checkpoints;
    `eval_config` is every arm's recorded eval section, `arm_configs` more of an arm's recorded
    config, `prepared` the run's prepared.json. A `retention` value per arm is every seed's, or
    a list of one value per seed."""
    run_dir = tmp_path / "run"
    (run_dir / "trials").mkdir(parents=True)
    arms = list(dev)
    seeds = list(range(len(next(iter(dev.values())))))
    study_file = study_file or ABLATIONS / "dual_heads.py"
    record = {
        "study": {"name": "s", "factor": "masking.ratio",
                  "arms": {a: {**({"eval": eval_config} if eval_config else {}), **(arm_configs or {}).get(a, {})}
                           for a in arms}, "seeds": seeds,
                  "budget_tokens": 1000, "budget_pairs": 0 if phase == 1 else 64,
                  "budget_unit": "tokens" if phase == 1 else "pairs",
                  "metric": "dev/ndcg@10", "profile": "demo", "disclosed_overlap": None},
        "arm_order": arms, "study_hash": "h" * 64, "study_file": str(study_file), "parent": None,
    }
    if parent_scores:
        record["parent_scores"] = parent_scores
    (run_dir / "study.json").write_text(json.dumps(record))
    if prepared is not None:
        (run_dir / "prepared.json").write_text(json.dumps(prepared))
    for arm in arms:
        for seed in seeds:
            trial_id = f"{arm}-{seed}"
            row = {"trial_id": trial_id, "arm": arm, "seed": seed, "stage": "final", "status": "finished",
                   "phase": phase, "dev/ndcg@10": dev[arm][seed],
                   "budget/tokens": (tokens or {}).get(arm, [1000] * len(seeds))[seed], "budget/pairs": 64,
                   "budget/flops": (flops or {}).get(arm, 1e12),
                   "checkpoint": _checkpoint(tmp_path / "ckpt" / trial_id, tokenizer, seed + 10 * arms.index(arm),
                                             phase)}
            if test:
                row["test/ndcg@10"] = test[arm][seed]
            for key, values in (retention or {}).items():
                value = values[arms.index(arm)]
                row[key] = value[seed] if isinstance(value, list) else value
            (run_dir / "trials" / f"{trial_id}.json").write_text(json.dumps(row))
    return run_dir


def test_promotion_picks_the_dev_best_arm_and_never_reads_test(tmp_path, tokenizer, monkeypatch):
    """The arm with the best dev mean wins even though another arm is best on test; its best dev
    seed supplies the checkpoint; no qrels file is opened; a test metric is refused outright."""
    import embedlab.core.beir as beir

    monkeypatch.setattr(beir, "load_task", lambda *a, **k: pytest.fail("promotion loaded a task"))
    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.30, 0.32], "mixed-dual-heads": [0.35, 0.31]},
                       test={"single-15": [0.9, 0.9], "mixed-dual-heads": [0.1, 0.1]})
    promotion = promote(run_dir, progress=lambda m: None)
    # an old record without the arms' eval config: the final eval says why it has no number
    assert promotion["final_eval"]["value"] is None and "no eval config" in promotion["final_eval"]["reason"]
    assert promotion["winner"]["arm"] == "mixed-dual-heads" and promotion["winner"]["seed"] == 0
    assert [r["arm"] for r in promotion["ranking"]] == ["mixed-dual-heads", "single-15"]
    assert promotion["lineage"]["content_hash"] == verify_checkpoint(Path(promotion["checkpoint"]))["content_hash"]
    assert json.loads((run_dir / PROMOTION_FILE).read_text())["winner"]["arm"] == "mixed-dual-heads"
    with pytest.raises(PromotionError, match="recipe-dev"):
        promote(run_dir, metric="test/ndcg@10", progress=lambda m: None)


def test_promoted_next_study_starts_from_the_winner(tmp_path, tokenizer):
    """next_study.py is the recipe's next phase with the winner as every arm's parent, and it
    refuses to load once that checkpoint's content changes."""
    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.2, 0.2], "mixed-dual-heads": [0.1, 0.1]})
    promotion = promote(run_dir, progress=lambda m: None)
    child = load_study(run_dir / NEXT_STUDY_FILE)
    assert child.name == "joint-vs-contrastive" and child.phase == 2 and child.profile == "demo"
    assert child.parent == promotion["checkpoint"]
    config = child.trial_config("joint-mlm-30", 0)
    assert config.parent == promotion["checkpoint"]
    weights = Path(promotion["checkpoint"]) / "encoder.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(Exception, match="encoder.safetensors|content hash"):
        load_study(run_dir / NEXT_STUDY_FILE)


def test_retention_break_is_refused(tmp_path, tokenizer):
    """A dev winner whose retention falls more than the margin below its parent's is refused,
    naming the metric and the best arm within the margin; within the margin it is promoted."""
    parent = {"dev/ndcg@10": 0.1, "retention/probe_accuracy": 0.80, "retention/similarity_spearman": 0.5}
    run_dir = _run_dir(tmp_path, tokenizer, phase=2, dev={"contrastive-only": [0.5, 0.6], "joint-mlm-30": [0.4, 0.45]},
                       retention={"retention/probe_accuracy": [0.60, 0.78], "retention/similarity_spearman": [0.5, 0.5]},
                       parent_scores=parent, study_file=ABLATIONS / "joint_vs_contrastive.py")
    with pytest.raises(PromotionError, match=r"contrastive-only.*retention/probe_accuracy 0\.8000 -> 0\.6000.*--arm joint-mlm-30"):
        promote(run_dir, max_retention_drop=0.05, progress=lambda m: None)
    assert not (run_dir / PROMOTION_FILE).exists()
    promotion = promote(run_dir, max_retention_drop=0.25, progress=lambda m: None)
    assert promotion["winner"]["arm"] == "contrastive-only"
    assert promotion["retention"]["drops"]["retention/probe_accuracy"]["drop"] == pytest.approx(0.2)
    assert load_study(run_dir / NEXT_STUDY_FILE).name == "hard-negatives"
    # The final-eval split is read once per decision: a second promotion is refused unless it
    # replaces the first, and then says the split was read again.
    with pytest.raises(PromotionError, match=r"already promoted \(contrastive-only seed 1, promotion.json\).*--replace"):
        promote(run_dir, arm="joint-mlm-30", max_retention_drop=0.05, progress=lambda m: None)
    said = []
    again = promote(run_dir, arm="joint-mlm-30", max_retention_drop=0.05, replace=True, progress=said.append)
    assert again["winner"]["arm"] == "joint-mlm-30" and again["final_eval_reads"] == 2
    assert again["replaces"]["winner"]["arm"] == "contrastive-only" and promotion["final_eval_reads"] == 1
    assert json.loads((run_dir / PROMOTION_FILE).read_text())["final_eval_reads"] == 2
    assert "promote: --replace: this run's final-eval split has now been read 2 times (recorded in promotion.json)" in said


def test_unequal_compute_and_missing_trials_are_refused(tmp_path, tokenizer):
    """Arms whose consumed tokens differ by more than 1% cannot be compared or promoted."""
    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.2, 0.2], "mixed-dual-heads": [0.1, 0.1]},
                       tokens={"single-15": [1000, 1000], "mixed-dual-heads": [1000, 1020]})
    with pytest.raises(UnequalComputeError, match="mixed-dual-heads"):
        promote(run_dir, progress=lambda m: None)
    (run_dir / "trials" / "mixed-dual-heads-1.json").unlink()
    with pytest.raises(PromotionError, match="--resume"):
        promote(run_dir, progress=lambda m: None)


def test_a_trial_stopped_for_non_finite_steps_blocks_promotion_with_its_reason(tmp_path, tokenizer):
    """The table keeps a stopped trial's status and reason; promotion names it instead of
    suggesting a resume (rerunning would stop the same way)."""
    from embedlab.stats.table import load_table

    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.2, 0.2], "mixed-dual-heads": [0.1, 0.1]})
    stopped = {"trial_id": "mixed-dual-heads-1", "arm": "mixed-dual-heads", "seed": 1, "stage": "final",
               "status": "nonfinite", "error": "8 consecutive steps rejected for a non-finite loss"}
    (run_dir / "trials" / "mixed-dual-heads-1.json").write_text(json.dumps(stopped))
    table = load_table(run_dir)
    assert table.set_index("trial_id").loc["mixed-dual-heads-1", "status"] == "nonfinite"
    with pytest.raises(PromotionError, match="mixed-dual-heads seed 1: nonfinite .8 consecutive steps"):
        promote(run_dir, progress=lambda m: None)


QUERY_TEXTS = [f"where does the quick fox number {i} jump" for i in range(12)]


def _task(directory: Path, *, test_targets: dict[str, str] | None = None) -> Path:
    """A small BEIR task: 30 documents, 12 queries, dev qrels on the first 6, test on the last 6."""
    corpus = {f"d{i}": ("", f"the quick brown fox {i} jumps over the lazy dog number {i * 7}") for i in range(30)}
    queries = {f"q{i}": text for i, text in enumerate(QUERY_TEXTS)}
    test = test_targets or {f"q{i}": f"d{i}" for i in range(6, 12)}
    qrels = {"dev": {f"q{i}": {f"d{i}": 1} for i in range(6)}, "test": {q: {d: 1} for q, d in test.items()}}
    write_task(Task(name="toy-task", corpus=corpus, queries=queries, qrels=qrels), directory)
    return directory


EVAL = {**EvalConfig(task="", max_length=64, batch_size=8).__dict__}


def test_final_eval_scores_the_winner_once_after_selection(tmp_path, tokenizer, monkeypatch):
    """The winner's checkpoint, and no other, is scored once on the task's test split; the number
    equals the evaluator's on that checkpoint, is labelled as never used, and changing every test
    label changes it but not the winner, the ranking or the chosen seed."""
    import embedlab.evaluate.checkpoint_eval as checkpoint_eval

    real = checkpoint_eval.evaluate_checkpoint
    calls = []

    def recording(checkpoint, task, split, **kwargs):
        calls.append((str(checkpoint), split))
        return real(checkpoint, task, split, **kwargs)

    monkeypatch.setattr(checkpoint_eval, "evaluate_checkpoint", recording)
    dev = {"single-15": [0.30, 0.32], "mixed-dual-heads": [0.35, 0.31]}
    results = []
    for name, targets in (("a", None), ("b", {f"q{i}": f"d{29 - i}" for i in range(6, 12)})):
        task_dir = _task(tmp_path / name / "task", test_targets=targets)
        run_dir = _run_dir(tmp_path / name, tokenizer, dev=dev, eval_config={**EVAL, "task": str(task_dir)})
        for path in (run_dir / "trials").glob("*.json"):  # scored on this very task, as the sweep records
            path.write_text(json.dumps({**json.loads(path.read_text()), "eval/task_hash": load_task(task_dir).hash}))
        lines = []
        calls.clear()
        promotion = promote(run_dir, progress=lines.append)
        assert calls == [(promotion["checkpoint"], "test")]
        scored = promotion["final_eval"]
        expected = real(Path(promotion["checkpoint"]), load_task(task_dir), "test", max_length=64, batch_size=8)
        assert scored == {"split": "test", "metric": "test/ndcg@10", "value": expected["ndcg@10"],
                          "note": FINAL_EVAL_NOTE, "task": "task", "task_hash": load_task(task_dir).hash,
                          "queries": 6, "checkpoint_hash": expected["checkpoint_hash"]}
        assert json.loads((run_dir / PROMOTION_FILE).read_text())["final_eval"] == scored
        assert any(line.startswith(f"promote: final eval test/ndcg@10 {scored['value']:.4f} on task (6 queries), "
                                   "beside dev 0.3500: reported once after selection; never used to choose anything")
                   for line in lines), lines
        results.append(promotion)
    assert [p["winner"] for p in results] == [results[0]["winner"]] * 2 and results[0]["winner"]["arm"] == "mixed-dual-heads"
    assert results[0]["ranking"] == results[1]["ranking"]
    assert results[0]["final_eval"]["value"] != results[1]["final_eval"]["value"]


def test_final_eval_records_why_it_has_no_number(tmp_path, tokenizer):
    """A task without test qrels, one whose content changed since its trials were scored, or a
    built-in task whose prepared data is gone gives a reason instead of a value; promotion
    itself goes ahead on dev."""
    task_dir = _task(tmp_path / "task")
    (task_dir / "qrels" / "test.tsv").unlink()
    dev = {"single-15": [0.2, 0.2], "mixed-dual-heads": [0.1, 0.1]}
    run_dir = _run_dir(tmp_path / "a", tokenizer, dev=dev, eval_config={**EVAL, "task": str(task_dir)})
    lines = []
    scored = promote(run_dir, progress=lines.append)["final_eval"]
    assert scored["value"] is None and "test.tsv: file not found (every task needs a test split)" in scored["reason"]
    assert f"promote: final eval not scored: {scored['reason']}" in lines
    changed = _task(tmp_path / "changed")
    run_dir = _run_dir(tmp_path / "moved", tokenizer, dev=dev, eval_config={**EVAL, "task": str(changed)})
    for path in (run_dir / "trials").glob("*.json"):  # as scored by the sweep, on other content
        path.write_text(json.dumps({**json.loads(path.read_text()), "eval/task_hash": "f" * 64}))
    scored = promote(run_dir, progress=lambda m: None)["final_eval"]
    assert scored["value"] is None and "was scored on ffffffffffff: its content changed" in scored["reason"]
    run_dir = _run_dir(tmp_path / "b", tokenizer, dev=dev, eval_config={**EVAL, "task": "python-docstrings"})
    scored = promote(run_dir, progress=lambda m: None)["final_eval"]
    assert scored["value"] is None and "built-in task 'python-docstrings' needs prepared data" in scored["reason"]
    run_dir = _run_dir(tmp_path / "c", tokenizer, dev=dev, eval_config={**EVAL, "task": "python-docstrings"},
                       prepared={arm: {"directory": str(tmp_path / "gone")} for arm in dev})
    assert "task directory not found" in promote(run_dir, progress=lambda m: None)["final_eval"]["reason"]


def test_promotion_records_what_the_arms_were_matched_in(tmp_path, tokenizer):
    """At a pairs budget, an arm spending 43.2% more FLOPs than the control is named in one line,
    printed and written to promotion.json."""
    lines = []
    run_dir = _run_dir(tmp_path, tokenizer, phase=2, dev={"contrastive-only": [0.5, 0.6], "joint-mlm-30": [0.4, 0.45]},
                       flops={"contrastive-only": 1e12, "joint-mlm-30": 1.432e12},
                       study_file=ABLATIONS / "joint_vs_contrastive.py")
    promotion = promote(run_dir, progress=lines.append)
    line = "data-matched (equal pairs per trial); FLOPs differ from control contrastive-only by +43.2% in joint-mlm-30"
    assert promotion["compute_match"] == line and f"promote: {line}" in lines
    assert json.loads((run_dir / PROMOTION_FILE).read_text())["compute_match"] == line


def test_consumption_off_the_declared_budget_is_refused(tmp_path, tokenizer):
    """Every trial 1.5% over the study's 1,000-token budget: equal to each other, still refused."""
    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.2, 0.2], "mixed-dual-heads": [0.1, 0.1]},
                       tokens={"single-15": [1015, 1015], "mixed-dual-heads": [1015, 1015]})
    with pytest.raises(UnequalComputeError, match=r"declared budget of 1,000 tokens.*consumed 1,015 \(\+1.50%\)"):
        promote(run_dir, progress=lambda m: None)
    assert not (run_dir / PROMOTION_FILE).exists()


PHASE2 = dict(phase=2, study_file=ABLATIONS / "joint_vs_contrastive.py")
PARENT = {"dev/ndcg@10": 0.1, "retention/probe_accuracy": 0.80}


def test_the_margin_is_checked_on_the_arms_mean_over_seeds(tmp_path, tokenizer):
    """The dev winner's best seed keeps the probe within 0.10 of the parent's, but its mean
    over seeds does not: refused, with the arm, the broken metric (mean, drop, worst seed) and
    the best arm within the margin as attributes."""
    run_dir = _run_dir(tmp_path, tokenizer, **PHASE2, parent_scores=PARENT,
                       dev={"contrastive-only": [0.6, 0.5], "joint-mlm-30": [0.4, 0.45]},
                       retention={"retention/probe_accuracy": [[0.79, 0.55], [0.78, 0.76]]})
    with pytest.raises(RetentionMarginError) as refused:
        promote(run_dir, max_retention_drop=0.10, progress=lambda m: None)
    assert refused.value.arm == "contrastive-only" and refused.value.within_margin == "joint-mlm-30"
    assert refused.value.max_drop == 0.10 and list(refused.value.broken) == ["retention/probe_accuracy"]
    broken = refused.value.broken["retention/probe_accuracy"]
    assert broken["child"] == pytest.approx(0.67) and broken["drop"] == pytest.approx(0.13)
    assert (broken["worst_seed"], broken["worst_child"]) == (1, 0.55)
    assert not (run_dir / PROMOTION_FILE).exists()


def test_promotion_prints_each_retention_check_with_its_unit_and_worst_seed(tmp_path, tokenizer):
    """Each retention metric's line gives the parent, the arm's mean over seeds, the drop and the
    worst seed; the margin is stated as absolute metric points, in the output and the record."""
    run_dir = _run_dir(tmp_path, tokenizer, **PHASE2, parent_scores=PARENT,
                       dev={"contrastive-only": [0.6, 0.5], "joint-mlm-30": [0.4, 0.45]},
                       retention={"retention/probe_accuracy": [[0.78, 0.76], [0.78, 0.76]]})
    lines = []
    promotion = promote(run_dir, max_retention_drop=0.10, progress=lines.append)
    assert ("promote: retention/probe_accuracy parent 0.8000 -> mean 0.7700 over 2 seeds (drop +0.0300); "
            "worst seed 1: 0.7600 (drop +0.0400)") in lines
    assert any(line.startswith("promote: retention margin 0.1 (absolute, in metric points: 0.10 lets a score end "
                               "0.10 below the parent's, not 10% below it)") for line in lines), lines
    assert json.loads((run_dir / PROMOTION_FILE).read_text())["retention"]["unit"].startswith("absolute")
    assert promotion["retention"]["drops"]["retention/probe_accuracy"]["worst_seed"] == 1


def test_a_retention_metric_the_parent_has_and_the_arm_lacks_is_refused(tmp_path, tokenizer):
    """The parent has a masked-token accuracy; the winner's trials have none: a PromotionError
    naming the metric and the arm, not a silent skip."""
    run_dir = _run_dir(tmp_path, tokenizer, **PHASE2, parent_scores={**PARENT, "retention/mlm_accuracy": 0.3},
                       dev={"contrastive-only": [0.6, 0.5], "joint-mlm-30": [0.4, 0.45]},
                       retention={"retention/probe_accuracy": [0.8, 0.8]})
    with pytest.raises(RetentionMetricMissing, match=r"arm 'contrastive-only' has no retention/mlm_accuracy "
                                                     r"at seed\(s\) \[0, 1\], but its parent scored 0\.3000"):
        promote(run_dir, progress=lambda m: None)


def test_a_child_of_a_dual_head_parent_is_checked_against_the_head_it_continued(tmp_path, tokenizer):
    """A dual-head parent scores 0.30 with its 5% head (the one nearest 15%) and 0.10 with its
    50% head. An arm at masking ratio 0.15 continued the 5% head and its 0.12 breaks the margin;
    an arm at 0.5 continued the 50% head, so the same 0.12 keeps it."""
    parent = {**PARENT, "retention/mlm_accuracy": 0.30, "retention/mlm_accuracy/mask5": 0.30,
              "retention/mlm_accuracy/mask50": 0.10}
    run_dir = _run_dir(tmp_path, tokenizer, **PHASE2, parent_scores=parent,
                       dev={"contrastive-only": [0.6, 0.5], "joint-mlm-30": [0.4, 0.45]},
                       retention={"retention/probe_accuracy": [0.8, 0.8], "retention/mlm_accuracy": [0.12, 0.12]},
                       arm_configs={"contrastive-only": {"masking": {"ratio": 0.15}},
                                    "joint-mlm-30": {"masking": {"ratio": 0.5}}})
    with pytest.raises(RetentionMarginError) as refused:
        promote(run_dir, max_retention_drop=0.10, progress=lambda m: None)
    assert list(refused.value.broken) == ["retention/mlm_accuracy/mask5"]
    assert refused.value.within_margin == "joint-mlm-30"


def test_the_tour_carries_on_with_the_arm_the_refusal_names(tmp_path, tokenizer):
    """The tour's promotion step takes the fallback arm from the refusal itself: an arm whose
    name ends in ")" (which a parsed message would cut) is promoted as named."""
    from embedlab.sweep.tour import promote_stage

    run_dir = _run_dir(tmp_path, tokenizer, **PHASE2, parent_scores=PARENT,
                       dev={"contrastive-only": [0.6, 0.5], "joint (mlm 0.3)": [0.4, 0.45]},
                       retention={"retention/probe_accuracy": [0.5, 0.79]})
    lines = []
    promotion = promote_stage(run_dir, dict(max_retention_drop=0.10, progress=lines.append))
    assert promotion["winner"]["arm"] == "joint (mlm 0.3)"
    assert any(line.startswith("promote: refused: winner 'contrastive-only' breaks") for line in lines), lines


def test_a_panel_metric_picks_on_it_and_reports_the_same_tasks_test_split(tmp_path, tokenizer):
    """Study metric `mean/dev/ndcg@10` of a two-task panel: the arm best on the mean wins though the
    other is best on the main task's dev; the final eval is each task's test number, as the evaluator
    gives it for the winner's checkpoint, and their plain mean; `<task>/dev/...` reports that task only."""
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint

    alpha = _task(tmp_path / "alpha")
    beta = _task(tmp_path / "beta", test_targets={f"q{i}": f"d{i + 12}" for i in range(6, 12)})
    dev = {"single-15": [0.40, 0.40], "mixed-dual-heads": [0.30, 0.30]}
    run_dir = _run_dir(tmp_path, tokenizer, dev=dev, eval_config={**EVAL, "task": str(alpha), "tasks": [str(beta)]})
    hashes = {"alpha/eval/task_hash": load_task(alpha).hash, "beta/eval/task_hash": load_task(beta).hash}
    for path in (run_dir / "trials").glob("*.json"):
        row = json.loads(path.read_text())
        mean = 0.5 if row["arm"] == "mixed-dual-heads" else 0.35
        path.write_text(json.dumps({**row, **hashes, "mean/dev/ndcg@10": mean + 0.01 * row["seed"],
                                    "beta/dev/ndcg@10": 0.6 if row["arm"] == "single-15" else 0.2}))

    with pytest.raises(PromotionError, match="recipe-dev"):
        promote(run_dir, metric="mean/test/ndcg@10", progress=lambda m: None)
    promotion = promote(run_dir, metric="mean/dev/ndcg@10", progress=lambda m: None)

    assert promotion["winner"]["arm"] == "mixed-dual-heads" and promotion["winner"]["seed"] == 1
    scored = promotion["final_eval"]
    singles = {name: evaluate_checkpoint(Path(promotion["checkpoint"]), load_task(directory), "test",
                                         batch_size=8, max_length=64)["ndcg@10"]
               for name, directory in (("alpha", alpha), ("beta", beta))}
    assert scored["metric"] == "mean/test/ndcg@10" and scored["note"] == FINAL_EVAL_NOTE
    assert {name: entry["value"] for name, entry in scored["tasks"].items()} == singles
    assert singles["alpha"] != singles["beta"] and scored["value"] == (singles["alpha"] + singles["beta"]) / 2
    assert scored["queries"] == 12
    one = promote(run_dir, metric="beta/dev/ndcg@10", replace=True, progress=lambda m: None)
    assert one["winner"]["arm"] == "single-15" and one["final_eval"]["metric"] == "beta/test/ndcg@10"
    assert list(one["final_eval"]["tasks"]) == ["beta"]


def test_a_seed_with_a_nan_metric_blocks_promotion_unless_told_and_is_never_counted(tmp_path, tokenizer):
    """single-15 seed 1 finished with dev nDCG@10 NaN: promotion refuses (the study declared 2
    seeds) naming it; with allow_missing_seeds it ranks on the seeds present, says so, and the
    ranking records 1 seed and single-15's one value (not a NaN-skipping mean over "2 seeds")."""
    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.5, 0.2], "mixed-dual-heads": [0.3, 0.3]})
    path = run_dir / "trials" / "single-15-1.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "dev/ndcg@10": float("nan")}))
    with pytest.raises(PromotionError, match=r"single-15 seed 1: failed \(study metric dev/ndcg@10 is nan\)"):
        promote(run_dir, progress=lambda m: None)
    said = []
    promotion = promote(run_dir, allow_missing_seeds=True, progress=said.append)
    assert promotion["ranking"] == [{"arm": "single-15", "mean": 0.5, "seeds": 1},
                                    {"arm": "mixed-dual-heads", "mean": 0.3, "seeds": 2}]
    assert any("ranking on fewer seeds than the study declared (2): missing (arm, seed) [('single-15', 1)]" in line
               for line in said)
    for seed in (0, 1):  # an arm with no seed left is refused even when told
        path = run_dir / "trials" / f"mixed-dual-heads-{seed}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "dev/ndcg@10": None}))
    with pytest.raises(PromotionError, match="mixed-dual-heads"):
        promote(run_dir, allow_missing_seeds=True, replace=True, progress=lambda m: None)


def test_a_ladder_promotes_from_its_top_rung_and_says_whether_its_winner_won_every_rung(tmp_path, tokenizer):
    """Two rungs of one study beside each other (`<study>-x0p5-...` and `<study>-...`): promoting
    the lower rung is refused, naming the top one, and writes nothing; promoting the top rung
    records each rung's winner and says the winner lost the lower rung."""
    storage = tmp_path / "runs"
    storage.mkdir()
    rungs = {}
    for index, (name, flops, dev) in enumerate((("s-x0p5", 5e11, {"a": [0.5, 0.52], "b": [0.6, 0.61]}),
                                                 ("s", 1e12, {"a": [0.7, 0.71], "b": [0.6, 0.62]}))):
        run_dir = _run_dir(tmp_path / name, tokenizer, dev, flops={"a": flops, "b": flops})
        record = json.loads((run_dir / "study.json").read_text())
        record["study"]["name"] = name
        (run_dir / "study.json").write_text(json.dumps(record))
        rungs[name] = run_dir.rename(storage / f"{name}-20261206-00000{index}")
    with pytest.raises(PromotionError, match=r"a lower rung of a budget ladder \(2 rungs beside it\).*top rung.*s-2026"):
        promote(rungs["s-x0p5"], progress=lambda line: None)
    assert not (rungs["s-x0p5"] / PROMOTION_FILE).exists()
    lines = []
    promotion = promote(rungs["s"], progress=lines.append)
    assert promotion["winner"]["arm"] == "a"
    assert [(r["winner"], r["flops"]) for r in promotion["ladder"]["rungs"]] == [("b", 5e11), ("a", 1e12)]
    assert promotion["ladder"]["won_every_rung"] is False
    assert f"promote: top rung of a 2-rung budget ladder; a did not win rung 1 (b, {rungs['s-x0p5']})" in lines
    # A study with no rung beside it is no ladder.
    lonely = _run_dir(tmp_path / "alone", tokenizer, {"a": [0.7, 0.71], "b": [0.6, 0.62]})
    assert "ladder" not in promote(lonely, progress=lambda line: None)


def test_promotion_ignores_unrelated_corrupt_siblings_and_names_a_rung_it_cannot_read(tmp_path, tokenizer, capsys):
    """The ladder lookup reads only siblings named as runs of this study or its rungs: a corrupt
    unrelated run beside it blocks nothing; a corrupt one named as a rung is refused in one line
    naming its file and why it was read, and nothing is written."""
    from embedlab.cli import main

    storage = tmp_path / "runs"
    storage.mkdir()
    run_dir = _run_dir(tmp_path / "s", tokenizer, {"a": [0.7, 0.71], "b": [0.6, 0.62]}).rename(
        storage / "s-20261206-000001")
    unrelated = storage / "other-study-20261205-000000"
    unrelated.mkdir()
    (unrelated / "study.json").write_text('{"study": {"name": "other-st')
    assert main(["promote", str(run_dir)]) == 0
    assert json.loads((run_dir / PROMOTION_FILE).read_text())["winner"]["arm"] == "a"
    (run_dir / PROMOTION_FILE).unlink()
    rung = storage / "s-x0p5-20261205-000000"
    rung.mkdir()
    (rung / "study.json").write_text('{"study": {"name": "s-x0p5", "metr')
    capsys.readouterr()
    assert main(["promote", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {rung / 'study.json'}: not a study record: truncated or invalid JSON (Unterminated "
                   "string starting at: line 1 column 30 (char 29)) (read because s-x0p5-20261205-000000, beside "
                   "s-20261206-000001, is named as a run of study s or of one of its budget rungs, which a ladder "
                   "compares; repair or move it)\n")
    assert not (run_dir / PROMOTION_FILE).exists()
