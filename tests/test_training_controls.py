"""Training controls (issue 9): weight-decay groups, schedules on the budget clock, the length
schedule, contrastive accumulation, the bf16 policy's fp32 reductions, and separate RNG streams."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from embedlab.core.config import (
    DEFAULT_BUDGET, ConfigError, GroupSettings, OptimizerConfig, ScheduleConfig, TrainConfig, TrialConfig, model_preset,
)
from embedlab.model.encoder import MLMModel
from embedlab.model.heads import MultiHeadMLMModel
from embedlab.objectives.contrastive import LearnableTemperature, multi_positive_infonce, pair_masks
from embedlab.train.length import split_rows, stage_length
from embedlab.train.optim import build_optimizer, lr_multiplier, optimizer_record

import synthetic
from synthetic import MODEL, bitwise_equal, deterministic, make_loop, train, trained_tensors


def _expected_categories(model: torch.nn.Module) -> dict[str, set[str]]:
    """The categories by parameter name, worked out from the architecture by hand."""
    out: dict[str, set[str]] = {"embedding": set(), "norm": set(), "bias": set(), "temperature": set(), "weight": set()}
    for name, _ in model.named_parameters():
        if name.endswith("embed.weight"):
            out["embedding"].add(name)
        elif "norm." in name:
            out["norm"].add(name)
        elif name.endswith("log_temperature"):
            out["temperature"].add(name)
        elif name.endswith("bias"):
            out["bias"].add(name)
        else:
            out["weight"].add(name)
    return out


@pytest.mark.parametrize("no_decay", [("bias", "norm", "temperature"), ("bias", "norm", "embedding", "temperature"), ()])
@pytest.mark.parametrize("kind", ["mlm", "dual-heads", "contrastive"])
def test_decay_exclusions_are_exactly_the_configured_set(kind, no_decay):
    """Every parameter is in one group; the undecayed ones are exactly the configured categories,
    the tied decoder counts once (as the embedding), and the manifest record lists the same names."""
    if kind == "mlm":
        model = MLMModel(MODEL)
    elif kind == "dual-heads":
        model = MultiHeadMLMModel(MODEL, ("r05", "r50"))
    else:
        model = torch.nn.ModuleList([MLMModel(MODEL).encoder, LearnableTemperature(0.05)])
    train = TrainConfig(weight_decay=0.1, optimizer=OptimizerConfig(no_decay=no_decay))
    optimizer = build_optimizer(model, train)
    expected = _expected_categories(model)
    undecayed = {name for group in optimizer.param_groups if group["weight_decay"] == 0.0 for name in group["names"]}
    assert undecayed == set().union(*(expected[c] for c in no_decay))
    names = [name for group in optimizer.param_groups for name in group["names"]]
    assert sorted(names) == sorted(name for name, _ in model.named_parameters())  # each once
    assert {g["category"]: set(g["names"]) for g in optimizer.param_groups} == {c: v for c, v in expected.items() if v}
    record = optimizer_record(optimizer)
    assert {g["category"]: set(g["names"]) for g in record["groups"]} == {c: v for c, v in expected.items() if v}
    assert record["fused"] is True  # fused AdamW exists for CPU tensors in this torch


def test_group_overrides_set_learning_rate_betas_and_eps():
    """A category's lr scale, betas and epsilon reach its group; the others keep the defaults."""
    train = TrainConfig(learning_rate=1e-3, optimizer=OptimizerConfig(
        groups=(GroupSettings(category="embedding", lr_scale=0.5, betas=(0.8, 0.9), eps=1e-8),)))
    optimizer = build_optimizer(MLMModel(MODEL), train)
    groups = {g["category"]: g for g in optimizer.param_groups}
    assert (groups["embedding"]["lr"], groups["embedding"]["betas"], groups["embedding"]["eps"]) == (5e-4, (0.8, 0.9), 1e-8)
    assert (groups["weight"]["lr"], groups["weight"]["betas"], groups["weight"]["eps"]) == (1e-3, (0.9, 0.98), 1e-6)
    with pytest.raises(ConfigError, match="train.optimizer.no_decay"):
        OptimizerConfig(no_decay=("layernorm",))
    with pytest.raises(ConfigError, match="train.optimizer.groups"):
        OptimizerConfig(groups=(GroupSettings(category="bias"), GroupSettings(category="bias")))


