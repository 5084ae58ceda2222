"""Phase 1 (masked language modelling) on Ray Train.

`Phase1Loop` is one worker's phase-1 training (model, optimizer, masking generator, step,
metrics, checkpoint contents); `phase1_worker` runs it as Ray Train's
`train_loop_per_worker` through `embedlab.train.loop`, which resumes, reports, checkpoints
and stops; `run_phase1` builds the trainer. Each worker masks its rows of every global batch
with its own masking generator and steps until the trial's budget (measured FLOPs, consumed
non-padding tokens or device seconds, `embedlab.train.budget`) is reached. Every worker sees
the same all-reduced counts, so all stop at the same step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from embedlab.artifacts.sync import node_path
from embedlab.core.config import REPLACEMENT_POLICY, TrialConfig
from embedlab.model.encoder import MLMModel
from embedlab.model.heads import MultiHeadMLMModel
from embedlab.prepared.directory import PreparedData
from embedlab.sources.mixture import Schedule, sample_schedule, schedule_target
from embedlab.streams.packed import packed_datasets, units_by_source
from embedlab.objectives.dual_mlm import (
    SHARED_HEAD, assign_ratios, head_names, mask_mixed, ratio_names, route_heads, worker_ratios,
)
from embedlab.checkpoints.io import CheckpointError, load_parent, pretrained_root
from embedlab.checkpoints.pretrained import pretrained_lineage
from embedlab.model.flops import FlopTally, TRAINED, attention_path
from embedlab.objectives.masking import mask_tokens
from embedlab.objectives.mlm import combine
from embedlab.tokenizer.frozen import load_tokenizer
from embedlab.train.budget import consumption, schedule_units, step_units
from embedlab.train.compiling import compile_blocks, resolve_compile
from embedlab.train.launch import fit
from embedlab.train.length import split_rows, stage_length
from embedlab.train.loop import Progress, TrainingLoop, run_on_ray
from embedlab.train.worker import RunOptions, WorkerConfig
from embedlab.train.mlm_step import (
    Microbatch,
    StepResult,
    accumulate_gradients,
    no_reduce,
    optimizer_step,
    prepare_microbatch,
    sum_all_reduce,
)
from embedlab.checkpoints.state import data_seed, seed_everything, seed_for
from embedlab.train.optim import build_optimizer, set_learning_rate
from embedlab.train.precision import half_activations, resolve_precision


@dataclass
class Phase1Progress(Progress):
    tokens: int = 0  # consumed non-padding tokens, all workers
    selected: int = 0  # selected (masked) tokens, all workers
    flops: float = 0.0  # training FLOPs the steps ran, all workers (`embedlab.model.flops`)
    ratio_rows: list[int] = field(default_factory=list)  # mixed ratios: rows given each ratio, all workers
    length_switches: list[dict] = field(default_factory=list)  # {"step", "tokens", "length"} per stage change
    consumed_by_source: list[float] = field(default_factory=list)  # tokens per source, as of the last report


class Phase1Loop(TrainingLoop):
    """Phase-1 MLM on one worker: masks its rows with its own masking generator and steps
    until the all-reduced consumption in the trial's budget unit reaches the budget."""

    def __init__(self, worker: WorkerConfig, *, rank: int, world: int, device: torch.device) -> None:
        trial = worker.trial
        self.trial, self.worker, self.rank, self.world, self.device = trial, worker, rank, world, device
        torch.set_num_threads(trial.train.torch_threads)
        self.tokenizer = load_tokenizer(node_path(worker.tokenizer_path), expected_hash=worker.tokenizer_hash)
        torch.manual_seed(seed_for(trial.train.seed, "init"))  # identical weights on every worker
        self.mixed = trial.masking.mixed_ratios
        self.parent = None
        if trial.model.pretrained:  # always an extension (`TrialConfig`): the parent's own model and head
            self.model, self.parent = continue_pretrained(trial.parent, self.tokenizer.hash, trial.masking.ratio)
        else:
            self.model = (
                MultiHeadMLMModel(trial.model, head_names(trial.masking)) if self.mixed else MLMModel(trial.model)
            )
        if trial.extension and not trial.model.pretrained:
            self.parent = continue_from(self.model, trial.parent, self.tokenizer.hash, trial.masking.ratio)
        self.model = self.model.to(device)
        if resolve_compile(trial.train, trial.model):
            compile_blocks(self.model.encoder)
        self.optimizer = build_optimizer(self.model, trial.train, device)
        self.precision = resolve_precision(trial.train)
        self.half = half_activations(self.precision, device)
        self.step_flops = 0.0
        self.masking_rng = torch.Generator().manual_seed(seed_for(trial.train.seed, "masking", rank))
        torch.manual_seed(seed_for(trial.train.seed, "dropout", rank))
        seed_everything(seed_for(trial.train.seed, "python", rank))
        self.all_reduce = sum_all_reduce(device) if world > 1 else no_reduce
        self.eligible_ban = torch.tensor(self.tokenizer.special_ids)
        self.random_range = self.tokenizer.replacement_ids
        self.sources = list(worker.sources)
        self.batches_per_step = trial.train.microbatches
        self.progress = Phase1Progress(consumed_by_source=[0.0] * len(self.sources))
        # Since the last report (empty at every checkpoint, which always reports):
        self.source_tokens = torch.zeros(len(self.sources), dtype=torch.float64)  # this worker's
        self.window: list[tuple[float, int]] = []
        self.group_window: dict[str, list] = {}  # per head / per ratio (loss sum, count)
        self.last: StepResult | None = None
        self.model.train()

    def clock(self) -> tuple[float, float]:
        progress = self.progress
        return consumption(self.trial.train, 1, tokens=progress.tokens, pairs=0, flops=progress.flops,
                           device_seconds=progress.device_seconds)

    def done(self) -> bool:
        clock, budget = self.clock()
        return clock >= budget

    def _ratio_index(self, rows: int, position: int) -> torch.Tensor:
        """This worker's rows' masking ratios in the global batch at data `position`: the
        run's proportion over every worker's rows (`assign_ratios` from the counts so far),
        shuffled by a generator that every worker seeds alike, so all agree on the split."""
        progress = self.progress
        if not progress.ratio_rows:
            progress.ratio_rows = [0] * len(self.mixed)
        shuffle = torch.Generator().manual_seed(seed_for(self.trial.train.seed, f"ratio-rows:{position}"))
        assigned = assign_ratios(rows * self.world, self.mixed, shuffle, progress.ratio_rows)
        progress.ratio_rows = (torch.tensor(progress.ratio_rows)
                               + torch.bincount(assigned, minlength=len(self.mixed))).tolist()
        return worker_ratios(assigned, self.rank, self.world)

    def _microbatch(self, batch: dict[str, torch.Tensor], position: int) -> Microbatch:
        input_ids, segment_ids = batch["input_ids"], batch["segment_ids"]
        self.source_tokens += torch.bincount(
            batch["source_index"][segment_ids > 0], minlength=len(self.sources)).double()
        eligible = (segment_ids > 0) & ~torch.isin(input_ids, self.eligible_ban)
        masking_ids = dict(mask_id=self.tokenizer.mask_id, random_token_range=self.random_range,
                           generator=self.masking_rng, word_start=batch["word_start"].bool(), segment_ids=segment_ids)
        ratio_index = head_index = None
        if self.mixed:
            ratio_index = self._ratio_index(len(input_ids), position)
            masked = mask_mixed(input_ids, eligible, self.trial.masking, ratio_index, **masking_ids)
            head_index = route_heads(self.trial.masking, ratio_index)
        else:
            masked = mask_tokens(input_ids, eligible, self.trial.masking, **masking_ids)
        # Counted from the CPU tensors, so a GPU step adds no host synchronisation for it.
        tally = FlopTally()
        tally.encode(self.trial.model, segment_ids, mode=TRAINED, device=self.device, half=self.half, training=True)
        tally.head(self.trial.model, float(masked.selected.sum()))
        self.step_flops += tally.flops
        # Masking draws on the CPU generator so its stream is the same on any device; routing,
        # counts and the attention layout are taken on the host too (`prepare_microbatch`).
        heads = self.model.head_names if isinstance(self.model, MultiHeadMLMModel) else (SHARED_HEAD,)
        return prepare_microbatch(masked, segment_ids, device=self.device, head_names=heads, head_index=head_index,
                                  ratio_index=ratio_index, mixed_ratios=self.mixed,
                                  source_index=batch["source_index"], source_names=self.sources,
                                  varlen=attention_path(self.trial.model, device=self.device, half=self.half,
                                                        length=segment_ids.shape[1], training=True).varlen)

    def fit_to_budget(self, batches: list[dict[str, torch.Tensor]], remaining: float) -> list[dict[str, torch.Tensor]]:
        """A token budget's last step keeps only the tokens the budget has left, this worker's
        share of them, in stream order (the rest become padding; rows stay, so every worker
        keeps the same row count and the ratio assignment stays one global split), so the
        trial lands on its budget within a token per worker; other units cut whole rows
        (`TrainingLoop.fit_to_budget`), as every row position costs FLOPs."""
        last = self.progress.last_step_cost
        if self.trial.train.budget.unit(1) != "tokens" or last <= 0 or remaining >= last:
            return super().fit_to_budget(batches, remaining)
        target, out = math.ceil(max(remaining, 0.0) / self.world), []
        for batch in batches:
            real = batch["segment_ids"] > 0
            keep = real & (real.reshape(-1).cumsum(0).reshape(real.shape) <= target)
            target -= int(keep.sum())
            cut = {name: column.clone() for name, column in batch.items()}
            cut["input_ids"][real & ~keep] = self.tokenizer.pad_id
            cut["segment_ids"][~keep] = 0
            cut["source_index"][~keep] = -1
            out.append(cut)
        return out

    def step(self, batches: list[dict[str, torch.Tensor]]) -> None:
        train, progress = self.trial.train, self.progress
        clock, budget = self.clock()
        length = stage_length(clock, budget, train.length_schedule, self.trial.data.sequence_length)
        if length != self.sequence_length():
            progress.length_switches.append({"step": progress.steps, "tokens": progress.tokens, "length": length})
        batches = [split_rows(batch, length) for batch in batches]
        self.step_flops = 0.0
        pending = [self._microbatch(batch, progress.batches + i) for i, batch in enumerate(batches)]
        set_learning_rate(self.optimizer, clock, budget, train)
        result = accumulate_gradients(self.model, pending, self.all_reduce, self.precision, flops=self.step_flops)
        result = optimizer_step(self.model, self.optimizer, result, train.max_grad_norm)
        progress.steps += 1
        progress.batches += len(batches)
        # A rejected step's batch counts as consumed (embedlab.train.nonfinite).
        progress.tokens += result.tokens
        progress.selected += result.selected
        progress.flops += result.flops
        progress.skipped += int(result.skipped)
        self.last = result
        if not result.rejected:
            self.window.append((result.loss_sum, result.selected))
            for key, (group_sum, count) in result.groups.items():
                totals = self.group_window.setdefault(key, [0.0, 0])
                totals[0] += group_sum
                totals[1] += count
        self.count_rejection(result.rejected)

    def sequence_length(self) -> int:
        """The length rows are trained at now: the last stage switched to, or the first stage's."""
        switches, stages = self.progress.length_switches, self.trial.train.length_schedule
        if switches:
            return switches[-1]["length"]
        return stages[0][1] if stages else self.trial.data.sequence_length

    def metrics(self) -> dict[str, Any]:
        progress = self.progress
        reduced = self.all_reduce(self.source_tokens.clone())
        consumed = torch.tensor(progress.consumed_by_source, dtype=torch.float64) + reduced
        progress.consumed_by_source = consumed.tolist()
        self.source_tokens.zero_()
        clock, budget = self.clock()
        elapsed = self.elapsed()
        metrics = {
            "train/loss": combine(self.window),
            "train/step": progress.steps,
            "train/lr": self.optimizer.param_groups[0]["lr"],
            "train/grad_norm": self.last.grad_norm,  # before clipping
            "train/sequence_length": self.sequence_length(),
            "train/effective_batch_tokens": progress.tokens / max(progress.steps, 1),
            "train/skipped_steps": progress.skipped,
            "train/nonfinite_steps": progress.nonfinite,
            "train/rejected_in_a_row": progress.rejected_in_a_row,
            "train/tokens_per_s": progress.tokens / elapsed,
            # Non-padding share of the row positions the steps computed (packing's yield).
            "data/packing_efficiency": progress.tokens / max(
                progress.steps * self.world * self.trial.train.batch_rows * self.trial.train.microbatches
                * self.trial.data.sequence_length, 1),
            "budget/tokens": progress.tokens,
            "budget/selected_tokens": progress.selected,
            "budget/fraction": clock / budget,
            "budget/flops": progress.flops,
            **{
                f"data/observed_share/{name}": progress.consumed_by_source[i] / max(progress.tokens, 1)
                for i, name in enumerate(self.sources)
            },
            **{f"masking/ratio_rows/{name}": rows for name, rows in self.ratio_rows().items()},
            **{f"train/loss/{key}": combine([tuple(v)]) for key, v in self.group_window.items()},
            **{f"train/selected/{key}": v[1] for key, v in self.group_window.items()},
        }
        self.window, self.group_window = [], {}
        return metrics

    def ratio_rows(self) -> dict[str, int]:
        """Mixed ratios: {ratio name: rows masked at it so far, all workers}; else empty."""
        if not self.mixed:
            return {}
        counts = self.progress.ratio_rows or [0] * len(self.mixed)
        return dict(zip(ratio_names(self.mixed), counts))

    def stream_ended(self) -> Exception:
        clock, budget = self.clock()
        return RuntimeError(
            f"worker {self.rank}: the data stream ended after {self.progress.tokens:,} tokens, "
            f"{clock / budget:.1%} of the budget ({self.progress.steps} steps); the schedule's margin did not "
            "cover this batch size"
        )

    def weights(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        model = self.model
        return model.encoder, model.heads if isinstance(model, MultiHeadMLMModel) else model.mlm_head

    def checkpoint_contents(self, metrics: dict[str, Any]) -> dict[str, Any]:
        trial, model, worker = self.trial, self.model, self.worker
        encoder, head = self.weights()
        return {
            "encoder": encoder,
            "head": head,
            "tokenizer": self.tokenizer,
            "fields": {
                "phase": 1,
                **self.run_fields(metrics),
                **({} if self.parent is None else {
                    "parent_hash": self.parent["content_hash"],
                    "parent_phase": self.parent.get("phase"),
                    **pretrained_root(self.parent),
                    "extension": {
                        "from_length": self.parent.get("config", {}).get("data", {}).get("sequence_length"),
                        "to_length": trial.data.sequence_length,
                        "optimizer_start": "optimizer state and schedule clock reset at the extension's start",
                    },
                }),
                "objective": {
                    "name": "mlm",
                    "masking_ratio": trial.masking.ratio,
                    "masking_strategy": trial.masking.strategy,
                    "mixed_ratios": trial.masking.mixed_ratios,
                    # Rows each ratio was given over the run, all workers: the proportion it ran at.
                    "observed_ratio_rows": self.ratio_rows(),
                    "heads": list(model.head_names) if isinstance(model, MultiHeadMLMModel) else ["mlm"],
                    "replacement": REPLACEMENT_POLICY,
                    "mask_fraction": trial.masking.mask_fraction,
                    "random_fraction": trial.masking.random_fraction,
                    "reduction": "sum of selected-token losses / selected count, over microbatches and workers",
                    "empty_selection": "step skipped, counted in train/skipped_steps",
                },
                "length_schedule": {
                    "stages": [list(stage) for stage in trial.train.length_schedule],
                    "switches": self.progress.length_switches,
                    "cut": "a packed row is cut into data.sequence_length / length rows; a document "
                           "crossing a cut continues in the next row at position 0",
                },
                "mixture": {
                    "intended_shares": worker.intended_shares,
                    "observed_token_shares": {
                        k.removeprefix("data/observed_share/"): v
                        for k, v in metrics.items() if k.startswith("data/observed_share/")
                    },
                    "schedule": self.worker.schedule,
                },
            },
        }


# Fields a length extension may change; every other model field must equal the parent's.
EXTENSION_MAY_CHANGE = ("preset", "max_length", "dropout", "attention")


def continue_from(model: MLMModel, parent: Path, tokenizer_hash: str, masking_ratio: float) -> dict[str, Any]:
    """Load a phase-1 parent's encoder and MLM head (the head nearest `masking_ratio` from a
    dual-head parent) into `model`, in place; returns the parent's manifest. Refuses a parent
    whose tokenizer or architecture differs (beyond `EXTENSION_MAY_CHANGE`)."""
    loaded = load_parent(parent, tokenizer_hash=tokenizer_hash, need_head=True, masking_ratio=masking_ratio)
    ours, theirs = asdict(model.encoder.config), asdict(loaded.model.encoder.config)
    differing = sorted(k for k in ours if k not in EXTENSION_MAY_CHANGE and ours[k] != theirs[k])
    if differing:
        raise CheckpointError(f"{parent}: an extension keeps the parent's architecture, but "
                              + ", ".join(f"model.{k} is {ours[k]} here and {theirs[k]} in the parent" for k in differing))
    if not loaded.head_restored:
        raise CheckpointError(f"{parent}: holds no MLM head to continue masked language modelling with")
    model.load_state_dict(loaded.model.state_dict())
    return loaded.manifest


def continue_pretrained(parent: Path, tokenizer_hash: str, masking_ratio: float) -> tuple[MLMModel, dict[str, Any]]:
    """A pretrained parent's encoder and masked-LM head, to continue its masked language
    modelling on this data (domain-adaptive pretraining), and the parent's manifest; refused,
    saying why, when the checkpoint has no head embedlab can continue."""
    loaded = load_parent(parent, tokenizer_hash=tokenizer_hash, need_head=True, masking_ratio=masking_ratio)
    if not loaded.head_restored:
        head = (pretrained_lineage(loaded.manifest) or {}).get("head") or {}
        raise CheckpointError(f"{parent}: holds no MLM head ({head.get('reason', 'none saved')}); phase 1 continues "
                              "masked language modelling only from a checkpoint with one")
    return loaded.model, loaded.manifest


def phase1_worker(loop_config: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train's `train_loop_per_worker` for phase 1."""
    return run_on_ray(Phase1Loop, loop_config)


def trial_schedule(trial: TrialConfig, prepared: PreparedData) -> tuple[Schedule, dict[str, int]]:
    """The trial's mixture schedule, long enough for the budget plus a margin (`schedule_target`)."""
    units, offsets = units_by_source(prepared.pieces_path)
    target = schedule_target(schedule_units(trial), step_units(trial))
    schedule = sample_schedule(
        units,
        prepared.record["mixture"]["shares"],
        target_units=target,
        max_epochs=trial.data.mixture.max_epochs,
        seed=data_seed(trial),
    )
    return schedule, offsets


def run_phase1(
    trial: TrialConfig,
    prepared: PreparedData,
    *,
    storage_path: Path,
    name: str,
    callbacks: list | None = None,
    options: RunOptions = RunOptions(),
):
    """Fit one phase-1 `TorchTrainer` on the trial's packed Ray Data stream.

    A run of a `name` that has checkpoints under `storage_path` resumes from the latest.
    """
    schedule, offsets = trial_schedule(trial, prepared)
    return fit(phase1_worker, phase1_worker_config(trial, prepared, schedule, options).to_dict(), trial,
               trial_streams(trial, prepared, schedule, offsets),
               storage_path=storage_path, name=name, callbacks=callbacks)


def trial_streams(trial: TrialConfig, prepared: PreparedData, schedule: Schedule, offsets: dict[str, int]) -> list:
    """The trial's Ray Datasets of packed rows, one per worker (its rows, in schedule order)."""
    tokenizer = prepared.tokenizer  # read from its file at each access: once here
    return packed_datasets(prepared.pieces_path, schedule, offsets,
                           sequence_length=trial.data.sequence_length, pad_id=tokenizer.pad_id,
                           cls_id=tokenizer.cls_id, world=trial.train.num_workers,
                           batch_rows=trial.train.batch_rows)


def phase1_worker_config(trial: TrialConfig, prepared: PreparedData, schedule: Schedule,
                         options: RunOptions = RunOptions()) -> WorkerConfig:
    """What every worker's `Phase1Loop` is built from."""
    return WorkerConfig(
        trial=trial, tokenizer_path=str(prepared.tokenizer_path), tokenizer_hash=prepared.record["tokenizer_hash"],
        data_revision=prepared.data_revision, sources=tuple(schedule.sources),
        intended_shares=prepared.record["mixture"]["shares"],
        schedule={"version": schedule.version, "seed": schedule.seed, "pieces": int(len(schedule.item))},
        run=options,
    )
