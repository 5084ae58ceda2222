"""Sentence embeddings: order kept and values stable across any batching; CLS pooling; export."""

import random

import numpy as np
import pytest
import torch

from embedlab.core.config import ModelConfig
from embedlab.model.encode import encode_texts
from embedlab.model.encoder import Encoder
from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

TEXTS = [
    "Return a new list containing all items from the iterable in ascending order.",
    "Open file and return a corresponding file object.",
    "x",
    "In the beginning God created the heaven and the earth. And the earth was without form, and void.",
    "",
    "Return the number of items in a container.",
] * 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tokenizer = save_tokenizer(train_tokenizer(TEXTS * 10, 300), tmp_path_factory.mktemp("tok"))
    torch.manual_seed(0)
    return Encoder(ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=300)).eval(), tokenizer


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_order_and_values_survive_any_batching(model, pooling):
    """Batch sizes 1, 3 and 64 and a shuffled input give the same row for the same text (1e-5), dimension d."""
    encoder, tokenizer = model
    reference = encode_texts(encoder, tokenizer, TEXTS, batch_size=64, pooling=pooling)
    assert reference.shape == (len(TEXTS), 32)
    for batch_size in (1, 3):
        np.testing.assert_allclose(encode_texts(encoder, tokenizer, TEXTS, batch_size=batch_size, pooling=pooling),
                                   reference, atol=1e-5)
    order = list(range(len(TEXTS)))
    random.Random(0).shuffle(order)
    shuffled = encode_texts(encoder, tokenizer, [TEXTS[i] for i in order], batch_size=5, pooling=pooling)
    np.testing.assert_allclose(shuffled, reference[order], atol=1e-5)


def test_unit_rows_and_the_zero_vector_rule(model):
    """Mean-pooled rows are unit length; an empty text (no content token) is the zero vector, never NaN."""
    encoder, tokenizer = model
    embeddings = encode_texts(encoder, tokenizer, TEXTS, pooling="mean")
    norms = np.linalg.norm(embeddings, axis=1)
    empty = [i for i, t in enumerate(TEXTS) if t == ""]
    assert np.allclose(norms[empty], 0.0) and np.isfinite(embeddings).all()
    assert np.allclose(np.delete(norms, empty), 1.0, atol=1e-5)


def test_cls_pooling_is_the_first_state(model):
    """CLS pooling returns the normalised final state at the CLS position."""
    encoder, tokenizer = model
    ids = torch.tensor([[tokenizer.cls_id, *tokenizer.encode_batch([TEXTS[0]])[0], tokenizer.sep_id]])
    state = encoder(ids, torch.ones_like(ids))[0, 0]
    np.testing.assert_allclose(encode_texts(encoder, tokenizer, [TEXTS[0]], pooling="cls")[0],
                               (state / state.norm()).detach().numpy(), atol=1e-5)
