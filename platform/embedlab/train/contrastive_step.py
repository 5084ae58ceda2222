"""One microbatch's contrastive term and its backward, on one worker of phase 2 or 3.

The term: this worker's queries scored against the candidates of every worker (their
positives and, in phase 3, hard negatives; `gather_with_grad`), and with
`contrastive.symmetric` the reverse direction too (this worker's positives against every
worker's queries), pooled as sums and counts (`embedlab.objectives.contrastive.pooled`).

With `contrastive.matryoshka.dims` the term is the weighted sum of that term at each listed
width of the truncated, re-normalised embeddings (`embedlab.objectives.matryoshka`), gathered
and scored per width.

The backward differentiates `ContrastiveLoss.objective(valid, weight)`, i.e.
weight * loss_sum / valid, with `valid` the step's global count of valid anchors and
`weight` = `contrastive_weight` (1 - `contrastive.mlm_weight`: the joint arm's
w * L_MLM + (1 - w) * L_contrastive). One rule on both paths: the plain one encodes the
microbatch with gradients and backpropagates that objective; GradCache
(`contrastive.gradcache_chunk`, `embedlab.objectives.gradcache`) is given the same count
and weight, so it accumulates the plain path's gradient with one chunk's activations,
with or without a joint MLM term.

With `contrastive.distillation.kl_weight` / `margin_mse_weight` (phase 3 with teacher labels) each query's
own positive and negatives are scored once more, as one batched matmul at the widest trained
width, and the KL and MarginMSE terms (`embedlab.objectives.distillation`) are folded into
the term's loss sum against their global counts (`DistillCounts`, known from the teacher
masks before the forward pass): the same single objective on both paths.

With `contrastive.distillation.embedding_mse_weight` each row also brings its pair's training-split
document (`distill_ids`) and the teacher's target for it (`teacher_embedding`). The documents
are encoded as a third group appended to the candidates' passes, so GradCache chunks and
recomputes them like any candidate; they are split off before the InfoNCE (they are nobody's
candidates) and regressed onto their targets at the full width (`embedding_mse`), folded in
against their global count like the other terms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from embedlab.core.config import ContrastiveConfig, ModelConfig
from embedlab.model.encoder import Encoder, SegmentLayout, segment_layout, to_device
from embedlab.model.flops import FlopTally, GRADCACHE, TRAINED, attention_path
from embedlab.model.pooling import l2_normalise, pool
from embedlab.objectives.contrastive import (ContrastiveLoss, LearnableTemperature, multi_positive_infonce,
    pair_masks, pooled)
from embedlab.objectives.distillation import (embedding_mse, kl_distillation, kl_rows, margin_mse, margin_pairs,
    own_candidate_scores, with_distillation)
from embedlab.objectives.gradcache import gradcache_step
from embedlab.objectives.matryoshka import matryoshka_loss, truncate
from embedlab.train.precision import forward_precision


def embed(encoder: Encoder, ids: torch.Tensor, pad_id: int, pooling: str,
          layout: SegmentLayout | None = None) -> torch.Tensor:
    """(B, L) `[CLS] text [SEP]` rows -> (B, d) unit embeddings (zero rows stay zero).

    `pooling` as `embedlab.model.pooling.pool`: "mean" averages content tokens (CLS and SEP
    excluded), "mean_all" every token of the row, "cls" takes the first position's final
    state. `layout`: the rows' variable-length layout, taken on the host (`Encoder.forward`).
    """
    segments = (ids != pad_id).long()
    hidden = encoder(ids, segments, layout)
    return l2_normalise(pool(hidden, segments, pooling))


@dataclass(frozen=True)
class Rows:
    """(B, L) token ids on the step's device and, for the variable-length path, their layout."""

    ids: torch.Tensor
    layout: SegmentLayout | None


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The one-worker gather: this worker's rows are all the candidates."""
    return tensor


def contrastive_weight(settings: ContrastiveConfig) -> float:
    """The contrastive term's weight in a step's objective: 1 - `mlm_weight` (1.0 without a
    joint MLM term)."""
    return 1.0 - settings.mlm_weight


DISTILLATION_TERMS = ("kl", "margin_mse", "embedding_mse")  # the names `with_distillation` folds in, in order


@dataclass(frozen=True)
class DistillCounts:
    """A step's global counts for the distillation terms, summed over microbatches and workers:
    KL rows (two or more teacher scores), MarginMSE (positive, negative) pairs and embedding
    rows with a teacher target."""

    kl: int
    margin: int
    embedding: int = 0


