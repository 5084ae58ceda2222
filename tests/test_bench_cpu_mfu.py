"""`bench mfu-cpu`: training FLOP/s from the FLOP counter over a measured matmul peak (no timed assertions)."""

from __future__ import annotations

import json

import pytest
import torch

from embedlab.bench.cpu_mfu import (
    CpuMfuBench,
    add_shares,
    cpu_mfu_comparisons,
    linear_shapes,
    matmul_peak,
    why_below_peak,
)
from embedlab.bench.measure import comparisons_json
from embedlab.cli import build_parser, main
from embedlab.cli.bench import cmd_bench_mfu_cpu
from embedlab.core.config import ConfigError, model_preset
from embedlab.core.errors import UsageError
from embedlab.model.flops import TRAINED, encoder_flops, head_forward_flops, linear_parameters

pytestmark = pytest.mark.timeout(300)

def test_shares_of_peak_and_their_rows_from_given_numbers():
    """share = measured FLOP/s / peak FLOP/s; each row is GFLOP/s against the peak, its ratio the share."""
    measured = {"preset": "small", "executed_flops_per_s": 1.5e9, "model_flops_per_s": 1.2e9,
                "attention_path": "dense SDPA mask", "linear_flops_per_s": 4.5e9,
                "linear_by_shape": {"qkv": 5e9, "head dense": 1e9}, "matmul_share": 0.4, "attention_share": 0.1,
                "busy_fraction": 0.9}
    row = add_shares(measured, 6e9)
    assert (row["executed_share"], row["model_share"], row["linear_share"]) == (0.25, 0.2, 0.75)
    result = {"peak": {"size": 2048, "flops_per_s": 6e9, "runs": [5e9, 6e9], "threads": 1},
              "bench": {"batch_rows": 16, "sequence_length": 128}, "presets": [row]}
    step, linears = cpu_mfu_comparisons(result)
    assert (step.embedlab, step.reference, step.ratio, step.unit) == (1.5, 6.0, 0.25, "GFLOP/s")
    assert linears.ratio == 0.75
    note = why_below_peak(row)
    assert "25.0% of peak" in note and "75% of peak" in note and "slowest: head dense" in note
    assert "matrix products take 40%, the attention kernel 10%, the rest (element-wise work, copies, AdamW) 50%" in note


def test_matmul_peak_is_a_positive_rate_from_a_real_product():
    """The peak is the best of the timed products, on this process's threads."""
    peak = matmul_peak(size=128, repeats=2)
    assert peak["flops_per_s"] == max(peak["runs"]) > 0 and len(peak["runs"]) == 2
    assert peak["threads"] == torch.get_num_threads()


def test_step_flops_are_the_training_counters_over_the_timed_batch():
    """The step's executed FLOPs are FlopTally's for the timed batch (dense path on the CPU: every
    row position through the linears, B x L^2 attention recomputed in the fused backward, the head
    at the selected positions), and the share is those FLOPs over the timed seconds over the peak."""
    from embedlab.bench.mfu import MfuBench, measure_mfu
    from embedlab.bench.synthetic import synthetic_batch

    config = model_preset("tiny", vocab_size=512)
    bench = MfuBench(preset="tiny", sequence_length=32, batch_rows=2, steps=1, warmup_steps=1, precision="fp32",
                     compile=False, compare_steps=0, profile_steps=0)
    result = measure_mfu(bench, torch.device("cpu"), peak_flops=1e12, config=config, progress=lambda m: None)
    generator = torch.Generator().manual_seed(0)
    synthetic_batch(2, 32, 512, 0, generator)  # the warm-up batch draws from the masking generator first
    _, masked = synthetic_batch(2, 32, 512, 10_000, generator)
    expected = (encoder_flops(config, 2, 32, 2 * 32 * 32, mode=TRAINED, recomputes=True)
                + 3 * head_forward_flops(config, float(masked.selected.sum())))
    assert result["executed_flops"] == pytest.approx(expected)
    assert result["executed_share"] == pytest.approx(expected / result["timed_seconds"] / 1e12)


def test_linear_shapes_are_the_counters_linears():
    """The shapes timed alone carry the counter's linear FLOPs: 3 x 2 x positions x linear
    parameters for the encoder, 3 x the head's forward at the selected positions."""
    config = model_preset("small")
    shapes = linear_shapes(config, positions=2048, selected=300)
    encoder = sum(s.trained_flops for s in shapes if not s.name.startswith(("head", "decoder")))
    head = sum(s.trained_flops for s in shapes if s.name.startswith(("head", "decoder")))
    assert encoder == 3 * 2 * 2048 * linear_parameters(config)
    assert head == 3 * head_forward_flops(config, 300)


def test_bench_cpu_mfu_cli_reports_a_step_and_a_linears_row_per_preset(capsys):
    """`bench mfu-cpu --json` measures the peak and each preset's step, linears and operator shares;
    its comparisons are GFLOP/s rows against the peak."""
    argv = ["bench", "mfu-cpu", "--presets", "tiny", "--sequence-length", "32", "--batch-rows", "2", "--steps", "1",
            "--peak-size", "128", "--peak-repeats", "1", "--json"]
    assert build_parser().parse_args(argv).func is cmd_bench_mfu_cpu
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    (row,) = result["presets"]
    assert result["peak"]["flops_per_s"] > 0 and row["preset"] == "tiny"
    assert row["executed_share"] == pytest.approx(row["executed_flops_per_s"] / result["peak"]["flops_per_s"])
    assert 0 < row["matmul_share"] + row["attention_share"] <= 1 and row["busy_fraction"] > 0
    rows = comparisons_json(cpu_mfu_comparisons(result))
    assert set(rows) == {"mfu-cpu: tiny step GFLOP/s vs peak", "mfu-cpu: tiny linears GFLOP/s vs peak"}
    assert all(r["embedlab"] > 0 and r["unit"] == "GFLOP/s" for r in rows.values())


def test_cpu_mfu_bench_refuses_bad_sizes_and_presets():
    """Sizes below 1 and unknown presets fail at construction, naming the field or the valid presets."""
    with pytest.raises(UsageError, match="bench.peak_size"):
        CpuMfuBench(peak_size=0)
    with pytest.raises(ConfigError, match="unknown preset 'huge'; valid"):
        CpuMfuBench(presets=("huge",))
