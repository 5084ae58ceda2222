"""`bench train`'s second reference, ModernBertForMaskedLM: what it is built as and that it trains.

No Ray and no prepared corpus: the real text is the standard library's own docstrings, and
the tokenizer is trained on them here.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import textwrap

import pytest
import torch

from embedlab.bench.measure import comparisons_json
from embedlab.bench.train import (
    REFERENCES,
    ReferenceTrainer,
    TokenIds,
    TrainBench,
    compare_training,
    linear_flops_per_token,
    modernbert_config,
    modernbert_extra_parameters,
    train_notes,
)
from embedlab.core.config import MODEL_PRESETS, model_preset
from embedlab.core.errors import UsageError
from embedlab.model.encoder import MLMModel, count_parameters

pytestmark = pytest.mark.timeout(300)

BENCH = TrainBench(preset="tiny", sequence_length=64, documents=24, batch_documents=8, repeats=1)


@pytest.fixture(scope="module")
def docstrings() -> list[str]:
    texts = [inspect.getdoc(getattr(module, name)) for module in (json, os, re, textwrap, inspect)
             for name in sorted(dir(module)) if not name.startswith("_")]
    return [text for text in texts if text and len(text) > 40]


@pytest.fixture(scope="module")
def tokenizer(docstrings, tmp_path_factory):
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    return save_tokenizer(train_tokenizer(docstrings, vocab_size=512), tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def sequences(docstrings, tokenizer) -> list[list[int]]:
    """As `bench_sequences` cuts documents: the first L-1 tokens and SEP."""
    encoded = tokenizer.encode_batch(docstrings[: BENCH.documents])
    return [ids[: BENCH.sequence_length - 1] + [tokenizer.sep_id] for ids in encoded]


@pytest.fixture(scope="module")
def ids(tokenizer) -> TokenIds:
    return TokenIds.of(tokenizer)


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_modernbert_reference_has_embedlab_shape_and_sparse_prediction(preset, ids):
    """Depth, width, heads, intermediate size and vocabulary are embedlab's, every layer is global,
    prediction is sparse, attention is SDPA; its parameters differ only by GeGLU's gate."""
    from transformers import ModernBertForMaskedLM

    config = model_preset(preset)
    reference = modernbert_config(config, ids, 512)
    assert (reference.num_hidden_layers, reference.hidden_size, reference.num_attention_heads,
            reference.intermediate_size, reference.vocab_size) == (
        config.layers, config.width, config.heads, config.ffn_width, config.vocab_size)
    assert reference.sparse_prediction and reference._attn_implementation == "sdpa"
    assert reference.layer_types == ["full_attention"] * config.layers
    assert reference.rope_parameters["full_attention"]["rope_theta"] == config.rope_base
    with torch.device("meta"):
        model, ours = ModernBertForMaskedLM(reference), MLMModel(config)
    d, f = config.width, config.ffn_width
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for layer in range(config.layers):
        prefix = f"model.layers.{layer}"
        assert shapes[f"{prefix}.attn.Wqkv.weight"] == (3 * d, d) and shapes[f"{prefix}.attn.Wo.weight"] == (d, d)
        assert shapes[f"{prefix}.mlp.Wi.weight"] == (2 * f, d) and shapes[f"{prefix}.mlp.Wo.weight"] == (d, f)
    assert shapes["model.embeddings.tok_embeddings.weight"] == (config.vocab_size, d)
    assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight  # tied, as embedlab's
    assert count_parameters(model) - count_parameters(ours) == modernbert_extra_parameters(config)
    assert linear_flops_per_token(config, "modernbert") > linear_flops_per_token(config, "embedlab")


def test_modernbert_trains_a_step_on_real_text(ids, sequences):
    """ModernBERT trains on the bench's collated batches of real documents: the step counts every
    non-padding token, the loss is computed at the masked positions only, and the weights move."""
    trainer = ReferenceTrainer(BENCH.model(), ids, BENCH, "modernbert")
    assert type(trainer.model).__name__ == "ModernBertForMaskedLM" and trainer.model.config.sparse_prediction
    batch = trainer.batches(sequences)[0]
    collated = trainer.collator(batch)
    logits = trainer.model(input_ids=collated["input_ids"], attention_mask=collated["attention_mask"],
                           labels=collated["labels"]).logits
    assert logits.shape == (int((collated["labels"] != -100).sum()), BENCH.model().vocab_size)
    before = trainer.model.model.layers[0].attn.Wqkv.weight.detach().clone()
    assert trainer.step(batch) == sum(len(example["input_ids"]) for example in batch)
    assert not torch.equal(before, trainer.model.model.layers[0].attn.Wqkv.weight)


def test_unknown_reference_architecture_names_the_valid_ones(ids):
    """A reference name not in `REFERENCES` is refused with the valid names."""
    with pytest.raises(UsageError, match="valid: \\['bert', 'modernbert'\\]"):
        ReferenceTrainer(BENCH.model(), ids, BENCH, "roberta")
    assert sorted(REFERENCES) == ["bert", "modernbert"]


def test_training_comparison_adds_the_modernbert_row_and_keeps_the_bert_row(ids, sequences):
    """One set of interleaved passes gives both rows: the BERT row under its old JSON key and
    shape, the ModernBERT row under a new key, embedlab's figure the same in both."""
    comparisons, facts = compare_training(sequences, ids, BENCH)
    shape = comparisons_json(comparisons)
    assert list(shape) == ["train: non-padding tokens/s", "train: non-padding tokens/s vs ModernBERT"]
    bert, modernbert = shape.values()
    for row in (bert, modernbert):
        assert set(row) == {"embedlab", "reference", "ratio", "unit", "better", "embedlab_measures",
                            "reference_measures", "runs"}
        assert row["unit"] == "tokens/s" and row["reference"] > 0 and set(row["runs"]) == {"embedlab", "reference"}
        assert row["ratio"] == pytest.approx(row["embedlab"] / row["reference"])
    assert bert["embedlab"] == modernbert["embedlab"]
    assert bert["reference_measures"].startswith("BertForMaskedLM")
    assert modernbert["reference_measures"].startswith("ModernBertForMaskedLM (sdpa attention")
    extra = facts["parameters"]["modernbert"] - facts["parameters"]["embedlab"]
    assert extra == modernbert_extra_parameters(BENCH.model())
    notes = train_notes({"facts": facts, "bench": dataclasses.asdict(BENCH)})
    assert any(line.startswith("train vs ModernBERT:") and "GeGLU" in line for line in notes)
    json.dumps(shape)  # what `--json` prints
