"""Distillation from teacher labels: KL and MarginMSE against independent references (a
temperature, a masked candidate), folded beside the InfoNCE with exact global counts, GradCache
= plain, two gloo workers = one process, the step's FLOPs against FlopCounterMode, the
teacher labels' table, versioning and masks, and the config's refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import synthetic
from embedlab.core.config import ConfigError, ContrastiveConfig, DistillationConfig, NegativesConfig
from embedlab.objectives.contrastive import multi_positive_infonce, pair_masks
from embedlab.objectives.distillation import (
    TermSum, embedding_mse, kl_distillation, kl_rows, margin_mse, margin_pairs, own_candidate_scores,
    with_distillation,
)
from embedlab.objectives.gather import gather_no_grad, gather_with_grad
from embedlab.objectives.gradcache import gradcache_step

from gloo import run_on_two_workers
from test_gather import TinyEncoder, gradients

TEACHER = "all-MiniLM-L6-v2"
N, K = 6, 2  # queries, negatives per query
KL_WEIGHT, MARGIN_WEIGHT = 0.3, 0.2
TAU_STUDENT, TAU_TEACHER = 0.07, 0.02


def _scores(seed: int = 0):
    """Student (N, 1+K) differentiable cosines, teacher cosines and a mask with a missing
    negative (row 1), a row with only its positive (row 2) and a missing positive (row 4)."""
    generator = torch.Generator().manual_seed(seed)
    student = (torch.rand(N, 1 + K, generator=generator, dtype=torch.float64) * 2 - 1).requires_grad_()
    teacher = torch.rand(N, 1 + K, generator=generator, dtype=torch.float64) * 2 - 1
    mask = torch.ones(N, 1 + K, dtype=torch.bool)
    mask[1, 2] = False
    mask[2, 1:] = False
    mask[4, 0] = False
    teacher = teacher.masked_fill(~mask, math.nan)  # what the stream gives: nan where no label
    return student, teacher, mask


def test_kl_distillation_equals_torch_kl_div_row_by_row():
    """Per counted row: torch's kl_div of the student's log-softmax (tau_s) against the teacher's
    softmax (tau_t) over the row's unmasked candidates; a row with one candidate is not counted.
    The gradient is the reference's too."""
    student, teacher, mask = _scores()
    got = kl_distillation(student, teacher, mask, student_temperature=TAU_STUDENT, teacher_temperature=TAU_TEACHER)
    want, rows = 0.0, 0
    for i in range(N):
        keep = mask[i]
        if keep.sum() < 2:
            continue
        log_q = F.log_softmax(student[i, keep] / TAU_STUDENT, dim=0)
        p = F.softmax(teacher[i, keep] / TAU_TEACHER, dim=0)
        want = want + F.kl_div(log_q, p, reduction="sum")
        rows += 1
    assert int(got.count) == rows == 5 and kl_rows(mask).tolist() == [True, True, False, True, True, True]
    torch.testing.assert_close(got.loss_sum, want, atol=1e-12, rtol=0)
    (grad_got,) = torch.autograd.grad(got.loss_sum, student, retain_graph=True)
    (grad_want,) = torch.autograd.grad(want, student)
    torch.testing.assert_close(grad_got, grad_want, atol=1e-12, rtol=0)
    assert torch.isfinite(grad_got).all() and (grad_got[2] == 0).all()


def test_kl_distillation_with_equal_scores_is_zero_and_temperatures_matter():
    """Equal scores at equal temperatures: KL 0; at unequal temperatures it is not."""
    student, _, mask = _scores()
    same = student.detach().clone()
    student = student.detach()
    assert float(kl_distillation(student, same, mask, student_temperature=0.05,
                                 teacher_temperature=0.05).loss_sum) == pytest.approx(0.0, abs=1e-12)
    assert float(kl_distillation(student, same, mask, student_temperature=0.05,
                                 teacher_temperature=0.1).loss_sum) > 1e-3


