"""Real Ray: a 2-worker TorchTrainer phase-1 run, the evaluation actor, phases 2 and 3 from it,
and a dual-heads phase 1 (the whole study path, sweep to release, is test_object_storage's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embedlab import load_table
from embedlab.checkpoints.io import load_encoder, verify_checkpoint
from embedlab.cli import main

from conftest import only_run, tiny_budget, tiny_trial

pytestmark = pytest.mark.timeout(400)

# What differs between two evaluations of one checkpoint: whether it came from the cache, and its clocks.
TIMING_KEYS = ("cached", "seconds", "eval_seconds", "eval_wall_seconds")


def untimed(scores: dict) -> str:
    """The scores without their timing, as JSON: floats written exactly (repr), and a NaN health
    value compares equal to itself."""
    return json.dumps({k: v for k, v in scores.items() if k not in TIMING_KEYS}, sort_keys=True)


def in_process(checkpoint, task_dir, split: str, **settings) -> dict:
    """`evaluate_checkpoint` in this process on one torch thread, as the evaluation actor runs it
    (`Evaluator(torch_threads=1)`): the oracle for what the actor answered."""
    import torch

    from embedlab.core.beir import load_task
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return evaluate_checkpoint(Path(checkpoint), load_task(task_dir), split, **settings)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(two_worker_phase1):
    trial, result, _ = two_worker_phase1
    return trial, result


def test_two_worker_trainer_reaches_budget_and_checkpoints(trained, prepared):
    """A 2-worker gloo TorchTrainer stops at the token budget and its checkpoint reads back whole."""
    trial, result = trained
    assert result.error is None
    metrics = result.metrics
    rows_per_step = 2 * trial.train.batch_rows
    tokens_per_step_max = rows_per_step * trial.data.sequence_length
    assert trial.train.budget.tokens <= metrics["budget/tokens"] < trial.train.budget.tokens + tokens_per_step_max
    assert 0 < metrics["train/loss"] < 10
    # Per-source loss over both workers: every source reported, selected counts summing to
    # the window's (their weighted mean is the window's loss).
    sources = [k.removeprefix("train/loss/source/") for k in metrics if k.startswith("train/loss/source/")]
    assert sorted(sources) == sorted(prepared.record["mixture"]["shares"])
    counts = {s: metrics[f"train/selected/source/{s}"] for s in sources}
    mean = sum(metrics[f"train/loss/source/{s}"] * n for s, n in counts.items() if n) / sum(counts.values())
    assert mean == pytest.approx(metrics["train/loss"], rel=1e-6)
    manifest = verify_checkpoint(Path(result.checkpoint.path))
    assert manifest["distributed"] == {"workers": 2, "backend": "gloo"}
    assert manifest["budget"]["budget/tokens"] == metrics["budget/tokens"]
    assert manifest["tokenizer_hash"] == prepared.record["tokenizer_hash"]
    assert manifest["data_revision"] == prepared.data_revision
    encoder, tokenizer, _ = load_encoder(Path(result.checkpoint.path))
    assert tokenizer.hash == prepared.record["tokenizer_hash"]


def test_evaluation_actor_scores_and_caches(trained, prepared):
    """The shared actor returns dev metrics for a checkpoint, every value (metrics, per-query
    values, health, FLOPs) exactly what `evaluate_checkpoint` computes in process with the
    actor's defaults (flat index, `EvalConfig.max_length`, no retention panel); the second call
    is served from cache with the same values."""
    import ray

    from embedlab.evaluate.actor import get_evaluator

    _, result = trained
    task_dir = str(prepared.task_dir("python-docstrings"))
    first = ray.get(get_evaluator().evaluate.remote(result.checkpoint.path, task_dir, "dev"))
    second = ray.get(get_evaluator().evaluate.remote(result.checkpoint.path, task_dir, "dev"))
    assert not first["cached"] and second["cached"]
    assert first["queries"] > 20 and first["docs"] > first["queries"]
    ours = in_process(result.checkpoint.path, task_dir, "dev")
    assert first["ndcg@10"] == ours["ndcg@10"]
    assert untimed(first) == untimed(ours)
    assert untimed(second) == untimed(first)


def test_actor_serves_two_concurrent_trials_loading_the_task_once(trained, prepared, tmp_path):
    """Two trials asking the actor at once (two checkpoints) are both answered, from one load of the task."""
    import shutil

    import ray

    from embedlab.evaluate.actor import get_evaluator
    from embedlab.release.export import export_inference

    _, result = trained
    export_inference(Path(result.checkpoint.path), tmp_path / "exported")  # a second checkpoint hash
    task_dir = tmp_path / "task"
    shutil.copytree(prepared.task_dir("python-docstrings"), task_dir)
    evaluator = get_evaluator()
    before = ray.get(evaluator.stats.remote())
    first = evaluator.evaluate.remote(result.checkpoint.path, str(task_dir), "dev")
    second = evaluator.evaluate.remote(str(tmp_path / "exported"), str(task_dir), "dev")
    first, second = ray.get([first, second])
    after = ray.get(evaluator.stats.remote())
    assert after["tasks_loaded"] == before["tasks_loaded"] + 1
    # Results are cached by content (checkpoint hash, task hash), so an earlier test may have
    # scored the first checkpoint on this task's content already.
    assert after["results_cached"] == before["results_cached"] + sum(not r["cached"] for r in (first, second))
    assert not second["cached"]
    assert first["checkpoint_hash"] != second["checkpoint_hash"]
    assert first["ndcg@10"] == second["ndcg@10"]  # the same encoder weights, exported


def test_per_query_values_average_to_the_reported_means(trained, prepared):
    """In process, on the real dev split: "per_query" holds one value per judged query for every
    metric, and their mean is the reported mean (to 1e-12: only summation order differs). The
    evaluation's FLOPs are those of encoding its documents and queries, plus the retention
    panel's texts when it is scored; its thread and wall seconds cover the whole call."""
    import math

    from embedlab.core.beir import load_task
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
    from embedlab.model.encode import encode_texts
    from embedlab.model.flops import FlopTally
    from embedlab.tasks.metrics import METRIC_NAMES

    _, result = trained
    checkpoint = Path(result.checkpoint.path)
    task = load_task(prepared.task_dir("python-docstrings"))
    scores = evaluate_checkpoint(checkpoint, task, "dev")
    judged = {q for q, grades in task.qrels["dev"].items() if any(g > 0 for g in grades.values())}
    assert set(scores["per_query"]) == set(METRIC_NAMES)
    for metric, values in scores["per_query"].items():
        assert set(values) == judged and len(values) == scores["queries"]
        assert math.fsum(values.values()) / len(values) == pytest.approx(scores[metric], abs=1e-12)
    # The same passes by hand, with a tally of their own: the evaluation counted exactly these.
    encoder, tokenizer, manifest = load_encoder(checkpoint)
    prefixes = manifest["pooling"].get("prefixes", {"query": "", "passage": ""})
    by_hand = FlopTally()
    queries = task.split_queries("dev")
    for texts, prefix in (([task.doc_text(d) for d in sorted(task.corpus)], prefixes["passage"]),
                          (list(queries.values()), prefixes["query"])):
        encode_texts(encoder, tokenizer, texts, prefix=prefix, pooling=manifest["pooling"]["method"], tally=by_hand)
    assert scores["eval_flops"] == pytest.approx(by_hand.flops, rel=1e-12) and by_hand.flops > 0
    assert 0 < scores["eval_seconds"] and scores["seconds"] <= scores["eval_wall_seconds"]
    with_panel = evaluate_checkpoint(checkpoint, task, "dev", retention_dir=prepared.directory / "retention")
    assert with_panel["eval_flops"] > scores["eval_flops"]
    assert with_panel["per_query"] == scores["per_query"]


