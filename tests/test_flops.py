"""The FLOP counter against `torch.utils.flop_counter.FlopCounterMode` on the real model and
step, for every phase and arm kind a study compares; and the compute a step records."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import synthetic
from embedlab.model.flops import attention_area, segment_lengths
from embedlab.streams.packed import worker_rows
from embedlab.train.budget import final_rows, trim_rows
from embedlab.train.device_time import DeviceClock
from embedlab.train.session import LocalSession

aten = torch.ops.aten
# FlopCounterMode counts the CPU's fused attention kernel with torch's own SDPA formula (it
# registers that formula for the CUDA kernels only); the math path's bmm are counted as is.
CPU_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu:
        lambda query, key, value, *args, out_shape=None, **kwargs: flop_counter.sdpa_flop_count(query, key, value),
    aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda grad, query, key, value, *args, out_shape=None, **kwargs:
            flop_counter.sdpa_backward_flop_count(grad, query, key, value),
}
TOLERANCE = 0.01


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    return synthetic.tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def parent(tmp_path_factory, frozen):
    return synthetic.write_parent(tmp_path_factory.mktemp("parent"), frozen)


def reference_step_flops(trial, frozen, rows, tmp_path) -> tuple[float, float]:
    """(counter, FlopCounterMode) FLOPs of one real step of `trial` on `rows`."""
    loop = synthetic.make_loop(trial, frozen)
    session = LocalSession(rows, tmp_path)
    batches = session.global_batches(trial.train.batch_rows)
    group = [worker_rows(next(batches), 0, 1) for _ in range(loop.batches_per_step)]
    before = loop.progress.flops
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        loop.step(group)
    assert not loop.progress.skipped
    return loop.progress.flops - before, float(counter.get_total_flops())


def assert_close(counted: float, reference: float) -> None:
    assert reference > 0
    assert abs(counted / reference - 1) <= TOLERANCE, f"counter {counted:.6g} vs FlopCounterMode {reference:.6g}"


def with_model(trial, **model):
    return dataclasses.replace(trial, model=dataclasses.replace(trial.model, **model))


@pytest.mark.parametrize("dropout", [0.0, 0.1])  # fused kernel / math path of SDPA
def test_phase1_mlm_step_matches_flop_counter_mode(frozen, tmp_path, dropout):
    """Phase-1 MLM over two microbatches, the head only at selected positions."""
    trial = with_model(synthetic.phase1_trial(), dropout=dropout)
    counted, reference = reference_step_flops(trial, frozen, synthetic.mlm_rows(frozen, 16), tmp_path)
    assert_close(counted, reference)


def test_dual_heads_step_matches_flop_counter_mode(frozen, tmp_path):
    """Mixed 15%/50% masking with a head per ratio."""
    trial = synthetic.phase1_trial(dual_heads=True)
    counted, reference = reference_step_flops(trial, frozen, synthetic.mlm_rows(frozen, 16), tmp_path)
    assert_close(counted, reference)


def test_bucketed_attention_counts_real_segment_lengths(frozen, tmp_path):
    """The CPU variable-length kernel: attention at the packed segments' bucketed lengths."""
    trial = with_model(synthetic.phase1_trial(), attention="varlen", dropout=0.0)
    rows = synthetic.mlm_rows(frozen, 16)
    counted, reference = reference_step_flops(trial, frozen, rows, tmp_path)
    assert_close(counted, reference)
    dense, _ = reference_step_flops(with_model(trial, attention="dense"), frozen, rows, tmp_path)
    assert counted < dense  # two 14-token segments cost less than one 32-token mask


def test_joint_arm_step_matches_flop_counter_mode(frozen, parent, tmp_path):
    """Joint MLM + contrastive: corrupted copies' MLM pass, symmetric InfoNCE, learnable temperature."""
    trial = synthetic.contrastive_trial(parent)
    counted, reference = reference_step_flops(trial, frozen, synthetic.pair_rows(frozen, 16), tmp_path)
    assert_close(counted, reference)
    plain = dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, mlm_weight=0.0))
    contrastive_only, _ = reference_step_flops(plain, frozen, synthetic.pair_rows(frozen, 16), tmp_path)
    assert counted > 1.5 * contrastive_only  # the corrupted copies' pass is counted