def embedding_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B,) bool: the rows whose document has a teacher target (a nan row has none)."""
    return torch.isfinite(batch["teacher_embedding"]).all(dim=1)


def local_distill_counts(batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """(3,) float64: this worker's KL rows, MarginMSE pairs and embedding rows over a step's
    microbatches, read from their `teacher_scores` and `teacher_embedding` (nan: no label) on
    the host (0 for a term whose column the stream does not carry)."""
    counts = torch.zeros(3, dtype=torch.float64)
    for batch in batches:
        if "teacher_scores" in batch:
            mask = torch.isfinite(batch["teacher_scores"])
            counts[0] += float(kl_rows(mask).sum())
            counts[1] += float(margin_pairs(mask).sum())
        if "teacher_embedding" in batch:
            counts[2] += float(embedding_mask(batch).sum())
    return counts


@dataclass(frozen=True)
class ContrastiveStep:
    """How one worker computes a microbatch's contrastive term and accumulates its gradient
    (module docstring)."""

    settings: ContrastiveConfig
    encoder: Encoder
    temperature: LearnableTemperature | None  # None: the fixed `settings.temperature`
    gather: Callable[[torch.Tensor], torch.Tensor]  # every worker's rows, with gradients (or `local`)
    gather_ids: Callable[[torch.Tensor], torch.Tensor]  # every worker's rows, without (or `local`)
    model: ModelConfig  # for the FLOPs of the encoding passes
    pad_id: int
    precision: str
    device: torch.device
    half: bool  # half-precision attention inputs (`embedlab.train.precision.half_activations`)

    def encode(self, rows: Rows) -> torch.Tensor:
        with forward_precision(self.precision, self.device):
            return embed(self.encoder, rows.ids, self.pad_id, self.settings.pooling, rows.layout)

    def rows(self, ids: torch.Tensor) -> list[Rows]:
        """(B, L) host ids -> the encoder's inputs on the device: one `Rows`, or one per GradCache
        chunk, each with its layout taken on the host when attention takes the variable-length
        path."""
        chunk, (_, length) = self.settings.gradcache_chunk, ids.shape
        varlen = attention_path(self.model, device=self.device, half=self.half, length=length, training=True).varlen
        return [Rows(to_device(part, self.device),
                     segment_layout((part != self.pad_id).long()).to(self.device) if varlen else None)
                for part in (ids.split(chunk) if chunk else (ids,))]

    def backward(self, batch: dict[str, torch.Tensor], valid: int, distill: DistillCounts | None = None):
        """Backward of one microbatch's objective (its loss sum weighted and divided by the
        step's global valid count `valid`; with distillation, `distill` the step's global
        counts of its terms); returns the term, the FLOPs this worker's passes ran and the
        temperature used."""
        settings = self.settings
        microbatch, host_sides = self.microbatch(batch, valid, distill)
        flops = self.encode_flops((batch["query_ids"], torch.cat(host_sides)))
        queries, candidates = self.rows(batch["query_ids"]), self.rows(torch.cat(host_sides))
        weight = contrastive_weight(settings)
        if settings.gradcache_chunk:
            term = gradcache_step(self.encode, queries, candidates, microbatch.term, global_valid=valid, scale=weight)
        else:
            term = microbatch.term(self.encode(*queries), self.encode(*candidates))
            term.objective(valid, weight).backward()
        return term, flops + microbatch.scores.flops, microbatch.tau

    def microbatch(self, batch: dict[str, torch.Tensor], valid: int,
                   distill: DistillCounts | None) -> tuple[Microbatch, list[torch.Tensor]]:
        """What scoring `batch` needs on the device (`Microbatch`), and the host id tensors its
        candidates' pass encodes after the queries': positives, negatives, distillation documents."""
        settings, device = self.settings, self.device
        host_sides = [batch["positive_ids"]]  # the stream's CPU tensors, read for FLOPs
        groups = [batch["group"]]
        exclude = [torch.zeros(len(batch["group"]), dtype=torch.bool)]
        if "negative_ids" in batch:
            rows, k, length = batch["negative_ids"].shape
            host_sides.append(batch["negative_ids"].reshape(rows * k, length))
            groups.append(batch["negative_group"].reshape(-1))
            exclude.append(batch["negative_len"].reshape(-1) == 0)
        groups, exclude = to_device(torch.cat(groups), device), to_device(torch.cat(exclude), device)
        if settings.distillation.weight > 0 and distill is None:
            raise ValueError("contrastive distillation weights need the step's DistillCounts")
        teacher = teacher_mask = targets = target_mask = None
        if settings.distillation.score_weight > 0:
            if "teacher_scores" not in batch:
                raise ValueError("contrastive.distillation.kl_weight / margin_mse_weight need the stream's "
                                 "teacher_scores")
            teacher = to_device(batch["teacher_scores"], device)
            teacher_mask = torch.isfinite(teacher)
        documents = 0  # the embedding-distillation rows appended to the candidates' passes
        if settings.distillation.embedding_mse_weight > 0:
            if "distill_ids" not in batch or "teacher_embedding" not in batch:
                raise ValueError("contrastive.distillation.embedding_mse_weight needs the stream's distill_ids and "
                                 "teacher_embedding")
            host_sides.append(batch["distill_ids"])
            documents = len(batch["distill_ids"])
            targets = to_device(batch["teacher_embedding"], device)
            target_mask = to_device(embedding_mask(batch), device)
        microbatch = Microbatch(
            step=self, query_groups=to_device(batch["group"], device), candidate_groups=self.gather_ids(groups),
            ineligible=self.gather_ids(exclude.long()).bool(),
            tau=self.temperature() if self.temperature is not None else settings.temperature,
            valid=valid, distill=distill, documents=documents, teacher=teacher, teacher_mask=teacher_mask,
            targets=targets, target_mask=target_mask)
        return microbatch, host_sides

    def encode_flops(self, texts: tuple[torch.Tensor, ...]) -> float:
        """FLOPs of encoding each (B, L) id tensor with gradients: one trained pass, or with
        GradCache a no-grad pass and a trained one per chunk (the kernel's work is per chunk)."""
        tally, chunk = FlopTally(), self.settings.gradcache_chunk
        for ids in texts:
            for part in (ids.split(chunk) if chunk else (ids,)):
                tally.encode(self.model, (part != self.pad_id).long(), mode=GRADCACHE if chunk else TRAINED,
                             device=self.device, half=self.half, training=True)
        return tally.flops


@dataclass
class Microbatch:
    """One microbatch's groups, masks, temperature and teacher targets on the device, and the
    score matrices' FLOPs (`scores`, counted at the shapes they are computed at): what its
    contrastive term (`term`) reads, the same on the plain path and on each GradCache chunk."""

    step: ContrastiveStep
    query_groups: torch.Tensor
    candidate_groups: torch.Tensor  # every worker's
    ineligible: torch.Tensor  # every worker's candidates that are no one's (an empty negative slot)
    tau: torch.Tensor | float
    valid: int
    distill: DistillCounts | None
    documents: int  # embedding-distillation rows appended to this worker's candidates
    teacher: torch.Tensor | None
    teacher_mask: torch.Tensor | None
    targets: torch.Tensor | None
    target_mask: torch.Tensor | None
    scores: FlopTally = field(default_factory=FlopTally)

    def term(self, queries: torch.Tensor, local_candidates: torch.Tensor) -> ContrastiveLoss:
        """The term at every trained width (`embedlab.objectives.matryoshka`; the full width
        alone unless `contrastive.matryoshka.dims` lists others), with distillation."""
        settings = self.step.settings
        widths, weights = settings.matryoshka.trained_widths(self.step.model.width)
        # The documents are no one's candidates: split off before the InfoNCE sees them.
        candidates, document_rows = ((local_candidates[:-self.documents], local_candidates[-self.documents:])
                                     if self.documents else (local_candidates, None))
        if widths == (queries.shape[1],):
            term = self.width_term(queries, candidates)
        else:
            term = matryoshka_loss(self.width_term, queries, candidates, widths, weights)
        if settings.distillation.weight > 0:
            return self.distillation_terms(term, queries, candidates, document_rows, widths[-1])
        return term

    def width_term(self, queries: torch.Tensor, local_candidates: torch.Tensor) -> ContrastiveLoss:
        """This worker's queries against every worker's candidates (+ the reverse direction)."""
        step = self.step
        masks = pair_masks(self.query_groups, self.candidate_groups,
                           exclude=self.ineligible[None, :].expand(len(queries), -1).contiguous())
        candidates = step.gather(local_candidates)
        self.scores.similarity(len(queries), len(candidates), queries.shape[1])
        term = multi_positive_infonce(queries, candidates, masks.positive, masks.eligible, temperature=self.tau)
        if step.settings.symmetric:
            # Reverse direction: this worker's positives against every worker's queries,
            # pooled with the forward term so sums and counts stay exact across workers.
            reverse = pair_masks(self.query_groups, step.gather_ids(self.query_groups))
            all_queries = step.gather(queries)
            self.scores.similarity(len(queries), len(all_queries), queries.shape[1])
            term = pooled([term, multi_positive_infonce(
                local_candidates[: len(queries)], all_queries, reverse.positive, reverse.eligible,
                temperature=self.tau,
            )])
        return term

    def distillation_terms(self, term: ContrastiveLoss, queries: torch.Tensor, local_candidates: torch.Tensor,
                           document_rows: torch.Tensor | None, width: int) -> ContrastiveLoss:
        """KL and MarginMSE over each query's own candidates at the widest trained `width`;
        embedding MSE of the documents at the full width."""
        settings, distill = self.step.settings.distillation, self.distill
        parts = {}
        if document_rows is not None:
            parts["embedding_mse"] = (embedding_mse(document_rows, self.targets, self.target_mask),
                                      settings.embedding_mse_weight, distill.embedding)
        if not settings.score_weight:
            return with_distillation(term, parts, self.valid)
        if width != queries.shape[1]:
            queries, local_candidates = truncate(queries, width), truncate(local_candidates, width)
        own = own_candidate_scores(queries, local_candidates, self.teacher.shape[1] - 1)
        self.scores.similarity(len(queries), self.teacher.shape[1], width)
        if settings.kl_weight:
            parts["kl"] = (kl_distillation(own, self.teacher, self.teacher_mask,
                                           student_temperature=settings.student_temperature,
                                           teacher_temperature=settings.teacher_temperature),
                           settings.kl_weight, distill.kl)
        if settings.margin_mse_weight:
            parts["margin_mse"] = (margin_mse(own, self.teacher, self.teacher_mask), settings.margin_mse_weight,
                                   distill.margin)
        return with_distillation(term, parts, self.valid)
