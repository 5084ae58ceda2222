"""Training and encoding FLOPs, counted from the shapes each pass really computes.

What is counted is what `torch.utils.flop_counter.FlopCounterMode` counts on the same model
and step (tests/test_flops.py holds every phase and arm kind to it within 1%): the matrix
products. Per encoder forward pass over a (B, T) batch:

    linears    2 * B*T * L * (4*d^2 + m*d*f)   (QKV, output, the FFN's m d x f matrices: two,
                                                 or three for ModernBERT's gated one, whose
                                                 input matrix is d x 2f; every row position,
                                                 padding included, as the linears run over
                                                 the whole padded tensor)
    attention  4 * d * L * area                 (QK^T and PV; `area` = sum over the attention
                                                 problems the kernel runs of q_len * k_len)

`area` follows the kernel the encoder picks (`embedlab.model.encoder.varlen_rule`): the dense
block-diagonal mask computes B * T^2 whatever the segments; the CPU bucketed kernel computes,
per length bucket, sequences * width^2; flash `varlen_attn` computes the sum of the real
segment lengths squared. A backward pass costs twice its forward (both operands' gradients
of every product), so a trained pass is 3x its forward and a no-grad pass (GradCache's first
encode, evaluation, mining) is 1x; but a fused attention kernel recomputes the scores in its
backward (5 products, not 4): 3.5x for attention. Fused kernels run on CUDA and on the CPU
unless attention dropout trains, which takes SDPA's math path. The MLM head adds
2 * N_selected * (d^2 + d*V) per forward (its dense transform and the tied decoder, at
selected positions only), and the contrastive score matrix 2 * N_queries * N_candidates * d. Element-wise work (norms, GELU, softmax,
losses, the optimizer) is not counted, as FlopCounterMode does not count it.

A pretrained backbone (`embedlab.model.pretrained`) is counted by the same formulas from the
`ModelConfig` derived from its checkpoint (`ModelConfig.ffn_matrices`; always the dense path;
loaded without BERT's pooler, which no pass runs): tests/test_pretrained.py holds BERT and
ModernBERT to FlopCounterMode as tests/test_flops.py holds embedlab's encoder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from embedlab.core.config import ModelConfig, TrialConfig
from embedlab.model.encoder import length_buckets, segment_layout, varlen_rule

FORWARD, TRAINED, GRADCACHE = "forward", "trained", "gradcache"
# Forward passes of each product per mode: a backward is 2 forwards (one per operand gradient);
# GradCache runs a no-grad forward and then a trained pass.
PASSES = {FORWARD: 1.0, TRAINED: 3.0, GRADCACHE: 4.0}
RECOMPUTE = 0.5  # a fused attention backward also recomputes QK^T: half a forward more
PATHS = ("dense", "bucketed", "flash")


def linear_parameters(config: ModelConfig) -> int:
    """The weights every position multiplies by in one encoder pass (no norms, no embedding)."""
    d, f = config.width, config.ffn_width
    return config.layers * (4 * d * d + config.ffn_matrices * d * f)


@dataclass(frozen=True)
class AttentionKernel:
    """What attention computes: its `path` ("dense", "bucketed" or "flash") and whether its
    backward recomputes the scores (a fused kernel) rather than reading them back."""

    path: str
    recomputes: bool

    @property
    def varlen(self) -> bool:
        """The variable-length path, whose layout a training step computes on the host."""
        return self.path != "dense"


def attention_path(config: ModelConfig, *, device: torch.device, half: bool, length: int,
                   training: bool) -> AttentionKernel:
    """The kernel the encoder runs for (B, `length`) inputs (`varlen_rule`'s choice); SDPA
    takes its unfused math path on the CPU only while attention dropout trains."""
    cuda = device.type == "cuda"
    varlen = varlen_rule(config.attention, cuda=cuda, half=half, length=length, training=training,
                         dropout=config.dropout)
    path = ("flash" if cuda else "bucketed") if varlen else "dense"
    return AttentionKernel(path=path, recomputes=cuda or not (training and config.dropout > 0))


def segment_lengths(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) segment ids (0 = padding) -> (S,) lengths of the segments, in row-major order."""
    layout = segment_layout(segment_ids.cpu())
    return (layout.cu_seqlens[1:] - layout.cu_seqlens[:-1]).long()


def attention_area(segment_ids: torch.Tensor, path: str) -> float:
    """Sum of q_len * k_len over the attention problems `path` runs for (B, T) `segment_ids`."""
    if path not in PATHS:
        raise ValueError(f"attention path {path!r}; valid: {list(PATHS)}")
    rows, length = segment_ids.shape
    if path == "dense":
        return float(rows * length * length)
    lengths = segment_lengths(segment_ids)
    if lengths.numel() == 0:
        return 0.0
    if path == "flash":
        return float(lengths.double().square().sum())
    # The bucketed kernel pads each bucket's sequences to the bucket's longest member.
    buckets = length_buckets(lengths)
    area = 0.0
    for bucket in torch.unique(buckets).tolist():
        members = lengths[buckets == bucket]
        area += float(members.numel()) * float(members.max()) ** 2
    return area


def encoder_flops(config: ModelConfig, rows: int, length: int, area: float, *, mode: str = FORWARD,
                  recomputes: bool = False) -> float:
    """Encoding (rows, length) positions whose attention covers `area`, in `mode`."""
    passes = PASSES[mode]
    attention_passes = passes + (RECOMPUTE if recomputes and mode != FORWARD else 0.0)
    return (passes * 2.0 * rows * length * linear_parameters(config)
            + attention_passes * 4.0 * config.width * config.layers * area)


def head_forward_flops(config: ModelConfig, selected: float) -> float:
    """One MLM head forward at `selected` positions: dense transform and tied decoder."""
    d = config.width
    return 2.0 * selected * (d * d + d * config.vocab_size)


def similarity_forward_flops(queries: float, candidates: float, width: int) -> float:
    """The (queries, candidates) score matrix of L2-normalised (., width) embeddings."""
    return 2.0 * queries * candidates * width


@dataclass
class FlopTally:
    """FLOPs of the passes a step (or an evaluation, or mining) runs, added as they run.

    `encode` takes the segment ids the encoder sees (on any device; only their shape is read
    on the dense path, and the bucketed and flash paths copy them to the CPU once) and where
    and how the encoder runs them, from which it takes the kernel (`attention_path`)."""

    flops: float = 0.0

    def encode(self, config: ModelConfig, segment_ids: torch.Tensor, *, mode: str, device: torch.device,
               half: bool, training: bool) -> float:
        rows, length = segment_ids.shape
        kernel = attention_path(config, device=device, half=half, length=length, training=training)
        flops = encoder_flops(config, rows, length, attention_area(segment_ids, kernel.path), mode=mode,
                              recomputes=kernel.recomputes)
        self.flops += flops
        return flops

    def head(self, config: ModelConfig, selected: float, *, mode: str = TRAINED) -> float:
        flops = PASSES[mode] * head_forward_flops(config, selected)
        self.flops += flops
        return flops

    def similarity(self, queries: float, candidates: float, width: int, *, mode: str = TRAINED) -> float:
        flops = PASSES[mode] * similarity_forward_flops(queries, candidates, width)
        self.flops += flops
        return flops


def _step_setup(trial: TrialConfig) -> tuple[torch.device, bool]:
    """The device and half precision a trial's steps run at, from its config alone."""
    train = trial.train
    half = train.precision == "bf16" or (train.precision == "auto" and train.use_gpu)
    return torch.device("cuda" if train.use_gpu else "cpu"), half


def mlm_step_flops(trial: TrialConfig, *, attention: bool = True) -> float:
    """One masked-language-modelling step's training FLOPs (phase 1), all workers, predicted
    from the config alone: rows taken full (packing leaves well under 1% padding) and as one
    segment each on the dense path, an upper bound on the variable-length paths; the head at
    the expected masking ratio of every position. Without `attention`, attention is left out:
    a lower bound for sizing data schedules. The trial itself always counts what it runs."""
    keep = 1.0 if attention else 0.0
    model, train = trial.model, trial.train
    device, half = _step_setup(trial)
    workers, rows = train.num_workers, train.batch_rows * train.microbatches
    length = trial.data.sequence_length
    kernel = attention_path(model, device=device, half=half, length=length, training=True)
    if trial.masking.mixed_ratios:
        weights = sum(weight for _, weight in trial.masking.mixed_ratios)
        ratio = sum(r * weight for r, weight in trial.masking.mixed_ratios) / weights
    else:
        ratio = trial.masking.ratio
    per_worker = encoder_flops(model, rows, length, keep * rows * length * length, mode=TRAINED,
                               recomputes=kernel.recomputes)
    per_worker += PASSES[TRAINED] * head_forward_flops(model, ratio * rows * length)
    return workers * per_worker


def contrastive_step_flops(trial: TrialConfig, *, attention: bool = True) -> float:
    """One contrastive step's training FLOPs (phases 2-3), all workers, predicted from the config
    alone: pairs padded to `pair_length`, exact on the dense path; every text a pair encodes
    (query, positive, negatives, a distillation document), every score matrix at every trained
    width, the distillation scores and a joint MLM term. Without `attention`, attention is left
    out (a lower bound). The trial itself always counts what it runs."""
    keep = 1.0 if attention else 0.0
    model, train = trial.model, trial.train
    device, half = _step_setup(trial)
    workers = train.num_workers
    settings = trial.contrastive
    negatives = settings.negatives.count
    length, batch = settings.pair_length, train.batch_rows
    kernel = attention_path(model, device=device, half=half, length=length, training=True)
    mode = GRADCACHE if settings.gradcache_chunk else TRAINED
    # Queries, positives, negatives and, with embedding distillation, one document a pair.
    texts = batch * (2 + negatives + (1 if settings.distillation.embedding_mse_weight > 0 else 0))
    # GradCache cuts each side into chunks: the dense area is the same, B * L^2 either way.
    per_microbatch = encoder_flops(model, texts, length, keep * texts * length * length, mode=mode,
                                   recomputes=kernel.recomputes)
    gathered = workers if settings.gather_across_workers and workers > 1 else 1
    widths = settings.matryoshka.trained_widths(model.width)[0]
    for width in widths:  # a score matrix per trained width
        per_microbatch += PASSES[TRAINED] * similarity_forward_flops(batch, gathered * batch * (1 + negatives), width)
        if settings.symmetric:
            per_microbatch += PASSES[TRAINED] * similarity_forward_flops(batch, gathered * batch, width)
    if settings.distillation.score_weight > 0:  # each query's own candidates, at the widest trained width
        per_microbatch += PASSES[TRAINED] * similarity_forward_flops(batch, 1 + negatives, widths[-1])
    if settings.mlm_weight > 0:
        copies = 2 * batch
        per_microbatch += encoder_flops(model, copies, length, keep * copies * length * length, mode=TRAINED,
                                        recomputes=kernel.recomputes)
        per_microbatch += PASSES[TRAINED] * head_forward_flops(model, trial.masking.ratio * copies * length)
    return workers * train.microbatches * per_microbatch


# The FLOP model of each config section a phase trains by (`PhaseSpec.section`): a new phase
# that trains by a new section registers its model here.
STEP_FLOPS: dict[str, Callable[..., float]] = {"masking": mlm_step_flops, "contrastive": contrastive_step_flops}


def expected_step_flops(trial: TrialConfig, *, attention: bool = True) -> float:
    """One step's training FLOPs for `trial`, all workers, predicted from its config alone by
    its phase's FLOP model (`STEP_FLOPS`): how a study turns a data budget of its control arm
    into a FLOPs budget, and how the planner sizes a pilot. Without `attention`, attention is
    left out: a lower bound for sizing data schedules. The trial itself always counts what it runs."""
    return STEP_FLOPS[trial.spec.section](trial, attention=attention)
