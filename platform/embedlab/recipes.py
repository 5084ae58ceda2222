"""Base recipes that study files derive their arms from, at the sizes of a profile.

A profile fixes what a study runs at (model preset, workers, budgets, seeds, how many arms);
the study file fixes what it compares. `demo` fits a 2-core CPU in minutes (a `small`
2-layer, width-128 encoder, a few 10^5 tokens a trial, two workers so the distributed paths
run); `cpu` is the same machine's hour: one worker with two torch threads (no gloo between
processes sharing two cores) and budgets large enough that the tour ends with a model worth
using and studies that can detect effects; `full` is the size the studies are
declared for on a GPU cluster (the `5m` preset, every arm, three seeds, budgets the built-in
corpus can feed without passing its repetition cap).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from embedlab.config import (MODEL_PRESETS, ConfigError, ContrastiveConfig, DataConfig, MaskingConfig, MixtureConfig,
                             TrainConfig, TrialConfig)


@dataclass(frozen=True, kw_only=True)
class Profile:
    """The sizes a study runs at. Budgets are per trial, summed over workers."""

    name: str
    model: str
    seeds: tuple[int, ...]
    phase1_tokens: int
    phase2_pairs: int
    phase3_pairs: int
    num_workers: int
    cpus_per_worker: float
    use_gpu: bool
    phase1_batch_rows: int
    contrastive_batch_rows: int
    sequence_length: int
    all_arms: bool  # False: a study keeps only the arms it marks for a short tour
    torch_threads: int = 1  # torch's intra-op threads in each worker
    phase2_learning_rate: float = 2e-4  # peak learning rates of the contrastive phases
    max_epochs: float = 4.0  # data.mixture.max_epochs: how often a source (or pair builder) may be reread
    phase3_learning_rate: float = 1e-4


PROFILES: dict[str, Profile] = {
    "demo": Profile(
        name="demo", model="small", seeds=(0, 1), phase1_tokens=300_000, phase2_pairs=2_048, phase3_pairs=1_024,
        num_workers=2, cpus_per_worker=0.5, use_gpu=False, phase1_batch_rows=8, contrastive_batch_rows=16,
        sequence_length=128, all_arms=False,
    ),
    # Sized for a 2-core CPU machine: a three-phase tour within an hour that ends with a usable
    # model. One worker with two torch threads (no all-gather between processes on two cores).
    "cpu": Profile(
        name="cpu", model="small", seeds=(0, 1), phase1_tokens=3_000_000, phase2_pairs=100_000, phase3_pairs=50_000,
        num_workers=1, cpus_per_worker=1.0, use_gpu=False, phase1_batch_rows=32, contrastive_batch_rows=64,
        sequence_length=128, all_arms=False, torch_threads=2, phase2_learning_rate=5e-4, phase3_learning_rate=2e-4,
        # The built-in corpus has 5,562 title-body pairs; 100k / 50k pairs read them about 5x.
        max_epochs=8.0,
    ),
    "full": Profile(
        name="full", model="5m", seeds=(0, 1, 2), phase1_tokens=5_000_000, phase2_pairs=200_000,
        phase3_pairs=50_000, num_workers=4, cpus_per_worker=2.0, use_gpu=True, phase1_batch_rows=32,
        contrastive_batch_rows=64, sequence_length=256, all_arms=True,
    ),
}
DEFAULT_PROFILE = "full"


def profile(name: str = DEFAULT_PROFILE) -> Profile:
    if name not in PROFILES:
        raise ConfigError(f"profile: unknown profile {name!r}; valid: {sorted(PROFILES)}")
    return PROFILES[name]


def _train(p: Profile, batch_rows: int, learning_rate: float) -> TrainConfig:
    return TrainConfig(batch_rows=batch_rows, learning_rate=learning_rate, num_workers=p.num_workers,
                       cpus_per_worker=p.cpus_per_worker, use_gpu=p.use_gpu, torch_threads=p.torch_threads)


def phase1_baseline(profile_name: str = "demo") -> TrialConfig:
    """Phase-1 MLM at the recipe's pilot setting: 15% selection, 80/10/10 replacement."""
    p = profile(profile_name)
    return TrialConfig(
        model=MODEL_PRESETS[p.model],
        masking=MaskingConfig(ratio=0.15),
        data=DataConfig(sequence_length=p.sequence_length, mixture=MixtureConfig(max_epochs=p.max_epochs)),
        train=_train(p, p.phase1_batch_rows, 1e-3),
    )


def phase2_baseline(profile_name: str = "demo") -> TrialConfig:
    """Phase-2 broad contrastive pretraining from a phase-1 checkpoint (given at sweep time):
    the recipe's pilot pair mixture mapped onto the built-in builders, mean pooling,
    temperature 0.05, candidates gathered across workers."""
    p = profile(profile_name)
    base = phase1_baseline(profile_name)
    return dataclasses.replace(
        base,
        phase=2,
        contrastive=ContrastiveConfig(
            pairs=(("same-source-spans", 0.5), ("title-body", 0.3), ("term-definition", 0.2)),
            pair_length=64,
            temperature=0.05,
        ),
        train=_train(p, p.contrastive_batch_rows, p.phase2_learning_rate),
    )


def phase3_baseline(profile_name: str = "demo") -> TrialConfig:
    """Phase-3 supervised contrastive fine-tuning from a phase-2 checkpoint: the recipe's
    pilot pair mixture (target query-document, semantic, general retrieval) mapped onto the
    built-in builders, with mined hard negatives and a smaller learning rate."""
    base = phase2_baseline(profile_name)
    return dataclasses.replace(
        base,
        phase=3,
        contrastive=dataclasses.replace(
            base.contrastive,
            pairs=(("title-body", 0.6), ("synonyms", 0.25), ("same-source-spans", 0.15)),
            hard_negatives=2,
            mining_top_k=200,
        ),
        train=dataclasses.replace(base.train, learning_rate=profile(profile_name).phase3_learning_rate),
    )


def budget_for(p: Profile, phase: int, control: TrialConfig | None = None) -> dict[str, int | float | str]:
    """The profile's study budget for a phase, as Study keyword arguments.

    With `control` (the arm the others are compared to, as the study builds it), the budget is
    measured training FLOPs: what the control's steps cost over the profile's tokens (phase 1)
    or pairs (phases 2-3), predicted by `embedlab.train.flops.expected_step_flops`. Every arm
    then trains to that many FLOPs, so an arm that costs more per token or pair (a joint MLM
    term, mined negatives, a higher masking ratio's head) reads less data: equal compute, not
    equal data. The data figures stay, as the length of the data schedule and for the record.
    Without `control`, the budget is the profile's data unit (tables then say the arms are
    data-matched, and by how much their FLOPs differ)."""
    if phase == 1:
        data: dict[str, int | float | str] = {"budget_tokens": p.phase1_tokens}
    else:
        # Phases 2-3 train on pairs; budget_tokens stays the phase-1 figure for the record.
        data = {"budget_tokens": p.phase1_tokens, "budget_pairs": p.phase2_pairs if phase == 2 else p.phase3_pairs}
    if control is None:
        return data
    from embedlab.train.budget import step_units
    from embedlab.train.flops import expected_step_flops

    units = p.phase1_tokens if phase == 1 else data["budget_pairs"]
    return {**data, "budget_unit": "flops",
            "budget_flops": float(units / step_units(control) * expected_step_flops(control))}
