"""`embedlab bench mfu`: model FLOPs utilisation of phase-1 training on one CUDA GPU.

MFU = model FLOPs per second / the device's peak dense bf16 FLOPs per second (`PEAKS`, by the
exact device name, or `--peak-tflops`; the JSON's "peak" says which). Model FLOPs are what the
model needs, not what an implementation spends:

    6 x body parameters x non-padding tokens        (matmuls, forward + backward)
  + 6 x (d^2 + d V) x selected tokens                (MLM head, selected positions only)
  + 12 x layers x d x sum over segments of length^2  (attention scores and values, own segment)

so padding, the dense mask's cross-document blocks, GradCache re-forwards and rematerialisation
count for nothing. Next to it the JSON gives the executed FLOPs ("executed_*"): what training's
own counter (`embedlab.model.flops.FlopTally`, `budget/flops`) counts for the same batches,
padding and the kernel's attention area included.

The step is the real one (`accumulate_gradients` under the bf16 policy, `optimizer_step`,
fused AdamW from `build_optimizer`); the encoder runs the variable-length flash path ("auto"
under bf16 autocast; the kernel is first checked against its oracle, `embedlab.bench.cuda_checks`,
and the dense mask timed instead if it fails) and, unless `--no-compile`, its blocks are
compiled around the attention kernel as training compiles them (`train.compile`,
`embedlab.train.compiling`). Rows are packed from synthetic documents
(`embedlab.bench.synthetic`: random ids, lengths drawn from a log-normal fitted to the built-in
corpus, cut into pieces of at most L) so the command needs no prepared data on the GPU
machine. Masked batches are prepared and moved to the device before the clock starts (the
loader prefetches ahead of the step); timing brackets `steps` steps with `torch.cuda.synchronize()`.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable

import numpy as np
import torch

from embedlab.bench import cuda_checks
from embedlab.bench.synthetic import synthetic_batch
from embedlab.core.config import ModelConfig, TrainConfig, model_preset
from embedlab.core.errors import UsageError
from embedlab.model.encoder import MLMModel, parameter_counts, segment_layout, varlen_rule
from embedlab.model.flops import FlopTally, TRAINED
from embedlab.train.compiling import compile_blocks
from embedlab.train.mlm_step import accumulate_gradients, optimizer_step, prepare_microbatch
from embedlab.train.optim import build_optimizer


@dataclasses.dataclass(frozen=True)
class PeakEntry:
    """One part's dense bf16 tensor-core peak (fp32 accumulate, no 2:4 structured sparsity)."""

    part: str
    dense_tflops: float
    source: str  # the figure the vendor prints, and how the dense one follows from it


_HALF = "dense = half the sheet's figure"
_H100_SXM = PeakEntry("H100 SXM5", 989.4, "NVIDIA H100 Tensor Core GPU Architecture whitepaper: 989.4 dense, "
                                          "1,978.9 sparse (the data sheet prints 1,979 TFLOPS with sparsity)")
_A100 = "NVIDIA A100 data sheet: BF16 Tensor Core 312 TFLOPS | 624 with sparsity (every form factor and memory size)"

