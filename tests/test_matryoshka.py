"""Matryoshka training: the loss at nested widths against an independent reference, GradCache =
plain, two gloo workers = one process, the FLOP counter against FlopCounterMode, the config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import synthetic
from embedlab.core.config import ConfigError, ContrastiveConfig, MatryoshkaConfig
from embedlab.objectives.contrastive import multi_positive_infonce, pair_masks
from embedlab.objectives.gather import gather_no_grad, gather_with_grad
from embedlab.objectives.gradcache import gradcache_step
from embedlab.objectives.matryoshka import matryoshka_loss, truncate, weighted_terms

from gloo import run_on_two_workers
from test_gather import CANDIDATE_GROUPS, CANDIDATE_SPLIT, QUERY_GROUPS, QUERY_SPLIT, build, gradients

WIDTHS, WEIGHTS = (2, 4, 8), (1.0, 0.5, 2.0)


def test_truncate_is_the_prefix_renormalised():
    x = torch.tensor([[3.0, 4.0, 12.0], [0.0, 0.0, 5.0]], dtype=torch.float64)
    torch.testing.assert_close(truncate(x, 2), torch.tensor([[0.6, 0.8], [0.0, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(truncate(x, 3), x / x.norm(dim=1, keepdim=True))
    for width in (0, 4):
        with pytest.raises(ValueError, match="truncation width must be in 1..3"):
            truncate(x, width)


def _reference(queries, candidates, targets, excluded, tau):
    """sum_k w_k * mean cross-entropy over rows with a target, written out by hand: truncate,
    renormalise, score, drop excluded candidates, softmax over the rest."""
    total = 0.0
    for width, weight in zip(WIDTHS, WEIGHTS):
        q = queries[:, :width] / queries[:, :width].norm(dim=1, keepdim=True)
        c = candidates[:, :width] / candidates[:, :width].norm(dim=1, keepdim=True)
        logits = (q @ c.T / tau).masked_fill(excluded, float("-inf"))
        rows = targets >= 0
        total += weight * F.cross_entropy(logits[rows], targets[rows])
    return total


def test_matryoshka_loss_equals_a_hand_written_reference():
    """At three widths with weights, a temperature of 0.07, an excluded candidate and a query
    without a positive: the weighted per-width means, and the counts of one width."""
    generator = torch.Generator().manual_seed(0)
    queries = F.normalize(torch.randn(5, 8, generator=generator, dtype=torch.float64), dim=1)
    candidates = F.normalize(torch.randn(7, 8, generator=generator, dtype=torch.float64), dim=1)
    query_groups, candidate_groups = torch.tensor([0, 1, 2, 3, 9]), torch.tensor([0, 1, 2, 3, 4, 5, 6])
    exclude = torch.zeros(5, 7, dtype=torch.bool)
    exclude[0, 5] = True
    masks = pair_masks(query_groups, candidate_groups, exclude=exclude)

    def term(q, c):
        return multi_positive_infonce(q, c, masks.positive, masks.eligible, temperature=0.07)

    got = matryoshka_loss(term, queries, candidates, WIDTHS, WEIGHTS)
    want = _reference(queries, candidates, torch.tensor([0, 1, 2, 3, -1]), exclude, 0.07)
    assert int(got.valid) == 4 and got.anchors == 5 and int(got.candidate_sum) == 4 * 7 - 1
    torch.testing.assert_close(got.mean, want, atol=1e-12, rtol=0)


def test_terms_over_different_anchors_are_refused():
    one = multi_positive_infonce(torch.eye(2), torch.eye(2), torch.eye(2, dtype=torch.bool),
                                 torch.ones(2, 2, dtype=torch.bool), temperature=0.1)
    other = multi_positive_infonce(torch.eye(3), torch.eye(3), torch.eye(3, dtype=torch.bool),
                                   torch.ones(3, 3, dtype=torch.bool), temperature=0.1)
    with pytest.raises(ValueError, match="different anchors"):
        weighted_terms([one, other], [1.0, 1.0])
    with pytest.raises(ValueError, match="2 terms but 1 weights"):
        weighted_terms([one, one], [1.0])


def _term(model, masks):
    def term(q, c):
        return multi_positive_infonce(q, gather_with_grad(c), masks.positive, masks.eligible,
                                      temperature=model.temperature())

    return lambda q, c: matryoshka_loss(term, q, c, WIDTHS, WEIGHTS)


def test_gradcache_equals_the_plain_matryoshka_step():
    """Chunks of 2 and 3 (unequal last chunks): GradCache's loss and every gradient equal the
    plain step's, the learnable temperature's included, in float64."""
    model, queries, candidates, exclude = build()
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclude)
    loss_fn = _term(model, masks)
    plain = loss_fn(model(queries), model(candidates))
    plain.mean.backward()
    plain_grads = gradients(model)
    model.zero_grad(set_to_none=True)
    cached = gradcache_step(model, queries.split(2), candidates.split(3), loss_fn)
    torch.testing.assert_close(cached.loss_sum, plain.loss_sum.detach(), atol=1e-12, rtol=0)
    for got, want in zip(gradients(model), plain_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def _worker(rank: int):
    model, queries, candidates, exclude = build()
    mine_q = slice(0, QUERY_SPLIT) if rank == 0 else slice(QUERY_SPLIT, None)
    mine_c = slice(0, CANDIDATE_SPLIT) if rank == 0 else slice(CANDIDATE_SPLIT, None)
    masks = pair_masks(QUERY_GROUPS[mine_q], gather_no_grad(CANDIDATE_GROUPS[mine_c]), exclude=exclude[mine_q])
    global_valid = masks.positive.any(dim=1).sum()
    dist.all_reduce(global_valid)
    local = _term(model, masks)(model(queries[mine_q]), model(candidates[mine_c]))
    local.objective(int(global_valid)).backward()
    for p in model.parameters():  # summed over workers, as embedlab's trainer does
        dist.all_reduce(p.grad)
    figures = torch.tensor([float(local.loss_sum), float(local.valid)], dtype=torch.float64)
    dist.all_reduce(figures)
    return figures.tolist(), [g.numpy() for g in gradients(model)]


@pytest.mark.timeout(120)
def test_two_gloo_workers_equal_one_process():
    """Two workers (5+4 queries, 7+4 candidates) gathering candidates at every width: the
    one-process loss, count and gradients."""
    results = run_on_two_workers(_worker)
    model, queries, candidates, exclude = build()
    masks = pair_masks(QUERY_GROUPS, CANDIDATE_GROUPS, exclude=exclude)
    whole = _term(model, masks)(model(queries), model(candidates))
    whole.mean.backward()
    for (loss_sum, valid), grads in results:
        assert valid == int(whole.valid) == 8
        assert abs(loss_sum / valid - float(whole.mean.detach())) < 1e-12
        for got, want in zip(grads, gradients(model)):
            torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("gradcache", [False, True])
def test_the_step_counts_every_widths_score_matrices(frozen, parent, tmp_path, gradcache):
    """A symmetric step at widths 8, 16, 32 against the same step at the full width alone: the
    counter's difference is FlopCounterMode's, exactly (the extra score matrices, both
    directions, forward and backward), and `expected_step_flops` predicts the step."""
    from embedlab.model.flops import expected_step_flops
    from test_flops import reference_step_flops

    trial = synthetic.contrastive_trial(parent, gradcache=gradcache)
    trial = dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, mlm_weight=0.0))
    nested = dataclasses.replace(trial, contrastive=dataclasses.replace(
        trial.contrastive, matryoshka=MatryoshkaConfig(dims=(8, 16, 32), weights=(1.0, 1.0, 2.0))))
    rows = synthetic.pair_rows(frozen, 16)
    full_counted, full_reference = reference_step_flops(trial, frozen, rows, tmp_path / "full")
    nested_counted, nested_reference = reference_step_flops(nested, frozen, rows, tmp_path / "nested")
    assert nested_counted - full_counted == pytest.approx(nested_reference - full_reference, rel=1e-9)
    assert nested_counted > full_counted
    if not gradcache:
        assert nested_counted == pytest.approx(expected_step_flops(nested), rel=1e-12)


def test_the_config_refuses_widths_it_cannot_train():
    for dims, weights, message in (((16, 8), (), "increasing order"), ((8, 8), (), "each once"),
                                   ((0, 8), (), "positive integer"), ((8, 16), (1.0,), "one positive weight"),
                                   ((8, 16), (1.0, 0.0), "one positive weight")):
        with pytest.raises(ConfigError, match=message):
            MatryoshkaConfig(dims=dims, weights=weights)
    assert MatryoshkaConfig(dims=[8, 16]).dims == (8, 16)  # a study's list
    assert ContrastiveConfig().matryoshka.trained_widths(128) == ((128,), (1.0,))
    assert MatryoshkaConfig(dims=(32, 128)).trained_widths(128) == ((32, 128), (1.0, 1.0))
    trial = synthetic.contrastive_trial(Path("parent"))  # never read: the config alone
    with pytest.raises(ConfigError, match="at most model.width=32"):
        dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive,
                                                                   matryoshka=MatryoshkaConfig(dims=(16, 64))))


# --- scoring at truncated widths (eval.dims) ---------------------------------------------------


def test_truncated_scoring_equals_a_hand_computation():
    """Two queries, three documents, embeddings of width 4 whose first 2 coordinates rank the
    documents otherwise: at width 2 the first query's relevant document falls to rank 2 and
    the second's stays first, so nDCG@10 is (1/log2(3) + 1) / 2 and MRR@10 (1/2 + 1) / 2; the
    full width keeps its own scores beside them, and the texts are encoded once."""
    import math

    import numpy as np

    from embedlab.core.beir import Task
    from embedlab.tasks.retrieval import evaluate_encoder, truncated

    vectors = {"d1": [0.5, 0.5, 0.0, 3.0], "d2": [0.9, 0.1, 1.0, 0.0], "d3": [0.0, 1.0, 0.0, 0.0],
               "q1": [1.0, 0.0, 0.0, 3.0], "q2": [0.0, 1.0, 0.0, 0.0]}
    task = Task(name="tiny", corpus={d: ("", d) for d in ("d1", "d2", "d3")}, queries={"q1": "q1", "q2": "q2"},
                qrels={"dev": {"q1": {"d1": 1}, "q2": {"d3": 1}}})
    calls = []

    def encode(texts):
        calls.append(len(texts))
        rows = np.array([vectors[t] for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    scores = evaluate_encoder(encode, task, "dev", dims=(2,))
    assert calls == [3, 2]
    assert scores["ndcg@10"] == pytest.approx(1.0) and scores["mrr@10"] == pytest.approx(1.0)
    assert scores["dim2/ndcg@10"] == pytest.approx((1 / math.log2(3) + 1) / 2, abs=1e-6)
    assert scores["dim2/mrr@10"] == pytest.approx(0.75, abs=1e-6)
    assert scores["per_query"]["dim2/ndcg@10"] == pytest.approx({"q1": 1 / math.log2(3), "q2": 1.0}, abs=1e-6)
    np.testing.assert_allclose(truncated(np.array([[3.0, 4.0, 12.0]]), 2), [[0.6, 0.8]], atol=1e-7)


def test_a_width_scores_what_an_encoder_of_that_width_scores(frozen, parent):
    """evaluate_checkpoint at eval.dims: each `dim<w>/...` metric and per-query value equals
    scoring the same checkpoint through an encoder whose output is truncated to w and
    re-normalised (a second path through the evaluator), and a row's columns carry them."""
    from functools import partial

    from embedlab.checkpoints.io import load_encoder
    from embedlab.core.beir import Task
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
    from embedlab.model.encode import encode_texts
    from embedlab.records.scores import _score_columns
    from embedlab.tasks.retrieval import evaluate_encoder, truncated

    texts = synthetic.TEXTS[:40]
    task = Task(name="synthetic", corpus={f"d{i}": ("", t) for i, t in enumerate(texts)},
                queries={f"q{i}": t.split(" jumps")[0] for i, t in enumerate(texts[:12])},
                qrels={"dev": {f"q{i}": {f"d{i}": 1} for i in range(12)}})
    scores = evaluate_checkpoint(parent, task, "dev", dims=(8, 16))
    encoder, tokenizer, manifest = load_encoder(parent)
    prefixes = manifest["pooling"].get("prefixes", {"query": "", "passage": ""})
    for width in (8, 16):
        encode = partial(encode_texts, encoder, tokenizer, pooling=manifest["pooling"]["method"])
        narrow = evaluate_encoder(lambda t: truncated(encode(t, prefix=prefixes["query"]), width), task, "dev",
                                  encode_documents=lambda t: truncated(encode(t, prefix=prefixes["passage"]), width))
        for name in ("ndcg@10", "recall@100", "mrr@10", "map"):
            assert scores[f"dim{width}/{name}"] == pytest.approx(narrow[name], abs=1e-6), (width, name)
            assert scores["per_query"][f"dim{width}/{name}"] == pytest.approx(narrow["per_query"][name], abs=1e-6)
    columns = _score_columns({**scores, "index": "flat"}, "dev")
    assert {f"dev/dim{w}/{m}" for w in (8, 16) for m in ("ndcg@10", "mrr@10")} <= set(columns)


