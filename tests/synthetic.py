"""In-process training on synthetic rows: the loops Ray Train runs, on a `LocalSession`.

Rows have the columns the real streams produce (packed MLM rows; tokenised pairs), random
but fixed, so a run of N steps is reproducible and the resume oracles can compare runs bitwise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedlab.core.config import (
    DEFAULT_BUDGET, ContrastiveConfig, DataConfig, DistillationConfig, MaskingConfig, ModelConfig, NegativesConfig,
    ScheduleConfig, TrainConfig, TrialConfig,
)
from embedlab.train.loop import TrainingLoop, run
from embedlab.train.session import LocalSession
from embedlab.train.worker import RunOptions, WorkerConfig

MODEL = ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=320, max_length=64, dropout=0.1)
DATA = DataConfig(sequence_length=32, tokenizer_vocab_size=256)
ROWS = 4  # rows per worker per (micro)batch
CONTENT = 28  # non-padding tokens in every phase-1 row; pair texts vary
STEPS = 8
TEXTS = [f"the quick brown fox {i} jumps over the lazy dog number {i * 7}" for i in range(200)]
TIMING = ("compute/", "train/tokens_per_s", "train/pairs_per_s")


def tokenizer(directory: Path):
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    return save_tokenizer(train_tokenizer(TEXTS, vocab_size=300), directory)


def phase1_trial(workers: int = 1, *, dual_heads: bool = False, **train: Any) -> TrialConfig:
    """Dropout on; `STEPS` steps exactly (every row has `CONTENT` tokens); 2 microbatches, or dual heads."""
    microbatches = 1 if dual_heads else 2
    masking = MaskingConfig(strategy="whole-word", mixed_ratios=((0.15, 3), (0.5, 1)), head_per_ratio=True) \
        if dual_heads else MaskingConfig(ratio=0.15)
    budget = dataclasses.replace(DEFAULT_BUDGET, tokens=STEPS * workers * ROWS * microbatches * CONTENT)
    defaults = dict(budget=budget, batch_rows=ROWS, microbatches=microbatches, report_every_steps=1,
                    checkpoint_every_steps=3, num_workers=workers, learning_rate=3e-3,
                    schedule=ScheduleConfig(warmup_fraction=0.25))
    return TrialConfig(model=MODEL, masking=masking, data=DATA, train=TrainConfig(**{**defaults, **train}))


def contrastive_trial(parent: Path, workers: int = 1, *, gradcache: bool = False, **train: Any) -> TrialConfig:
    """Phase 2 from `parent`: joint MLM, symmetric, learnable temperature (or GradCache chunks of 2)."""
    settings = ContrastiveConfig(pairs=(("a", 0.5), ("b", 0.5)), pair_length=16, symmetric=True)
    settings = dataclasses.replace(settings, gradcache_chunk=2) if gradcache else dataclasses.replace(
        settings, mlm_weight=0.3, learnable_temperature=True)
    budget = dataclasses.replace(DEFAULT_BUDGET, pairs=STEPS * workers * ROWS)
    defaults = dict(budget=budget, batch_rows=ROWS, report_every_steps=1,
                    checkpoint_every_steps=3, num_workers=workers, learning_rate=3e-3, schedule=ScheduleConfig(warmup_fraction=0.25))
    return TrialConfig(model=MODEL, data=DATA, phase=2, parent=str(parent), contrastive=settings,
                       train=TrainConfig(**{**defaults, **train}))


def write_parent(directory: Path, frozen) -> Path:
    """A random phase-1 checkpoint (encoder and MLM head) to start a contrastive phase from."""
    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.model.encoder import MLMModel

    torch.manual_seed(7)
    model = MLMModel(MODEL)
    save_checkpoint(directory, model.encoder, head=model.mlm_head, tokenizer=frozen, fields={"phase": 1})
    return directory


def loop_config(trial: TrialConfig, frozen) -> WorkerConfig:
    return WorkerConfig(trial=trial, tokenizer_path=str(frozen.path), tokenizer_hash=frozen.hash,
                        data_revision="synthetic", sources=("a", "b"), intended_shares={"a": 0.5, "b": 0.5},
                        schedule={"version": "synthetic"})


def mlm_rows(frozen, count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Packed rows of two documents (sources a and b) and padding."""
    generator = np.random.default_rng(seed)
    length = DATA.sequence_length
    ids = generator.integers(len(frozen.special_ids), frozen.vocab_size, (count, length))
    segments = np.zeros((count, length), dtype=np.int64)
    segments[:, :14], segments[:, 14:CONTENT] = 1, 2
    ids[segments == 0] = frozen.pad_id
    sources = np.where(segments == 1, 0, 1)
    sources[segments == 0] = -1
    word_start = generator.integers(0, 2, (count, length))
    word_start[:, [0, 14]] = 1
    return {"input_ids": ids, "segment_ids": segments, "source_index": sources, "word_start": word_start}