def test_margin_mse_equals_an_explicit_loop():
    """Every (i, k) with both the positive and negative k labelled: ((s0 - sk) - (t0 - tk))^2."""
    student, teacher, mask = _scores()
    got = margin_mse(student, teacher, mask)
    want, pairs = 0.0, 0
    for i in range(N):
        for k in range(1, 1 + K):
            if mask[i, 0] and mask[i, k]:
                want = want + ((student[i, 0] - student[i, k]) - (teacher[i, 0] - teacher[i, k])) ** 2
                pairs += 1
    assert int(got.count) == pairs == 7 and int(margin_pairs(mask).sum()) == pairs
    torch.testing.assert_close(got.loss_sum, want, atol=1e-12, rtol=0)
    (grad_got,) = torch.autograd.grad(got.loss_sum, student, retain_graph=True)
    (grad_want,) = torch.autograd.grad(want, student)
    torch.testing.assert_close(grad_got, grad_want, atol=1e-12, rtol=0)


def test_embedding_mse_is_the_mean_squared_error_of_labelled_rows():
    generator = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(4, 5, generator=generator), torch.randn(4, 5, generator=generator)
    mask = torch.tensor([True, False, True, True])
    got = embedding_mse(student, teacher, mask)
    assert int(got.count) == 3
    torch.testing.assert_close(got.mean, F.mse_loss(student[mask], teacher[mask]))


def test_own_candidate_scores_pick_each_querys_positive_and_negatives():
    """Candidates laid out as [positives (N), negatives (N*K) row-major]: row i is q_i against
    p_i, then n_i0 .. n_i(K-1)."""
    generator = torch.Generator().manual_seed(2)
    queries, candidates = torch.randn(3, 4, generator=generator), torch.randn(3 + 3 * 2, 4, generator=generator)
    got = own_candidate_scores(queries, candidates, 2)
    want = torch.tensor([[float(queries[i] @ candidates[j]) for j in (i, 3 + 2 * i, 3 + 2 * i + 1)]
                         for i in range(3)])
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="expected 9 candidates"):
        own_candidate_scores(queries, candidates[:8], 2)


def test_folded_objective_is_the_weighted_means():
    """with_distillation's objective (over the global valid count) is (1 - w_kl - w_m) * InfoNCE
    mean + w_kl * KL mean + w_m * MarginMSE mean, each over its own count; weight 1 leaves the
    InfoNCE out."""
    student, teacher, mask = _scores()
    infonce = multi_positive_infonce(F.normalize(torch.randn(N, 4, dtype=torch.float64), dim=1),
                                     F.normalize(torch.randn(N, 4, dtype=torch.float64), dim=1),
                                     torch.eye(N, dtype=torch.bool), torch.ones(N, N, dtype=torch.bool),
                                     temperature=0.05)
    kl = kl_distillation(student, teacher, mask, student_temperature=TAU_STUDENT, teacher_temperature=TAU_TEACHER)
    margin = margin_mse(student, teacher, mask)
    folded = with_distillation(infonce, {"kl": (kl, KL_WEIGHT, int(kl.count)),
                                         "margin_mse": (margin, MARGIN_WEIGHT, int(margin.count))}, N)
    want = (1 - KL_WEIGHT - MARGIN_WEIGHT) * infonce.mean + KL_WEIGHT * kl.mean + MARGIN_WEIGHT * margin.mean
    torch.testing.assert_close(folded.objective(N), want, atol=1e-12, rtol=0)
    assert folded.infonce_sum is infonce.loss_sum and dict(folded.terms)["kl"] is kl
    only = with_distillation(infonce, {"kl": (kl, 1.0, int(kl.count))}, N)
    torch.testing.assert_close(only.objective(N), kl.mean, atol=1e-12, rtol=0)


# --- GradCache and workers ---------------------------------------------------------------------

def _build():
    """A tiny encoder (float64), N query and N*(1+K) candidate features (positives, then each
    query's K negatives), the teacher's scores and mask."""
    torch.manual_seed(0)
    model = TinyEncoder().double()
    generator = torch.Generator().manual_seed(3)
    queries = torch.randn(N, 12, generator=generator, dtype=torch.float64)
    candidates = torch.randn(N * (1 + K), 12, generator=generator, dtype=torch.float64)
    _, teacher, mask = _scores()
    return model, queries, candidates, teacher, mask


