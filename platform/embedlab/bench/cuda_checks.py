"""`embedlab model check-cuda`: the GPU paths checked against their CPU-tested oracles.

The test suite runs on CPUs, so what training does only on a GPU is checked here,
on the GPU, each against an oracle the suite already trusts:

- **flash varlen**: torch's variable-length flash kernel (bf16) against
  `reference_varlen_attention` (fp32, one SDPA call per sequence), forward and gradients;
- **encoder paths**: a small `MLMModel` under bf16 autocast, variable-length attention
  against the dense block-diagonal mask, loss and gradients;
- **device vs CPU**: the same model and batch in fp32 (TF32 off) on the GPU and on the CPU,
  loss and gradients: every index, scatter and mask op of the encoder and MLM head on CUDA;
- **collectives**: the trainer's all-reduce (`sum_all_reduce`, float64 counts and the flat
  gradient buffer) and byte all-gather (`all_gather_bytes`, resume) on a one-process group
  of the device's backend (NCCL on CUDA): initialisation, dtypes and device placement, not
  cross-GPU traffic, which needs two GPUs;
- **host reads**: a phase-1 step never reads the device back before its one read (the loss
  sums and gradient norm the non-finite rule decides on), nor in its optimizer step: on CUDA
  under `torch.cuda.set_sync_debug_mode("error")`; elsewhere on the meta device;
- **compiled step**: three optimizer steps (fused AdamW) with the blocks compiled as training
  compiles them (`embedlab.train.compiling`) against the same steps eager, in fp32.

Each check reports its measured errors and tolerance and never raises: a failure is a
result. On a CPU (`--device cpu`, and the test suite) the same checks run with the
bucketed CPU kernel, the CPU compiler and gloo; `workers/bench-gpu.sh` runs them on the GPU.
Errors are relative: max |a - b| / max |b| for tensors, |a - b| / |b| for losses, and
||a - b|| / ||b|| over all parameters for gradients.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import traceback
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from embedlab.bench.synthetic import synthetic_batch, synthetic_rows
from embedlab.core.config import ModelConfig, TrainConfig
from embedlab.model.encoder import (
    MLMModel,
    bucketed_varlen_attention,
    flash_varlen_attention,
    reference_varlen_attention,
    segment_layout,
)
from embedlab.model.heads import MultiHeadMLMModel
from embedlab.train.compiling import compile_blocks
from embedlab.train.mlm_step import (
    accumulate_gradients,
    all_reduce_gradients,
    optimizer_step,
    prepare_microbatch,
    sum_all_reduce,
)
from embedlab.checkpoints.state import all_gather_bytes
from embedlab.train.nonfinite import finite_update
from embedlab.train.optim import build_optimizer

Kernel = Callable[..., torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    compares: str
    tolerance: float
    measured: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None  # the exception, when the check could not run


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| / max |reference|, both compared in float64 on the CPU."""
    value, reference = value.detach().double().cpu(), reference.detach().double().cpu()
    return float((value - reference).abs().max() / reference.abs().max().clamp(min=1e-30))


def _judged(name: str, compares: str, tolerance: float, measured: dict[str, float]) -> Check:
    return Check(name, all(v <= tolerance for v in measured.values()), compares, tolerance, measured)


def _model_config() -> ModelConfig:
    # Two layers, head width 64 (the flash kernel's common case), a small vocabulary.
    return ModelConfig(preset="check", layers=2, width=128, heads=2, ffn_width=512, vocab_size=1000)


def _microbatch(config: ModelConfig, rows: int, length: int, seed: int, device: torch.device):
    """Packed rows of corpus-like document lengths, 15% masked (`synthetic_batch`), on
    `device`; the same seed gives the same batch on any device."""
    segments, masked = synthetic_batch(rows, length, config.vocab_size, seed, torch.Generator().manual_seed(seed))
    # The layout goes along whichever path the model takes; the dense one ignores it.
    return prepare_microbatch(masked, segments, device=device, varlen=True)


