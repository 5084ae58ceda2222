"""Real Ray: a 2-worker TorchTrainer phase-1 run, the evaluation actor, and a two-arm sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedlab import load_table
from embedlab.cli import main
from embedlab.train.checkpoint import load_encoder, verify_checkpoint

from conftest import tiny_trial

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def trained(ray_session, prepared, tmp_path_factory):
    from embedlab.train.phase1 import run_phase1

    trial = tiny_trial(num_workers=2)
    result = run_phase1(trial, prepared, storage_path=tmp_path_factory.mktemp("train"), name="two-workers")
    return trial, result


def test_two_worker_trainer_reaches_budget_and_checkpoints(trained, prepared):
    """A 2-worker gloo TorchTrainer stops at the token budget and its checkpoint reads back whole."""
    trial, result = trained
    assert result.error is None
    metrics = result.metrics
    rows_per_step = 2 * trial.train.batch_rows
    tokens_per_step_max = rows_per_step * trial.data.sequence_length
    assert trial.train.budget_tokens <= metrics["budget/tokens"] < trial.train.budget_tokens + tokens_per_step_max
    assert 0 < metrics["train/loss"] < 10
    manifest = verify_checkpoint(Path(result.checkpoint.path))
    assert manifest["distributed"] == {"workers": 2, "backend": "gloo"}
    assert manifest["budget"]["budget/tokens"] == metrics["budget/tokens"]
    assert manifest["tokenizer_hash"] == prepared.record["tokenizer_hash"]
    assert manifest["data_revision"] == prepared.data_revision
    encoder, tokenizer, _ = load_encoder(Path(result.checkpoint.path))
    assert tokenizer.hash == prepared.record["tokenizer_hash"]


def test_evaluation_actor_scores_and_caches(trained, prepared):
    """The shared actor returns dev metrics for a checkpoint, and the second call is served from cache."""
    import ray

    from embedlab.evaluate.actor import get_evaluator

    _, result = trained
    task_dir = str(prepared.task_dir("python-docstrings"))
    first = ray.get(get_evaluator().evaluate.remote(result.checkpoint.path, task_dir, "dev"))
    second = ray.get(get_evaluator().evaluate.remote(result.checkpoint.path, task_dir, "dev"))
    assert not first["cached"] and second["cached"]
    assert 0.0 <= first["ndcg@10"] <= 1.0 and first["queries"] > 20 and first["docs"] > first["queries"]
    assert {k: v for k, v in first.items() if k not in ("cached", "seconds")} == {
        k: v for k, v in second.items() if k not in ("cached", "seconds")
    }


def test_evaluate_cli_json(trained, prepared, capsys):
    """`embedlab evaluate --json` prints the contract's keys for a BEIR directory."""
    _, result = trained
    code = main(["evaluate", "--encoder", result.checkpoint.path,
                 "--task", str(prepared.task_dir("python-docstrings")), "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"ndcg@10", "recall@100", "mrr@10", "queries", "docs"} <= set(out)
    assert out["split"] == "test"


STUDY = """
from dataclasses import replace
from embedlab import Study
from embedlab.config import TrialConfig

def study():
    base = TrialConfig.from_dict({config!r})
    return Study(
        name="tiny-masking", factor="masking.ratio",
        arms={{"mask-15": base, "mask-30": replace(base, masking=replace(base.masking, ratio=0.3))}},
        seeds=(0,), budget_tokens=4_000,
    )
"""


def test_two_arm_sweep_table(ray_session, prepared, tmp_path, capsys):
    """`embedlab sweep` runs both arms on Ray Tune at equal consumed tokens and the table reads back."""
    study_file = tmp_path / "tiny_study.py"
    study_file.write_text(STUDY.format(config=tiny_trial(num_workers=1).to_dict()))
    code = main(["sweep", str(study_file), "--storage", str(tmp_path / "runs")])
    assert code == 0
    run_dir = next((tmp_path / "runs").iterdir())
    table = load_table(run_dir)
    assert list(table["arm"]) == ["mask-15", "mask-30"]
    assert list(table["factor_value"]) == [0.15, 0.3]
    assert table["budget/tokens"].nunique() == 1 and table["budget/tokens"].iloc[0] >= 4_000
    assert table["dev/ndcg@10"].between(0, 1).all()
    assert "mask-30" in capsys.readouterr().out
    assert main(["table", str(run_dir)]) == 0