def test_eval_dims_are_validated_against_the_model():
    from embedlab.core.config import EvalConfig

    for dims in ((16, 8), (0,), (8, 8)):
        with pytest.raises(ConfigError, match="eval.dims"):
            EvalConfig(dims=dims)
    trial = synthetic.contrastive_trial(Path("parent"))
    with pytest.raises(ConfigError, match="below model.width=32"):
        dataclasses.replace(trial, eval=dataclasses.replace(trial.eval, dims=(8, 32)))


def test_a_study_metric_at_a_width_needs_every_arm_to_score_it():
    """ablations/matryoshka.py ranks on the quarter width (every arm lists it in eval.dims,
    the full width beside it); a width one arm does not score is refused, naming the arm."""
    from embedlab.studies.study import load_study

    study = load_study(Path(__file__).parent.parent / "ablations" / "matryoshka.py", "cpu")
    assert study.metric == "dev/dim32/ndcg@10"
    assert {arm: config.contrastive.matryoshka.dims for arm, config in study.arms.items()} == {
        "full": (), "nested": (32, 64, 128), "quarter": (32,)}
    assert all(config.eval.dims == (32,) for config in study.arms.values())
    with pytest.raises(ConfigError, match=r"width 16, which arms \['full', 'nested', 'quarter'\] do not list"):
        dataclasses.replace(study, metric="dev/dim16/ndcg@10")
