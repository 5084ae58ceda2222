"""Promotion: the dev-best arm wins, test numbers never decide, a retention break is refused,
unequal compute is refused, and the next phase's study starts from the winner's checkpoint."""

import json
from pathlib import Path

import pytest

from embedlab.config import ModelConfig
from embedlab.model.encoder import MLMModel
from embedlab.sweep.promote import NEXT_STUDY_FILE, PROMOTION_FILE, PromotionError, promote
from embedlab.sweep.study import load_study
from embedlab.sweep.table import UnequalComputeError
from embedlab.train.checkpoint import save_checkpoint, verify_checkpoint

ABLATIONS = Path(__file__).parent.parent / "ablations"
TINY = ModelConfig(preset="tiny", layers=1, width=32, heads=2, ffn_width=64, vocab_size=512, max_length=64)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from embedlab.tokenizer import save_tokenizer, train_tokenizer

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
             tokens: dict[str, list[int]] | None = None, study_file: Path | None = None) -> Path:
    """A finished run: arms x seeds rows with the given dev (and test) metrics, real checkpoints."""
    run_dir = tmp_path / "run"
    (run_dir / "trials").mkdir(parents=True)
    arms = list(dev)
    seeds = list(range(len(next(iter(dev.values())))))
    study_file = study_file or ABLATIONS / "dual_heads.py"
    record = {
        "study": {"name": "s", "factor": "masking.ratio", "arms": {a: {} for a in arms}, "seeds": seeds,
                  "budget_tokens": 1000, "budget_pairs": 0, "budget_unit": "tokens" if phase == 1 else "pairs",
                  "metric": "dev/ndcg@10", "profile": "demo", "disclosed_overlap": None},
        "arm_order": arms, "study_hash": "h" * 64, "study_file": str(study_file), "parent": None,
    }
    if parent_scores:
        record["parent_scores"] = parent_scores
    (run_dir / "study.json").write_text(json.dumps(record))
    for arm in arms:
        for seed in seeds:
            trial_id = f"{arm}-{seed}"
            row = {"trial_id": trial_id, "arm": arm, "seed": seed, "stage": "final", "status": "finished",
                   "phase": phase, "dev/ndcg@10": dev[arm][seed],
                   "budget/tokens": (tokens or {}).get(arm, [1000] * len(seeds))[seed], "budget/pairs": 64,
                   "checkpoint": _checkpoint(tmp_path / "ckpt" / trial_id, tokenizer, seed + 10 * arms.index(arm),
                                             phase)}
            if test:
                row["test/ndcg@10"] = test[arm][seed]
            for key, values in (retention or {}).items():
                row[key] = values[arms.index(arm)]
            (run_dir / "trials" / f"{trial_id}.json").write_text(json.dumps(row))
    return run_dir


def test_promotion_picks_the_dev_best_arm_and_never_reads_test(tmp_path, tokenizer, monkeypatch):
    """The arm with the best dev mean wins even though another arm is best on test; its best dev
    seed supplies the checkpoint; no qrels file is opened; a test metric is refused outright."""
    import embedlab.evaluate.beir as beir

    monkeypatch.setattr(beir, "load_task", lambda *a, **k: pytest.fail("promotion loaded a task"))
    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.30, 0.32], "mixed-dual-heads": [0.35, 0.31]},
                       test={"single-15": [0.9, 0.9], "mixed-dual-heads": [0.1, 0.1]})
    promotion = promote(run_dir, progress=lambda m: None)
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
    assert promote(run_dir, arm="joint-mlm-30", max_retention_drop=0.05, progress=lambda m: None)["winner"]["arm"] == "joint-mlm-30"


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
    from embedlab.sweep.table import load_table

    run_dir = _run_dir(tmp_path, tokenizer, dev={"single-15": [0.2, 0.2], "mixed-dual-heads": [0.1, 0.1]})
    stopped = {"trial_id": "mixed-dual-heads-1", "arm": "mixed-dual-heads", "seed": 1, "stage": "final",
               "status": "nonfinite", "error": "8 consecutive steps rejected for a non-finite loss"}
    (run_dir / "trials" / "mixed-dual-heads-1.json").write_text(json.dumps(stopped))
    table = load_table(run_dir)
    assert table.set_index("trial_id").loc["mixed-dual-heads-1", "status"] == "nonfinite"
    with pytest.raises(PromotionError, match="mixed-dual-heads seed 1: nonfinite .8 consecutive steps"):
        promote(run_dir, progress=lambda m: None)