# Budget 1000 units, warmup 10%, floor 10% of the peak, WSD decay over the last 20%.
SCHEDULE_TABLE = [
    # consumed, linear, cosine, wsd, constant
    (0, 0.01, 0.01, 0.01, 0.01),
    (49, 0.5, 0.5, 0.5, 0.5),
    (100, 1.0, 1.0, 1.0, 1.0),
    (325, 0.775, 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2, 1.0, 1.0),
    (550, 0.55, 0.55, 1.0, 1.0),
    (799, 0.1 + 0.9 * 201 / 900, 0.1 + 0.9 * (1 + math.cos(math.pi * 699 / 900)) / 2, 1.0, 1.0),
    (900, 0.2, 0.1 + 0.9 * (1 + math.cos(math.pi * 8 / 9)) / 2, 0.55, 1.0),
    (1000, 0.1, 0.1, 0.1, 1.0),
    (1200, 0.1, 0.1, 0.1, 1.0),  # the last step may overshoot the budget
]


@pytest.mark.parametrize("column,kind", [(1, "linear"), (2, "cosine"), (3, "wsd"), (4, "constant")])
def test_schedule_values_match_the_hand_computed_table(column, kind):
    """Each schedule's multiplier at given consumed budgets equals the table worked out by hand."""
    schedule = ScheduleConfig(kind=kind, warmup_fraction=0.1, decay_fraction=0.2, min_lr_fraction=0.1)
    for row in SCHEDULE_TABLE:
        assert lr_multiplier(row[0], 1000, schedule) == pytest.approx(row[column], abs=1e-12), row


@pytest.mark.parametrize("kind", ["cosine", "wsd"])
def test_resumed_schedule_continues_from_the_consumed_budget(kind, frozen, tmp_path):
    """Interrupted after 3 steps and resumed, every step's learning rate is the peak times the
    schedule at the tokens consumed before it, as in an uninterrupted run."""
    schedule = ScheduleConfig(kind=kind, warmup_fraction=0.25, decay_fraction=0.5, min_lr_fraction=0.1)
    trial = synthetic.phase1_trial(1, schedule=schedule)
    full, _ = train(trial, frozen, tmp_path / "full")
    first, _ = train(trial, frozen, tmp_path / "split", stop_after_step=3)
    second, _ = train(trial, frozen, tmp_path / "split")
    assert deterministic(first + second) == deterministic(full)
    budget = trial.train.budget.tokens
    for report in first + second:
        consumed = report["budget/tokens"] - budget // synthetic.STEPS  # before this step
        assert report["train/lr"] == pytest.approx(3e-3 * lr_multiplier(consumed, budget, schedule), rel=1e-12)
    assert len({r["train/lr"] for r in full}) > 4


def test_length_schedule_switches_at_the_declared_budget(frozen, tmp_path):
    """Half the budget at 16 tokens then half at 32: the switch is at the first step that starts
    at >= 50% of the budget, recorded with its step and tokens, and a run resumed before the
    switch ends bitwise as the uninterrupted one."""
    trial = synthetic.phase1_trial(1, length_schedule=((0.5, 16), (0.5, 32)))
    full, loop = train(trial, frozen, tmp_path / "full")
    step_tokens = trial.train.budget.tokens // synthetic.STEPS
    assert [r["train/sequence_length"] for r in full] == [16] * 4 + [32] * 4
    assert loop.progress.length_switches == [{"step": 4, "tokens": 4 * step_tokens, "length": 32}]
    first, _ = train(trial, frozen, tmp_path / "split", stop_after_step=3)
    second, resumed = train(trial, frozen, tmp_path / "split")
    assert deterministic(first + second) == deterministic(full)
    assert bitwise_equal(trained_tensors(resumed), trained_tensors(loop))
    assert [stage_length(t, 1000, ((0.9, 128), (0.1, 512)), 512) for t in (0, 899, 900, 1500)] == [128, 128, 512, 512]
    with pytest.raises(ConfigError, match="train.length_schedule"):
        dataclasses.replace(trial, train=dataclasses.replace(trial.train, length_schedule=((0.5, 12), (0.5, 32))))


def test_split_rows_cuts_rows_in_order():
    """A (2, 8) batch at length 4 becomes (4, 4) rows whose concatenation is the original."""
    batch = {"input_ids": torch.arange(16).reshape(2, 8), "segment_ids": torch.ones(2, 8, dtype=torch.long)}
    cut = split_rows(batch, 4)
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert split_rows(batch, 8) is batch


