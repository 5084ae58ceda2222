"""`embedlab bench mfu-cpu`: phase-1 training FLOP/s as a share of this CPU's measured peak.

    embedlab bench mfu-cpu [--presets small 5m] [--threads 1] [--json]   (no Ray, no prepared data)

The peak is measured, not looked up: the best timing of an fp32 `peak_size` x `peak_size`
matmul (2 n^3 FLOPs each) on the same torch threads as the step, `peak_repeats` timed before
every preset and after the last.
The step is `bench mfu`'s (`embedlab.bench.mfu.measure_mfu`: the real phase-1 step, eager,
fp32, fused AdamW, on packed rows of synthetic documents of corpus-like lengths, masked before
the clock starts), and its FLOPs are what training's own counter counts for those batches
(`embedlab.model.flops.FlopTally`, the `budget/flops` of a run: every row position through the
linears, the attention area the kernel computes, the head at the selected positions; element-
wise work counts nothing). Model FLOPs (`bench mfu`'s MFU convention) are in the JSON beside.

Why a step is below the peak, measured for each preset rather than asserted:

- linear shapes: each of the step's linear products at its real shape, timed alone as
  `F.linear` forward and backward (the input's and the weight's gradients); their FLOP/s over
  the peak is the ceiling the model's matrix sizes allow (a width of 128 makes thin products).
- operator shares: the share of the step's operator time (torch.profiler) in matrix products
  and in the fused attention kernel (whose softmax and, in its backward, recomputed scores run
  at element-wise speed); the rest is norms, GELU, the loss, copies and AdamW, which the
  counter gives no FLOPs.
- busy fraction: operator time over wall time; the rest is Python and dispatch between
  operators (on the CPU there is no device to synchronise with).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from embedlab.bench.measure import Comparison
from embedlab.bench.mfu import MfuBench, bench_model, measure_mfu
from embedlab.core.config import MaskingConfig, ModelConfig, model_preset
from embedlab.core.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class CpuMfuBench:
    """Sizes of one `bench mfu-cpu` run: steps shaped like `bench train`'s (about 2k positions)."""

    presets: tuple[str, ...] = ("small", "5m")
    sequence_length: int = 128
    batch_rows: int = 16
    steps: int = 6
    warmup_steps: int = 2
    profile_steps: int = 2
    peak_size: int = 2048
    peak_repeats: int = 5
    threads: int = 1  # torch threads for the peak and the steps alike
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sequence_length", "batch_rows", "steps", "peak_size", "peak_repeats", "threads"):
            if getattr(self, name) < 1:
                raise UsageError(f"bench.{name}: must be >= 1, got {getattr(self, name)}")
        if not self.presets:
            raise UsageError("bench.presets: name at least one model preset")
        for preset in self.presets:
            model_preset(preset)  # unknown presets fail here, naming the valid ones


SHARES = {"executed_share": "executed_flops_per_s", "model_share": "model_flops_per_s",
          "linear_share": "linear_flops_per_s"}


def add_shares(row: dict, peak_flops_per_s: float) -> dict:
    """`row` with each measured FLOP/s (`SHARES`' values) as a share of the peak FLOP/s."""
    return {**row, **{share: row[rate] / peak_flops_per_s for share, rate in SHARES.items()}}


