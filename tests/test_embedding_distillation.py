"""Embedding distillation: the student's unit embeddings of training-split documents regressed
onto a teacher's (`contrastive.distillation.embedding_mse_weight`). The fixed projection against its stated
definition, the cut to the student's pair length against a brute-force search over token
boundaries, the documents' assignment and the set's masks and refusals, and the term in
training: GradCache = plain, two gloo workers = one process (beside KL and MarginMSE), the
step's FLOPs against FlopCounterMode and the loop's reported terms. The real teacher and the
audit are tested with the prepared corpus in test_gate.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import synthetic
from embedlab.core.config import ConfigError, ContrastiveConfig, DistillationConfig
from embedlab.objectives.contrastive import multi_positive_infonce, pair_masks
from embedlab.teacher import embeddings as te, labels as teacher_labels
from embedlab.teacher.labels import TeacherLabelsError
from embedlab.teacher.student_view import cut_to_tokens
from embedlab.objectives.distillation import (
    embedding_mse, kl_distillation, kl_rows, margin_mse, margin_pairs, own_candidate_scores, with_distillation,
)
from embedlab.objectives.gather import gather_no_grad, gather_with_grad
from embedlab.objectives.gradcache import gradcache_step

from gloo import run_on_two_workers
from test_distillation import KL_WEIGHT, MARGIN_WEIGHT, TAU_STUDENT, TAU_TEACHER, TEACHER, K, N, _build, \
    _candidates, _groups, _negative_rows
from test_gather import gradients

EMBED_WEIGHT = 0.25
WIDTH = 8  # the tiny encoder's


# --- the projection -----------------------------------------------------------------------------

def test_projection_is_the_stated_orthonormal_map():
    """Narrower student: P has orthonormal rows and target = P t / |P t|; wider: orthonormal
    columns, so every cosine between texts is kept exactly; equal: the identity. Seeded: the
    same matrix every time, another seed another matrix."""
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((5, 12))
    teacher /= np.linalg.norm(teacher, axis=1, keepdims=True)
    narrow = te.projection_matrix(12, 4)
    np.testing.assert_allclose(narrow @ narrow.T, np.eye(4), atol=1e-12)
    by_hand = teacher @ narrow.T
    by_hand /= np.linalg.norm(by_hand, axis=1, keepdims=True)
    np.testing.assert_allclose(te.project(teacher, 4), by_hand, atol=1e-6)
    wide = te.projection_matrix(12, 20)
    np.testing.assert_allclose(wide.T @ wide, np.eye(12), atol=1e-12)
    lifted = te.project(teacher, 20)
    np.testing.assert_allclose(lifted @ lifted.T, teacher @ teacher.T, atol=1e-6)
    np.testing.assert_array_equal(te.projection_matrix(12, 12), np.eye(12))
    np.testing.assert_array_equal(te.projection_matrix(12, 4), narrow)
    assert not np.allclose(te.projection_matrix(12, 4, seed=1), narrow)


# --- the documents -------------------------------------------------------------------------------

TEXTS = (
    "The dpkg database records every package installed on the system, with its version and status.",
    "A tuple is an immutable sequence; lists are mutable and may grow or shrink in place.",
    "short text",
    "Reconfiguring the network interfaces requires restarting the networking service afterwards.",
)


def _brute_force_cut(tokenizer, text: str, prefix: str, max_tokens: int) -> str:
    """The longest start of `text`, ending where one of its tokens (in context) ends, that fits."""
    encoding = tokenizer.tokenizer.encode(prefix + text, add_special_tokens=False)
    ends = sorted({end - len(prefix) for _, end in encoding.offsets if end > len(prefix)} | {len(text)}, reverse=True)
    for end in ends:
        cut = text[:end].rstrip()
        if len(tokenizer.encode_batch([prefix + cut])[0]) <= max_tokens:
            return cut
    return ""


@pytest.mark.parametrize("max_tokens", [3, 12, 20, 40, 200])
def test_a_document_is_cut_to_the_longest_start_that_fits(frozen, max_tokens):
    """(3: the prefix alone is longer, so nothing of the text is kept.)"""
    for text in TEXTS:
        cut = cut_to_tokens(frozen, text, prefix="passage: ", max_tokens=max_tokens)
        assert text.startswith(cut)
        assert cut == "" or len(frozen.encode_batch(["passage: " + cut])[0]) <= max_tokens
        assert cut == _brute_force_cut(frozen, text, "passage: ", max_tokens)
    assert cut_to_tokens(frozen, TEXTS[0], prefix="passage: ", max_tokens=200) == TEXTS[0]


def test_documents_are_dealt_once_each_in_a_seeded_order():
    """Distinct pairs get distinct documents until they run out, then the order repeats; the
    same seed deals the same way whatever order the pair ids come in."""
    docs = [f"d{i}" for i in range(5)]
    pairs = [f"p{i}" for i in range(12)]
    dealt = te.assign_documents(pairs, docs, seed=3)
    first = [dealt[p] for p in sorted(pairs)]
    assert sorted(first[:5]) == docs and first[5:10] == first[:5] and first[10:] == first[:2]
    assert te.assign_documents(list(reversed(pairs)) + pairs[:3], docs, seed=3) == dealt
    assert te.assign_documents(pairs, docs, seed=4) != dealt
    with pytest.raises(TeacherLabelsError, match="training-split documents"):
        te.assign_documents(pairs, [], seed=3)


def _identity(**changed):
    fields = dict(teacher={"name": TEACHER, "weights_sha256": "ab" * 32}, passage_prefix="", student_prefix="passage: ",
                  corpus_revision="rev-1", tokenizer_hash="t" * 64, pair_length=16, student_width=3, seed=7,
                  pair_ids=["p1", "p2"], code="code-1")
    return te.embeddings_identity(**{**fields, **changed})


def test_a_set_gives_each_pair_its_text_and_target_and_masks_what_it_lacks(tmp_path):
    targets = np.array([[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]], dtype=np.float32)
    table = te.embeddings_table(["p1", "p2"], ["d9", "d4"], ["first text", "second text"], targets)
    directory = te.write_embeddings(tmp_path / "set", table, _identity(), {"flops": 5.0, "seconds": 1.0,
                                                                          "wall_seconds": 2.0})
    texts, rows = te.embedding_rows(str(directory / te.EMBEDDINGS_FILE), ["p2", "p7", "p1"])
    assert texts == ["second text", "", "first text"]
    np.testing.assert_array_equal(rows[[0, 2]], targets[[1, 0]])
    assert np.isnan(rows[1]).all()
    assert list(te.teacher_embedding_items(directory)) == [("set:p1:d9", "first text"), ("set:p2:d4", "second text")]
    assert teacher_labels.set_cost(directory) == {"flops": 5.0, "seconds": 1.0, "wall_seconds": 2.0}
    manifest = te.load_manifest(directory, _identity())
    assert manifest["counts"] == {"pairs": 2, "documents": 2, "empty_texts": 0}
    assert "not human" not in manifest["labels"] and "a model's vectors" in manifest["labels"]
    assert manifest["disclosure"] == te.VECTORS_DISCLOSURE and "vectors" in manifest["disclosure"]
    with pytest.raises(TeacherLabelsError, match="pair_length, projection differ"):
        te.load_manifest(directory, _identity(pair_length=32, student_width=4))
    with pytest.raises(TeacherLabelsError, match="incomplete or absent"):
        te.load_manifest(tmp_path / "none", _identity())


def test_the_config_takes_embedding_distillation_in_phase_2_too():
    settings = ContrastiveConfig(distillation=DistillationConfig(teacher=TEACHER, embedding_mse_weight=0.5))  # no negatives
    assert settings.distillation.weight == 0.5 and settings.distillation.score_weight == 0
    with pytest.raises(ConfigError, match="need a teacher"):
        DistillationConfig(embedding_mse_weight=0.5)
    with pytest.raises(ConfigError, match="at most 1"):
        DistillationConfig(teacher=TEACHER, kl_weight=0.6, embedding_mse_weight=0.6)
    with pytest.raises(ConfigError, match=r"must be in \[0, 1\]"):
        DistillationConfig(teacher=TEACHER, embedding_mse_weight=1.5)


# --- the term in training: GradCache and workers -------------------------------------------------

def _targets():
    """(N, WIDTH) unit targets for N documents, row 3 without one (nan: masked)."""
    generator = torch.Generator().manual_seed(5)
    targets = F.normalize(torch.randn(N, WIDTH, generator=generator, dtype=torch.float64), dim=1)
    targets[3] = math.nan
    return targets, torch.isfinite(targets).all(dim=1)


def _loss_fn(model, teacher, mask, targets, target_mask, valid, counts, query_groups, candidate_groups):
    """InfoNCE over gathered candidates, KL and MarginMSE over each query's own, and embedding
    MSE of the documents appended after the candidates, folded against the global counts."""
    masks = pair_masks(query_groups, gather_no_grad(candidate_groups))
    documents = len(targets)

    def loss_fn(q, c):
        c, d = c[:-documents], c[-documents:]
        infonce = multi_positive_infonce(q, gather_with_grad(c), masks.positive, masks.eligible,
                                         temperature=model.temperature())
        own = own_candidate_scores(q, c, K)
        terms = {"kl": (kl_distillation(own, teacher, mask, student_temperature=TAU_STUDENT,
                                        teacher_temperature=TAU_TEACHER), KL_WEIGHT, counts[0]),
                 "margin_mse": (margin_mse(own, teacher, mask), MARGIN_WEIGHT, counts[1]),
                 "embedding_mse": (embedding_mse(d, targets, target_mask), EMBED_WEIGHT, counts[2])}
        return with_distillation(infonce, terms, valid)

    return loss_fn


def _documents(rows: slice) -> torch.Tensor:
    return torch.randn(N, 12, generator=torch.Generator().manual_seed(9), dtype=torch.float64)[rows]


def test_gradcache_equals_the_plain_step_with_documents():
    """Chunks of 2 queries and 5 of the candidates-then-documents rows (a chunk straddles the
    boundary): GradCache's loss and every gradient equal the plain backward's, in float64."""
    model, queries, candidates, teacher, mask = _build()
    targets, target_mask = _targets()
    counts = (int(kl_rows(mask).sum()), int(margin_pairs(mask).sum()), int(target_mask.sum()))
    loss_fn = _loss_fn(model, teacher, mask, targets, target_mask, N, counts, *_groups(slice(None)))
    rows = torch.cat([candidates, _documents(slice(None))])
    plain = loss_fn(model(queries), model(rows))
    plain.objective(N).backward()
    plain_grads = gradients(model)
    named = dict(plain.terms)["embedding_mse"]
    assert int(named.count) == N - 1 and float(named.loss_sum.detach()) > 0
    model.zero_grad(set_to_none=True)
    cached = gradcache_step(model, queries.split(2), rows.split(5), loss_fn, global_valid=N)
    torch.testing.assert_close(cached.loss_sum, plain.loss_sum.detach(), atol=1e-12, rtol=0)
    for got, want in zip(gradients(model), plain_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def _worker(rank: int):
    model, queries, candidates, teacher, mask = _build()
    targets, target_mask = _targets()
    rows = slice(0, 4) if rank == 0 else slice(4, None)
    counts = torch.tensor([float(kl_rows(mask[rows]).sum()), float(margin_pairs(mask[rows]).sum()),
                           float(target_mask[rows].sum()), float(len(range(N)[rows]))], dtype=torch.float64)
    dist.all_reduce(counts)
    kl_count, margin_count, embed_count, valid = (int(x) for x in counts.tolist())
    loss_fn = _loss_fn(model, teacher[rows], mask[rows], targets[rows], target_mask[rows], valid,
                       (kl_count, margin_count, embed_count), *_groups(rows))
    local = loss_fn(model(queries[rows]), model(torch.cat([_candidates(candidates, rows), _documents(rows)])))
    local.objective(valid).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    figures = torch.stack([local.loss_sum.detach()] + [dict(local.terms)[name].loss_sum.detach()
                                                       for name in ("kl", "margin_mse", "embedding_mse")]).double()
    dist.all_reduce(figures)
    return figures.tolist(), [g.numpy() for g in gradients(model)]


@pytest.mark.timeout(120)
def test_two_gloo_workers_equal_one_process_with_documents():
    """Two workers (4 + 2 queries, each with its own candidates and documents; the masked
    document on the first): the one-process folded loss, each term's sum and every gradient."""
    results = run_on_two_workers(_worker)
    model, queries, candidates, teacher, mask = _build()
    targets, target_mask = _targets()
    counts = (int(kl_rows(mask).sum()), int(margin_pairs(mask).sum()), int(target_mask.sum()))
    whole = _loss_fn(model, teacher, mask, targets, target_mask, N, counts, *_groups(slice(None)))(
        model(queries), model(torch.cat([candidates, _documents(slice(None))])))
    whole.objective(N).backward()
    want = [float(whole.loss_sum.detach())] + [float(dict(whole.terms)[name].loss_sum.detach())
                                               for name in ("kl", "margin_mse", "embedding_mse")]
    for figures, grads in results:
        assert figures == pytest.approx(want, abs=1e-12)
        for got, expected in zip(grads, gradients(model)):
            torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-12, rtol=1e-10)