def pair_rows(frozen, count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Tokenised pairs of varying length; rows 2k and 2k+1 share a positive group."""
    generator = np.random.default_rng(seed)
    length = 16

    def texts() -> tuple[np.ndarray, np.ndarray]:
        ids = np.full((count, length), frozen.pad_id, dtype=np.int64)
        lengths = generator.integers(5, length + 1, count)
        for row, n in enumerate(lengths):
            ids[row, :n] = [frozen.cls_id, *generator.integers(len(frozen.special_ids), frozen.vocab_size, n - 2),
                            frozen.sep_id]
        return ids, lengths

    (queries, query_len), (positives, positive_len) = texts(), texts()
    return {"query_ids": queries, "positive_ids": positives, "group": np.arange(count) // 2 + 1000,
            "builder_index": np.arange(count) % 2, "tokens": query_len + positive_len}


def hard_negative_rows(frozen, count: int = 16) -> dict[str, np.ndarray]:
    """`pair_rows` with two negatives a pair (other rows' positives); row 0's second slot is
    empty (length 0, masked out)."""
    rows = pair_rows(frozen, count)
    negatives = rows["positive_ids"][np.random.default_rng(3).permutation(count)]
    rows["negative_ids"] = np.stack([negatives, negatives[::-1]], axis=1)  # (rows, 2, L)
    rows["negative_group"] = np.full((count, 2), -1, dtype=np.int64)
    rows["negative_len"] = np.full((count, 2), 8, dtype=np.int64)
    rows["negative_len"][0, 1] = 0
    return rows


def phase3_trial(parent: Path, **distillation: Any) -> TrialConfig:
    """Phase 3 from `parent` with two hard negatives a pair (`distillation`: the fields of its
    distillation section)."""
    settings = ContrastiveConfig(pairs=(("a", 0.5), ("b", 0.5)), pair_length=16, negatives=NegativesConfig(count=2),
                                 distillation=DistillationConfig(**distillation))
    return dataclasses.replace(contrastive_trial(parent), phase=3, contrastive=settings)


def make_loop(trial: TrialConfig, frozen, *, rank: int = 0, world: int = 1) -> TrainingLoop:
    from embedlab.train.contrastive import ContrastiveLoop
    from embedlab.train.phase1 import Phase1Loop

    kind = Phase1Loop if trial.phase == 1 else ContrastiveLoop
    return kind(loop_config(trial, frozen), rank=rank, world=world, device=torch.device("cpu"))


def rows_for(trial: TrialConfig, frozen) -> dict[str, np.ndarray]:
    count = (STEPS + 2) * trial.train.num_workers * ROWS * trial.train.microbatches
    return mlm_rows(frozen, count) if trial.phase == 1 else pair_rows(frozen, count)


def train(trial: TrialConfig, frozen, root: Path, *, rank: int = 0, world: int = 1,
          stop_after_step: int | None = None) -> tuple[list[dict[str, Any]], TrainingLoop]:
    """One run (a resume when `root` holds checkpoints): its reports and its loop."""
    session = LocalSession(rows_for(trial, frozen), root, rank=rank, world=world)
    loop = make_loop(trial, frozen, rank=rank, world=world)
    run(loop, session, RunOptions(stop_after_step=stop_after_step))
    return session.reports, loop


def deterministic(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reports without wall-clock figures."""
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in reports]


def trained_tensors(loop: TrainingLoop) -> list[torch.Tensor]:
    """Every trained parameter, then every optimizer state tensor, in optimizer order."""
    params = [p.detach().clone() for group in loop.optimizer.param_groups for p in group["params"]]
    state = loop.optimizer.state_dict()["state"]
    return params + [v.clone() for index in sorted(state) for _, v in sorted(state[index].items())]


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