def matmul_peak(size: int = 2048, repeats: int = 5) -> dict:
    """Best-of-`repeats` FLOP/s of an fp32 (size, size) @ (size, size) matmul on this process's
    torch threads, after one untimed product (thread pool and allocator warm)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(a, b, out=out)
        runs.append(2.0 * size**3 / (time.perf_counter() - started))
    return {"size": size, "flops_per_s": max(runs), "runs": runs, "threads": torch.get_num_threads()}


@dataclass(frozen=True)
class LinearShape:
    """One linear product of the step: (rows, inputs) @ (inputs, outputs), `count` per step."""

    name: str
    rows: int
    inputs: int
    outputs: int
    count: int

    @property
    def trained_flops(self) -> float:
        """Forward and backward (input and weight gradients): three products of 2 r i o."""
        return 6.0 * self.rows * self.inputs * self.outputs * self.count


def linear_shapes(config: ModelConfig, positions: int, selected: int) -> list[LinearShape]:
    """The encoder's linears over every position and the head's over the selected ones."""
    d, f, layers = config.width, config.ffn_width, config.layers
    return [
        LinearShape("qkv", positions, d, 3 * d, layers),
        LinearShape("attention out", positions, d, d, layers),
        LinearShape("ffn up", positions, d, f, layers),
        LinearShape("ffn down", positions, f, d, layers),
        LinearShape("head dense", selected, d, d, 1),
        LinearShape("decoder", selected, d, config.vocab_size, 1),
    ]


def time_linear(shape: LinearShape, repeats: int = 3, target_flops: float = 1e9) -> float:
    """Best-of-`repeats` FLOP/s of one `shape` product trained (forward, both gradients); each
    timing runs enough products for about `target_flops`, so the timer's resolution is moot."""
    x = torch.randn(shape.rows, shape.inputs, requires_grad=True)
    weight = torch.randn(shape.outputs, shape.inputs, requires_grad=True)
    grad = torch.randn(shape.rows, shape.outputs)
    flops = 6.0 * shape.rows * shape.inputs * shape.outputs
    iterations = max(1, math.ceil(target_flops / flops))

    def products() -> None:
        for _ in range(iterations):
            torch.nn.functional.linear(x, weight).backward(grad)

    products()  # untimed: allocations and gradient buffers
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        products()
        best = min(best, time.perf_counter() - started)
    return iterations * flops / best


def linear_ceiling(config: ModelConfig, positions: int, selected: int, repeats: int = 3) -> dict:
    """The step's linear products timed alone: FLOP/s of each shape, and of all of them as the
    step runs them (total FLOPs over the total of each shape's best time)."""
    shapes = linear_shapes(config, positions, selected)
    rates = {shape.name: time_linear(shape, repeats) for shape in shapes}
    seconds = sum(shape.trained_flops / rates[shape.name] for shape in shapes)
    total = sum(shape.trained_flops for shape in shapes)
    return {"flops_per_s": total / seconds, "by_shape": rates,
            "shapes": [dataclasses.asdict(shape) for shape in shapes]}


def measure_preset(preset: str, bench: CpuMfuBench, progress: Callable[[str], None] = print) -> dict:
    """One preset's step (`measure_mfu` on the CPU) and its linears alone: FLOP/s, no shares yet."""
    step_bench = MfuBench(preset=preset, sequence_length=bench.sequence_length, batch_rows=bench.batch_rows,
                          steps=bench.steps, warmup_steps=bench.warmup_steps, precision="fp32", compile=False,
                          seed=bench.seed, compare_steps=0, profile_steps=bench.profile_steps)
    config = bench_model(step_bench)
    step = measure_mfu(step_bench, torch.device("cpu"), config=config, progress=progress)
    positions = bench.batch_rows * bench.sequence_length
    linears = linear_ceiling(config, positions, round(MaskingConfig().ratio * positions))
    profile = step.get("profile", {})
    return {
        "preset": preset,
        "executed_flops_per_s": step["executed_tflops_per_s"] * 1e12,
        "model_flops_per_s": step["model_tflops_per_s"] * 1e12,
        "tokens_per_s": step["tokens_per_s"],
        "attention_path": step["attention_path"],
        "linear_flops_per_s": linears["flops_per_s"],
        "linear_by_shape": linears["by_shape"],
        "matmul_share": profile.get("matmul_share"),
        "attention_share": profile.get("attention_share"),
        "busy_fraction": profile.get("busy_fraction"),
        "profile_top": profile.get("top", [])[:5],
    }