# --- the training step ---------------------------------------------------------------------------

def _document_rows(frozen, rows: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """`rows` with a document a pair (another row's query) and a unit target; row 2 has none."""
    rows = dict(rows)
    rows["distill_ids"] = rows["query_ids"][::-1].copy()
    targets = np.random.default_rng(6).standard_normal((len(rows["query_ids"]), width)).astype(np.float32)
    targets /= np.linalg.norm(targets, axis=1, keepdims=True)
    targets[2] = np.nan
    rows["teacher_embedding"] = targets
    return rows


def test_the_step_counts_the_documents_passes(frozen, parent, tmp_path):
    """Phase 3 with KL, MarginMSE and embedding MSE: the counter agrees with FlopCounterMode on
    the whole step, and the documents add what FlopCounterMode says a third group of passes
    costs, and what `expected_step_flops` predicts from the config (exact on the dense path)."""
    from embedlab.model.flops import expected_step_flops
    from test_flops import assert_close, reference_step_flops

    scores = synthetic.phase3_trial(parent, teacher=TEACHER, kl_weight=KL_WEIGHT, margin_mse_weight=MARGIN_WEIGHT)
    both = synthetic.phase3_trial(parent, teacher=TEACHER, kl_weight=KL_WEIGHT, margin_mse_weight=MARGIN_WEIGHT,
                                  embedding_mse_weight=EMBED_WEIGHT)
    rows = _negative_rows(frozen)
    base_counted, base_reference = reference_step_flops(scores, frozen, rows, tmp_path / "scores")
    counted, reference = reference_step_flops(both, frozen, _document_rows(frozen, rows, both.model.width),
                                              tmp_path / "both")
    assert_close(counted, reference)
    assert counted - base_counted == pytest.approx(reference - base_reference, rel=1e-9)
    assert counted - base_counted == pytest.approx(expected_step_flops(both) - expected_step_flops(scores), rel=1e-12)


def test_the_loop_reports_the_embedding_term_in_its_weighted_sum(frozen, parent, tmp_path):
    """Phase 2 (no negatives): train/loss = (1 - w) * InfoNCE mean + w * embedding MSE mean, the
    latter over the rows with a target (one has none), both reported."""
    from embedlab.streams.packed import worker_rows
    from embedlab.train.session import LocalSession

    trial = synthetic.contrastive_trial(parent)
    trial = dataclasses.replace(trial, contrastive=dataclasses.replace(
        trial.contrastive, distillation=DistillationConfig(teacher=TEACHER, embedding_mse_weight=EMBED_WEIGHT)))
    loop = synthetic.make_loop(trial, frozen)
    rows = _document_rows(frozen, synthetic.pair_rows(frozen, 16), trial.model.width)
    batches = LocalSession(rows, tmp_path).global_batches(trial.train.batch_rows)
    loop.start_clock()
    loop.step([worker_rows(next(batches), 0, 1) for _ in range(loop.batches_per_step)])
    metrics = loop.metrics()
    infonce, embed = metrics["train/contrastive_loss"], metrics["train/embedding_mse_loss"]
    assert "train/kl_loss" not in metrics and embed > 0
    assert metrics["train/loss"] == pytest.approx((1 - EMBED_WEIGHT) * infonce + EMBED_WEIGHT * embed, rel=1e-6)
