"""How a trial trains: the compute budget it trains to (`Budget`), and phase 1's optimisation,
schedule and reliability settings (`TrainConfig`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from embedlab.core.config.checks import check, check_fields, check_positive, check_seed
from embedlab.core.config.phases import phase_spec


SCHEDULE_KINDS = ("linear", "cosine", "wsd", "constant")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    """The learning rate as a multiple of the peak, a function of the consumed budget.

    The clock is the trial's budget unit (tokens in phase 1, pairs in phases 2-3, measured
    FLOPs or device seconds), never steps, so arms whose steps differ in size see the same schedule,
    and a resumed run continues from its consumed budget. Linear warmup over the first
    `warmup_fraction` of the budget, then: "linear" to `min_lr_fraction` at the budget,
    "cosine" (half a cosine) to it, "wsd" (warmup-stable-decay) at the peak until the last
    `decay_fraction` of the budget and linearly to it over that, or "constant" at the peak.
    """

    kind: str = "linear"
    warmup_fraction: float = 0.1
    decay_fraction: float = 0.2  # "wsd" only: the share of the budget the final decay takes
    min_lr_fraction: float = 0.0  # the floor the decay ends at, as a fraction of the peak

    def __post_init__(self) -> None:
        check_fields(self, "train.schedule")
        check(self.kind in SCHEDULE_KINDS, "train.schedule.kind", f"{self.kind!r}; valid: {list(SCHEDULE_KINDS)}")
        check(0.0 <= self.warmup_fraction < 1.0, "train.schedule.warmup_fraction", "must be in [0, 1)")
        check(0.0 < self.decay_fraction <= 1.0 - self.warmup_fraction, "train.schedule.decay_fraction",
              "must be in (0, 1 - warmup_fraction]")
        check(0.0 <= self.min_lr_fraction <= 1.0, "train.schedule.min_lr_fraction", "must be in [0, 1]")


PARAMETER_CATEGORIES = ("weight", "bias", "norm", "embedding", "temperature")


@dataclass(frozen=True, kw_only=True)
class GroupSettings:
    """Overrides for one parameter category's optimizer group (`PARAMETER_CATEGORIES`):
    its learning rate as a multiple of the schedule's, and its own betas or epsilon."""

    category: str
    lr_scale: float = 1.0
    betas: tuple[float, float] | None = None
    eps: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, "train.optimizer.groups")
        check(self.category in PARAMETER_CATEGORIES, "train.optimizer.groups.category",
              f"{self.category!r}; valid: {list(PARAMETER_CATEGORIES)}")
        check(self.lr_scale > 0, "train.optimizer.groups.lr_scale", "must be positive")
        check(self.betas is None or (len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas)),
              "train.optimizer.groups.betas", "must be two numbers in [0, 1)")
        check(self.eps is None or self.eps > 0, "train.optimizer.groups.eps", "must be positive")


FUSED_MODES = ("auto", "on", "off")


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """AdamW with one parameter group per category (`embedlab.train.optim`).

    Categories: "embedding" (the token embedding table, also the tied MLM decoder), "norm"
    (LayerNorm weights and biases), "bias" (every other bias, the MLM vocabulary bias
    included), "temperature" (a learnable contrastive temperature) and "weight" (every other
    matrix). The categories in `no_decay` get no weight decay; the rest get
    `train.weight_decay`. `fused`: "auto" uses PyTorch's fused AdamW kernel where the
    device has one (CPU and CUDA in torch >= 2.4), "on" requires it, "off" uses the
    multi-tensor path. The groups, their members and settings are recorded in every manifest.
    """

    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    no_decay: tuple[str, ...] = ("bias", "norm", "temperature")
    fused: str = "auto"
    groups: tuple[GroupSettings, ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, "train.optimizer")
        check(len(self.betas) == 2 and all(0.0 <= b < 1.0 for b in self.betas), "train.optimizer.betas",
              "must be two numbers in [0, 1)")
        check(self.eps > 0, "train.optimizer.eps", "must be positive")
        unknown = sorted(set(self.no_decay) - set(PARAMETER_CATEGORIES))
        check(not unknown, "train.optimizer.no_decay", f"unknown categories {unknown}; valid: {list(PARAMETER_CATEGORIES)}")
        check(self.fused in FUSED_MODES, "train.optimizer.fused", f"{self.fused!r}; valid: {list(FUSED_MODES)}")
        named = [g.category for g in self.groups]
        check(len(set(named)) == len(named), "train.optimizer.groups", f"a category appears twice: {named}")