def test_contrastive_accumulation_equals_the_pooled_loss(frozen, parent, tmp_path):
    """Two microbatches per step: the update equals one AdamW step on (sum of each microbatch's
    InfoNCE sum) / (all anchors), computed by hand; and the run resumes bitwise."""
    from embedlab.core.config import ContrastiveConfig
    from embedlab.train.contrastive_step import embed
    from embedlab.train.optim import set_learning_rate

    trial = TrialConfig(model=MODEL, data=synthetic.DATA, phase=2, parent=str(parent),
                        contrastive=ContrastiveConfig(pairs=(("a", 0.5), ("b", 0.5)), pair_length=16),
                        train=TrainConfig(budget=dataclasses.replace(DEFAULT_BUDGET, pairs=64), batch_rows=4, microbatches=2,
                                          report_every_steps=1, checkpoint_every_steps=3, learning_rate=3e-3))
    rows = synthetic.pair_rows(frozen, 8, seed=3)
    parts = [{k: torch.as_tensor(v[i * 4:(i + 1) * 4]) for k, v in rows.items()} for i in range(2)]
    loop = make_loop(trial, frozen)
    reference = make_loop(trial, frozen)  # same parent weights
    for each in (loop, reference):
        each.model.eval()  # the parent's config has dropout; the oracle compares without it
    loop.step(parts)

    total = torch.zeros(())
    for part in parts:
        queries = embed(reference.encoder, part["query_ids"], frozen.pad_id, "mean")
        candidates = embed(reference.encoder, part["positive_ids"], frozen.pad_id, "mean")
        masks = pair_masks(part["group"], part["group"])
        total = total + multi_positive_infonce(queries, candidates, masks.positive, masks.eligible,
                                               temperature=0.05).loss_sum
    (total / 8).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters.parameters(), trial.train.max_grad_norm)
    set_learning_rate(reference.optimizer, 0, 64, trial.train)
    reference.optimizer.step()
    assert loop.window == [pytest.approx(float(total.detach()) / 8, rel=1e-6)]
    for got, want in zip(loop.parameters.parameters(), reference.parameters.parameters()):
        torch.testing.assert_close(got, want, atol=1e-7, rtol=1e-6)
    loop.start_clock()
    assert loop.progress.pairs == 8 and loop.metrics()["train/effective_batch_pairs"] == 8

    full, done = train(trial, frozen, tmp_path / "full")
    first, _ = train(trial, frozen, tmp_path / "split", stop_after_step=3)
    second, resumed = train(trial, frozen, tmp_path / "split")
    assert deterministic(first + second) == deterministic(full)
    assert bitwise_equal(trained_tensors(resumed), trained_tensors(done))