def _loss_and_gradients(model, microbatch, precision: str) -> tuple[float, torch.Tensor]:
    """The training step's loss sum and flat gradient (`accumulate_gradients`), from zero."""
    model.zero_grad(set_to_none=True)
    result = accumulate_gradients(model, [microbatch], precision=precision).result()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    return result.loss_sum, flat.double().cpu()


def _gradient_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm().clamp(min=1e-30))


@contextlib.contextmanager
def _no_tf32() -> Iterator[None]:
    """fp32 matmuls in full fp32 on CUDA while a comparison runs (TF32 would round to 10 bits)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def default_kernel(device: torch.device) -> Kernel:
    """The variable-length kernel the encoder runs on `device`."""
    return flash_varlen_attention if device.type == "cuda" else bucketed_varlen_attention


def check_varlen_kernel(device: torch.device, kernel: Kernel | None = None, dtype: torch.dtype | None = None,
                        tolerance: float = 2e-2) -> Check:
    """The variable-length kernel against the per-sequence fp32 oracle, forward and gradients,
    on four packed rows of 256 tokens (corpus-like segment lengths), 4 heads of width 64."""
    kernel = kernel or default_kernel(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    _, segments = synthetic_rows(4, 256, 1000, seed=0)
    layout = segment_layout(segments.to(device))
    generator = torch.Generator().manual_seed(0)
    shape = (len(layout.token_index), 4, 64)
    # Inputs rounded to the kernel's dtype first, so the oracle sees the same values and the
    # errors are the kernel's arithmetic alone.
    base = [torch.randn(shape, generator=generator).to(dtype).float() for _ in range(3)]
    upstream = torch.randn(shape, generator=generator)

    def run(function: Kernel, run_dtype: torch.dtype) -> list[torch.Tensor]:
        q, k, v = (t.to(device, run_dtype).requires_grad_() for t in base)
        out = function(q, k, v, layout.cu_seqlens, layout.max_length)
        return [out, *torch.autograd.grad(out, (q, k, v), upstream.to(device, out.dtype))]

    values, references = run(kernel, dtype), run(reference_varlen_attention, torch.float32)
    measured = {name: relative_error(a, b) for name, a, b in zip(("output", "dq", "dk", "dv"), values, references)}
    name = getattr(kernel, "__name__", "kernel")
    return _judged("flash varlen" if device.type == "cuda" else "varlen kernel",
                   f"{name} ({str(dtype).removeprefix('torch.')}) vs reference_varlen_attention (fp32)",
                   tolerance, measured)


def check_encoder_paths(device: torch.device, precision: str = "bf16", tolerance: float = 2e-2) -> Check:
    """Variable-length attention against the dense mask in the whole model, same weights."""
    config = _model_config()
    microbatch = _microbatch(config, rows=4, length=256, seed=1, device=device)
    results = []
    for attention in ("varlen", "dense"):
        torch.manual_seed(0)
        model = MLMModel(dataclasses.replace(config, attention=attention)).to(device).train()
        results.append(_loss_and_gradients(model, microbatch, precision))
    (loss, grads), (reference_loss, reference_grads) = results
    return _judged("encoder paths", f"MLMModel, {precision}: attention='varlen' vs 'dense'", tolerance,
                   {"loss": abs(loss - reference_loss) / abs(reference_loss),
                    "gradients": _gradient_error(grads, reference_grads)})


def check_device_vs_cpu(device: torch.device, tolerance: float = 1e-4) -> Check:
    """The model on `device` against the same model on the CPU, fp32, dense attention."""
    config = dataclasses.replace(_model_config(), attention="dense")
    torch.manual_seed(0)
    cpu_model = MLMModel(config).train()
    on_device = MLMModel(config)
    on_device.load_state_dict(cpu_model.state_dict())
    with _no_tf32():
        loss, grads = _loss_and_gradients(on_device.to(device).train(),
                                          _microbatch(config, rows=4, length=256, seed=2, device=device), "fp32")
    reference_loss, reference_grads = _loss_and_gradients(
        cpu_model, _microbatch(config, rows=4, length=256, seed=2, device=torch.device("cpu")), "fp32")
    return _judged("device vs cpu", f"MLMModel fp32 on {device.type} vs on cpu (dense attention)", tolerance,
                   {"loss": abs(loss - reference_loss) / abs(reference_loss),
                    "gradients": _gradient_error(grads, reference_grads)})


def _train_steps(device: torch.device, compiled: bool, steps: int = 3) -> list[float]:
    config = _model_config()
    torch.manual_seed(0)
    model = MLMModel(config).to(device).train()
    if compiled:
        compile_blocks(model.encoder)
    train = TrainConfig()
    optimizer = build_optimizer(model, train, device)
    losses = []
    for step in range(steps):
        result = accumulate_gradients(model, [_microbatch(config, rows=4, length=128, seed=10 + step, device=device)])
        losses.append(optimizer_step(model, optimizer, result, train.max_grad_norm).loss_sum)
    return losses


def check_compiled_step(device: torch.device, tolerance: float = 1e-3) -> Check:
    """Three fp32 training steps with compiled blocks against the same steps eager."""
    with _no_tf32():
        compiled, eager = _train_steps(device, compiled=True), _train_steps(device, compiled=False)
    return _judged("compiled step", "3 fp32 steps (fused AdamW where available), compiled blocks vs eager",
                   tolerance, {f"loss step {i + 1}": abs(c - e) / abs(e) for i, (c, e) in enumerate(zip(compiled, eager))})


def check_collectives(device: torch.device) -> Check:
    """The trainer's all-reduce and byte all-gather on a one-process group of the device's
    backend: the results must equal the one-process values exactly."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    config = _model_config()
    microbatch = _microbatch(config, rows=2, length=128, seed=3, device=device)
    handle, path = tempfile.mkstemp(prefix="embedlab-store-")
    os.close(handle)
    os.unlink(path)  # the file store creates it
    dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = MLMModel(config).to(device).train()
        accumulate_gradients(model, [microbatch])  # one-process gradients, then summed over the group
        local = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        all_reduce_gradients(model, sum_all_reduce(device))
        reduced = [p.grad for p in model.parameters() if p.grad is not None]
        # 2^40 + 1 is exact in float64 and not in float32: a downcast anywhere shows.
        counts = torch.tensor([3.0, 2.0**40 + 1.0], dtype=torch.float64)
        payload = os.urandom(1001)
        measured = {
            "gradients": max(float((a - b).abs().max()) for a, b in zip(reduced, local)),
            "float64 counts": float((sum_all_reduce(device)(counts.clone()) - counts).abs().max()),
            "bytes gathered wrong": float(all_gather_bytes(payload, device) != [payload]),
        }
    finally:
        dist.destroy_process_group()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return _judged("collectives", f"sum_all_reduce and all_gather_bytes on {backend} (1 process) "
                                  "vs the one-process values", 0.0, measured)



