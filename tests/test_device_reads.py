"""A training step never reads the device back before its one read.

On a GPU every read of a device value (a count, a norm, a mask's gather, a data-dependent
layout) makes the host wait until the GPU has run everything queued, so the GPU then idles
while the host catches up. These tests run the steps on the meta device, whose tensors have
shapes but no data: any read raises there, so a step that completes read nothing. What the
GPU itself would flag is checked on a GPU by `embedlab model check-cuda` ("host reads").
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from embedlab.model.encoder import MLMModel
from embedlab.train.checkpoint import save_checkpoint
from embedlab.train.contrastive import ContrastiveLoop
from embedlab.train.mlm_step import accumulate_gradients
from embedlab.train.phase1 import Phase1Loop

import synthetic

META = torch.device("meta")


def on_meta(model: torch.nn.Module, attention: str) -> None:
    """bf16 weights for the flash kernel, which the variable-length path takes off the CPU."""
    if attention == "varlen":
        model.to(torch.bfloat16)


def batches_of(rows: dict, count: int = 2, size: int = 4) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.as_tensor(v[i * size:(i + 1) * size]) for k, v in rows.items()} for i in range(count)]


@pytest.mark.parametrize("attention", ["dense", "varlen"])
@pytest.mark.parametrize("dual_heads", [False, True])
def test_a_phase1_step_reads_nothing_back_before_its_one_read(frozen, dual_heads, attention):
    """Phase1Loop prepares two microbatches (masking, routing, counts, layout on the host) and
    accumulates and clips their gradients on the meta device, one head or two with per-ratio
    and per-source groups, dense or flash attention; only the step's one read touches data."""
    trial = synthetic.phase1_trial(dual_heads=dual_heads)
    trial = dataclasses.replace(trial, model=dataclasses.replace(trial.model, attention=attention))
    loop = Phase1Loop(synthetic.loop_config(trial, frozen), rank=0, world=1, device=META)
    on_meta(loop.model, attention)
    pending = [loop._microbatch(batch, i) for i, batch in enumerate(batches_of(synthetic.mlm_rows(frozen, 8)))]
    assert all((mb.layout is not None) == (attention == "varlen") for mb in pending)
    step = accumulate_gradients(loop.model, pending, loop.all_reduce, loop.precision)
    norm = torch.nn.utils.clip_grad_norm_(loop.model.parameters(), trial.train.max_grad_norm)
    assert step.sums.device == norm.device == META
    assert step.sums.shape == (1 + len(step.counts),) and step.selected == sum(mb.selected for mb in pending)
    with pytest.raises(NotImplementedError, match="meta"):
        step.result(norm)  # the one read: the loss sums and the norm the step decides on


def contrastive_loop(frozen, directory, attention: str, **settings) -> ContrastiveLoop:
    """A phase-2 loop on the meta device from a parent whose encoder takes `attention`."""
    model_config = dataclasses.replace(synthetic.MODEL, attention=attention)
    torch.manual_seed(7)
    model = MLMModel(model_config)
    save_checkpoint(directory / "parent", model.encoder, head=model.mlm_head, tokenizer=frozen, fields={"phase": 1})
    trial = dataclasses.replace(synthetic.contrastive_trial(directory / "parent", **settings), model=model_config)
    loop = ContrastiveLoop(synthetic.loop_config(trial, frozen), rank=0, world=1, device=META)
    on_meta(loop.model, attention)
    return loop


@pytest.mark.parametrize("attention", ["dense", "varlen"])
def test_the_joint_mlm_term_reads_nothing_back(frozen, tmp_path, attention):
    """The joint arm's MLM term (phase 2) masks, counts and lays out its copies on the host, and
    its forwards and backwards on the meta device read nothing; its loss sum stays there."""
    loop = contrastive_loop(frozen, tmp_path, attention)
    loss_sum, count, _ = loop._mlm_backward(batches_of(synthetic.pair_rows(frozen, 8)))
    assert loss_sum.device == META and count > 0
    assert all(p.grad is not None and p.grad.device == META for p in loop.model.encoder.parameters())


@pytest.mark.parametrize("gradcache", [False, True])
@pytest.mark.parametrize("attention", ["dense", "varlen"])
def test_the_contrastive_encodings_read_nothing_back(frozen, tmp_path, attention, gradcache):
    """Phases 2-3 encode their texts (whole, or GradCache's chunks) from rows sent with their
    layout taken on the host: embedding and pooling forwards and backwards read nothing. (The
    contrastive objective itself still reads its valid-row count: README, Benchmarks.)"""
    loop = contrastive_loop(frozen, tmp_path, attention, gradcache=gradcache)
    ids = torch.as_tensor(synthetic.pair_rows(frozen, 8)["query_ids"])
    rows = loop.contrastive.rows(ids)
    assert len(rows) == (4 if gradcache else 1) and all((r.layout is not None) == (attention == "varlen") for r in rows)
    embeddings = torch.cat([loop.contrastive.encode(r) for r in rows])
    assert embeddings.shape == (8, synthetic.MODEL.width) and embeddings.device == META
    embeddings.float().sum().backward()
    assert all(p.grad is not None for p in loop.encoder.parameters())
