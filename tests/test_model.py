"""The encoder: parameter counts, document isolation in packed rows, pooling contracts."""

import pytest
import torch

from embedlab.core.config import ModelConfig, model_preset
from embedlab.model.encoder import Encoder, MLMModel, parameter_counts, segment_positions
from embedlab.model.pooling import l2_normalise, mean_pool

TINY = ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=97)


def formula(config: ModelConfig) -> int:
    V, d, f, L = config.vocab_size, config.width, config.ffn_width, config.layers
    return V * d + L * (4 * d * d + 2 * d * f + 4 * d) + 2 * d


def test_300m_parameter_counts_from_meta_tree():
    """The 300m preset's real module tree has exactly the recipe's parameter counts."""
    assert parameter_counts(model_preset("300m")) == {"encoder": 302_090_240, "with_mlm_head": 303_191_040}


@pytest.mark.parametrize("name", ["tiny", "small", "5m"])
def test_presets_match_the_derivation(name):
    """Every preset's tree agrees with V*d + L(4d^2 + 2df + 4d) + 2d and a d^2+3d+V head."""
    config = model_preset(name)
    counts = parameter_counts(config)
    assert counts["encoder"] == formula(config)
    d = config.width
    assert counts["with_mlm_head"] - counts["encoder"] == d * d + d + 2 * d + config.vocab_size


def test_mlm_decoder_is_tied_to_embeddings():
    """The MLM decoder is the embedding table itself, counted once."""
    model = MLMModel(TINY)
    assert model.mlm_head.embedding.weight is model.encoder.embed.weight


def test_linears_are_bias_free_and_norms_affine():
    """Attention and FFN linears carry no bias; every LayerNorm has weight and bias."""
    encoder = Encoder(TINY)
    for block in encoder.blocks:
        for linear in (block.attn.qkv, block.attn.out, block.ffn.up, block.ffn.down):
            assert linear.bias is None
        for norm in (block.attn_norm, block.ffn_norm):
            assert norm.weight is not None and norm.bias is not None


def test_segment_positions_restart_per_document():
    """RoPE positions restart at every document inside a packed row."""
    segments = torch.tensor([[1, 1, 1, 2, 2, 3, 0, 0]])
    assert segment_positions(segments).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]


def test_packed_row_equals_documents_encoded_alone():
    """Two documents packed in one row get the same states as each encoded in its own row."""
    torch.manual_seed(0)
    encoder = Encoder(TINY).eval()
    doc_a = torch.randint(5, 97, (7,))
    doc_b = torch.randint(5, 97, (5,))
    packed_ids = torch.cat([doc_a, doc_b, torch.zeros(4, dtype=torch.long)])[None]
    packed_seg = torch.tensor([[1] * 7 + [2] * 5 + [0] * 4])
    packed = encoder(packed_ids, packed_seg)[0]
    alone_a = encoder(doc_a[None], torch.ones(1, 7, dtype=torch.long))[0]
    alone_b = encoder(doc_b[None], torch.ones(1, 5, dtype=torch.long))[0]
    torch.testing.assert_close(packed[:7], alone_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[7:12], alone_b, atol=1e-5, rtol=1e-5)


def test_padding_does_not_change_real_tokens():
    """Extra padding leaves every real token's state unchanged."""
    torch.manual_seed(1)
    encoder = Encoder(TINY).eval()
    ids = torch.randint(5, 97, (1, 6))
    short = encoder(ids, torch.ones(1, 6, dtype=torch.long))
    padded_ids = torch.cat([ids, torch.zeros(1, 10, dtype=torch.long)], dim=1)
    padded_seg = torch.cat([torch.ones(1, 6, dtype=torch.long), torch.zeros(1, 10, dtype=torch.long)], dim=1)
    padded = encoder(padded_ids, padded_seg)
    torch.testing.assert_close(padded[:, :6], short, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(padded).all()


def test_mean_pool_ignores_masked_positions_and_zero_rule():
    """Mean pooling averages masked-in positions only; an empty row pools to a zero unit-safe vector."""
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 5.0], [6.0, 6.0], [7.0, 7.0]]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    pooled = mean_pool(hidden, mask)
    torch.testing.assert_close(pooled, torch.tensor([[2.0, 2.0], [0.0, 0.0]]))
    normalised = l2_normalise(pooled)
    torch.testing.assert_close(normalised[0].norm(), torch.tensor(1.0))
    assert normalised[1].abs().sum() == 0 and torch.isfinite(normalised).all()


def test_unknown_preset_lists_valid_names():
    """An unknown preset name fails with the valid names in the message."""
    with pytest.raises(ValueError, match="300m"):
        model_preset("nope")