def bench_cpu_mfu(bench: CpuMfuBench = CpuMfuBench(), progress: Callable[[str], None] = print) -> dict:
    """{"peak": ..., "presets": [...]}: each preset's step and linears as shares of the peak.

    The peak is timed before every preset and after the last, and the best of all those
    products is taken: on a shared machine one burst of timings can land in a busy moment,
    and a peak measured low would inflate every share."""
    torch.set_num_threads(bench.threads)
    runs, rows = [], []
    for preset in (*bench.presets, None):
        runs += matmul_peak(bench.peak_size, bench.peak_repeats)["runs"]
        if preset is not None:
            rows.append(measure_preset(preset, bench, progress))
    peak = {"size": bench.peak_size, "flops_per_s": max(runs), "runs": runs, "threads": torch.get_num_threads()}
    progress(f"bench mfu-cpu: fp32 {bench.peak_size}^3 matmul peak {peak['flops_per_s'] / 1e9:.1f} GFLOP/s "
             f"on {peak['threads']} thread(s), best of {len(runs)} around the presets")
    rows = [add_shares(row, peak["flops_per_s"]) for row in rows]
    for row in rows:
        progress(f"bench mfu-cpu: {row['preset']}: step {row['executed_flops_per_s'] / 1e9:.1f} GFLOP/s "
                 f"({row['executed_share']:.1%} of peak), its linears alone {row['linear_flops_per_s'] / 1e9:.1f} "
                 f"GFLOP/s ({row['linear_share']:.1%})")
    return {"bench": dataclasses.asdict(bench), "peak": peak, "presets": rows}


def why_below_peak(row: dict) -> str:
    """One preset's measured reasons, in the order they cost: shapes, non-matmul work, overhead."""
    parts = [f"its linears alone reach {row['linear_share']:.0%} of peak at their shapes "
             f"(slowest: {min(row['linear_by_shape'], key=row['linear_by_shape'].get)})"]
    if row["matmul_share"] is not None:
        parts.append(f"of the step's operator time, matrix products take {row['matmul_share']:.0%}, the attention "
                     f"kernel {row['attention_share']:.0%}, the rest (element-wise work, copies, AdamW) "
                     f"{1 - row['matmul_share'] - row['attention_share']:.0%}")
        parts.append(f"operators fill {min(row['busy_fraction'], 1.0):.0%} of wall time (the rest: Python and "
                     "dispatch between operators; nothing to synchronise on the CPU)")
    return f"mfu-cpu {row['preset']}: step at {row['executed_share']:.1%} of peak; " + "; ".join(parts)


def cpu_mfu_comparisons(result: dict) -> list[Comparison]:
    """Two rows a preset, each a GFLOP/s against the measured peak (ratio = share of peak)."""
    peak, bench = result["peak"], result["bench"]
    peak_text = (f"fp32 {peak['size']}x{peak['size']} @ {peak['size']}x{peak['size']} matmul, best of "
                 f"{len(peak['runs'])}, {peak['threads']} thread(s)")
    rows = []
    for row in result["presets"]:
        rows.append(Comparison(
            name=f"mfu-cpu: {row['preset']} step GFLOP/s vs peak", embedlab=row["executed_flops_per_s"] / 1e9,
            reference=peak["flops_per_s"] / 1e9, unit="GFLOP/s", better="higher",
            embedlab_measures=f"phase-1 step, preset {row['preset']}, fp32 eager, {bench['batch_rows']} rows of "
                              f"L={bench['sequence_length']}, {row['attention_path']}, FLOPs by FlopTally "
                              f"(model-FLOPs MFU {row['model_share']:.1%})",
            reference_measures=peak_text))
        rows.append(Comparison(
            name=f"mfu-cpu: {row['preset']} linears GFLOP/s vs peak", embedlab=row["linear_flops_per_s"] / 1e9,
            reference=peak["flops_per_s"] / 1e9, unit="GFLOP/s", better="higher",
            embedlab_measures="the step's linear products alone at their shapes, forward and backward",
            reference_measures=peak_text))
    return rows


def cpu_mfu_notes(result: dict) -> list[str]:
    return [why_below_peak(row) for row in result["presets"]]
