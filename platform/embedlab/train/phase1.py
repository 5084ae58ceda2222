"""Phase 1 (masked language modelling) on Ray Train.

`phase1_worker` is the `train_loop_per_worker` that `TorchTrainer` runs on every worker;
`run_phase1` builds the trainer. Workers read packed rows from their Ray Data shard
(`get_dataset_shard("train")`), mask them with a per-worker masking RNG, and step until
the global count of consumed non-padding tokens reaches the budget. Every worker sees the
same all-reduced counts, so all stop at the same step.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from embedlab.config import REPLACEMENT_POLICY, TrialConfig
from embedlab.data.mixture import Schedule, sample_schedule, schedule_target
from embedlab.data.prepare import PreparedData
from embedlab.data.stream import packed_dataset, units_by_source
from embedlab.model.encoder import MLMModel, count_parameters
from embedlab.model.heads import MultiHeadMLMModel
from embedlab.objectives.dual_mlm import assign_ratios, head_names, mask_mixed, route_heads
from embedlab.objectives.masking import MaskedBatch, mask_tokens
from embedlab.objectives.mlm import combine
from embedlab.tokenizer import load_tokenizer
from embedlab.train.launch import fit
from embedlab.train.checkpoint import save_checkpoint
from embedlab.train.mlm_step import (
    NO_DECAY_RULE,
    Microbatch,
    accumulate_gradients,
    build_optimizer,
    learning_rate_at,
    no_reduce,
    optimizer_step,
)


def seed_for(seed: int, stream: str, rank: int = 0) -> int:
    """Independent RNG streams (init, masking, ...) derived from one trial seed."""
    digest = hashlib.sha256(f"{seed}:{stream}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def sum_all_reduce(device: torch.device):
    """An all-reduce (sum) over the process group that accepts tensors on any device."""

    def reduce(tensor: torch.Tensor) -> torch.Tensor:
        on_device = tensor.to(device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        return on_device.to(tensor.device)

    return reduce


def estimated_flops(model: torch.nn.Module, tokens: int, selected: int) -> float:
    """6 * (encoder parameters without the embedding table) per token, plus one head's dense
    transform and vocabulary projection per selected token (heads run nowhere else; each
    selected token goes through exactly one head). Attention scores are ignored."""
    config = model.encoder.config
    body = count_parameters(model.encoder) - config.vocab_size * config.width
    head = config.width * config.width + config.width * config.vocab_size
    return 6.0 * body * tokens + 6.0 * head * selected


def phase1_worker(loop_config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    trial = TrialConfig.from_dict(loop_config["trial"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(trial.train.torch_threads)
    device = ray.train.torch.get_device()
    tokenizer = load_tokenizer(loop_config["tokenizer_path"], expected_hash=loop_config["tokenizer_hash"])

    torch.manual_seed(seed_for(trial.train.seed, "init"))  # identical weights on every worker
    mixed = trial.masking.mixed_ratios
    model = (MultiHeadMLMModel(trial.model, head_names(trial.masking)) if mixed else MLMModel(trial.model)).to(device)
    optimizer = build_optimizer(model, trial.train.learning_rate, trial.train.weight_decay)
    masking_rng = torch.Generator().manual_seed(seed_for(trial.train.seed, "masking", rank))
    torch.manual_seed(seed_for(trial.train.seed, "dropout", rank))
    all_reduce = sum_all_reduce(device) if world > 1 else no_reduce
    eligible_ban = torch.tensor(tokenizer.special_ids)
    random_range = (len(tokenizer.special_ids), tokenizer.vocab_size)

    budget = trial.train.budget_tokens
    sources = loop_config["sources"]
    source_tokens = torch.zeros(len(sources), dtype=torch.float64)  # this worker's, since the last report
    consumed_by_source = torch.zeros(len(sources), dtype=torch.float64)  # all workers'
    consumed = selected_total = steps = skipped = 0
    window: list[tuple[float, int]] = []
    group_window: dict[str, list] = {}  # per head / per ratio (loss sum, count) since the last report
    started = time.perf_counter()
    pending: list[Microbatch] = []
    model.train()
    # One pass over the shard: the schedule is long enough for the budget, and a second
    # pass would repeat data past the mixture's repetition cap.
    for batch in ray.train.get_dataset_shard("train").iter_torch_batches(
        batch_size=trial.train.batch_rows, drop_last=True, dtypes=torch.long
    ):
        input_ids, segment_ids = batch["input_ids"], batch["segment_ids"]
        source_index = batch["source_index"]
        source_tokens += torch.bincount(source_index[segment_ids > 0], minlength=len(sources)).double()
        eligible = (segment_ids > 0) & ~torch.isin(input_ids, eligible_ban)
        word_start = batch["word_start"].bool()
        masking_ids = dict(mask_id=tokenizer.mask_id, random_token_range=random_range, generator=masking_rng,
                           word_start=word_start, segment_ids=segment_ids)
        ratio_index = head_index = None
        if mixed:
            ratio_index = assign_ratios(len(input_ids), mixed, masking_rng)
            masked = mask_mixed(input_ids, eligible, trial.masking, ratio_index, **masking_ids)
            head_index = route_heads(trial.masking, ratio_index).to(device)
        else:
            masked = mask_tokens(input_ids, eligible, trial.masking, **masking_ids)
        # Masking draws on the CPU generator so its stream is the same on any device.
        masked = MaskedBatch(*(t.to(device) for t in (masked.inputs, masked.targets, masked.selected)))
        pending.append(Microbatch(masked=masked, segment_ids=segment_ids.to(device),
                                  ratio_index=ratio_index, head_index=head_index))
        if len(pending) < trial.train.microbatches:
            continue
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(consumed, budget, trial.train.learning_rate, trial.train.warmup_fraction)
        result = accumulate_gradients(model, pending, all_reduce, mixed)
        result = optimizer_step(model, optimizer, result, trial.train.max_grad_norm)
        pending = []
        steps += 1
        consumed += result.tokens
        selected_total += result.selected
        skipped += int(result.skipped)
        window.append((result.loss_sum, result.selected))
        for key, (group_sum, count) in result.groups.items():
            totals = group_window.setdefault(key, [0.0, 0])
            totals[0] += group_sum
            totals[1] += count
        done = consumed >= budget
        if not (done or steps % trial.train.report_every_steps == 0):
            continue
        consumed_by_source += all_reduce(source_tokens.clone())
        source_tokens.zero_()
        elapsed = time.perf_counter() - started
        metrics = {
            "train/loss": combine(window),
            "train/step": steps,
            "train/lr": optimizer.param_groups[0]["lr"],
            "train/grad_norm": result.grad_norm,
            "train/skipped_steps": skipped,
            "train/tokens_per_s": consumed / elapsed,
            "budget/tokens": consumed,
            "budget/selected_tokens": selected_total,
            "budget/fraction": consumed / budget,
            "budget/flops_estimate": estimated_flops(model, consumed, selected_total),
            "compute/wall_seconds": elapsed,
            "compute/worker_seconds": elapsed * world,
            **{
                f"data/observed_share/{name}": float(consumed_by_source[i] / max(consumed, 1))
                for i, name in enumerate(sources)
            },
            **{f"train/loss/{key}": combine([tuple(v)]) for key, v in group_window.items()},
            **{f"train/selected/{key}": v[1] for key, v in group_window.items()},
        }
        window, group_window = [], {}
        if done:
            _final_report(model, tokenizer, trial, loop_config, metrics, rank, world)
            return
        ray.train.report(metrics)
    raise RuntimeError(
        f"worker {rank}: the data stream ended after {consumed:,} of {budget:,} budget tokens "
        f"({steps} steps); the schedule's margin did not cover this batch size"
    )


def _final_report(model, tokenizer, trial, loop_config, metrics, rank, world) -> None:
    import ray.train

    if rank != 0:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(
            Path(directory),
            model.encoder,
            head=model.heads if isinstance(model, MultiHeadMLMModel) else model.mlm_head,
            tokenizer=tokenizer,
            fields={
                "phase": 1,
                "config": trial.to_dict(),
                "seed": trial.train.seed,
                "data_revision": loop_config["data_revision"],
                "objective": {
                    "name": "mlm",
                    "masking_ratio": trial.masking.ratio,
                    "masking_strategy": trial.masking.strategy,
                    "mixed_ratios": trial.masking.mixed_ratios,
                    "heads": list(model.head_names) if isinstance(model, MultiHeadMLMModel) else ["mlm"],
                    "replacement": REPLACEMENT_POLICY,
                    "mask_fraction": trial.masking.mask_fraction,
                    "random_fraction": trial.masking.random_fraction,
                    "reduction": "sum of selected-token losses / selected count, over microbatches and workers",
                    "empty_selection": "step skipped, counted in train/skipped_steps",
                },
                "optimizer": {"name": "AdamW", "no_decay": NO_DECAY_RULE},
                "precision": "fp32",
                "distributed": {"workers": world, "backend": dist.get_backend() if world > 1 else "none"},
                "budget": {k: v for k, v in metrics.items() if k.startswith(("budget/", "compute/"))},
                "mixture": {
                    "intended_shares": loop_config["intended_shares"],
                    "observed_token_shares": {
                        k.removeprefix("data/observed_share/"): v
                        for k, v in metrics.items() if k.startswith("data/observed_share/")
                    },
                    "schedule": loop_config["schedule"],
                },
            },
        )
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def trial_schedule(trial: TrialConfig, prepared: PreparedData) -> tuple[Schedule, dict[str, int]]:
    """The trial's mixture schedule, long enough for the budget plus a margin (`schedule_target`)."""
    units, offsets = units_by_source(prepared.pieces_path)
    step_tokens = (
        trial.train.num_workers * trial.train.batch_rows * trial.train.microbatches * trial.data.sequence_length
    )
    target = schedule_target(trial.train.budget_tokens, step_tokens)
    schedule = sample_schedule(
        units,
        prepared.record["mixture"]["shares"],
        target_units=target,
        max_epochs=trial.data.mixture.max_epochs,
        seed=trial.data.mixture.seed,
    )
    return schedule, offsets


def run_phase1(
    trial: TrialConfig,
    prepared: PreparedData,
    *,
    storage_path: Path,
    name: str,
    callbacks: list | None = None,
):
    """Fit one phase-1 `TorchTrainer` on the trial's packed Ray Data stream."""
    schedule, offsets = trial_schedule(trial, prepared)
    rows = packed_dataset(
        prepared.pieces_path, schedule, offsets,
        sequence_length=trial.data.sequence_length, pad_id=prepared.tokenizer.pad_id,
    )
    return fit(
        phase1_worker,
        {
            "trial": trial.to_dict(),
            "tokenizer_path": str(prepared.tokenizer_path),
            "tokenizer_hash": prepared.record["tokenizer_hash"],
            "data_revision": prepared.data_revision,
            "sources": list(schedule.sources),
            "intended_shares": prepared.record["mixture"]["shares"],
            "schedule": {"version": schedule.version, "seed": schedule.seed, "pieces": int(len(schedule.item))},
        },
        trial,
        rows,
        storage_path=storage_path,
        name=name,
        callbacks=callbacks,
    )
