"""The memory one training worker needs at least, from the config alone (no model is built):
what a plan states and what the sweep compares with the nodes it could run on.

    state        16 bytes per parameter: fp32 weights, their gradients and AdamW's two moments
                 (the master weights stay fp32 under bf16 autocast: `embedlab.train.precision`)
    activations  what one microbatch keeps for its backward, at least: per token and layer
                 the block's input, the FFN input and the FFN's hidden state, 2d + f values
                 (2 bytes each under bf16, else 4); the attention scores, the MLM logits and
                 Ray's own processes come on top

Parameters are the encoder's (`embedlab.model.encoder`: V*d + L*(4*d^2 + 2*d*f + 4*d) + 2*d),
plus, in phase 1, one MLM head's transform and vocabulary bias per head (d^2 + 3*d + V; its
decoder is the tied embedding). Both terms are lower bounds of what a worker allocates, so a
plan refused on them is refused for a reason: no node can hold even this much.
"""

from __future__ import annotations

from dataclasses import dataclass

from embedlab.core.config import ModelConfig, TrialConfig

STATE_BYTES_PER_PARAMETER = 16  # fp32 weight, gradient, and AdamW's first and second moments


@dataclass(frozen=True)
class TrainingMemory:
    """A worker's memory floor: `parameters`, the bytes of their training `state`, and the
    `activations` one microbatch keeps for its backward; `device` says where it is held
    ("GPU": each worker's device memory; "CPU": its share of host memory)."""

    parameters: int
    state: int
    activations: int
    device: str

    @property
    def total(self) -> int:
        return self.state + self.activations

    @property
    def text(self) -> str:
        """The estimate in words, for a plan and for a refusal."""
        return (f"at least {gib(self.total)} per {self.device} worker ({self.parameters:,} parameters: "
                f"{gib(self.state)} of weights, gradients and AdamW state; {gib(self.activations)} of activations "
                "a microbatch)")


def gib(count: int | float) -> str:
    """A byte count in GiB, readable at any size (0.002 GiB to 8.1e+07 GiB)."""
    value = count / 2**30
    return f"{value:.3g} GiB" if value < 1e6 else f"{value:.2e} GiB"


def encoder_parameters(model: ModelConfig) -> int:
    """The encoder's parameters by the formula `embedlab.model.encoder` states."""
    d, f = model.width, model.ffn_width
    return model.vocab_size * d + model.layers * (4 * d * d + 2 * d * f + 4 * d) + 2 * d


def training_memory(trial: TrialConfig) -> TrainingMemory:
    """The memory floor of one worker of `trial` (module docstring)."""
    model, train = trial.model, trial.train
    parameters = encoder_parameters(model)
    if not trial.spec.from_parent or trial.contrastive.mlm_weight > 0:
        heads = max(1, len(trial.masking.mixed_ratios)) if trial.masking.head_per_ratio else 1
        parameters += heads * (model.width * model.width + 3 * model.width + model.vocab_size)
    half = train.precision == "bf16" or (train.precision == "auto" and train.use_gpu)
    per_value = 2 if half else 4
    activations = (_microbatch_tokens(trial) * model.layers * (2 * model.width + model.ffn_width) * per_value)
    return TrainingMemory(parameters=parameters, state=STATE_BYTES_PER_PARAMETER * parameters,
                          activations=activations, device="GPU" if train.use_gpu else "CPU")


def _microbatch_tokens(trial: TrialConfig) -> int:
    """Tokens one worker's microbatch runs through the trained pass: its packed rows in phase
    1; in phases 2-3 its queries, positives and hard negatives at `contrastive.pair_length`,
    a GradCache chunk's worth at a time when GradCache is on."""
    rows = trial.train.batch_rows
    if not trial.spec.reads_pairs:
        return rows * trial.data.sequence_length
    settings = trial.contrastive
    if settings.gradcache_chunk:
        rows = min(rows, settings.gradcache_chunk)
    return rows * (2 + settings.negatives.count) * settings.pair_length
