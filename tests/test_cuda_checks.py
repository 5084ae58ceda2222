"""`embedlab model check-cuda`: the GPU paths' checks, run here on the CPU with the CPU
kernel, compiler and gloo; and each check fails when what it checks is wrong."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from embedlab.bench import cuda_checks
from embedlab.bench import mfu as bench_mfu
from embedlab.cli import main
from embedlab.bench.cuda_checks import CHECKS, check_varlen_kernel, run_checks

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow  # torch.compile's first compile of a step
def test_every_check_passes_on_the_cpu_paths(capsys):
    """The command runs all six checks and exits 0 when all pass; JSON lists each with its
    measured errors under its tolerance."""
    assert main(["model", "check-cuda", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in report["checks"]] == ["varlen kernel", "encoder paths", "device vs cpu",
                                                     "collectives", "host reads", "compiled step"]
    for check in report["checks"]:
        assert check["ok"] and check["error"] is None and check["measured"]
        assert all(0.0 <= value <= check["tolerance"] for value in check["measured"].values())


def _attention_across_segments(q, k, v, cu_seqlens, max_length):
    """A wrong kernel: attends over the whole batch, ignoring segment boundaries."""
    return F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v))).transpose(0, 1)


def _attention_without_scale(q, k, v, cu_seqlens, max_length):
    """A subtly wrong kernel: right segments, softmax(QK^T) without 1/sqrt(Dh)."""
    from embedlab.model.encoder import reference_varlen_attention

    return reference_varlen_attention(q * q.shape[-1] ** 0.5, k, v, cu_seqlens, max_length)


@pytest.mark.parametrize("kernel", [_attention_across_segments, _attention_without_scale])
def test_the_kernel_check_fails_a_wrong_kernel(kernel):
    check = check_varlen_kernel(torch.device("cpu"), kernel=kernel)
    assert not check.ok and max(check.measured.values()) > 10 * check.tolerance


def test_the_host_read_check_fails_a_step_that_reads_the_device(monkeypatch):
    """Microbatches sent without their attention layout make the encoder compute it on the
    device, a read back: the check fails and names where."""
    prepare = cuda_checks.prepare_microbatch
    monkeypatch.setattr(cuda_checks, "prepare_microbatch", lambda *a, **k: prepare(*a, **{**k, "varlen": False}))
    check = cuda_checks.check_host_reads(torch.device("cpu"))
    assert not check.ok and "model/encoder.py" in check.error and "nonzero" in check.error


def test_a_check_that_raises_is_a_failed_check(monkeypatch, capsys):
    """A missing kernel (an old torch, say) fails its check with the error; the others still run."""
    def missing(device):
        raise ImportError("cannot import name 'varlen_attn'")

    monkeypatch.setitem(CHECKS, "flash varlen", missing)
    checks = run_checks(torch.device("cpu"), ("flash varlen", "device vs cpu"), progress=lambda m: None)
    assert [c.ok for c in checks] == [False, True]
    assert "ImportError: cannot import name 'varlen_attn'" in checks[0].error


def test_bench_mfu_times_the_dense_mask_when_the_flash_check_fails(monkeypatch):
    """`bench mfu` checks the flash kernel before timing it; a failure leaves the bench on the
    dense mask (recorded), a pass keeps the preset's attention, and without flash no check runs."""
    bench = bench_mfu.MfuBench(preset="tiny", sequence_length=64)
    cpu = torch.device("cpu")
    assert bench_mfu.flash_preflight(bench, cpu, progress=lambda m: None) == (bench_mfu.bench_model(bench), None)
    monkeypatch.setattr(bench_mfu, "attention_path", lambda *args: "varlen flash")
    for ok in (False, True):
        failed = cuda_checks.Check("flash varlen", ok, "flash vs oracle", 0.02, {"output": 0.5 if not ok else 0.001})
        monkeypatch.setattr(cuda_checks, "run_checks", lambda device, names, progress: [failed])
        config, record = bench_mfu.flash_preflight(bench, cpu, progress=lambda m: None)
        assert config.attention == ("auto" if ok else "dense") and record == dataclasses.asdict(failed)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_check_cuda_refuses_without_cuda(capsys):
    assert main(["model", "check-cuda"]) == 2
    assert "needs CUDA" in capsys.readouterr().err