def test_gradcache_step_matches_flop_counter_mode(frozen, parent, tmp_path):
    """GradCache: the no-grad encode, the loss pass and the chunked re-encode with backward."""
    trial = synthetic.contrastive_trial(parent, gradcache=True)
    counted, reference = reference_step_flops(trial, frozen, synthetic.pair_rows(frozen, 16), tmp_path)
    assert_close(counted, reference)


def test_hard_negative_step_matches_flop_counter_mode(frozen, parent, tmp_path):
    """Phase 3 with two mined negatives a pair (one missing, masked out), query -> candidates."""
    trial = synthetic.phase3_trial(parent)
    rows = synthetic.hard_negative_rows(frozen)
    counted, reference = reference_step_flops(trial, frozen, rows, tmp_path)
    assert_close(counted, reference)


def test_evaluation_encode_matches_flop_counter_mode(frozen):
    """Evaluation and mining encode without gradients, batch by batch at each batch's length."""
    from embedlab.model.encode import encode_texts
    from embedlab.model.encoder import Encoder
    from embedlab.model.flops import FlopTally

    encoder = Encoder(synthetic.MODEL).eval()
    tally = FlopTally()
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        encode_texts(encoder, frozen, synthetic.TEXTS[:40], batch_size=16, max_length=24, tally=tally)
    assert_close(tally.flops, float(counter.get_total_flops()))


def test_attention_area_follows_the_kernel():
    """Dense counts T^2 per row, flash the squared segment lengths, the CPU kernel its buckets."""
    segments = torch.tensor([[1] * 20 + [2] * 5 + [0] * 7, [1] * 3 + [0] * 29])
    assert segment_lengths(segments).tolist() == [20, 5, 3]
    assert attention_area(segments, "dense") == 2 * 32 * 32
    assert attention_area(segments, "flash") == 20**2 + 5**2 + 3**2
    # Buckets: 20 -> 32 (one member, width 20); 5 and 3 -> 16 (two members, width 5).
    assert attention_area(segments, "bucketed") == 1 * 20**2 + 2 * 5**2


def test_final_step_is_cut_to_the_budget():
    """The last step keeps the share of rows the budget has left, at least one."""
    assert final_rows(100.0, 10.0, 8) == 8
    assert final_rows(10.0, 10.0, 8) == 8
    assert final_rows(5.0, 10.0, 8) == 4
    assert final_rows(0.1, 10.0, 8) == 1
    assert final_rows(5.0, 0.0, 8) == 8  # the first step: nothing to scale by
    batch = {"a": torch.arange(8), "b": torch.zeros(8, 3)}
    assert trim_rows(batch, 3)["b"].shape == (3, 3)
    with pytest.raises(ValueError, match="row count"):
        trim_rows({"a": torch.arange(8), "b": torch.zeros(7)}, 3)


def test_flops_budget_lands_within_one_percent(frozen, tmp_path):
    """A FLOPs-budgeted phase-1 run stops within 1% of its budget, its last step cut to the
    rows the budget has left (a whole last step would overshoot by 1/30 of the budget)."""
    base = synthetic.phase1_trial(microbatches=1)
    rows = synthetic.mlm_rows(frozen, 160)
    step = reference_step_flops(base, frozen, rows, tmp_path / "step")[0]
    budget = 29.6 * step
    trial = dataclasses.replace(base, train=dataclasses.replace(
        base.train, budget=dataclasses.replace(base.train.budget, flops=budget)))
    last = run_to_budget(trial, frozen, rows, tmp_path / "run")
    assert abs(last["budget/flops"] / budget - 1) <= TOLERANCE
    assert last["train/step"] == 30  # 29 whole steps and a cut one


