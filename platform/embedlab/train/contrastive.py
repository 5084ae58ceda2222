"""Phases 2 and 3 (contrastive) on Ray Train, from a parent checkpoint.

Every worker encodes its pairs' queries and positives (and, in phase 3, mined negatives),
pools them (mean or CLS, L2-normalised) and scores its queries against the candidates of
*all* workers (`gather_with_grad`). Its loss is its queries' loss sum divided by the
global count of valid anchors, and gradients are summed across workers, so the step is
the one-process gradient of the global mean loss. Gradient accumulation is not offered
here: it would not enlarge the contrastive denominator (each microbatch sees only its own
candidates); GradCache (`contrastive.gradcache_chunk`) is the way to a large denominator
under a memory limit.

Joint arm (`contrastive.mlm_weight` = w > 0): w * L_MLM + (1 - w) * L_contrastive, with
MLM on separately corrupted copies of the same texts and contrastive on clean views; both
component losses and the norms of their gradients are reported.

Lineage: the child records its parent's content hash and refuses a parent whose tokenizer
hash differs from its own data's. Optimizer state and schedule clocks reset (recorded),
since a changed objective is not an exact resume.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from embedlab.config import TrialConfig
from embedlab.model.encoder import Encoder, MLMModel
from embedlab.model.pooling import l2_normalise, mean_pool
from embedlab.objectives.contrastive import LearnableTemperature, multi_positive_infonce, pair_masks, pooled
from embedlab.objectives.gather import gather_no_grad, gather_with_grad
from embedlab.objectives.gradcache import gradcache_step
from embedlab.objectives.masking import mask_tokens
from embedlab.objectives.mlm import mlm_loss_sum
from embedlab.tokenizer import load_tokenizer
from embedlab.train.launch import fit
from embedlab.train.checkpoint import load_parent, save_checkpoint
from embedlab.train.mlm_step import all_reduce_gradients, build_optimizer, learning_rate_at, no_reduce
from embedlab.train.phase1 import seed_for, sum_all_reduce


def embed(encoder: Encoder, ids: torch.Tensor, pad_id: int, pooling: str) -> torch.Tensor:
    """(B, L) `[CLS] text [SEP]` rows -> (B, d) unit embeddings (zero rows stay zero).

    Mean pooling averages content tokens (CLS and SEP excluded); CLS pooling takes the
    first position's final state.
    """
    segments = (ids != pad_id).long()
    hidden = encoder(ids, segments)
    if pooling == "cls":
        return l2_normalise(hidden[:, 0])
    lengths = segments.sum(dim=1, keepdim=True)
    positions = torch.arange(ids.shape[1], device=ids.device)[None, :]
    content = (positions >= 1) & (positions < lengths - 1)
    return l2_normalise(mean_pool(hidden, content))


def _grad_vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()
    ])


def contrastive_worker(loop_config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    trial = TrialConfig.from_dict(loop_config["trial"])
    settings = trial.contrastive
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(trial.train.torch_threads)
    device = ray.train.torch.get_device()
    tokenizer = load_tokenizer(loop_config["tokenizer_path"], expected_hash=loop_config["tokenizer_hash"])
    joint = settings.mlm_weight > 0
    parent = load_parent(Path(trial.parent), tokenizer_hash=tokenizer.hash, need_head=joint)
    model = parent.model.to(device)  # MLMModel when joint, else an Encoder
    encoder = model.encoder if joint else model
    temperature = LearnableTemperature(settings.temperature).to(device) if settings.learnable_temperature else None
    parameters = torch.nn.ModuleList([model] + ([temperature] if temperature is not None else []))
    optimizer = build_optimizer(parameters, trial.train.learning_rate, trial.train.weight_decay)
    masking_rng = torch.Generator().manual_seed(seed_for(trial.train.seed, "masking", rank))
    torch.manual_seed(seed_for(trial.train.seed, "dropout", rank))
    all_reduce = sum_all_reduce(device) if world > 1 else no_reduce
    gather = gather_with_grad if settings.gather_across_workers and world > 1 else (lambda x: x)
    gather_ids = gather_no_grad if settings.gather_across_workers and world > 1 else (lambda x: x)
    eligible_ban = torch.tensor(tokenizer.special_ids, device=device)
    random_range = (len(tokenizer.special_ids), tokenizer.vocab_size)

    budget = trial.train.budget_pairs
    builders = loop_config["sources"]
    builder_pairs = torch.zeros(len(builders), dtype=torch.float64)  # this worker's, since the last report
    builder_tokens = torch.zeros(len(builders), dtype=torch.float64)
    consumed_pairs = torch.zeros(len(builders), dtype=torch.float64)  # all workers'
    consumed_tokens = torch.zeros(len(builders), dtype=torch.float64)
    pairs_seen = tokens_seen = steps = 0
    candidate_sum = anchors = 0
    window: list[float] = []
    window_mlm: list[float] = []
    started = time.perf_counter()
    model.train()
    for batch in ray.train.get_dataset_shard("train").iter_torch_batches(
        batch_size=trial.train.batch_rows, drop_last=True, dtypes=torch.long
    ):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(pairs_seen, budget, trial.train.learning_rate, trial.train.warmup_fraction)
        builder_pairs += torch.bincount(batch["builder_index"], minlength=len(builders)).double()
        builder_tokens += torch.bincount(batch["builder_index"], weights=batch["tokens"].double(), minlength=len(builders))
        sides = [batch["positive_ids"].to(device)]
        groups = [batch["group"].to(device)]
        exclude = [torch.zeros(len(batch["group"]), dtype=torch.bool, device=device)]
        if "negative_ids" in batch:
            rows, k, length = batch["negative_ids"].shape
            sides.append(batch["negative_ids"].reshape(rows * k, length).to(device))
            groups.append(batch["negative_group"].reshape(-1).to(device))
            exclude.append((batch["negative_len"].reshape(-1) == 0).to(device))
        query_groups = batch["group"].to(device)
        candidate_groups = gather_ids(torch.cat(groups))
        ineligible = gather_ids(torch.cat(exclude).long()).bool()
        tau = temperature() if temperature is not None else settings.temperature

        def contrastive_term(queries: torch.Tensor, local_candidates: torch.Tensor):
            """This worker's queries against every worker's candidates (+ the reverse direction)."""
            masks = pair_masks(query_groups, candidate_groups,
                               exclude=ineligible[None, :].expand(len(queries), -1).contiguous())
            term = multi_positive_infonce(queries, gather(local_candidates), masks.positive, masks.eligible,
                                          temperature=tau)
            if settings.symmetric:
                # Reverse direction: this worker's positives against every worker's queries,
                # pooled with the forward term so sums and counts stay exact across workers.
                reverse = pair_masks(query_groups, gather_ids(query_groups))
                term = pooled([term, multi_positive_infonce(
                    local_candidates[: len(queries)], gather(queries), reverse.positive, reverse.eligible,
                    temperature=tau,
                )])
            return term

        def encode(ids: torch.Tensor) -> torch.Tensor:
            return embed(encoder, ids, tokenizer.pad_id, settings.pooling)

        # Every query's own positive is a candidate, so every anchor is valid and the global
        # count is known before the forward pass (GradCache needs it up front).
        anchors_per_query = 2 if settings.symmetric else 1
        valid = anchors_per_query * int(all_reduce(torch.tensor([float(len(query_groups))], dtype=torch.float64)).item())
        weight = 1.0 - settings.mlm_weight
        if settings.gradcache_chunk:
            term = gradcache_step(
                encode, batch["query_ids"].to(device).split(settings.gradcache_chunk),
                torch.cat(sides).split(settings.gradcache_chunk), contrastive_term, global_valid=valid,
            )
        else:
            term = contrastive_term(encode(batch["query_ids"].to(device)), encode(torch.cat(sides)))
            (weight * term.loss_sum / valid).backward()
        if term.valid != anchors_per_query * len(query_groups):
            raise RuntimeError(f"worker {rank}: {term.anchors - term.valid} anchors without a positive")
        queries_in_batch = len(query_groups)
        grad_norms: dict[str, float] = {}
        if joint:
            contrastive_grad = _grad_vector(parameters)
            texts = torch.cat([batch["query_ids"], batch["positive_ids"]]).to(device)
            segments = (texts != tokenizer.pad_id).long()
            eligible = (segments > 0) & ~torch.isin(texts, eligible_ban)
            masked = mask_tokens(texts.cpu(), eligible.cpu(), trial.masking, mask_id=tokenizer.mask_id,
                                 random_token_range=random_range, generator=masking_rng)
            selected = masked.selected.to(device)
            mlm_sum, mlm_count = mlm_loss_sum(model(masked.inputs.to(device), segments, selected), texts[selected])
            global_count = int(all_reduce(torch.tensor([float(mlm_count)], dtype=torch.float64)).item())
            if global_count:
                (settings.mlm_weight * mlm_sum / global_count).backward()
            mlm_loss = float(all_reduce(torch.tensor([float(mlm_sum.detach())], dtype=torch.float64)).item())
            window_mlm.append(mlm_loss / max(global_count, 1))
            grad_norms = {
                "train/grad_norm_contrastive": float(contrastive_grad.norm()),
                "train/grad_norm_mlm": float((_grad_vector(parameters) - contrastive_grad).norm()),
            }
        all_reduce_gradients(parameters, all_reduce)
        norm = float(torch.nn.utils.clip_grad_norm_(parameters.parameters(), trial.train.max_grad_norm))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        counts = all_reduce(torch.tensor(
            [float(queries_in_batch), float(batch["tokens"].sum()), float(term.candidate_sum), float(term.anchors)],
            dtype=torch.float64,
        ))
        pairs_seen += int(counts[0])
        tokens_seen += int(counts[1])
        candidate_sum += int(counts[2])
        anchors += int(counts[3])
        loss_total = float(all_reduce(torch.tensor([float(term.loss_sum.detach())], dtype=torch.float64)).item())
        window.append(loss_total / max(valid, 1))
        done = pairs_seen >= budget
        if not (done or steps % trial.train.report_every_steps == 0):
            continue
        consumed_pairs += all_reduce(builder_pairs.clone())
        consumed_tokens += all_reduce(builder_tokens.clone())
        builder_pairs.zero_()
        builder_tokens.zero_()
        elapsed = time.perf_counter() - started
        metrics = {
            **{f"data/observed_pair_share/{name}": float(consumed_pairs[i] / max(pairs_seen, 1))
               for i, name in enumerate(builders)},
            **{f"data/observed_token_share/{name}": float(consumed_tokens[i] / max(tokens_seen, 1))
               for i, name in enumerate(builders)},
            "train/loss": sum(window) / len(window),
            "train/contrastive_loss": sum(window) / len(window),
            **({"train/mlm_loss": sum(window_mlm) / len(window_mlm)} if window_mlm else {}),
            **grad_norms,
            "train/step": steps,
            "train/lr": optimizer.param_groups[0]["lr"],
            "train/grad_norm": norm,
            "train/skipped_steps": 0,
            "train/temperature": float(tau),
            "train/effective_candidates": candidate_sum / max(anchors, 1),
            "budget/pairs": pairs_seen,
            "budget/tokens": tokens_seen,
            "budget/fraction": pairs_seen / budget,
            "compute/wall_seconds": elapsed,
            "compute/worker_seconds": elapsed * world,
        }
        window, window_mlm = [], []
        if done:
            _final_report(model, encoder, parent, tokenizer, trial, loop_config, metrics, rank, world)
            return
        ray.train.report(metrics)
    raise RuntimeError(
        f"worker {rank}: the pair stream ended after {pairs_seen:,} of {budget:,} budget pairs"
    )


def _final_report(model, encoder, parent, tokenizer, trial, loop_config, metrics, rank, world) -> None:
    import ray.train

    if rank != 0:
        ray.train.report(metrics)
        return
    settings = trial.contrastive
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(
            Path(directory),
            encoder,
            head=model.mlm_head if isinstance(model, MLMModel) else None,
            tokenizer=tokenizer,
            pooling=settings.pooling,
            prefixes={"query": settings.query_prefix, "passage": settings.passage_prefix},
            fields={
                "phase": trial.phase,
                "parent_hash": parent.manifest["content_hash"],
                "parent_phase": parent.manifest.get("phase"),
                "config": trial.to_dict(),
                "seed": trial.train.seed,
                "data_revision": loop_config["data_revision"],
                "objective": {
                    "name": "joint mlm + contrastive" if settings.mlm_weight > 0 else "contrastive",
                    "contrastive": "multi-positive InfoNCE (log-sum-positive)"
                    + (", symmetric (both directions pooled)" if settings.symmetric else ", query -> candidates"),
                    "temperature": metrics["train/temperature"],
                    "learnable_temperature": settings.learnable_temperature,
                    "mlm_weight": settings.mlm_weight,
                    "reduction": "sum over valid anchors / global valid anchors; gradients summed over workers",
                    "candidates": "gathered across workers" if settings.gather_across_workers else "local",
                    "hard_negatives": settings.hard_negatives,
                    "mined_set": loop_config.get("mined_version"),
                    "effective_candidates": metrics["train/effective_candidates"],
                },
                "optimizer": {"name": "AdamW", "state": "reset at phase start", "schedule_clock": "reset"},
                "precision": "fp32",
                "distributed": {"workers": world, "backend": "gloo" if world > 1 else "none"},
                "budget": {k: v for k, v in metrics.items() if k.startswith(("budget/", "compute/"))},
                "mixture": {
                    "intended_pair_shares": loop_config["intended_shares"],
                    "observed_pair_shares": {k.rsplit("/", 1)[1]: v for k, v in metrics.items()
                                             if k.startswith("data/observed_pair_share/")},
                    "observed_token_shares": {k.rsplit("/", 1)[1]: v for k, v in metrics.items()
                                              if k.startswith("data/observed_token_share/")},
                    "schedule": loop_config["schedule"],
                },
            },
        )
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def mine_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets, progress=print) -> Path:
    """Mine hard negatives for the scheduled pairs with the parent encoder (cached by version).

    The candidate pool is the prepared corpus's training split; known positives, their
    near-duplicate groups and every recipe-dev / final-eval document are never negatives.
    """
    from functools import partial

    import numpy as np
    import pyarrow.parquet as pq

    from embedlab.data.mining import MinedSet, MiningConfig, mine_hard_negatives, mining_version
    from embedlab.data.pairs import Pair
    from embedlab.evaluate.encode import encode_texts
    from embedlab.train.checkpoint import load_encoder

    encoder, tokenizer, manifest = load_encoder(Path(trial.parent))
    rows = np.unique(np.array([offsets[n] for n in schedule.sources], dtype=np.int64)[schedule.source] + schedule.item)
    table = pq.read_table(pairs_path).take(rows).to_pylist()
    pairs = [Pair(**{**row, "doc_ids": tuple(row["doc_ids"])}) for row in table]
    config = MiningConfig(negatives_per_query=trial.contrastive.hard_negatives,
                          top_k=trial.contrastive.mining_top_k, false_negative_margin=trial.contrastive.mining_margin)
    version = mining_version(encoder_id=manifest["content_hash"], corpus_revision=prepared.data_revision,
                             config=config, pair_ids=[p.pair_id for p in pairs])
    directory = prepared.directory / "mined" / version[:16]
    if not (directory / "manifest.json").is_file():
        encode = partial(encode_texts, encoder, tokenizer, max_length=trial.contrastive.pair_length,
                         pooling=manifest["pooling"]["method"])
        mined = mine_hard_negatives(pairs, prepared.corpus.read(), encode, config=config,
                                    encoder_id=manifest["content_hash"], corpus_revision=prepared.data_revision,
                                    progress=progress)
        mined.save(directory)
        (directory / "report.md").write_text(mined.report())
        progress(f"mining: {len(pairs):,} pairs, negatives in {directory} (version {version[:16]})")
    return directory


def run_contrastive(trial: TrialConfig, prepared, *, storage_path: Path, name: str, callbacks: list | None = None,
                    progress=print):
    """Fit one phase-2 or phase-3 `TorchTrainer` on the trial's pair stream."""
    from embedlab.data.mixture import schedule_target
    from embedlab.data.pair_stream import pair_dataset, pair_schedule, pair_table_path

    settings = trial.contrastive
    shares = dict(settings.pairs)
    pairs_path = pair_table_path(prepared, list(shares), progress)
    step_pairs = trial.train.num_workers * trial.train.batch_rows
    schedule, offsets = pair_schedule(
        pairs_path, shares, target_pairs=schedule_target(trial.train.budget_pairs, step_pairs),
        max_epochs=trial.data.mixture.max_epochs, seed=trial.data.mixture.seed,
    )
    mined = None
    if trial.phase == 3 and settings.hard_negatives:
        mined = mine_for_phase3(trial, prepared, pairs_path, schedule, offsets, progress)
    rows = pair_dataset(
        pairs_path, schedule, offsets, tokenizer_path=prepared.tokenizer_path, length=settings.pair_length,
        query_prefix=settings.query_prefix, passage_prefix=settings.passage_prefix,
        negatives_path=None if mined is None else mined / "negatives.parquet",
        negatives_per_pair=settings.hard_negatives,
    )
    return fit(
        contrastive_worker,
        {
            "trial": trial.to_dict(),
            "tokenizer_path": str(prepared.tokenizer_path),
            "tokenizer_hash": prepared.record["tokenizer_hash"],
            "data_revision": prepared.data_revision,
            "sources": list(schedule.sources),
            "intended_shares": shares,
            "schedule": {"version": schedule.version, "seed": schedule.seed, "pairs": int(len(schedule.item))},
            "mined_version": None if mined is None else mined.name,
        },
        trial,
        rows,
        storage_path=storage_path,
        name=name,
        callbacks=callbacks,
    )