def _loss_fn(model, teacher, mask, valid, counts, query_groups, candidate_groups):
    """InfoNCE over gathered candidates (each query's positive in its group) with KL and
    MarginMSE over its own candidates folded in against the global counts."""
    masks = pair_masks(query_groups, gather_no_grad(candidate_groups))

    def loss_fn(q, c):
        infonce = multi_positive_infonce(q, gather_with_grad(c), masks.positive, masks.eligible,
                                         temperature=model.temperature())
        own = own_candidate_scores(q, c, K)
        terms = {"kl": (kl_distillation(own, teacher, mask, student_temperature=TAU_STUDENT,
                                        teacher_temperature=TAU_TEACHER), KL_WEIGHT, counts[0]),
                 "margin_mse": (margin_mse(own, teacher, mask), MARGIN_WEIGHT, counts[1])}
        return with_distillation(infonce, terms, valid)

    return loss_fn


def _groups(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Query i's group is i; its positive shares it, its negatives are each their own group."""
    ids = torch.arange(N)[rows]
    negatives = (1000 + ids[:, None] * K + torch.arange(K)).reshape(-1)
    return ids, torch.cat([ids, negatives])


def _candidates(candidates: torch.Tensor, rows: slice) -> torch.Tensor:
    ids = torch.arange(N)[rows]
    negatives = candidates[N:].reshape(N, K, -1)[ids].reshape(len(ids) * K, -1)
    return torch.cat([candidates[:N][ids], negatives])


def test_gradcache_equals_the_plain_distilled_step():
    """Chunks of 2 queries and 5 candidates: GradCache's loss and every gradient (the learnable
    temperature's included) equal the plain backward's, in float64."""
    model, queries, candidates, teacher, mask = _build()
    counts = (int(kl_rows(mask).sum()), int(margin_pairs(mask).sum()))
    loss_fn = _loss_fn(model, teacher, mask, N, counts, *_groups(slice(None)))
    plain = loss_fn(model(queries), model(candidates))
    plain.objective(N).backward()
    plain_grads = gradients(model)
    model.zero_grad(set_to_none=True)
    cached = gradcache_step(model, queries.split(2), candidates.split(5), loss_fn, global_valid=N)
    torch.testing.assert_close(cached.loss_sum, plain.loss_sum.detach(), atol=1e-12, rtol=0)
    for got, want in zip(gradients(model), plain_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


def _worker(rank: int):
    model, queries, candidates, teacher, mask = _build()
    rows = slice(0, 4) if rank == 0 else slice(4, None)  # 4 + 2 queries, each with its candidates
    counts = torch.tensor([float(kl_rows(mask[rows]).sum()), float(margin_pairs(mask[rows]).sum()),
                           float(len(range(N)[rows]))], dtype=torch.float64)
    dist.all_reduce(counts)  # as the trainer does: the global counts before the forward pass
    kl_count, margin_count, valid = (int(x) for x in counts.tolist())
    loss_fn = _loss_fn(model, teacher[rows], mask[rows], valid, (kl_count, margin_count), *_groups(rows))
    local = loss_fn(model(queries[rows]), model(_candidates(candidates, rows)))
    local.objective(valid).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    figures = torch.stack([local.loss_sum.detach(), dict(local.terms)["kl"].loss_sum.detach(),
                           dict(local.terms)["margin_mse"].loss_sum.detach()]).double()
    dist.all_reduce(figures)
    return figures.tolist(), [g.numpy() for g in gradients(model)]


@pytest.mark.timeout(120)
def test_two_gloo_workers_equal_one_process():
    """Two workers (4 + 2 queries, each with its own positives and negatives, candidates
    gathered for the InfoNCE): the one-process folded loss, KL and MarginMSE sums and gradients."""
    results = run_on_two_workers(_worker)
    model, queries, candidates, teacher, mask = _build()
    counts = (int(kl_rows(mask).sum()), int(margin_pairs(mask).sum()))
    whole = _loss_fn(model, teacher, mask, N, counts, *_groups(slice(None)))(model(queries), model(candidates))
    whole.objective(N).backward()
    want = [float(whole.loss_sum.detach()), float(dict(whole.terms)["kl"].loss_sum.detach()),
            float(dict(whole.terms)["margin_mse"].loss_sum.detach())]
    for figures, grads in results:
        assert figures == pytest.approx(want, abs=1e-12)
        for got, expected in zip(grads, gradients(model)):
            torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-12, rtol=1e-10)


# --- the training step -------------------------------------------------------------------------

def _negative_rows(frozen):
    """Two negatives a pair (row 0's second slot empty) with teacher scores: nan for the empty
    slot and for a whole row (one below the minimum confidence)."""
    rows = synthetic.hard_negative_rows(frozen)
    teacher = np.random.default_rng(4).uniform(-0.2, 0.9, (16, 3)).astype(np.float32)
    teacher[0, 2] = np.nan
    teacher[5] = np.nan
    rows["teacher_scores"] = teacher
    return rows


def test_the_distilled_step_counts_its_own_candidate_scores(frozen, parent, tmp_path):
    """Phase 3 with two negatives, KL and MarginMSE beside the InfoNCE: the counter agrees with
    FlopCounterMode on the whole step, and its difference from the same step without
    distillation is FlopCounterMode's difference and `expected_step_flops`' (the (N, 1 + K)
    scores, forward and backward)."""
    from embedlab.model.flops import expected_step_flops
    from test_flops import assert_close, reference_step_flops

    plain = synthetic.phase3_trial(parent)
    distilled = synthetic.phase3_trial(parent, teacher=TEACHER, kl_weight=KL_WEIGHT, margin_mse_weight=MARGIN_WEIGHT)
    rows = _negative_rows(frozen)
    plain_counted, plain_reference = reference_step_flops(plain, frozen, rows, tmp_path / "plain")
    counted, reference = reference_step_flops(distilled, frozen, rows, tmp_path / "distilled")
    assert_close(counted, reference)
    assert counted - plain_counted == pytest.approx(reference - plain_reference, rel=1e-9)
    assert counted - plain_counted == pytest.approx(expected_step_flops(distilled) - expected_step_flops(plain),
                                                    rel=1e-12)


def test_the_loop_reports_each_term_and_their_weighted_sum(frozen, parent, tmp_path):
    """A distilling loop's train/loss is the objective it differentiates: (1 - w) * the InfoNCE
    mean + w_kl * the KL mean + w_m * the MarginMSE mean, each reported beside it."""
    from embedlab.streams.packed import worker_rows
    from embedlab.train.session import LocalSession

    trial = synthetic.phase3_trial(parent, teacher=TEACHER, kl_weight=KL_WEIGHT, margin_mse_weight=MARGIN_WEIGHT)
    loop = synthetic.make_loop(trial, frozen)
    batches = LocalSession(_negative_rows(frozen), tmp_path).global_batches(trial.train.batch_rows)
    loop.start_clock()
    loop.step([worker_rows(next(batches), 0, 1) for _ in range(loop.batches_per_step)])
    metrics = loop.metrics()
    parts = [metrics[f"train/{name}_loss"] for name in ("contrastive", "kl", "margin_mse")]
    assert all(math.isfinite(p) for p in parts) and parts[1] > 0 and parts[2] > 0
    want = (1 - KL_WEIGHT - MARGIN_WEIGHT) * parts[0] + KL_WEIGHT * parts[1] + MARGIN_WEIGHT * parts[2]
    assert metrics["train/loss"] == pytest.approx(want, rel=1e-6)  # the model's float32 sums, folded once


# --- teacher labels ------------------------------------------------------------------------------

def _encode(texts):
    """A deterministic stand-in encoder for table mechanics (the real teacher is tested below)."""
    rows = np.array([[len(t), sum(map(ord, t)) % 17, t.count("e") + 1] for t in texts], dtype=np.float64)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _pairs():
    from embedlab.teacher.labels import ScoredPair

    return [ScoredPair("p1", "how do I sort a list", "use sorted()", (("d1", "lists are mutable"),
                                                                        ("d2", "a set has no order"))),
            ScoredPair("p2", "open a file", "call open(path)", (("d3", "files need closing"),)),
            ScoredPair("p3", "what is a tuple", "an immutable sequence", ())]


def _identity(**changed):
    from embedlab.teacher.labels import labels_identity

    fields = dict(teacher={"name": TEACHER, "weights_sha256": "ab" * 32}, query_prefix="", passage_prefix="",
                  pairs_table="cd" * 32, negative_sets={"mined": "m1", "given": None}, negatives_per_pair=2,
                  pair_ids=["p1", "p2", "p3"], code="code-1",
                  student_view={"tokenizer": "t" * 64, "pair_length": 64, "query_prefix": "query: ",
                                "passage_prefix": "passage: "})
    return labels_identity(**{**fields, **changed})


def assert_same_labels(one, other) -> None:
    """Two labels tables hold the same rows (nan confidences compare equal)."""
    assert one.schema == other.schema
    for name in one.schema.names:
        np.testing.assert_array_equal(one[name].to_numpy(), other[name].to_numpy())


def test_labels_table_records_each_score_confidence_and_agreement(tmp_path):
    """One row per (pair, candidate) with the cosine of the encoder's rows; a pair's confidence
    is its positive's score minus its best negative's (nan without a negative) and `agrees`
    whether that is positive; scoring twice gives the same bytes of scores."""
    from embedlab.teacher.labels import POSITIVE, score_pairs

    table = score_pairs(_encode, _pairs(), query_prefix="query: ", passage_prefix="passage: ")
    assert table.num_rows == 3 + 2 + 1
    rows = table.to_pylist()
    vectors = {t: v for t, v in zip(["query: how do I sort a list", "passage: use sorted()",
                                      "passage: lists are mutable", "passage: a set has no order"],
                                     _encode(["query: how do I sort a list", "passage: use sorted()",
                                              "passage: lists are mutable", "passage: a set has no order"]))}
    q = vectors["query: how do I sort a list"]
    want = [float(np.dot(q, vectors[f"passage: {t}"])) for t in ("use sorted()", "lists are mutable",
                                                               "a set has no order")]
    first = [r for r in rows if r["pair_id"] == "p1"]
    assert [r["doc_id"] for r in first] == [POSITIVE, "d1", "d2"]
    assert [r["score"] for r in first] == pytest.approx(want, abs=1e-6)
    assert first[0]["confidence"] == pytest.approx(want[0] - max(want[1:]), abs=1e-6)
    assert first[0]["agrees"] == (want[0] > max(want[1:]))
    third = [r for r in rows if r["pair_id"] == "p3"][0]
    assert math.isnan(third["confidence"]) and third["agrees"] is None  # no negative: nothing to rank
    assert_same_labels(score_pairs(_encode, _pairs()), score_pairs(_encode, _pairs()))


def test_labels_are_refused_for_other_inputs(tmp_path):
    """A saved set loads for its own identity and is refused, naming what differs, for another
    pairs table or negatives set; a set without its manifest (incomplete) is refused."""
    from embedlab.teacher.labels import (
        MANIFEST_FILE, TeacherLabelsError, load_manifest, score_pairs, write_labels,
    )

    directory = write_labels(tmp_path / "set", score_pairs(_encode, _pairs()), _identity(), {"flops": 1.0})
    manifest = load_manifest(directory, _identity())
    agrees = manifest["counts"]["teacher_agrees"]
    assert manifest["labels"] == "teacher" and manifest["counts"] == {
        "pairs": 3, "scores": 6, "teacher_agrees": agrees, "teacher_disagrees": 2 - agrees,
        "pairs_without_negatives": 1}  # p3 has no negative: neither agreement nor disagreement
    with pytest.raises(TeacherLabelsError, match="pairs_table differ"):
        load_manifest(directory, _identity(pairs_table="ef" * 32))
    with pytest.raises(TeacherLabelsError, match="negative_sets differ"):
        load_manifest(directory, _identity(negative_sets={"mined": "m2", "given": None}))
    with pytest.raises(TeacherLabelsError, match="student_view differ"):
        load_manifest(directory, _identity(student_view={**_identity()["student_view"], "pair_length": 32}))
    (directory / MANIFEST_FILE).unlink()
    with pytest.raises(TeacherLabelsError, match="incomplete or absent"):
        load_manifest(directory, _identity())


def test_score_rows_mask_what_the_teacher_lacks(tmp_path):
    """The stream's (B, 1 + K) scores: the stored score per slot, nan for an empty slot, for a
    doc the set has no score of, and for the whole row of a pair below the minimum confidence
    (or without a negative to have one)."""
    from embedlab.teacher.labels import LABELS_FILE, score_pairs, teacher_score_rows, write_labels

    table = score_pairs(_encode, _pairs())
    directory = write_labels(tmp_path / "set", table, _identity(), {"flops": 1.0})
    path = str(directory / LABELS_FILE)
    score = {(r["pair_id"], r["doc_id"]): r["score"] for r in table.to_pylist()}
    confidence = {r["pair_id"]: r["confidence"] for r in table.to_pylist()}
    got = teacher_score_rows(path, ["p1", "p2", "p3"], [["d1", "d2"], ["d3", None], ["unknown", None]])
    want = np.array([[score["p1", ""], score["p1", "d1"], score["p1", "d2"]],
                     [score["p2", ""], score["p2", "d3"], np.nan],
                     [score["p3", ""], np.nan, np.nan]], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    threshold = float(np.nextafter(np.float32(confidence["p1"]), np.float32(np.inf)))  # just above p1's
    kept = teacher_score_rows(path, ["p1", "p2", "p3"], [["d1", "d2"], ["d3", None], [None, None]],
                              min_confidence=threshold)
    assert np.isnan(kept[0]).all() and np.isnan(kept[2]).all()  # p1 below, p3 has no margin
    np.testing.assert_array_equal(np.isnan(kept[1]), [confidence["p2"] < threshold] * 2 + [True])
    from embedlab.teacher.labels import pairs_below_confidence

    assert pairs_below_confidence(directory, threshold) == 2 + (confidence["p2"] < threshold)
    assert pairs_below_confidence(directory, None) == 0


def test_the_teacher_scores_each_text_as_the_student_sees_it(frozen):
    """Every query and candidate is cut to the longest start (at a token boundary) whose
    student prefix + text fits the pair length with [CLS] and [SEP]: its student tokens are the
    start of the student's tokens of the whole text, and a text that fits is kept whole."""
    from embedlab.teacher.labels import ScoredPair
    from embedlab.teacher.phase3 import as_student_sees
    from test_embedding_distillation import TEXTS, _brute_force_cut

    settings = ContrastiveConfig(pair_length=24)  # "query: short text" is 13 tokens here, the long texts ~70
    pairs = [ScoredPair("p1", TEXTS[1], TEXTS[0], (("d1", TEXTS[3]), ("d2", TEXTS[2]))),
             ScoredPair("p2", TEXTS[2], TEXTS[3], ())]
    seen = as_student_sees(pairs, settings, frozen)
    assert [p.pair_id for p in seen] == ["p1", "p2"] and [d for d, _ in seen[0].negatives] == ["d1", "d2"]
    for whole, cut in zip(pairs, seen):
        for prefix, text, part in ((settings.prefixes.query, whole.query, cut.query),
                                   (settings.prefixes.passage, whole.positive, cut.positive),
                                   *((settings.prefixes.passage, t, c) for (_, t), (_, c) in
                                     zip(whole.negatives, cut.negatives))):
            assert part == _brute_force_cut(frozen, text, prefix, settings.pair_length - 2)
            ids = frozen.encode_batch([prefix + part])[0]
            assert ids == frozen.encode_batch([prefix + text])[0][:len(ids)]
    assert seen[0].positive != TEXTS[0] and seen[1].query == TEXTS[2]  # a long text cut, a short one whole


def test_the_real_teacher_scores_reproducibly():
    """MiniLM's labels of the same pairs twice are identical, and each score is the cosine of
    its own encodings of the prefixed texts."""
    from embedlab.teacher.labels import load_teacher, measured_encode, score_pairs

    teacher = load_teacher(TEACHER)
    encode, cost = measured_encode(teacher)
    first = score_pairs(encode, _pairs(), passage_prefix="passage: ")
    assert_same_labels(first, score_pairs(teacher.encode, _pairs(), passage_prefix="passage: "))
    q, p = teacher.encode(["how do I sort a list", "passage: use sorted()"])
    assert first["score"][0].as_py() == pytest.approx(float(np.dot(q, p)), abs=1e-5)
    assert cost()["flops"] > 0


def test_the_config_refuses_distillation_it_cannot_run():
    two = NegativesConfig(count=2)
    for fields, negatives, message in (({"kl_weight": 0.5}, two, "need a teacher"),
                                       ({"kl_weight": 0.5, "teacher": TEACHER}, NegativesConfig(), "negatives.count >= 1"),
                                       ({"kl_weight": 0.7, "margin_mse_weight": 0.5, "teacher": TEACHER}, two,
                                        "at most 1"),
                                       ({"kl_weight": -0.1}, two, r"must be in \[0, 1\]"),
                                       ({"teacher": "gpt"}, two, "valid"),
                                       ({"student_temperature": 0.0}, two, "positive"),
                                       ({"min_confidence": 3.0}, two, r"in \[-2, 2\]")):
        with pytest.raises(ConfigError, match=message):
            ContrastiveConfig(negatives=negatives, distillation=DistillationConfig(**fields))
    settings = ContrastiveConfig(negatives=NegativesConfig(count=2), distillation=DistillationConfig(teacher=TEACHER, kl_weight=1.0))
    assert settings.distillation.weight == 1.0


def test_termsum_mean_of_nothing_is_zero_not_nan():
    empty = TermSum(loss_sum=torch.zeros((), requires_grad=True), count=torch.zeros((), dtype=torch.long))
    assert float(empty.mean.detach()) == 0.0


def test_scoring_in_chunks_gives_the_same_labels_and_reports_progress(monkeypatch):
    """Encoding a few texts a call (with a progress line each) scores exactly what one call does."""
    import embedlab.teacher.labels as teacher_labels

    whole = teacher_labels.score_pairs(_encode, _pairs())
    monkeypatch.setattr(teacher_labels, "ENCODE_CHUNK", 3)
    lines: list[str] = []
    assert_same_labels(teacher_labels.score_pairs(_encode, _pairs(), progress=lines.append), whole)
    # 3 queries and 6 distinct passages
    assert [line.split(" texts")[0] for line in lines] == [
        "teacher labels: 3/9", "teacher labels: 6/9", "teacher labels: 9/9"]


def test_one_process_at_a_time_scores_a_set(tmp_path):
    """While one holder has a set's scoring lock, another cannot take it; after, it can."""
    import fcntl

    from embedlab.artifacts.build import directory_lock

    directory = tmp_path / "teacher-labels" / "abc"
    with directory_lock(directory):
        with open(directory.parent / ".abc.lock", "w") as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(directory.parent / ".abc.lock", "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


# --- the teacher as a study's reference ----------------------------------------------------------

def test_a_distilling_study_scores_its_teacher_as_a_reference(tmp_path):
    """The teacher's reference scores are MiniLM's on the task's split, metric by metric as
    `evaluate_baseline` computes them; the table's reference line names parent and teacher with
    the metrics each has; a study whose teacher has no weight distils from nothing."""
    from embedlab.core.beir import Task, load_task, write_task
    from embedlab.stats.references import distilled_teacher, reference_line, score_teacher
    from embedlab.tasks.baselines import MINILM, evaluate_baseline

    task = Task(name="tiny", corpus={"d1": ("", "Return a sorted list of the items."),
                                     "d2": ("", "Open a file and return a stream."),
                                     "d3": ("", "The tuple is an immutable sequence.")},
                queries={"q1": "how do I sort a list", "q2": "open a file", "q3": "an immutable sequence"},
                qrels={"dev": {"q1": {"d1": 1}, "q2": {"d2": 1}}, "test": {"q3": {"d3": 1}}})
    write_task(task, tmp_path / "tiny")
    got = score_teacher(MINILM, str(tmp_path / "tiny"), "dev")
    want = evaluate_baseline(MINILM, load_task(tmp_path / "tiny"), "dev")
    assert got["dev/ndcg@10"] == want["ndcg@10"] and got["dev/recall@100"] == want["recall@100"]
    assert got["teacher"] == MINILM and got["eval/task_hash"] == want["task_hash"]
    record = {"parent_scores": {"dev/ndcg@10": 0.25}, "teacher_scores": got}
    assert reference_line(record, ["dev/ndcg@10", "train/loss"]) == (
        "references, not trained in this study (same split and queries): parent: dev/ndcg@10 0.2500; "
        f"teacher {MINILM}: dev/ndcg@10 {got['dev/ndcg@10']:.4f}")
    assert reference_line({}, ["dev/ndcg@10"]) == ""
    plain = synthetic.phase3_trial(synthetic.Path("parent"), teacher=TEACHER)
    distilling = synthetic.phase3_trial(synthetic.Path("parent"), teacher=TEACHER, kl_weight=0.5)
    assert distilled_teacher({"a": plain}) is None and distilled_teacher({"a": plain, "b": distilling}) == TEACHER
