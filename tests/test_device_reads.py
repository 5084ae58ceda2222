"""A training step reads the device back once, at its end, and nowhere before.

On a GPU every read of a device value (a count, a norm, a mask's gather, a data-dependent
layout, a copy from pageable memory) makes the host wait until the GPU has run everything
queued, so the GPU then idles while the host catches up. These tests run whole steps on the
meta device, whose tensors have shapes but no data: the first read raises there, so the
frame it raises in is the step's first read, which must be its one designed read (the
figures the non-finite rule decides on, with the gradient norm). What the GPU itself would
flag is checked on a GPU by `embedlab model check-cuda` ("host reads").
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from embedlab.checkpoints.io import save_checkpoint
from embedlab.model.encoder import MLMModel
from embedlab.train.contrastive import ContrastiveLoop
from embedlab.train.phase1 import Phase1Loop

import synthetic

META = torch.device("meta")


def on_meta(model: torch.nn.Module, attention: str) -> None:
    """bf16 weights for the flash kernel, which the variable-length path takes off the CPU
    (autocast has no meta device)."""
    if attention == "varlen":
        model.to(torch.bfloat16)


def batches_of(rows: dict, count: int = 2, size: int = 4) -> list[dict[str, torch.Tensor]]:
    return [{k: torch.as_tensor(v[i * size:(i + 1) * size]) for k, v in rows.items()} for i in range(count)]


def first_read(step: Callable[[], object]) -> traceback.FrameSummary:
    """Runs `step` on the meta device: the innermost embedlab frame of the read that stops it."""
    try:
        step()
    except NotImplementedError as error:
        assert "meta" in str(error)
        return [f for f in traceback.extract_tb(error.__traceback__) if "/embedlab/" in f.filename][-1]
    pytest.fail("the step ran to its end on the meta device: it never read its figures")


@pytest.mark.parametrize("attention", ["dense", "varlen"])
@pytest.mark.parametrize("dual_heads", [False, True])
def test_a_phase1_step_reads_the_device_only_at_its_end(frozen, dual_heads, attention):
    """Phase1Loop.step on two microbatches (masking, routing, counts and layout on the host;
    forwards, backwards and clipping on the device), one head or two with per-ratio and
    per-source groups, dense or flash attention: its first read is `AccumulatedStep.result`."""
    trial = synthetic.phase1_trial(dual_heads=dual_heads, microbatches=2)
    trial = dataclasses.replace(trial, model=dataclasses.replace(trial.model, attention=attention))
    loop = Phase1Loop(synthetic.loop_config(trial, frozen), rank=0, world=1, device=META)
    on_meta(loop.model, attention)
    loop.start_clock()
    frame = first_read(lambda: loop.step(batches_of(synthetic.mlm_rows(frozen, 8))))
    assert (Path(frame.filename).name, frame.name) == ("mlm_step.py", "result")


def contrastive_loop(frozen, directory: Path, attention: str, **settings) -> ContrastiveLoop:
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
@pytest.mark.parametrize("gradcache", [False, True])
def test_a_contrastive_step_reads_the_device_only_at_its_end(frozen, tmp_path, gradcache, attention):
    """ContrastiveLoop.step on two microbatches: symmetric InfoNCE with a learnable
    temperature and the joint MLM term, or GradCache's chunks; encodings sent with their
    layout, the objective's counts kept on the device: its first read is the step's figures."""
    loop = contrastive_loop(frozen, tmp_path, attention, gradcache=gradcache)
    loop.start_clock()
    frame = first_read(lambda: loop.step(batches_of(synthetic.pair_rows(frozen, 8))))
    assert (Path(frame.filename).name, frame.name) == ("contrastive.py", "step") and "figures" in frame.line
