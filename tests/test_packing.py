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