HOST_READ_HEADS, HOST_READ_RATIOS = ("mask15", "mask50"), ((0.15, 1.0), (0.5, 1.0))


def _prepared_step(model, device: torch.device, precision: str, seed: int):
    """Two microbatches prepared on the host (both heads, per-ratio and per-source groups,
    the variable-length layout), their gradients accumulated and clipped: the step up to its
    one read. Returns the accumulated step and the gradient norm, both unread."""
    microbatches = []
    for part in range(2):
        segments, masked = synthetic_batch(4, 128, model.encoder.config.vocab_size, seed + part,
                                           torch.Generator().manual_seed(seed + part))
        rows = torch.arange(len(segments)) % 2  # each row's ratio, and its head
        sources = torch.where(segments > 0, segments % 2, -1)  # two "sources": odd and even documents
        microbatches.append(prepare_microbatch(
            masked, segments, device=device, head_names=HOST_READ_HEADS, head_index=rows, ratio_index=rows,
            mixed_ratios=HOST_READ_RATIOS, source_index=sources, source_names=("odd", "even"), varlen=True))
    accumulated = accumulate_gradients(model, microbatches, precision=precision)
    return accumulated, torch.nn.utils.clip_grad_norm_(model.parameters(), TrainConfig().max_grad_norm)


@contextlib.contextmanager
def _reads_raise(device: torch.device) -> Iterator[None]:
    """On CUDA, any synchronising call raises while inside (`torch.cuda.set_sync_debug_mode`)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _where(error: BaseException) -> str:
    """The innermost embedlab frame of `error`'s traceback, as path:line."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "embedlab" in f.filename]
    return f"{frames[-1].filename.rsplit('embedlab', 1)[-1].lstrip('/')}:{frames[-1].lineno}" if frames else "?"


