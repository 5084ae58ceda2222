"""The encoder: parameter counts, document isolation in packed rows, pooling contracts."""

import pytest
import torch

from embedlab.config import ModelConfig, model_preset
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
    """The variable-length attention path (real tokens only, cut at segments; CPU reference kernel)
    gives the dense block-diagonal path's states and gradients at every non-padding position."""
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


def test_segment_layout_cuts_rows_and_segments():
    """cu_seqlens restart at every segment and every row; padding is left out."""
    from embedlab.model.encoder import segment_layout

    layout = segment_layout(torch.tensor([[1, 1, 2, 0], [1, 1, 1, 1]]))
    assert layout.token_index.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert layout.cu_seqlens.tolist() == [0, 2, 3, 7] and layout.max_length == 4