def test_varlen_path_equals_dense_mask_path():
    """The variable-length attention path (real tokens only, cut at segments; on CPU the
    bucketed kernel) gives the dense block-diagonal path's states and gradients at every
    non-padding position."""
    import dataclasses

    torch.manual_seed(2)
    dense = Encoder(TINY).double().eval()
    varlen = Encoder(dataclasses.replace(TINY, attention="varlen")).double().eval()
    varlen.load_state_dict(dense.state_dict())
    ids = torch.randint(5, 97, (3, 16))
    segments = torch.tensor([[1] * 5 + [2] * 9 + [0] * 2, [1] * 16, [1] * 3 + [2] * 3 + [3] * 4 + [0] * 6])
    real = segments > 0
    out_dense, out_varlen = dense(ids, segments), varlen(ids, segments)
    torch.testing.assert_close(out_varlen[real], out_dense[real], atol=1e-10, rtol=1e-10)
    out_dense[real].square().sum().backward()
    out_varlen[real].square().sum().backward()
    for a, b in zip(dense.parameters(), varlen.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-9, rtol=1e-9)


def test_bucketed_varlen_kernel_equals_the_per_sequence_reference():
    """The CPU kernel (sequences batched by power-of-two length bucket, padded keys masked)
    gives the per-sequence loop's outputs and gradients, for lengths inside, at and across
    bucket edges, single tokens, one full bucket and an empty batch."""
    from embedlab.model.encoder import bucketed_varlen_attention, reference_varlen_attention

    torch.manual_seed(3)
    for lengths in ([1, 5, 16, 17, 33, 100, 3, 64, 65, 128], [16, 16, 16], [7], [300, 2, 1024]):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        q, k, v = (torch.randn(sum(lengths), 2, 4, dtype=torch.double, requires_grad=True) for _ in range(3))
        want = reference_varlen_attention(q, k, v, cu, max(lengths))
        got = bucketed_varlen_attention(q, k, v, cu, max(lengths))
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
        grads = torch.autograd.grad((got * want.detach()).sum(), (q, k, v))
        for a, b in zip(grads, torch.autograd.grad((want * want.detach()).sum(), (q, k, v))):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    empty = torch.zeros(0, 2, 4)
    assert bucketed_varlen_attention(empty, empty, empty, torch.zeros(1, dtype=torch.int32), 0).shape == (0, 2, 4)


def test_bucketed_varlen_dropout_stays_inside_each_sequence():
    """With attention dropout the CPU kernel still mixes values only within a sequence (the
    gradient of each output row reaches no other sequence's values), drops weights at about
    the set rate, and is exact without dropout."""
    from embedlab.model.encoder import bucketed_varlen_attention

    torch.manual_seed(4)
    lengths = [5, 9, 12, 20, 40]  # 5, 9 and 12 share the 16 bucket, padded and masked
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = sum(lengths)
    q, k = torch.randn(total, 1, 4), torch.randn(total, 1, 4)
    v = torch.randn(total, 1, 4, requires_grad=True)
    out = bucketed_varlen_attention(q, k, v, cu, 40, dropout_p=0.5)
    for index, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        (grad,) = torch.autograd.grad(out[start:end].sum(), v, retain_graph=True)
        outside = torch.ones(total, dtype=torch.bool)
        outside[start:end] = False
        assert grad[outside].abs().max() == 0 and grad[start:end].abs().sum() > 0, lengths[index]
    # Each kept weight is scaled by 1/(1-p): with all-ones values an output is 2 x the kept share.
    ones = torch.ones(total, 1, 4)
    shares = torch.stack([bucketed_varlen_attention(q, k, ones, cu, 40, dropout_p=0.5) for _ in range(200)])
    assert abs(float(shares.mean()) - 1.0) < 0.05
    torch.testing.assert_close(bucketed_varlen_attention(q, k, ones, cu, 40), torch.ones(total, 1, 4))


def test_auto_attention_path():
    """"auto": the bucketed varlen kernel on CPU from 1,024 tokens a row, the dense mask below;
    on CUDA the flash kernel in half precision only, and not while dropout trains (it has no
    attention dropout); an explicit path is always taken."""
    import dataclasses

    from embedlab.model.encoder import CPU_VARLEN_MIN_LENGTH, use_varlen, varlen_rule

    cuda = dict(cuda=True, length=128)
    assert varlen_rule("auto", half=True, training=True, dropout=0.0, **cuda)
    assert varlen_rule("auto", half=True, training=False, dropout=0.1, **cuda)
    assert not varlen_rule("auto", half=True, training=True, dropout=0.1, **cuda)
    assert not varlen_rule("auto", half=False, training=False, dropout=0.0, **cuda)
    assert varlen_rule("varlen", half=False, training=True, dropout=0.1, **cuda)
    assert not varlen_rule("auto", cuda=False, half=True, length=1023, training=False, dropout=0.0)

    assert CPU_VARLEN_MIN_LENGTH == 1024
    short, long = torch.zeros(2, 512, 8), torch.zeros(1, 1024, 8)
    assert not use_varlen(TINY, short) and use_varlen(TINY, long)
    assert use_varlen(dataclasses.replace(TINY, attention="varlen"), short)
    assert not use_varlen(dataclasses.replace(TINY, attention="dense"), long, training=True)


def test_segment_layout_cuts_rows_and_segments():
    """cu_seqlens restart at every segment and every row; padding is left out."""
    from embedlab.model.encoder import segment_layout

    layout = segment_layout(torch.tensor([[1, 1, 2, 0], [1, 1, 1, 1]]))
    assert layout.token_index.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert layout.cu_seqlens.tolist() == [0, 2, 3, 7] and layout.max_length == 4
