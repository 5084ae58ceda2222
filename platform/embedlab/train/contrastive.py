"""Phases 2 and 3 (contrastive) on Ray Train, from a parent checkpoint.

Every worker encodes its pairs' queries and positives (and, in phase 3, mined negatives),
pools them (mean or CLS, L2-normalised) and scores its queries against the candidates of
*all* workers (`gather_with_grad`). Its loss is its queries' loss sum divided by the
global count of valid anchors, and gradients are summed across workers, so the step is
the one-process gradient of the global mean loss. Gradient accumulation
(`train.microbatches` = k) makes a step of k microbatches whose loss sums all divide by the
step's global anchor count: k times the pairs per update, but each query still sees only its
own microbatch's candidates (`train/effective_candidates` says how many); GradCache
(`contrastive.gradcache_chunk`) is the way to a larger denominator under a memory limit.

Joint arm (`contrastive.mlm_weight` = w > 0): w * L_MLM + (1 - w) * L_contrastive, with
MLM on separately corrupted copies of the same texts and contrastive on clean views; both
component losses and the norms of their gradients are reported. The contrastive term, its
weight 1 - w and its backward, plain or GradCache by one rule, are
`embedlab.train.contrastive_step`'s; phase 3's negatives are made on the trial driver
before the workers start (`embedlab.negatives.phase3`).

Lineage: the child records its parent's content hash and refuses a parent whose tokenizer
hash differs from its own data's. Optimizer state and schedule clocks reset at the phase
start (recorded), since a changed objective is not an exact resume; within the phase a run
resumes exactly from its own checkpoints (`embedlab.train.loop`). With `contrastive.init`
"random" the encoder starts from a fresh initialisation of the parent's architecture, drawn
from the trial seed, and the parent supplies only the tokenizer (an MLM head only for the
joint term, fresh too; without one masked-token retention is not measured). Under a
lineage-scoped budget (`train.budget.scope`) a child that starts from the parent's weights
is charged the parent's training FLOPs (`embedlab.train.budget.split_lineage_budget`): its
clock runs over the rest of the budget, and it reports `budget/inherited_flops` and
`budget/total_flops` (inherited + `budget/flops`) beside its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from embedlab.artifacts.sync import node_path
from embedlab.checkpoints.io import HEAD_FILE, load_parent, local_checkpoint, pretrained_root
from embedlab.checkpoints.state import seed_everything, seed_for
from embedlab.core.config import TrialConfig
from embedlab.model.encoder import Encoder, MLMModel
from embedlab.model.pretrained import PretrainedEncoder, with_mlm_head
from embedlab.model.flops import FORWARD, FlopTally, TRAINED, attention_path
from embedlab.objectives.contrastive import LearnableTemperature
from embedlab.objectives.gather import gather_no_grad, gather_with_grad
from embedlab.objectives.masking import mask_tokens
from embedlab.objectives.mlm import mlm_loss_sum
from embedlab.streams.packed import worker_splits
from embedlab.streams.pair_stream import pair_dataset
from embedlab.teacher.embeddings import EMBEDDINGS_FILE
from embedlab.teacher.labels import LABELS_FILE
from embedlab.teacher.phase3 import (teacher_compute_figures)
from embedlab.tokenizer.frozen import load_tokenizer
from embedlab.train.budget import consumption, recorded_flops, split_lineage_budget
from embedlab.train.compiling import compile_blocks, resolve_compile
from embedlab.train.contrastive_step import (ContrastiveStep, DISTILLATION_TERMS, DistillCounts, local,
    local_distill_counts)
from embedlab.negatives.mining import NEGATIVES_FILE
from embedlab.train.launch import fit
from embedlab.train.loop import Progress, TrainingLoop, run_on_ray
from embedlab.train.mlm_step import all_reduce_gradients, no_reduce, prepare_microbatch, sum_all_reduce
from embedlab.train.nonfinite import finite_update
from embedlab.train.optim import build_optimizer, set_learning_rate
from embedlab.train.precision import forward_precision, half_activations, resolve_precision
from embedlab.train.trial_data import trial_data
from embedlab.train.worker import RunOptions, WorkerConfig


def _grad_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()
    ])


def _difference_norm(model: torch.nn.Module, vector: torch.Tensor) -> torch.Tensor:
    """|| gradients of `model` (flattened in `_grad_vector`'s order) - `vector` ||, without
    building the gradient vector a second time."""
    squares, offset = vector.new_zeros((), dtype=torch.float64), 0  # read with the step's other figures
    for p in model.parameters():
        part = vector[offset:offset + p.numel()]
        difference = -part if p.grad is None else p.grad.reshape(-1) - part
        squares += difference.double().square().sum()
        offset += p.numel()
    return squares.sqrt()


@dataclass
class ContrastiveProgress(Progress):
    pairs: int = 0  # consumed positive pairs, all workers
    tokens: int = 0  # their non-padding tokens (queries, positives, negatives)
    candidate_sum: int = 0  # candidates over all anchors, for train/effective_candidates
    anchors: int = 0
    flops: float = 0.0
    consumed_pairs: list[float] = field(default_factory=list)  # per builder, as of the last report
    consumed_tokens: list[float] = field(default_factory=list)


class StepCounts:
    """A step's counts on this worker, by name, summed across workers in one all-reduce: its
    queries (`pairs`), their non-padding `tokens`, the `candidates` its anchors were scored
    against, its valid `anchors` and the training `flops` its passes ran. Float64, so the sums
    are exact integers where they count."""

    NAMES = ("pairs", "tokens", "candidates", "anchors", "flops")

    def __init__(self) -> None:
        self.values = torch.zeros(len(self.NAMES), dtype=torch.float64)

    def add(self, **amounts: float) -> None:
        for name, amount in amounts.items():
            self.values[self.NAMES.index(name)] += amount

    def set(self, **amounts: float) -> None:
        for name, amount in amounts.items():
            self.values[self.NAMES.index(name)] = amount

    def get(self, name: str) -> float:
        return float(self.values[self.NAMES.index(name)])

    def all_reduced(self, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        """Every count summed over the workers, by name."""
        return dict(zip(self.NAMES, all_reduce(self.values).tolist()))


class ContrastiveLoop(TrainingLoop):
    """Phase 2 or 3 on one worker, from the trial's parent checkpoint (module docstring)."""

    def __init__(self, worker: WorkerConfig, *, rank: int, world: int, device: torch.device) -> None:
        trial = worker.trial
        self.trial, self.worker, self.rank, self.world, self.device = trial, worker, rank, world, device
        settings = self.settings = trial.contrastive
        torch.set_num_threads(trial.train.torch_threads)
        self.tokenizer = load_tokenizer(node_path(worker.tokenizer_path), expected_hash=worker.tokenizer_hash)
        self.joint = settings.mlm_weight > 0
        self.from_parent = settings.init == "parent"
        # A contrastive-only child carries its parent's MLM head along, frozen (its own dense,
        # norm and bias; the decoder stays tied to the child's embeddings), so masked-token
        # accuracy can be measured for every child, as retention asks.
        keeps_head = self.from_parent and (self.joint or (local_checkpoint(trial.parent) / HEAD_FILE).is_file())
        self.parent = load_parent(trial.parent, tokenizer_hash=self.tokenizer.hash, need_head=keeps_head,
                                  masking_ratio=trial.masking.ratio)
        model = self.parent.model if self.from_parent else random_model(
            self.parent.model, head=self.joint, seed=trial.train.seed)
        self.model = model.to(device)  # MLMModel with a head, else an Encoder
        self.charged_flops = 0.0  # the parent's training FLOPs a lineage-scoped budget charges
        if trial.train.budget.scope == "lineage":
            self.charged_flops, _ = split_lineage_budget(trial.train.budget.flops, recorded_flops(self.parent.manifest),
                                                         inherits_weights=self.from_parent)
        self.encoder = self.model.encoder if isinstance(self.model, MLMModel) else self.model
        if isinstance(self.model, MLMModel) and not self.joint:
            for name, parameter in self.model.mlm_head.named_parameters():
                if not name.startswith("embedding."):
                    parameter.requires_grad_(False)
        if resolve_compile(trial.train, trial.model):
            compile_blocks(self.encoder)
        self.temperature = (
            LearnableTemperature(settings.temperature).to(device) if settings.learnable_temperature else None
        )
        trained = [self.model if self.joint else self.encoder] + (
            [self.temperature] if self.temperature is not None else [])
        self.parameters = torch.nn.ModuleList(trained)
        self.optimizer = build_optimizer(self.parameters, trial.train, device)
        self.precision = resolve_precision(trial.train)
        self.half = half_activations(self.precision, device)
        self.batches_per_step = trial.train.microbatches
        self.anchors_per_query = 2 if settings.symmetric else 1  # the reverse direction anchors each positive
        self.masking_rng = torch.Generator().manual_seed(seed_for(trial.train.seed, "masking", rank))
        torch.manual_seed(seed_for(trial.train.seed, "dropout", rank))
        seed_everything(seed_for(trial.train.seed, "python", rank))
        gathered = settings.gather_across_workers and world > 1
        self.all_reduce = sum_all_reduce(device) if world > 1 else no_reduce
        self.contrastive = ContrastiveStep(
            settings=settings, encoder=self.encoder, temperature=self.temperature,
            gather=gather_with_grad if gathered else local, gather_ids=gather_no_grad if gathered else local,
            model=trial.model, pad_id=self.tokenizer.pad_id, precision=self.precision, device=device, half=self.half,
        )
        self.host_ban = torch.tensor(self.tokenizer.special_ids)  # never masked (the joint term's copies)
        self.random_range = self.tokenizer.replacement_ids
        self.builders = list(worker.sources)
        self.progress = ContrastiveProgress(consumed_pairs=[0.0] * len(self.builders),
                                            consumed_tokens=[0.0] * len(self.builders))
        # Since the last report (empty at every checkpoint, which always reports):
        self.builder_pairs = torch.zeros(len(self.builders), dtype=torch.float64)  # this worker's
        self.builder_tokens = torch.zeros(len(self.builders), dtype=torch.float64)
        self.window: list[float] = []
        self.window_mlm: list[float] = []
        # Distillation arms: the InfoNCE's own mean and each distillation term's, per step.
        self.window_terms: dict[str, list[float]] = {}
        self.last: dict[str, float] = {}
        self.model.train()

    def clock(self) -> tuple[float, float]:
        """(consumed, budget) of this phase: a lineage-scoped budget less what it charged the parent."""
        p = self.progress
        consumed, budget = consumption(self.trial.train, self.trial.phase, tokens=p.tokens, pairs=p.pairs,
                                       flops=p.flops, device_seconds=p.device_seconds)
        return consumed, budget - self.charged_flops

    def done(self) -> bool:
        clock, budget = self.clock()
        return clock >= budget

    def step(self, batches: list[dict[str, torch.Tensor]]) -> None:
        """One update from `train.microbatches` microbatches: each scores its queries against
        its own candidates (gathered across workers), and every loss sum is divided by the
        step's global count of valid anchors, so the gradient is that of the mean over all
        the step's anchors; the joint MLM term likewise divides by its global selected count."""
        train = self.trial.train
        clock, budget = self.clock()
        set_learning_rate(self.optimizer, clock, budget, train)
        # Every query's own positive is a candidate, so every anchor is valid and the global
        # count is known before the forward pass (GradCache needs it up front).
        # Distillation's counts come from the teacher masks on the host, so they too are known
        # before the forward pass: one all-reduce for all three.
        distilling = self.settings.distillation.weight > 0
        queries = torch.tensor([float(sum(len(b["group"]) for b in batches))], dtype=torch.float64)
        known = self.all_reduce(torch.cat([queries, local_distill_counts(batches)]) if distilling else queries).tolist()
        valid = self.anchors_per_query * int(known[0])
        distill = DistillCounts(kl=int(known[1]), margin=int(known[2]), embedding=int(known[3])) if distilling else None
        loss_local = torch.zeros(1, dtype=torch.float64, device=self.device)  # summed as the host summed it
        # Distillation arms: this worker's InfoNCE, KL, MarginMSE and embedding MSE sums.
        parts_local = torch.zeros(1 + len(DISTILLATION_TERMS), dtype=torch.float64, device=self.device)
        terms = torch.zeros(2, dtype=torch.float64, device=self.device)  # this worker's valid anchors, candidates
        counts = StepCounts()
        taus = []
        for batch in batches:
            term, flops, tau = self._contrastive_backward(batch, valid, distill)
            loss_local += term.loss_sum.detach().double()
            if distilling:
                named = dict(term.terms)
                parts_local += torch.stack([term.infonce_sum.detach().double().reshape(())] + [
                    named[name].loss_sum.detach().double() if name in named else
                    torch.zeros((), dtype=torch.float64, device=self.device) for name in DISTILLATION_TERMS])
            terms += torch.stack([term.valid, term.candidate_sum]).double()
            counts.add(pairs=float(len(batch["group"])), tokens=float(batch["tokens"].sum()),
                       anchors=float(term.anchors), flops=flops)
            taus.append(tau)
        # The step's figures stay on the device until one read, with the gradient norm.
        figures = {"loss": self.all_reduce(loss_local), "valid": terms[0], "candidates": terms[1]}
        if distilling:
            figures["parts"] = self.all_reduce(parts_local)
        contrastive_grad = None
        if self.joint:
            # Each term's norm is of its global gradient (summed over workers), so the
            # contrastive part costs one more gradient all-reduce a step in joint arms.
            contrastive_grad = self.all_reduce(_grad_vector(self.parameters))
            figures["mlm"], global_count, mlm_flops = self._mlm_backward(batches)
            counts.add(flops=mlm_flops)
        all_reduce_gradients(self.parameters, self.all_reduce)
        if contrastive_grad is not None:
            figures["train/grad_norm_contrastive"] = contrastive_grad.norm()
            figures["train/grad_norm_mlm"] = _difference_norm(self.parameters, contrastive_grad)
        figures["norm"] = torch.nn.utils.clip_grad_norm_(self.parameters.parameters(), train.max_grad_norm)
        tau = taus[-1]
        if isinstance(tau, torch.Tensor):
            figures["tau"] = tau.detach()
        parts = figures.pop("parts", None)
        read = dict(zip(figures, torch.cat([value.double().reshape(1) for value in figures.values()]).tolist()))
        if parts is not None:
            parts = parts.tolist()
        anchors = int(counts.get("anchors"))
        if read["valid"] != anchors:  # before any update: every query's own positive is a candidate
            raise RuntimeError(f"worker {self.rank}: {anchors - int(read['valid'])} anchors without a positive")
        counts.set(candidates=read["candidates"])
        loss_total, norm = read["loss"], read["norm"]
        mlm_mean = read["mlm"] / max(global_count, 1) if self.joint else 0.0
        # All three figures are global, so every worker takes the same decision.
        rejected = not finite_update(loss_total, mlm_mean, norm)
        if not rejected:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals = counts.all_reduced(self.all_reduce)
        # A rejected step's batch counts as consumed (embedlab.train.nonfinite).
        progress = self.progress
        progress.steps += 1
        progress.batches += len(batches)
        progress.pairs += int(totals["pairs"])
        progress.tokens += int(totals["tokens"])
        progress.candidate_sum += int(totals["candidates"])
        progress.anchors += int(totals["anchors"])
        progress.flops += totals["flops"]
        if not rejected:
            self.window.append(loss_total / max(valid, 1))
            if parts is not None:
                # Each term over its own global count: the figures the objective weighs.
                for name, value, count in (("contrastive", parts[0], valid), ("kl", parts[1], distill.kl),
                                           ("margin_mse", parts[2], distill.margin),
                                           ("embedding_mse", parts[3], distill.embedding)):
                    if name == "contrastive" or count:
                        self.window_terms.setdefault(name, []).append(value / max(count, 1))
            if self.joint:
                self.window_mlm.append(mlm_mean)
        self.last = {"train/grad_norm": norm, "train/temperature": read.get("tau", tau),
                     **{key: value for key, value in read.items() if key.startswith("train/")}}
        self.count_rejection(rejected)

    def _contrastive_backward(self, batch: dict[str, torch.Tensor], valid: int, distill: DistillCounts | None = None):
        """Backward of one microbatch's contrastive objective (`embedlab.train.contrastive_step`),
        counting its pairs and tokens per builder; returns the term, the FLOPs this worker's
        passes ran and the temperature used. The term's counts stay on the device: `step`
        checks them after its one read."""
        self.builder_pairs += torch.bincount(batch["builder_index"], minlength=len(self.builders)).double()
        self.builder_tokens += torch.bincount(batch["builder_index"], weights=batch["tokens"].double(),
                                              minlength=len(self.builders))
        return self.contrastive.backward(batch, valid, distill)

    def _mlm_backward(self, batches: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, int, float]:
        """The joint arm's MLM term on separately corrupted copies of every microbatch's texts:
        all are masked first, so the global selected count divides every backward. Returns the
        term's global loss sum (on the device, (1,) float64), the global selected count and the
        FLOPs this worker's passes ran."""
        device, pad_id = self.device, self.tokenizer.pad_id
        parts, trained, forward_only = [], FlopTally(), FlopTally()
        for batch in batches:
            # Masked, counted and laid out on the host (the stream's CPU tensors), then moved once.
            texts = torch.cat([batch["query_ids"], batch["positive_ids"]])
            segments = (texts != pad_id).long()
            eligible = (segments > 0) & ~torch.isin(texts, self.host_ban)
            masked = mask_tokens(texts, eligible, self.trial.masking, mask_id=self.tokenizer.mask_id,
                                 random_token_range=self.random_range, generator=self.masking_rng)
            for tally, mode in ((trained, TRAINED), (forward_only, FORWARD)):
                tally.encode(self.trial.model, segments, mode=mode, device=device, half=self.half, training=True)
                tally.head(self.trial.model, float(masked.selected.sum()), mode=mode)
            kernel = attention_path(self.trial.model, device=device, half=self.half, length=segments.shape[1],
                                    training=True)
            parts.append(prepare_microbatch(masked, segments, device=device, varlen=kernel.varlen))
        global_count = int(self.all_reduce(torch.tensor([float(sum(mb.selected for mb in parts))],
                                                        dtype=torch.float64)).item())
        loss_local = torch.zeros(1, dtype=torch.float64, device=device)
        for mb in parts:
            (head,) = mb.heads.values()
            with forward_precision(self.precision, device):
                logits = self.model(mb.inputs, mb.segment_ids, head.positions, layout=mb.layout)
            mlm_sum, _ = mlm_loss_sum(logits, head.targets)
            if global_count:
                (self.settings.mlm_weight * mlm_sum / global_count).backward()
            loss_local += mlm_sum.detach().double()
        # No selected token on any worker: no MLM backward ran, only the forwards.
        return self.all_reduce(loss_local), global_count, (trained if global_count else forward_only).flops

    def metrics(self) -> dict[str, Any]:
        progress = self.progress
        pairs = self.all_reduce(self.builder_pairs.clone())
        tokens = self.all_reduce(self.builder_tokens.clone())
        progress.consumed_pairs = (torch.tensor(progress.consumed_pairs, dtype=torch.float64) + pairs).tolist()
        progress.consumed_tokens = (torch.tensor(progress.consumed_tokens, dtype=torch.float64) + tokens).tolist()
        self.builder_pairs.zero_()
        self.builder_tokens.zero_()
        clock, budget = self.clock()
        elapsed = self.elapsed()
        loss = sum(self.window) / len(self.window) if self.window else float("nan")
        metrics = {
            **{f"data/observed_pair_share/{name}": progress.consumed_pairs[i] / max(progress.pairs, 1)
               for i, name in enumerate(self.builders)},
            **{f"data/observed_token_share/{name}": progress.consumed_tokens[i] / max(progress.tokens, 1)
               for i, name in enumerate(self.builders)},
            "train/loss": loss,
            "train/contrastive_loss": loss,
            **{f"train/{name}_loss": sum(values) / len(values) for name, values in self.window_terms.items()},
            **({"train/mlm_loss": sum(self.window_mlm) / len(self.window_mlm)} if self.window_mlm else {}),
            **self.last,
            "train/step": progress.steps,
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "train/skipped_steps": progress.skipped,
            "train/nonfinite_steps": progress.nonfinite,
            "train/rejected_in_a_row": progress.rejected_in_a_row,
            "train/effective_candidates": progress.candidate_sum / max(progress.anchors, 1),
            "train/pairs_per_s": progress.pairs / elapsed,
            "train/effective_batch_pairs": progress.pairs / max(progress.steps, 1),
            "train/effective_batch_tokens": progress.tokens / max(progress.steps, 1),
            "budget/pairs": progress.pairs,
            "budget/tokens": progress.tokens,
            "budget/fraction": clock / budget,
            "budget/flops": progress.flops,
            **({"budget/inherited_flops": self.charged_flops,
                "budget/total_flops": self.charged_flops + progress.flops}
               if self.trial.train.budget.scope == "lineage" else {}),
            **self.worker.made.mining_compute,
            **self.worker.made.negative_figures,
            **teacher_compute_figures(self.worker.made.teacher_labels, self.worker.made.teacher_embeddings),
        }
        self.window, self.window_mlm, self.window_terms = [], [], {}
        return metrics

    def stream_ended(self) -> Exception:
        clock, budget = self.clock()
        return RuntimeError(
            f"worker {self.rank}: the pair stream ended after {self.progress.pairs:,} pairs, {clock / budget:.1%} "
            "of the budget" + (" (a device-time budget: raise train.budget.pairs, the pair schedule's length)"
                               if self.trial.train.budget.device_seconds else "")
        )

    def weights(self) -> tuple[torch.nn.Module, torch.nn.Module | None]:
        return self.encoder, self.model.mlm_head if isinstance(self.model, MLMModel) else None

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {} if self.temperature is None else {"log_temperature": self.temperature.log_temperature}

    def load_extra(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.temperature is not None:
            with torch.no_grad():
                self.temperature.log_temperature.copy_(tensors["log_temperature"])

    def checkpoint_contents(self, metrics: dict[str, Any]) -> dict[str, Any]:
        trial, settings, made = self.trial, self.settings, self.worker.made
        encoder, head = self.weights()
        head_origin = "the parent's" if self.parent.head_restored else "fresh"
        return {
            "encoder": encoder,
            "head": head,
            "tokenizer": self.tokenizer,
            "pooling": settings.pooling,
            "prefixes": {"query": settings.prefixes.query, "passage": settings.prefixes.passage},
            "fields": {
                "phase": trial.phase,
                "parent_hash": self.parent.manifest["content_hash"],
                "parent_phase": self.parent.manifest.get("phase"),
                **pretrained_root(self.parent.manifest),
                "initialisation": self.initialisation_record(),
                **self.run_fields(metrics),
                "objective": {
                    "name": "joint mlm + contrastive" if settings.mlm_weight > 0 else "contrastive",
                    "contrastive": "multi-positive InfoNCE (log-sum-positive)"
                    + (", symmetric (both directions pooled)" if settings.symmetric else ", query -> candidates"),
                    "temperature": metrics["train/temperature"],
                    "learnable_temperature": settings.learnable_temperature,
                    "mlm_weight": settings.mlm_weight,
                    "mlm_head": (f"{head_origin}, trained with the joint MLM term" if self.joint else
                                 "the parent's, frozen (decoder tied to these embeddings)" if head is not None
                                 else None),
                    "reduction": "sum over valid anchors / global valid anchors; gradients summed over workers",
                    "candidates": "gathered across workers" if settings.gather_across_workers else "local",
                    "hard_negatives": settings.negatives.count,
                    "mined_set": made.mined_version,
                    "given_negatives": made.given_negatives,
                    "effective_candidates": metrics["train/effective_candidates"],
                    **({"distillation": {
                        "kl_weight": settings.distillation.kl_weight, "margin_mse_weight": settings.distillation.margin_mse_weight,
                        "embedding_mse_weight": settings.distillation.embedding_mse_weight,
                        "infonce_weight": 1.0 - settings.distillation.weight,
                        "kl_temperatures": {"student": settings.distillation.student_temperature,
                                            "teacher": settings.distillation.teacher_temperature},
                        "scores": "cosines of each query's own positive and negatives at the widest trained width",
                        "embedding_mse": "the unit embedding of one training-split document per pair, at the "
                                         "full width, regressed onto the teacher's projected vector of it",
                        "reduction": "each term's sum / its global count (KL rows, MarginMSE pairs, "
                                     "embedding rows)",
                        "teacher_labels": made.teacher_labels,
                        "teacher_embeddings": made.teacher_embeddings,
                    }} if settings.distillation.weight > 0 else {}),
                },
                "optimizer_start": "optimizer state and schedule clock reset at the phase start",
                "mixture": {
                    "intended_pair_shares": self.worker.intended_shares,
                    "observed_pair_shares": {k.rsplit("/", 1)[1]: v for k, v in metrics.items()
                                             if k.startswith("data/observed_pair_share/")},
                    "observed_token_shares": {k.rsplit("/", 1)[1]: v for k, v in metrics.items()
                                              if k.startswith("data/observed_token_share/")},
                    "schedule": self.worker.schedule,
                },
            },
        }

    def initialisation_record(self) -> dict[str, Any]:
        """Where the encoder's weights started, for the manifest."""
        if self.from_parent:
            return {"encoder": "parent", "weights": f"the parent's ({self.parent.manifest['content_hash']})"}
        return {"encoder": "random", "seed": seed_for(self.trial.train.seed, "init"),
                "weights": "a fresh initialisation of the parent's architecture; the parent supplied only the "
                           "tokenizer" + (" (the joint term's MLM head is fresh too)" if self.joint else
                                          "; no MLM head, so masked-token retention is not measured")}


def random_model(parent: torch.nn.Module, *, head: bool, seed: int) -> torch.nn.Module:
    """A freshly initialised encoder of the architecture of `parent` (the parent's encoder or
    `MLMModel`; an `MLMModel` with a fresh head when `head`), drawn from the trial seed's
    "init" stream, as phase 1 draws its own: identical on every worker and for every run at
    that seed. A pretrained backbone is drawn by its own family's initialisation. The global
    RNG is left as it was."""
    encoder = parent.encoder if isinstance(parent, MLMModel) else parent
    if isinstance(encoder, PretrainedEncoder):
        fresh = PretrainedEncoder(encoder.hf_config, seed=seed_for(seed, "init"))
        return (with_mlm_head(fresh, seed=seed_for(seed, "init")) if head else fresh).train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_for(seed, "init"))
        model = MLMModel(encoder.config) if head else Encoder(encoder.config)
    return model.train()


def contrastive_worker(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train's `train_loop_per_worker` for phases 2 and 3."""
    return run_on_ray(ContrastiveLoop, loop_config)


def run_contrastive(trial: TrialConfig, prepared, *, storage_path: Path, name: str, callbacks: list | None = None,
                    progress=print, options: RunOptions = RunOptions(), overlap_policy: str | None = None):
    """Fit one phase-2 or phase-3 `TorchTrainer` on the trial's pair stream.

    Before it trains, what it trains on is built or found, each part past the contamination
    gate against its evaluation tasks (`embedlab.train.trial_data`): final-eval items refuse
    the run with a ContaminationError unless `overlap_policy` (the study's disclosed-overlap
    policy) is given. A run of a `name` that has checkpoints under `storage_path` resumes from
    the latest.
    """
    settings = trial.contrastive
    data = trial_data(trial, prepared, overlap_policy=overlap_policy, progress=progress)
    streams = [pair_dataset(
        data.pairs_path, data.schedule, data.offsets, tokenizer_path=prepared.tokenizer_path,
        length=settings.pair_length, query_prefix=settings.prefixes.query, passage_prefix=settings.prefixes.passage,
        negatives_path=None if data.mined is None else data.mined / NEGATIVES_FILE,
        negatives_per_pair=settings.negatives.count,
        given_negatives_path=None if data.given is None else data.given / NEGATIVES_FILE,
        teacher_labels_path=None if data.labels is None else data.labels / LABELS_FILE,
        teacher_min_confidence=settings.distillation.min_confidence,
        teacher_embeddings_path=None if data.documents is None else data.documents / EMBEDDINGS_FILE,
        split=split,
    ) for split in worker_splits(trial.train.num_workers, trial.train.batch_rows)]
    schedule = data.schedule
    worker = WorkerConfig(
        trial=trial, tokenizer_path=str(prepared.tokenizer_path), tokenizer_hash=prepared.record["tokenizer_hash"],
        data_revision=prepared.data_revision, sources=tuple(schedule.sources), intended_shares=dict(settings.pairs),
        schedule={"version": schedule.version, "seed": schedule.seed, "pairs": int(len(schedule.item))},
        run=options, made=data.made(trial),
    )
    return fit(
        contrastive_worker,
        worker.to_dict(),
        trial,
        streams,
        storage_path=storage_path,
        name=name,
        callbacks=callbacks,
    )