def test_bf16_policy_keeps_fp32_master_weights_state_and_reductions(frozen):
    """On CPU with bf16 autocast: the head's logits are bf16, yet the step's loss sum is the fp32
    cross-entropy of those logits (a bf16 sum differs), and weights, gradients and AdamW
    moments stay fp32."""
    trial = synthetic.phase1_trial(1, precision="bf16")
    loop = make_loop(trial, frozen)
    logits = []
    loop.model.mlm_head.register_forward_hook(lambda module, args, out: logits.append(out.detach()))
    rows = synthetic.mlm_rows(frozen, 8)
    batches = [{k: torch.as_tensor(v[i * 4:(i + 1) * 4]) for k, v in rows.items()} for i in range(2)]
    pending = [loop._microbatch(b, position) for position, b in enumerate(batches)]
    from embedlab.train.mlm_step import accumulate_gradients

    result = accumulate_gradients(loop.model, pending, precision="bf16").result()
    assert [t.dtype for t in logits] == [torch.bfloat16, torch.bfloat16]
    targets = [mb.heads["mlm"].targets for mb in pending]
    fp32_sum = sum(float(F.cross_entropy(t.float(), y, reduction="sum")) for t, y in zip(logits, targets))
    bf16_sum = sum(float(F.cross_entropy(t, y, reduction="sum")) for t, y in zip(logits, targets))
    assert result.loss_sum == pytest.approx(fp32_sum, rel=1e-6)
    assert abs(bf16_sum - fp32_sum) > 1e-6 * abs(fp32_sum)  # the check can tell the two apart
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in loop.model.parameters())
    loop.optimizer.step()
    assert all(v.dtype == torch.float32 for s in loop.optimizer.state.values() for k, v in s.items() if k != "step")
    embeddings = torch.nn.functional.normalize(torch.randn(6, 8), dim=1).bfloat16()
    masks = pair_masks(torch.arange(6) // 2, torch.arange(6) // 2)
    assert multi_positive_infonce(embeddings, embeddings, masks.positive, masks.eligible,
                                  temperature=0.05).loss_sum.dtype == torch.float32


def test_precision_auto_resolves_by_device_and_is_recorded(frozen, tmp_path):
    """'auto' is fp32 on CPU and bf16 with GPUs; the manifest records the resolved policy."""
    from embedlab.checkpoints.io import read_manifest
    from embedlab.train.precision import resolve_precision

    assert resolve_precision(TrainConfig()) == "fp32"
    assert resolve_precision(TrainConfig(use_gpu=True)) == "bf16"
    assert resolve_precision(TrainConfig(use_gpu=True, precision="fp32")) == "fp32"
    train(synthetic.phase1_trial(1), frozen, tmp_path)
    checkpoints = sorted(Path(tmp_path).rglob("manifest.json"))
    manifest = read_manifest(checkpoints[-1].parent)
    assert manifest["precision"]["policy"] == "fp32"
    assert {g["category"] for g in manifest["optimizer"]["groups"]} == {"embedding", "norm", "bias", "weight"}
    assert manifest["optimizer"]["schedule"]["kind"] == "linear"
    assert set(manifest["rng_streams"]) == {"init", "dropout", "masking", "sampling", "library"}


def test_compile_resolves_by_device_and_a_compiled_run_trains_as_eager(frozen, tmp_path):
    """train.compile: 'auto' is off on CPU and on with GPUs, and bad values are refused. A
    phase-1 run with compiled blocks reports the eager run's losses (to float rounding:
    inductor fuses the kernels), keeps parameter names, and records the choice."""
    from embedlab.checkpoints.io import read_manifest
    from embedlab.train.compiling import resolve_compile

    assert not resolve_compile(TrainConfig()) and resolve_compile(TrainConfig(use_gpu=True))
    assert resolve_compile(TrainConfig(compile="on")) and not resolve_compile(TrainConfig(use_gpu=True, compile="off"))
    with pytest.raises(ConfigError, match="train.compile"):
        TrainConfig(compile="yes")
    trial = synthetic.phase1_trial(1)
    trial = dataclasses.replace(trial, model=dataclasses.replace(trial.model, dropout=0.0))  # same draws both ways
    eager, eager_loop = train(trial, frozen, tmp_path / "eager")
    on = dataclasses.replace(trial, train=dataclasses.replace(trial.train, compile="on"))
    compiled, compiled_loop = train(on, frozen, tmp_path / "compiled")
    assert [r["train/loss"] for r in compiled] == pytest.approx([r["train/loss"] for r in eager], rel=1e-4)
    assert list(compiled_loop.model.state_dict()) == list(eager_loop.model.state_dict())
    compiled_steps = ("attention_inputs", "residual_outputs")
    assert all(step in b.__dict__ for b in compiled_loop.model.encoder.blocks for step in compiled_steps)
    assert not any(step in b.__dict__ for b in eager_loop.model.encoder.blocks for step in compiled_steps)
    records = [read_manifest(sorted(root.rglob("manifest.json"))[-1].parent)["compile"]
               for root in (tmp_path / "eager", tmp_path / "compiled")]
    assert records[0] == {"setting": "auto", "compiled": False, "parts": None}
    assert records[1]["compiled"] and records[1]["setting"] == "on" and "feed-forward" in records[1]["parts"]


def test_compiled_blocks_hold_the_norms_projections_rotary_and_feed_forward():
    """`compile_blocks` captures, in two graphs shared by every block, both LayerNorms, the
    QKV/output/feed-forward projections, rotary's cos/sin, GELU and dropout: all of a block
    but the attention kernel. (torch's own modules compiled alone, `LayerNorm.compile()`,
    capture nothing: dynamo skips their frames.) The compiled model computes the eager one."""
    from embedlab.train.compiling import compile_blocks

    graphs: list[set[str]] = []

    def recording(graph_module, example_inputs):
        graphs.append({getattr(node.target, "__name__", str(node.target)) for node in graph_module.graph.nodes
                       if node.op in ("call_function", "call_method")})
        return graph_module.forward

    torch._dynamo.reset()  # graphs compiled by earlier tests share these methods' cache
    config = model_preset("tiny", vocab_size=512, layers=3)
    torch.manual_seed(0)
    model, eager = MLMModel(config), MLMModel(config)
    eager.load_state_dict(model.state_dict())
    compile_blocks(model.encoder, backend=recording)
    assert torch._dynamo.config.recompile_limit >= 64
    ids = torch.randint(5, 512, (2, 32))
    segments = torch.tensor([[1] * 20 + [2] * 12, [1] * 25 + [0] * 7])
    selected = torch.rand(2, 32) < 0.3
    torch.testing.assert_close(model(ids, segments, selected), eager(ids, segments, selected))
    assert len(graphs) == 2  # one per step, reused by all three blocks
    inputs, outputs = graphs
    assert {"layer_norm", "linear", "cos", "sin"} <= inputs
    assert {"layer_norm", "linear", "gelu", "dropout"} <= outputs
    assert not any("attention" in name for graph in graphs for name in graph)


def test_masking_draws_do_not_depend_on_dropout(frozen):
    """Masking has its own generator: the masks of a second step are the same with dropout on
    or off, although dropout draws from the default generator in between."""
    rows = synthetic.mlm_rows(frozen, 8)
    batches = [{k: torch.as_tensor(v[i * 4:(i + 1) * 4]) for k, v in rows.items()} for i in range(2)]
    selections = []
    for dropout in (0.0, 0.3):
        trial = synthetic.phase1_trial(1)
        trial = dataclasses.replace(trial, model=dataclasses.replace(trial.model, dropout=dropout))
        loop = make_loop(trial, frozen)
        loop.step(batches)
        selections.append(loop._microbatch(batches[0], 0).heads["mlm"].positions)
    assert torch.equal(*selections)


def test_extension_continues_the_parents_weights_and_records_it(frozen, parent, tmp_path):
    """A phase-1 extension starts from the parent's encoder and MLM head exactly (longer
    max_length allowed), records the parent and the lengths, and refuses another architecture."""
    from embedlab.checkpoints.io import CheckpointError, load_encoder, read_manifest

    trial = dataclasses.replace(synthetic.phase1_trial(1), model=dataclasses.replace(MODEL, max_length=128),
                                extension=True, parent=str(parent))
    loop = make_loop(trial, frozen)
    encoder, _, manifest = load_encoder(parent)
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(loop.model.encoder.state_dict()[name], tensor), name
    from safetensors.torch import load_file

    from embedlab.checkpoints.io import HEAD_FILE

    head = load_file(str(Path(parent) / HEAD_FILE))
    assert torch.equal(loop.model.mlm_head.dense.weight, head["dense.weight"])
    train(trial, frozen, tmp_path)
    written = read_manifest(sorted(Path(tmp_path).rglob("manifest.json"))[-1].parent)
    assert written["parent_hash"] == manifest["content_hash"] and written["extension"]["to_length"] == 32
    wider = dataclasses.replace(trial, model=dataclasses.replace(trial.model, width=64, ffn_width=128))
    with pytest.raises(CheckpointError, match="model.width is 64 here and 32 in the parent"):
        make_loop(wider, frozen)
    with pytest.raises(ConfigError, match="extension"):
        dataclasses.replace(trial, extension=False)


def test_waiting_for_data_is_measured_apart_from_the_stream_start(frozen, tmp_path):
    """A stream that takes 50 ms per batch: the first wait counts as stream start, every later
    one as data wait (2 microbatches a step, so at least 2 x 50 ms per later step)."""
    import time as clock

    from embedlab.train.loop import run
    from embedlab.train.session import LocalSession

    class SlowSession(LocalSession):
        def worker_batches(self, rows):
            for batch in super().worker_batches(rows):
                clock.sleep(0.05)
                yield batch

    trial = synthetic.phase1_trial(1)
    session = SlowSession(synthetic.rows_for(trial, frozen), tmp_path)
    run(make_loop(trial, frozen), session)
    last = session.reports[-1]
    assert last["compute/stream_start_seconds"] >= 0.1
    assert last["compute/data_wait_seconds"] >= (synthetic.STEPS - 1) * 2 * 0.05
    assert 0 < last["compute/data_wait_fraction"] < 1