PRECISIONS = ("auto", "fp32", "bf16")
COMPILE_MODES = ("auto", "on", "off")
# The largest budget in each unit: far beyond any training run made so far (the largest are near
# 1e26 FLOPs and 2e13 tokens), and below 2**53, where the float64 counters of a trial's
# consumed tokens and pairs still add exactly. A budget above them is a typo or an overflow.
BUDGET_MAXIMA = {"tokens": 10**15, "pairs": 10**15, "flops": 1e27, "device_seconds": 1e12}
# What a FLOPs budget counts: this trial's own training ("phase"), or the whole lineage's
# ("lineage": a trial that starts from its parent's weights is charged the parent's training).
BUDGET_SCOPES = ("phase", "lineage")


@dataclass(frozen=True, kw_only=True)
class Budget:
    """The compute a trial trains to; a study holds one and stamps it on every arm.

    `tokens` counts consumed non-padding input tokens summed over all workers (phase 1);
    `pairs` consumed positive pairs (phases 2 and 3). `flops` > 0 makes the budget measured
    training FLOPs instead, `device_seconds` > 0 device time summed over the workers; a
    trial trains to one of them, and stops at the first step that reaches it (`unit`).
    The data figures stay with a FLOPs or device-time budget: they size the data schedule.

    `scope` (BUDGET_SCOPES): "phase" counts this trial's own training FLOPs against `flops`;
    "lineage" (phases 2-3, a FLOPs budget) makes `flops` the total over the lineage, so a
    trial that starts from its parent's weights is charged the parent's measured training
    FLOPs and trains the rest, and one that starts from a random initialisation trains all
    of it (`embedlab.train.budget.split_lineage_budget`).
    """

    tokens: int
    pairs: int
    flops: float = 0.0
    device_seconds: float = 0.0
    scope: str = "phase"

    def __post_init__(self) -> None:
        for unit, most in BUDGET_MAXIMA.items():  # before the types: an inf or 1e30 is named with the maximum
            amount = getattr(self, unit)
            if isinstance(amount, int | float) and not isinstance(amount, bool):
                check(amount <= most, f"train.budget.{unit}", f"{amount:.3g}: must be a finite amount of at most "
                      f"{most:.0e} {unit.replace('_', ' ')}, the largest budget embedlab trains to")
        check_fields(self, "train.budget")
        check_positive(self, "train.budget", "tokens", "pairs")
        check(self.flops >= 0, "train.budget.flops", "must be >= 0 (0: budget in tokens or pairs)")
        check(self.device_seconds >= 0, "train.budget.device_seconds",
              "must be >= 0 (0: budget in tokens, pairs or FLOPs)")
        check(not (self.flops > 0 and self.device_seconds > 0), "train.budget.device_seconds",
              "a trial trains to one budget: set flops or device_seconds, not both")
        check(self.scope in BUDGET_SCOPES, "train.budget.scope", f"{self.scope!r}; valid: {list(BUDGET_SCOPES)}")
        check(self.scope == "phase" or self.flops > 0, "train.budget.scope",
              "'lineage' adds a parent's training FLOPs to a child's, so it needs a train.budget.flops budget")

    def unit(self, phase: int) -> str:
        """What a trial of `phase` trains to: measured FLOPs or device seconds when set, else
        its phase's data (tokens in phase 1, pairs in phases 2-3)."""
        phase_spec(phase)  # a ConfigError naming the valid phases, whatever the amounts
        return budget_unit_of(dataclasses.asdict(self), phase)

    def amount(self, phase: int) -> float:
        """The budget in its unit for a trial of `phase`."""
        return getattr(self, self.unit(phase))

    def data(self, phase: int) -> int:
        """The phase's data figure: tokens in phase 1, pairs in phases 2-3 (its `data_unit`)."""
        return getattr(self, phase_spec(phase).data_unit)

    def declared(self, phase: int) -> dict[str, float]:
        """The amount in each unit the budget declares for a trial of `phase`: tokens (phase
        1's data, and the record's figure in phases 2-3), pairs in phases 2-3 only (a phase-1
        trial reads none), FLOPs and device seconds when set."""
        return declared_amounts(dataclasses.asdict(self), phase)


def budget_unit_of(amounts: dict[str, Any], phase: int) -> str:
    """`Budget.unit` of a budget's mapping (`Budget`'s fields; one absent counts as 0), so a
    recorded study's unit reads the same whether or not it holds every field."""
    if (amounts.get("flops") or 0) > 0:
        return "flops"
    if (amounts.get("device_seconds") or 0) > 0:
        return "device_seconds"
    return phase_spec(phase).data_unit