def test_joint_arm_at_equal_flops_consumes_fewer_pairs(frozen, parent, tmp_path):
    """At one FLOPs budget the joint arm reads fewer pairs than contrastive-only, and both
    consume the budget within 1%."""
    joint = synthetic.contrastive_trial(parent, batch_rows=8)  # a row is 1/8 of a step: cut finely
    plain = dataclasses.replace(joint, contrastive=dataclasses.replace(joint.contrastive, mlm_weight=0.0))
    rows = synthetic.pair_rows(frozen, 400)
    budget = 24.3 * reference_step_flops(plain, frozen, rows, tmp_path / "step")[0]
    spent = {}
    for name, trial in (("plain", plain), ("joint", joint)):
        trial = dataclasses.replace(trial, train=dataclasses.replace(
            trial.train, budget=dataclasses.replace(trial.train.budget, flops=budget)))
        spent[name] = run_to_budget(trial, frozen, rows, tmp_path / name)
        assert abs(spent[name]["budget/flops"] / budget - 1) <= TOLERANCE
    assert spent["joint"]["budget/pairs"] < spent["plain"]["budget/pairs"]


def run_to_budget(trial, frozen, rows, root) -> dict:
    """The last report of a run of `trial` on `rows`, in this process."""
    from embedlab.train.loop import run

    session = LocalSession(rows, root)
    run(synthetic.make_loop(trial, frozen), session)
    return session.reports[-1]


def test_device_seconds_are_the_thread_cpu_time_on_cpu(frozen, tmp_path):
    """On CPU `compute/device_seconds` is the training thread's CPU time over the steps: a
    sleep inside a step adds wall time but no device time."""
    clock = DeviceClock(torch.device("cpu"))
    assert clock.name == "thread-cpu"
    wall = time.perf_counter()
    clock.start()
    started = time.thread_time()
    sum(i * i for i in range(200_000))
    time.sleep(0.3)
    spent = time.thread_time() - started
    clock.stop()
    wall = time.perf_counter() - wall
    seconds = clock.take()
    assert seconds == pytest.approx(spent, abs=2e-3)
    assert seconds < wall - 0.25  # the sleep is not device time
    assert clock.take() == 0.0  # taken once

    trial = synthetic.phase1_trial()
    reports, loop = synthetic.train(trial, frozen, tmp_path / "run")
    last = reports[-1]
    assert last["compute/device_clock"] == "thread-cpu"
    assert 0 < last["compute/device_seconds"] <= time.thread_time()
    assert last["compute/device_seconds"] < last["compute/wall_seconds"] * trial.train.num_workers + 1e-9
    assert last["compute/device_seconds"] == loop.progress.device_seconds



def test_expected_step_flops_predicts_a_dense_contrastive_step(frozen, parent, tmp_path):
    """A phase-2 or phase-3 arm's step on the dense path is predicted exactly from its config:
    how a study turns its control's pairs into a FLOPs budget."""
    from embedlab.model.flops import expected_step_flops

    plain = synthetic.contrastive_trial(parent)
    plain = dataclasses.replace(plain, contrastive=dataclasses.replace(plain.contrastive, mlm_weight=0.0))
    counted, _ = reference_step_flops(plain, frozen, synthetic.pair_rows(frozen, 16), tmp_path / "pairs")
    assert counted == pytest.approx(expected_step_flops(plain), rel=1e-12)


def test_token_budget_lands_on_the_token(frozen, tmp_path):
    """A token-budgeted run's last step keeps exactly the tokens the budget has left."""
    tokens = round(7.4 * synthetic.ROWS * synthetic.CONTENT)
    trial = synthetic.phase1_trial(microbatches=1, budget=dataclasses.replace(synthetic.DEFAULT_BUDGET, tokens=tokens))
    last = run_to_budget(trial, frozen, synthetic.mlm_rows(frozen, 40), tmp_path / "run")
    assert last["budget/tokens"] == trial.train.budget.tokens
    assert last["train/step"] == 8