def check_host_reads(device: torch.device) -> Check:
    """A phase-1 step never reads the device back before its one read: from preparing two
    microbatches on the host (two LM heads, per-ratio and per-source groups, the variable-
    length layout) to the clipped gradient norm, and again over the optimizer step after that
    read. On CUDA under `torch.cuda.set_sync_debug_mode("error")` (bf16 autocast, the flash
    kernel, fused AdamW), after one warm-up step; elsewhere on the meta device (bf16
    weights), whose tensors hold no data, so any read raises (the optimizer is not run there)."""
    cuda = device.type == "cuda"
    run_on = device if cuda else torch.device("meta")
    config = dataclasses.replace(_model_config(), attention="varlen")
    torch.manual_seed(0)
    model = MultiHeadMLMModel(config, HOST_READ_HEADS).to(run_on).train()
    precision = "bf16" if cuda else "fp32"
    if not cuda:
        model.to(torch.bfloat16)  # the flash kernel's inputs; autocast has no meta device
    optimizer = build_optimizer(model, TrainConfig(), run_on) if cuda else None
    if cuda:  # lazily created handles and caches may synchronise once
        optimizer_step(model, optimizer, _prepared_step(model, run_on, precision, seed=20)[0],
                       TrainConfig().max_grad_norm)
    try:
        with _reads_raise(run_on):
            accumulated, norm = _prepared_step(model, run_on, precision, seed=30)
        if cuda:
            result = accumulated.result(norm)  # the step's one read
            with _reads_raise(run_on):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize(run_on)
            if not finite_update(result.loss_sum, result.grad_norm):
                raise RuntimeError(f"a non-finite step: loss sum {result.loss_sum}, norm {result.grad_norm}")
    except (RuntimeError, NotImplementedError) as error:
        return Check("host reads", False, "", 0.0, error=f"{type(error).__name__} at {_where(error)}: {error}")
    where = "CUDA, synchronising calls raise" if cuda else "the meta device, reads raise"
    return _judged("host reads", f"a phase-1 step prepared on the host, on {where}, until its one read "
                                 "(and the optimizer step after it on CUDA)", 0.0, {"reads before the one read": 0.0})

# The compile last: the slowest check, so a run short of time still has the others.
CHECKS: dict[str, Callable[[torch.device], Check]] = {
    "flash varlen": check_varlen_kernel,
    "encoder paths": check_encoder_paths,
    "device vs cpu": check_device_vs_cpu,
    "collectives": check_collectives,
    "host reads": check_host_reads,
    "compiled step": check_compiled_step,
}


def run_checks(device: torch.device, names: tuple[str, ...] = tuple(CHECKS),
               progress: Callable[[str], None] = print) -> list[Check]:
    """Every named check on `device`; one that raises is a failed check carrying the error."""
    results = []
    for name in names:
        try:
            check = CHECKS[name](device)
        except Exception as error:  # noqa: BLE001 - a broken GPU path is a result, not a crash
            check = Check(name, False, "", 0.0, error=f"{type(error).__name__}: {error}")
        progress(f"check {check.name}: {'ok' if check.ok else 'FAILED'} "
                 + (check.error or ", ".join(f"{k} {v:.2e}" for k, v in check.measured.items()))
                 + (f" (tolerance {check.tolerance:g})" if check.error is None else ""))
        results.append(check)
    return results