def declared_amounts(amounts: dict[str, Any], phase: int) -> dict[str, float]:
    """`Budget.declared` of a budget's mapping (one absent field counts as 0)."""
    declared = {unit: amounts.get(unit) or 0 for unit in ("tokens", "pairs", "flops", "device_seconds")}
    if phase_spec(phase).data_unit == "tokens":  # the tokens are every phase's record; pairs only where read
        declared["pairs"] = 0
    return {unit: amount for unit, amount in declared.items() if amount > 0}


# TrainConfig's budget when none is given: a demo-sized phase 1, 2,000 pairs in phases 2-3.
DEFAULT_BUDGET = Budget(tokens=100_000, pairs=2_000)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Phase-1 optimisation and the compute budget.

    `budget` (`Budget`) is what the trial trains to; training stops at the first step that
    reaches it. `batch_rows` is rows per worker per microbatch; a step is `microbatches` of
    them on every worker.

    Reliability (`embedlab.checkpoints.state`, `embedlab.train.nonfinite`): every
    `checkpoint_every_steps` steps (0: only the final checkpoint) a checkpoint holds the
    complete training state, and a run resumes from it exactly; Ray Train restarts a failed
    worker group up to `max_failures` times from the latest one. A step whose loss or
    gradient is not finite is rejected (no update); `max_rejected_steps` rejections in a
    row stop the trial with `NonFiniteError`.

    Optimisation: AdamW (`optimizer`) at peak `learning_rate` on the `schedule`; gradients
    clipped to global norm `max_grad_norm` (the pre-clip norm is reported). `precision`:
    "fp32" everywhere, or "bf16" autocast for the forward passes with fp32 master weights,
    fp32 optimizer state and fp32 loss reductions; "auto" is bf16 with GPUs and fp32 on
    CPUs (resolved value recorded in the manifest). `compile`: "on" compiles all of each
    block but the attention kernel with `torch.compile` (`embedlab.train.compiling`), "off" runs
    eager, "auto" compiles on GPUs only (on CPU it measured no faster).

    Length schedule (phase 1): `length_schedule` lists (budget fraction, sequence length)
    stages, e.g. ((0.9, 128), (0.1, 512)) for BERT's 90%/10%; lengths must divide
    `data.sequence_length`, at which rows are packed (usually the last stage's). A stage at a shorter length
    cuts each packed row into `data.sequence_length / length` rows (the step's tokens stay the
    same), so a stage switch changes what a step attends over, not the data order or budget.
    Empty: the whole phase at `data.sequence_length`.
    """

    budget: Budget = DEFAULT_BUDGET
    batch_rows: int = 16
    microbatches: int = 1
    learning_rate: float = 1e-3  # the peak; the schedule scales it
    weight_decay: float = 0.01
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    max_grad_norm: float = 1.0
    precision: str = "auto"
    compile: str = "auto"
    length_schedule: tuple[tuple[float, int], ...] = ()
    seed: int = 0
    num_workers: int = 2
    cpus_per_worker: float = 0.5
    use_gpu: bool = False
    report_every_steps: int = 10
    torch_threads: int = 1
    checkpoint_every_steps: int = 200
    max_failures: int = 2
    max_rejected_steps: int = 8

    def __post_init__(self) -> None:
        check_fields(self, "train")
        check_seed(self.seed, "train.seed")
        check_positive(
            self, "train", "batch_rows", "microbatches", "learning_rate",
            "max_grad_norm", "num_workers", "cpus_per_worker", "report_every_steps", "torch_threads",
        )
        check(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        check(self.precision in PRECISIONS, "train.precision", f"{self.precision!r}; valid: {list(PRECISIONS)}")
        check(self.compile in COMPILE_MODES, "train.compile", f"{self.compile!r}; valid: {list(COMPILE_MODES)}")
        if self.length_schedule:
            fractions = [fraction for fraction, _ in self.length_schedule]
            check(all(f > 0 for f in fractions) and abs(sum(fractions) - 1.0) < 1e-6, "train.length_schedule",
                  f"budget fractions must be positive and sum to 1, got {fractions}")
            lengths = [length for _, length in self.length_schedule]
            check(lengths == sorted(lengths) and all(length >= 8 for length in lengths), "train.length_schedule",
                  f"lengths must be >= 8 and non-decreasing, got {lengths}")
        check(isinstance(self.budget, Budget), "train.budget", f"must be a Budget, got {type(self.budget).__name__}")
        check(self.checkpoint_every_steps >= 0, "train.checkpoint_every_steps",
              "must be >= 0 (0: only the final checkpoint)")
        check(self.max_failures >= 0, "train.max_failures", "must be >= 0 (0: no restart)")
        check(self.max_rejected_steps >= 1, "train.max_rejected_steps", "must be >= 1")
