"""Boundary-preserving packing: nothing lost, nothing crosses a document, rows full."""

import numpy as np

from embedlab.data.packing import pack_documents

SEP, PAD = 3, 0


def unpack(rows) -> list[list[int]]:
    """Rebuild each document's token list from the packed rows via document_index."""
    docs: dict[int, list[int]] = {}
    for ids, doc in zip(rows.input_ids, rows.document_index):
        for token, index in zip(ids, doc):
            if index >= 0:
                docs.setdefault(int(index), []).append(int(token))
    return [docs[i] for i in sorted(docs)]


def test_every_token_is_kept_in_order_with_a_boundary():
    """Unpacking the rows gives back every document followed by SEP."""
    rng = np.random.default_rng(0)
    documents = [list(rng.integers(5, 100, size=n)) for n in rng.integers(1, 60, size=200)]
    rows = pack_documents(documents, sequence_length=32, sep_id=SEP, pad_id=PAD)
    assert unpack(rows) == [d + [SEP] for d in documents]
    assert rows.input_ids.shape[1] == 32


def test_segments_never_mix_documents_and_padding_is_segment_zero():
    """Inside a row each segment holds one document; PAD positions are segment 0."""
    rng = np.random.default_rng(1)
    documents = [list(rng.integers(5, 100, size=n)) for n in rng.integers(1, 80, size=100)]
    rows = pack_documents(documents, sequence_length=48, sep_id=SEP, pad_id=PAD)
    for seg, doc, ids in zip(rows.segment_ids, rows.document_index, rows.input_ids):
        assert ((seg == 0) == (doc == -1)).all() and (ids[seg == 0] == PAD).all()
        for s in set(seg[seg > 0].tolist()):
            assert len(set(doc[seg == s].tolist())) == 1


def test_rows_are_nearly_full():
    """Only fragments shorter than min_fragment leave padding: efficiency above 0.9 here."""
    rng = np.random.default_rng(2)
    documents = [list(rng.integers(5, 100, size=n)) for n in rng.integers(20, 300, size=300)]
    rows = pack_documents(documents, sequence_length=128, sep_id=SEP, pad_id=PAD)
    assert rows.efficiency > 0.9
    assert rows.non_padding_tokens == sum(len(d) + 1 for d in documents)


def test_chunking_never_truncates():
    """A long document is cut into pieces of at most L tokens that concatenate back to it plus SEP."""
    from embedlab.data.packing import chunk_document

    tokens = list(range(5, 305))
    pieces = chunk_document(tokens, sequence_length=64, sep_id=SEP)
    assert all(len(p) <= 64 for p in pieces) and sum(pieces, []) == tokens + [SEP]
    assert chunk_document([7, 8], sequence_length=64, sep_id=SEP) == [[7, 8, SEP]]


def test_packed_document_mlm_counts_and_outputs_match_alone():
    """A packed row gives each document its stand-alone states (1e-5), and the MLM loss sum and
    selected count of the row equal the sums over the documents encoded alone with the same selection."""
    import torch

    from embedlab.config import ModelConfig
    from embedlab.model.encoder import MLMModel
    from embedlab.objectives.mlm import mlm_loss_sum

    rng = np.random.default_rng(3)
    documents = [list(rng.integers(5, 90, size=n)) for n in (11, 23, 7, 40)]
    rows = pack_documents(documents, sequence_length=96, sep_id=SEP, pad_id=PAD)
    assert rows.input_ids.shape[0] == 1
    torch.manual_seed(0)
    model = MLMModel(ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=97)).eval()
    ids = torch.from_numpy(rows.input_ids).long()
    segments = torch.from_numpy(rows.segment_ids).long()
    selected = torch.from_numpy(rng.random(rows.input_ids.shape) < 0.3) & (segments > 0)
    packed_states = model.encoder(ids, segments)[0]
    packed_sum, packed_count = mlm_loss_sum(model(ids, segments, selected), ids[selected])
    alone_sum, alone_count = 0.0, 0
    for index, doc in enumerate(documents):
        positions = torch.from_numpy(rows.document_index[0] == index)
        alone_ids = torch.tensor([doc + [SEP]])
        alone_states = model.encoder(alone_ids, torch.ones_like(alone_ids))[0]
        torch.testing.assert_close(packed_states[positions], alone_states, atol=1e-5, rtol=1e-5)
        alone_selected = selected[0][positions][None]
        part_sum, part_count = mlm_loss_sum(
            model(alone_ids, torch.ones_like(alone_ids), alone_selected), alone_ids[alone_selected]
        )
        alone_sum += float(part_sum)
        alone_count += part_count
    assert packed_count == alone_count > 0
    assert abs(float(packed_sum) - alone_sum) < 1e-4