def test_evaluate_cli_json(trained, prepared, capsys):
    """`embedlab evaluate --json` prints the contract's keys for a BEIR directory."""
    _, result = trained
    code = main(["evaluate", "--encoder", result.checkpoint.path,
                 "--task", str(prepared.task_dir("python-docstrings")), "--split", "test", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {"ndcg@10", "recall@100", "mrr@10", "queries", "docs"} <= set(out)
    assert out["split"] == "test"


def test_evaluate_cli_builtin_task_uses_the_checkpoints_data(trained, prepared, capsys):
    """`evaluate --task python-docstrings` rebuilds nothing: it finds the task of the data the checkpoint trained on."""
    import ray

    from embedlab.evaluate.actor import get_evaluator

    _, result = trained
    assert main(["evaluate", "--encoder", result.checkpoint.path, "--task", "python-docstrings",
                 "--split", "dev", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    task_dir = str(prepared.task_dir("python-docstrings"))
    via_actor = ray.get(get_evaluator().evaluate.remote(result.checkpoint.path, task_dir, "dev"))
    assert out["task_hash"] == via_actor["task_hash"] and out["ndcg@10"] == via_actor["ndcg@10"]


@pytest.fixture(scope="module")
def phase2(trained, prepared, tmp_path_factory):
    import dataclasses

    from embedlab.core.config import ContrastiveConfig
    from embedlab.train.contrastive import run_contrastive

    _, parent = trained
    trial = dataclasses.replace(
        tiny_trial(num_workers=2, budget=tiny_budget(pairs=64)), phase=2, parent=parent.checkpoint.path,
        contrastive=ContrastiveConfig(pairs=(("title-body", 0.6), ("same-source-spans", 0.4)),
                                      pair_length=48, mlm_weight=0.3, symmetric=True),
    )
    result = run_contrastive(trial, prepared, storage_path=tmp_path_factory.mktemp("phase2"), name="phase2",
                             progress=lambda m: None)
    return trial, result


def test_phase2_joint_from_phase1_records_lineage(trained, phase2):
    """A joint phase-2 run on 2 workers starts from the phase-1 checkpoint, reaches its pair budget,
    reports both component losses and gradient norms, and records its parent and reset optimizer."""
    _, parent = trained
    trial, result = phase2
    assert result.error is None
    metrics = result.metrics
    assert 64 <= metrics["budget/pairs"] < 64 + 16
    for key in ("train/contrastive_loss", "train/mlm_loss", "train/grad_norm_contrastive", "train/grad_norm_mlm"):
        assert metrics[key] > 0
    # Forward anchors see 2 workers x 8 positives; reverse anchors see 2 x 8 queries.
    assert metrics["train/effective_candidates"] == 16
    shares = {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("data/observed_pair_share/")}
    assert abs(shares["title-body"] - 0.6) < 0.1
    manifest = verify_checkpoint(Path(result.checkpoint.path))
    assert manifest["phase"] == 2 and manifest["parent_phase"] == 1
    assert manifest["parent_hash"] == verify_checkpoint(Path(parent.checkpoint.path))["content_hash"]
    assert manifest["optimizer_start"] == "optimizer state and schedule clock reset at the phase start"
    assert {g["category"] for g in manifest["optimizer"]["groups"]} >= {"embedding", "norm", "weight"}
    assert manifest["pooling"]["prefixes"] == {"query": "query: ", "passage": "passage: "}
    assert "mlm_head.safetensors" in manifest["files"]


def test_phase3_with_mined_negatives_from_phase2(phase2, prepared, tmp_path_factory):
    """Phase 3 mines negatives with the phase-2 encoder, has MiniLM score every query's
    candidates and encode a training-split document per pair, trains on them (InfoNCE with KL,
    MarginMSE and embedding distillation, GradCache) from the phase-2 checkpoint and records the
    lineage, the teacher labels and the teacher embeddings; the mined set never uses dev/test
    documents or the pairs' own documents."""
    import dataclasses

    import pyarrow.parquet as pq
    import torch

    from embedlab.core.config import DistillationConfig, NegativesConfig
    from embedlab.train.contrastive import run_contrastive

    trial2, parent = phase2
    trial = dataclasses.replace(
        trial2, phase=3, parent=parent.checkpoint.path,
        contrastive=dataclasses.replace(trial2.contrastive, mlm_weight=0.0, pooling="cls", symmetric=False,
                                        gradcache_chunk=4, negatives=NegativesConfig(count=2, top_k=2000),
                                        distillation=DistillationConfig(teacher="all-MiniLM-L6-v2", kl_weight=0.3,
                                                                        margin_mse_weight=0.2,
                                                                        embedding_mse_weight=0.2)),
    )
    result = run_contrastive(trial, prepared, storage_path=tmp_path_factory.mktemp("phase3"), name="phase3",
                             progress=lambda m: None)
    assert result.error is None
    manifest = verify_checkpoint(Path(result.checkpoint.path))
    # The teacher's labels reached the workers as float scores (a long cast would zero them).
    distilled = manifest["objective"]["distillation"]
    assert (distilled["kl_weight"], distilled["margin_mse_weight"]) == (0.3, 0.2)
    labels = distilled["teacher_labels"]
    assert labels["teacher"]["name"] == "all-MiniLM-L6-v2" and labels["counts"]["pairs"] > 0
    assert (prepared.directory / "teacher-labels" / labels["set"] / "labels.parquet").is_file()
    assert result.metrics["compute/teacher_flops"] > 0 and result.metrics["data/teacher_pairs"] == labels["counts"]["pairs"]
    counts = labels["counts"]  # every pair agrees, disagrees, or has no negative to judge: once each
    assert counts["teacher_agrees"] + counts["teacher_disagrees"] + counts["pairs_without_negatives"] == counts["pairs"]
    assert result.metrics["data/teacher_pairs_without_negatives"] == counts["pairs_without_negatives"]
    assert 0 < result.metrics["train/kl_loss"] < 10 and 0 < result.metrics["train/margin_mse_loss"] < 10
    # The documents' targets reached the workers as floats too; their set and cost are recorded.
    documents = distilled["teacher_embeddings"]
    assert distilled["embedding_mse_weight"] == 0.2 and documents["projection"]["student_width"] == trial.model.width
    assert (prepared.directory / "teacher-embeddings" / documents["set"] / "embeddings.parquet").is_file()
    assert result.metrics["data/teacher_embedding_texts"] == documents["counts"]["pairs"] > 0
    assert result.metrics["compute/teacher_flops"] == pytest.approx(
        labels["compute"]["compute/teacher_flops"] + documents["compute"]["flops"])
    assert 0 < result.metrics["train/embedding_mse_loss"] < 1
    assert manifest["phase"] == 3 and manifest["parent_hash"] == verify_checkpoint(Path(parent.checkpoint.path))["content_hash"]
    assert manifest["objective"]["hard_negatives"] == 2 and manifest["objective"]["mined_set"]
    # Contrastive-only (mlm_weight 0): it carries its parent's MLM head unchanged, so it can be scored.
    from safetensors.torch import load_file

    head, parent_head = (load_file(str(Path(c.checkpoint.path) / "mlm_head.safetensors")) for c in (result, parent))
    assert head.keys() == parent_head.keys() and all(torch.equal(head[k], parent_head[k]) for k in head)
    assert manifest["objective"]["mlm_head"].startswith("the parent's")
    # Positives of both workers plus the mined negatives the batches carried (a weak phase-2
    # encoder scores many candidates above its positives, so the margin drops those).
    assert result.metrics["train/effective_candidates"] > 16
    mined_path = prepared.directory / "mined" / manifest["objective"]["mined_set"] / "negatives.parquet"
    mined = pq.read_table(mined_path)
    corpus = prepared.corpus.read().to_pydict()
    split = dict(zip(corpus["doc_id"], corpus["split"]))
    assert mined.num_rows > 0 and {split[d] for d in mined["doc_id"].to_pylist()} == {"train"}
    mined_counts = json.loads((mined_path.parent / "manifest.json").read_text())["counts"]
    assert result.metrics["data/mining_queries_with_negatives"] == (
        mined_counts["queries_with_negatives"] / mined_counts["queries"])
    assert mined_counts["queries_with_negatives"] == len(set(mined["pair_id"].to_pylist()))
    # A pair that has mined negatives gets them as non-empty rows in the training stream.
    from embedlab.pairs.table import pair_table_path
    from embedlab.streams.pair_stream import tokenize_pair_window

    pairs_path = pair_table_path(prepared, [b for b, _ in trial.contrastive.pairs], progress=lambda m: None)
    pair_ids = pq.read_table(pairs_path, columns=["pair_id"])["pair_id"].to_pylist()
    row = pair_ids.index(mined["pair_id"][0].as_py())
    window = tokenize_pair_window(
        {"rows": [[row]], "source_index": [[0]]}, pairs_path=str(pairs_path),
        tokenizer_path=str(prepared.tokenizer_path), length=48, query_prefix="query: ", passage_prefix="passage: ",
        negatives_path=str(mined_path), negatives_per_pair=2,
    )
    assert (window["negative_len"] > 0).all()
    # Scored as a sweep trial is (the trial driver's call: the trial's split, index and max_length,
    # the prepared data's retention panel), the actor's answer is the in-process evaluation's.
    import ray

    from embedlab.evaluate.actor import get_evaluator
    from embedlab.tasks.resolve import resolve_task

    task_dir = str(resolve_task(trial.eval.task, prepared.directory))
    retention = prepared.directory / "retention"
    via_actor = ray.get(get_evaluator().evaluate.remote(
        result.checkpoint.path, task_dir, trial.eval.split, trial.eval.index, str(retention), "phase3",
        max_length=trial.eval.max_length))
    ours = in_process(result.checkpoint.path, task_dir, trial.eval.split, index=trial.eval.index,
                      max_length=trial.eval.max_length, retention_dir=retention)
    assert via_actor["ndcg@10"] == ours["ndcg@10"]
    assert untimed(via_actor) == untimed(ours)
    assert ours["checkpoint_hash"] == manifest["content_hash"]


def test_dual_heads_whole_word_phase1(ray_session, prepared, tmp_path):
    """Phase 1 with 5%/50% masking mixed 4:1 and one head per ratio trains on Ray with whole-word
    masking, reports per-head losses and counts, and saves both heads apart from the encoder."""
    import dataclasses

    from safetensors.torch import load_file

    from embedlab.train.phase1 import run_phase1

    trial = tiny_trial(num_workers=1, batch_rows=10)
    trial = dataclasses.replace(trial, masking=dataclasses.replace(
        trial.masking, strategy="whole-word", mixed_ratios=((0.05, 4), (0.5, 1)), head_per_ratio=True))
    result = run_phase1(trial, prepared, storage_path=tmp_path, name="dual")
    assert result.error is None
    metrics = result.metrics
    for head in ("mask5", "mask50"):
        assert metrics[f"train/selected/head/{head}"] > 0 and metrics[f"train/loss/head/{head}"] > 0
    # 8 rows at 5% and 2 rows at 50% per batch: the 50% head sees more tokens than the 5% head.
    assert metrics["train/selected/head/mask50"] > metrics["train/selected/head/mask5"]
    manifest = verify_checkpoint(Path(result.checkpoint.path))
    assert manifest["objective"]["heads"] == ["mask5", "mask50"]
    heads = load_file(str(Path(result.checkpoint.path) / "mlm_head.safetensors"))
    assert {k.split(".")[0] for k in heads} == {"mask5", "mask50"}
    encoder, _, _ = load_encoder(Path(result.checkpoint.path))  # the inference package needs no head


USER_PAIRS_STUDY = """
from dataclasses import replace
from embedlab import Budget, Study, recipes
from embedlab.core.config import PairFiles, TrialConfig

def study(profile=None):
    base = TrialConfig.from_dict({config!r})
    data = replace(base.data, pair_files=(PairFiles(name="my-pairs", path={pairs!r}, rights="Debian package descriptions, each under its package's licence"),))
    arm = replace(base, data=data, parent=None)
    return Study(name="user-pairs", factor="contrastive.negatives.given_margin", seeds=(0,),
                 budget=Budget(tokens=1, pairs=64), arms={{"margin": arm, "no-margin": recipes.derive(arm, {{"contrastive.negatives.given_margin": "off"}})}})
"""


def test_phase3_on_user_pairs_ends_in_a_table_and_a_release(phase2, prepared, tmp_path, capsys):
    """The own-pairs guide's worked path (docs/guides/own-pairs.md): phase 3 on a user's JSONL
    pairs (given negatives, no mining), scored on the user's own BEIR folder, from a phase-2
    checkpoint, through the CLI: a sweep,
    its table, promotion (the final-eval split read once) and an exported release whose
    encoder is the promoted checkpoint's."""
    import dataclasses

    from embedlab.core.beir import Task, write_task
    from embedlab.core.config import NegativesConfig
    from embedlab.tasks.heldout import DPKG_STATUS, read_dpkg_status

    trial2, parent = phase2
    # Real text outside the test corpus (Python docs and docstrings): Debian package descriptions,
    # the first 120 packages as the user's pairs, the next 60 that quote none of them (related
    # packages share boilerplate paragraphs: a 10-word run in common, or a whole query, is a
    # leak the gate refuses) as the user's evaluation task.
    from conftest import audit_would_find, plain_words

    items = read_dpkg_status(DPKG_STATUS).items
    train = items[:120]
    train_texts = [plain_words(t) for it in train for t in (it.query, it.document)]

    def quotes_training(text: str) -> bool:
        return audit_would_find(plain_words(text), train_texts)

    held = [it for it in items[120:] if not quotes_training(it.query) and not quotes_training(it.document)][:60]
    assert len(held) == 60
    rows = [{"query": it.query, "positive": it.document, "negative": train[(i + 1) % len(train)].document}
            for i, it in enumerate(train)]
    pairs_file = tmp_path / "my_pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    qrels = {split: {f"q{i}": {f"d{i}": 1} for i in range(start, start + 30)} for split, start in (("dev", 0),
                                                                                                  ("test", 30))}
    task_dir = tmp_path / "my-task"
    write_task(Task(name="my-task", corpus={f"d{i}": ("", it.document) for i, it in enumerate(held)},
                    queries={f"q{i}": it.query for i, it in enumerate(held)}, qrels=qrels), task_dir)
    trial = dataclasses.replace(
        trial2, phase=3, eval=dataclasses.replace(trial2.eval, task=str(task_dir)),
        contrastive=dataclasses.replace(trial2.contrastive, pairs=(("my-pairs", 0.75), ("title-body", 0.25)),
                                        mlm_weight=0.0, negatives=NegativesConfig(count=1, mine=False)))
    study_file = tmp_path / "user_pairs.py"
    study_file.write_text(USER_PAIRS_STUDY.format(config=trial.to_dict(), pairs=str(pairs_file)))
    runs = tmp_path / "runs"
    assert main(["sweep", str(study_file), "--parent", parent.checkpoint.path, "--storage", str(runs)]) == 0
    run_dir = only_run(runs)
    table = load_table(str(run_dir))
    assert sorted(table["arm"]) == ["margin", "no-margin"] and table["dev/ndcg@10"].notna().all()
    assert (table["budget/pairs"] >= 64).all()
    # Both arms read the same scheduled pairs and their given negatives; both drop a negative
    # whose text is (a near-duplicate of) its row's positive, the text rules (here: the next
    # package's description, a -dev or -doc package's copy of its library's); the margin arm
    # also screens them under the parent encoder (and pays for it).
    given = {arm: verify_checkpoint(Path(c))["objective"]["given_negatives"]
             for arm, c in zip(table["arm"], table["checkpoint"])}
    assert given["margin"]["given"] == given["no-margin"]["given"] > 0
    for arm in ("margin", "no-margin"):
        assert given[arm]["kept"] + sum(given[arm]["dropped"].values()) == given[arm]["given"], arm
    text_rules = {rule: n for rule, n in given["no-margin"]["dropped"].items() if rule != "false-negative-margin"}
    assert given["no-margin"]["dropped"]["false-negative-margin"] == 0
    assert {rule: given["margin"]["dropped"][rule] for rule in text_rules} == text_rules
    assert given["margin"]["dropped"]["false-negative-margin"] > 0
    screened = dict(zip(table["arm"], table["compute/given_negatives_flops"]))
    assert screened["margin"] > 0 and not screened["no-margin"] > 0
    # The trials' work before training reached the sweep's console, each line named by its trial.
    console = capsys.readouterr().out.splitlines()
    for arm in ("margin", "no-margin"):
        assert any(line.startswith(f"trial final {arm} seed 0: given negatives: ") for line in console), arm
    assert main(["table", str(run_dir)]) == 0
    assert "no-margin" in capsys.readouterr().out
    assert main(["promote", str(run_dir), "--max-retention-drop", "1.0"]) == 0
    promotion = json.loads((run_dir / "promotion.json").read_text())
    assert promotion["final_eval"]["split"] == "test" and promotion["final_eval"]["queries"] == 30
    release = tmp_path / "release"
    assert main(["export", promotion["checkpoint"], str(release)]) == 0
    from embedlab.release.export import MANIFEST_FILE

    manifest = json.loads((release / MANIFEST_FILE).read_text())
    assert manifest["exported_from"] == verify_checkpoint(Path(promotion["checkpoint"]))["content_hash"]
    # The user's pairs were frozen, with their provenance and rights note, in the parent's
    # prepared directory (the pair sources are not part of its key).
    records = list((prepared.directory / "user-pairs").glob("*/record.json"))
    assert len(records) == 1 and "Debian package descriptions" in records[0].read_text()