# The peak MFU divides by, keyed by the exact name torch.cuda.get_device_name reports (the names in
# NVIDIA's driver README, "Supported NVIDIA GPU products"). An exact match, never a substring: "NVIDIA
# H100 PCIe" (756.5) and "NVIDIA H100 NVL" (835.5) must not pass for the SXM part (989.4), and "NVIDIA
# A10" is not "NVIDIA A100 ...". Dense figures throughout: the Hopper and L4 sheets print only the
# sparse ("with sparsity") figure, so dense is half of it; the Ampere and L40/L40S sheets print both
# (dense | sparse). A name not listed (an ambiguous "NVIDIA H100", a MIG slice such as "NVIDIA
# A100-SXM4-40GB MIG 1g.5gb", H800, H20, A10G, A800, Blackwell, consumer cards) has no peak here:
# `embedlab bench mfu --peak-tflops` gives it.
PEAKS: dict[str, PeakEntry] = {
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": PeakEntry("H100 PCIe", 756.5, f"NVIDIA H100 data sheet: 1,513 TFLOPS with sparsity; {_HALF}"),
    "NVIDIA H100 NVL": PeakEntry("H100 NVL", 835.5, f"NVIDIA H100 data sheet: 1,671 TFLOPS with sparsity; {_HALF}"),
    # The H200 is the H100 SXM5's GH100 configuration and clocks with HBM3e: the same 1,979 TFLOPS sparse.
    "NVIDIA H200": PeakEntry("H200 SXM", 989.4, "NVIDIA H200 data sheet: 1,979 TFLOPS with sparsity; "
                                                "dense as the H100 SXM5 whitepaper's 989.4"),
    "NVIDIA H200 NVL": PeakEntry("H200 NVL", 835.5, f"NVIDIA H200 data sheet: 1,671 TFLOPS with sparsity; {_HALF}"),
    "NVIDIA A100-SXM4-40GB": PeakEntry("A100 SXM4 40GB", 312.0, _A100),
    "NVIDIA A100-SXM4-80GB": PeakEntry("A100 SXM4 80GB", 312.0, _A100),
    "NVIDIA A100-PCIE-40GB": PeakEntry("A100 PCIe 40GB", 312.0, _A100),
    "NVIDIA A100 80GB PCIe": PeakEntry("A100 PCIe 80GB", 312.0, _A100),
    "NVIDIA A10": PeakEntry("A10", 125.0, "NVIDIA A10 data sheet: BF16 Tensor Core 125 | 250 TFLOPS with sparsity"),
    "NVIDIA A30": PeakEntry("A30", 165.0, "NVIDIA A30 data sheet: BF16 Tensor Core 165 | 330 TFLOPS with sparsity"),
    "NVIDIA A40": PeakEntry("A40", 149.7, "NVIDIA A40 data sheet: BF16 Tensor Core 149.7 | 299.4 TFLOPS with sparsity"),
    "NVIDIA L4": PeakEntry("L4", 121.0, f"NVIDIA L4 data sheet: BF16 Tensor Core 242 TFLOPS with sparsity; {_HALF}"),
    "NVIDIA L40": PeakEntry("L40", 181.05, "NVIDIA L40 data sheet: BF16 Tensor Core 181.05 | 362.1 TFLOPS with sparsity"),
    "NVIDIA L40S": PeakEntry("L40S", 362.05, "NVIDIA L40S data sheet: BF16 Tensor Core 362.05 | 733 TFLOPS with sparsity"),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MfuBench:
    preset: str = "300m"
    sequence_length: int = 512
    batch_rows: int = 64
    steps: int = 20
    warmup_steps: int = 5
    precision: str = "bf16"
    compile: bool = True
    seed: int = 0
    compare_steps: int = 8  # timed steps of each eager run in `before_after` (0: skip it)
    profile_steps: int = 3  # steps re-run under torch.profiler after timing (`kernel_profile`; 0: skip)
    attention: str = "auto"  # the model's attention path; "dense" skips the flash kernel altogether


def bench_model(bench: MfuBench) -> ModelConfig:
    """The preset's config, long enough for the bench's rows, on the bench's attention path."""
    return model_preset(bench.preset, max_length=max(512, bench.sequence_length), attention=bench.attention)


def body_parameters(config: ModelConfig) -> int:
    """Encoder parameters without the embedding table (a lookup costs no matmul FLOPs): the
    MFU convention's model size, norms included, unlike the training counter's linears
    (`embedlab.model.flops`), which count what the kernels execute, recomputation included."""
    return parameter_counts(config)["encoder"] - config.vocab_size * config.width


def model_flops(config: ModelConfig, tokens: int, selected: int, segment_lengths: np.ndarray) -> float:
    """Training FLOPs the model needs for one pass over these tokens (module docstring)."""
    d = config.width
    attention = 12.0 * config.layers * d * float((segment_lengths.astype(np.float64) ** 2).sum())
    return 6.0 * body_parameters(config) * tokens + 6.0 * (d * d + d * config.vocab_size) * selected + attention


def segment_lengths(segment_ids: torch.Tensor) -> np.ndarray:
    """Lengths of every non-padding segment of (B, T) rows."""
    cu = segment_layout(segment_ids).cu_seqlens.numpy()
    return np.diff(cu)


def measure_mfu(bench: MfuBench, device: torch.device, peak_flops: float | None = None,
                config: ModelConfig | None = None, progress: Callable[[str], None] = print) -> dict:
    """Tokens/s, model TFLOP/s, MFU and peak memory of `steps` timed phase-1 steps."""
    config = config or bench_model(bench)
    torch.manual_seed(bench.seed)
    model = MLMModel(config).to(device).train()
    if bench.compile:
        compile_blocks(model.encoder)  # what training does with train.compile on
    train = TrainConfig()
    optimizer = build_optimizer(model, train, device)
    generator = torch.Generator().manual_seed(bench.seed)
    batches = []
    for step in range(bench.warmup_steps + bench.steps):
        # Timed batch i has the same seed whatever the warm-up length, so shorter runs time
        # the first batches of a longer one (`before_after`).
        seed = bench.seed + (step if step < bench.warmup_steps else 10_000 + step - bench.warmup_steps)
        segments, masked = synthetic_batch(bench.batch_rows, bench.sequence_length, config.vocab_size, seed, generator)
        flops = model_flops(config, int((segments > 0).sum()), int(masked.selected.sum()), segment_lengths(segments))
        executed = FlopTally()  # as the phase-1 loop counts its microbatches
        executed.encode(config, segments, mode=TRAINED, device=device, half=bench.precision == "bf16", training=True)
        executed.head(config, float(masked.selected.sum()))
        varlen = attention_path(config, device, bench.precision, bench.sequence_length).startswith("varlen")
        batches.append((prepare_microbatch(masked, segments, device=device, varlen=varlen), flops, executed.flops))

    def run(items) -> tuple[float, int, float, float]:
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        tokens, flops, executed = 0, 0.0, 0.0
        for microbatch, batch_flops, batch_executed in items:
            result = accumulate_gradients(model, [microbatch], precision=bench.precision)
            tokens += optimizer_step(model, optimizer, result, train.max_grad_norm).tokens
            flops += batch_flops
            executed += batch_executed
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, tokens, flops, executed

    warmup_seconds, *_ = run(batches[: bench.warmup_steps])
    progress(f"bench mfu: warm-up ({bench.warmup_steps} steps{', compiling' if bench.compile else ''}) "
             f"took {warmup_seconds:.1f}s")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds, tokens, flops, executed = run(batches[bench.warmup_steps :])
    achieved = flops / seconds
    result = {
        "bench": dataclasses.asdict(bench),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tokens_per_s": tokens / seconds,
        "model_tflops_per_s": achieved / 1e12,
        "peak_tflops_per_s": None if peak_flops is None else peak_flops / 1e12,
        "mfu": None if peak_flops is None else achieved / peak_flops,
        "executed_flops": executed,
        "executed_tflops_per_s": executed / seconds / 1e12,
        "executed_share": None if peak_flops is None else executed / seconds / peak_flops,
        "peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "warmup_seconds": warmup_seconds,
        "timed_seconds": seconds,
        "attention_path": attention_path(config, device, bench.precision, bench.sequence_length),
    }
    if bench.profile_steps > 0:
        try:  # diagnosis only: the figures above stand if the profiler fails
            result["profile"] = kernel_profile(
                lambda: run(batches[bench.warmup_steps :][: bench.profile_steps]), device)
        except Exception as error:  # noqa: BLE001
            result["profile_error"] = f"{type(error).__name__}: {error}"
    return result


# CPU operators by the profiler's names (prefixes): matrix products, and the fused attention kernels.
MATMUL_OPERATORS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION_OPERATORS = ("aten::_scaled_dot_product",)


def kernel_profile(work: Callable[[], object], device: torch.device, top: int = 15) -> dict:
    """Where the time of `work` went, from torch.profiler, untimed steps: on CUDA the kernels
    by self device time, their share of the device's busy time, and busy time against wall
    time (the rest is the GPU waiting on the host: launches, synchronisations); on CPU the
    operators by self CPU time. One GPU run then says what to optimise next."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as profiler:
        started = time.perf_counter()  # inside: profiler start-up and flush are not the work's
        work()  # synchronises the device before returning
        wall_us = (time.perf_counter() - started) * 1e6
    if cuda:
        rows = [(e.key, getattr(e, "self_device_time_total", 0.0), e.count) for e in profiler.key_averages()
                if e.device_type == DeviceType.CUDA]
    else:
        rows = [(e.key, e.self_cpu_time_total, e.count) for e in profiler.key_averages()]
    busy = sum(t for _, t, _ in rows)
    if not busy:
        raise RuntimeError("the profiler recorded no " + ("kernels" if cuda else "operators"))
    rows.sort(key=lambda row: -row[1])
    return {
        "wall_ms": wall_us / 1e3,
        "busy_ms": busy / 1e3,
        "busy_fraction": busy / wall_us,  # on CPU: operator time over wall (threads can overlap)
        # On CPU, the shares of the matrix products and of the fused attention kernel (its softmax
        # too); the rest is element-wise work, copies and the optimizer. Not classified for CUDA
        # kernels, whose names follow no one scheme.
        "matmul_share": None if cuda else sum(t for name, t, _ in rows if name.startswith(MATMUL_OPERATORS)) / busy,
        "attention_share": None if cuda else sum(t for name, t, _ in rows
                                                 if name.startswith(ATTENTION_OPERATORS)) / busy,
        "top": [{"name": name[:160], "self_ms": t / 1e3, "calls": calls, "share": t / busy}
                for name, t, calls in rows[:top]],
    }


def attention_path(config: ModelConfig, device: torch.device, precision: str, length: int) -> str:
    """Which attention kernel the timed steps ran (`embedlab.model.encoder.varlen_rule`)."""
    cuda = device.type == "cuda"
    varlen = varlen_rule(config.attention, cuda=cuda, half=precision == "bf16", length=length, training=True,
                         dropout=config.dropout)
    return ("varlen flash" if cuda else "varlen bucketed") if varlen else "dense SDPA mask"


def before_after(bench: MfuBench, device: torch.device, measured: dict, config: ModelConfig | None = None,
                 progress: Callable[[str], None] = print) -> list[dict]:
    """Two optimisations, each measured before and after on the first `compare_steps` of the
    same timed batches (3 warm-up steps first); tokens/s, higher is better.

    - bf16 autocast (fp32 master weights and reductions) against fp32, both eager and both
      on the dense attention mask: the flash kernel takes no fp32, so letting each run pick
      its own kernel would measure the attention path too.
    - the compiled blocks (the `measured` run) against the same run eager."""
    if bench.compare_steps < 1 or (bench.precision == "fp32" and not bench.compile):
        return []  # nothing to compare
    config = config or bench_model(bench)
    short = dataclasses.replace(bench, steps=bench.compare_steps, warmup_steps=3, compile=False, profile_steps=0)

    def rate(precision: str, run_config: ModelConfig) -> float:
        # The compiled model before this one is held by a reference cycle (its blocks' compiled
        # methods): free it before allocating another.
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return measure_mfu(dataclasses.replace(short, precision=precision), device, config=run_config,
                           progress=progress)["tokens_per_s"]

    rows = []
    if bench.precision != "fp32":
        dense = dataclasses.replace(config, attention="dense")
        rows.append({"name": f"opt: {bench.precision} autocast", "embedlab": rate(bench.precision, dense),
                     "reference": rate("fp32", dense), "unit": "tokens/s",
                     "embedlab_measures": f"{bench.precision} autocast, fp32 master weights and reductions, "
                                          "eager, dense attention mask",
                     "reference_measures": "fp32 (TF32 matmuls allowed), eager, dense attention mask"})
    if bench.compile:
        path = attention_path(config, device, bench.precision, bench.sequence_length)
        rows.append({"name": "opt: torch.compile blocks", "embedlab": measured["tokens_per_s"],
                     "reference": rate(bench.precision, config), "unit": "tokens/s",
                     "embedlab_measures": f"blocks compiled around the attention kernel, {bench.precision}, {path}",
                     "reference_measures": f"eager, {bench.precision}, {path}"})
    for row in rows:
        row["ratio"] = row["embedlab"] / row["reference"]
        progress(f"bench mfu: {row['name']}: {row['embedlab']:,.0f} vs {row['reference']:,.0f} tokens/s "
                 f"({row['ratio']:.2f}x)")
    return rows


def flash_preflight(bench: MfuBench, device: torch.device,
                    progress: Callable[[str], None] = print) -> tuple[ModelConfig, dict | None]:
    """The bench's model config, and the flash kernel's check (`embedlab.bench.cuda_checks`) when the
    timed steps would run it: a kernel that fails its check (or is missing from this torch)
    leaves the bench on the dense mask, recorded, rather than losing the whole run."""
    config = bench_model(bench)
    if attention_path(config, device, bench.precision, bench.sequence_length) != "varlen flash":
        return config, None
    (check,) = cuda_checks.run_checks(device, ("flash varlen",), progress=progress)
    if not check.ok:
        config = dataclasses.replace(config, attention="dense")
        progress("bench mfu: the flash kernel failed its check; timing the dense attention mask instead")
    return config, dataclasses.asdict(check)


def peak_entry(name: str) -> PeakEntry | None:
    """The `PEAKS` entry of the device torch names `name` (exactly, surrounding blanks aside), or None."""
    return PEAKS.get(name.strip())


def device_peak(name: str) -> float | None:
    """The dense bf16 peak of a known GPU in FLOP/s, by its exact name (None if unknown)."""
    entry = peak_entry(name)
    return None if entry is None else entry.dense_tflops * 1e12


def resolve_peak(name: str, peak_tflops: float | None = None) -> tuple[float, dict]:
    """The peak MFU divides by (FLOP/s) and its record for the JSON ("peak"): `--peak-tflops`
    when given, else the device's `PEAKS` entry; neither is a UsageError saying to pass it
    (`embedlab bench mfu` prints it as one line and exits 2)."""
    entry = peak_entry(name)
    record = {"device": name, "entry": None if entry is None else entry.part,
              "table_tflops": None if entry is None else entry.dense_tflops,
              "table_source": None if entry is None else entry.source}
    if peak_tflops:
        return peak_tflops * 1e12, {**record, "tflops": float(peak_tflops), "from": "--peak-tflops"}
    if entry is None:
        raise UsageError(f"no dense bf16 peak is known for {name!r} (embedlab.bench.mfu.PEAKS matches exact device "
                         f"names: {', '.join(sorted(PEAKS))}); MFU needs --peak-tflops N, the device's dense bf16 "
                         "tensor-core peak in TFLOP/s (not the sparsity figure)")
    return entry.dense_tflops * 1e12, {**record, "tflops": entry.dense_tflops, "from": "table"}


def bench_mfu(bench: MfuBench = MfuBench(), peak_tflops: float | None = None,
              progress: Callable[[str], None] = print) -> dict:
    """MFU on this machine's first CUDA device; refuses without one."""
    if not torch.cuda.is_available():
        raise UsageError("bench mfu needs CUDA (torch.cuda.is_available() is False here); "
                         "run workers/bench-gpu.sh on a GPU machine")
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    peak, peak_record = resolve_peak(name, peak_tflops)  # refuses an unknown device before any GPU time
    torch.backends.cuda.matmul.allow_tf32 = True  # only fp32 leftovers; bf16 matmuls are unaffected
    progress(f"bench mfu: {name}, preset {bench.preset}, L={bench.sequence_length}, {bench.batch_rows} rows/step, "
             f"{bench.precision}, peak {peak / 1e12:.1f} TFLOP/s "
             f"({peak_record['entry'] if peak_record['from'] == 'table' else '--peak-tflops'})")
    config, flash = flash_preflight(bench, device, progress)
    result = measure_mfu(bench, device, peak, config=config, progress=progress)
    result["peak"] = peak_record
    result["flash_check"] = flash
    try:  # the MFU figure stands even if a comparison run fails (out of memory, say)
        result["before_after"] = before_after(bench, device, result, config=config, progress=progress)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
        result["before_after"] = []
        result["before_after_error"] = f"{type(error).__name__}: {error}"
        progress(f"bench mfu: before/after comparison failed: {result['before_after_error']}")
    return result
