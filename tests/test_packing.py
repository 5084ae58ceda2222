"""Boundary-preserving packing: nothing lost, nothing crosses a document, rows full."""

import numpy as np
import torch
import pytest

from embedlab.streams.packing import pack_documents, pack_pieces

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
    from embedlab.streams.packing import chunk_document

    tokens = list(range(5, 305))
    pieces = chunk_document(tokens, sequence_length=64, sep_id=SEP)
    assert all(len(p) <= 64 for p in pieces) and sum(pieces, []) == tokens + [SEP]
    assert chunk_document([7, 8], sequence_length=64, sep_id=SEP) == [[7, 8, SEP]]


def test_packed_document_mlm_counts_and_outputs_match_alone():
    """A packed row gives each document its stand-alone states (1e-5), and the MLM loss sum and
    selected count of the row equal the sums over the documents encoded alone with the same selection."""
    import torch

    from embedlab.core.config import ModelConfig
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


def _reference_pack(pieces, sequence_length, pad_id, min_fragment=8, opener=None):
    """The packing rule token by token in plain lists: the oracle for the vectorised packer;
    with `opener`, every segment opens with that token."""
    extra = 0 if opener is None else 1
    rows, ids, seg, doc = [], [], [], []

    def close():
        pad = sequence_length - len(ids)
        rows.append((ids + [pad_id] * pad, seg + [0] * pad, doc + [-1] * pad))
        ids.clear(), seg.clear(), doc.clear()

    for index, piece in enumerate(pieces):
        remaining = list(piece)
        while remaining:
            space = sequence_length - len(ids)
            if ids and (space <= extra or space < min(min_fragment, len(remaining) + extra)):
                close()
                continue
            part, remaining = remaining[:space - extra], remaining[space - extra:]
            part = [opener] * extra + part
            segment = (seg[-1] if seg else 0) + 1
            ids.extend(part), seg.extend([segment] * len(part)), doc.extend([index] * len(part))
            if len(ids) == sequence_length:
                close()
    if ids:
        close()
    return [np.array([r[k] for r in rows], dtype=np.int32).reshape(len(rows), sequence_length) for k in range(3)]


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_packing_equals_the_token_by_token_rule(seed):
    """Random pieces (empty, tiny, near the fragment limit, longer than a row) pack exactly as
    the token-by-token rule does, through lists and through flat arrays with a selection."""
    from embedlab.streams.packing import pack_flat

    generator = np.random.default_rng(seed)
    lengths = generator.choice([0, 1, 3, 7, 8, 9, 31, 32, 33, 70], size=200)
    pieces = [generator.integers(5, 1000, n).tolist() for n in lengths]
    expected = _reference_pack(pieces, 32, pad_id=0)
    packed = pack_pieces(pieces, sequence_length=32, pad_id=0)
    for got, want in zip((packed.input_ids, packed.segment_ids, packed.document_index), expected):
        np.testing.assert_array_equal(got, want)
    values = np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    chosen = generator.permutation(len(pieces))[:120]
    selected = pack_flat(values, offsets, sequence_length=32, pad_id=0, pieces=chosen)
    reference = _reference_pack([pieces[i] for i in chosen], 32, pad_id=0)
    for got, want in zip((selected.input_ids, selected.segment_ids, selected.document_index), reference):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("sequence_length", [5, 9, 32])
@pytest.mark.parametrize("min_fragment", [1, 8, 40])
@pytest.mark.parametrize("opener", [None, 2])
def test_fragments_expanded_equal_the_token_by_token_rule(sequence_length, min_fragment, opener):
    """`pack_fragments` expanded to tokens (`Fragments.layout`) packs random pieces as the
    token-by-token rule does, with and without an opener, for a fragment floor under, near and
    over the row length and pieces from empty to several rows (a row shorter than the floor
    takes a long piece's fragments instead of padding for ever)."""
    from embedlab.streams.packing import flatten_pieces, pack_fragments

    generator = np.random.default_rng(sequence_length * 100 + min_fragment)
    edges = [0, 1, 2, min_fragment - 2, min_fragment - 1, min_fragment, sequence_length - 2, sequence_length - 1,
             sequence_length, sequence_length + 1, 2 * sequence_length + 3]
    lengths = generator.choice([n for n in edges if n >= 0], size=150)
    pieces = [generator.integers(5, 1000, n).tolist() for n in lengths]
    values, offsets = flatten_pieces(pieces)
    fragments = pack_fragments(lengths, sequence_length=sequence_length, min_fragment=min_fragment,
                               opener=opener is not None)
    packed = fragments.layout(offsets[:-1]).packed(values, PAD, opener)
    expected = _reference_pack(pieces, sequence_length, PAD, min_fragment, opener)
    for got, want in zip((packed.input_ids, packed.segment_ids, packed.document_index), expected):
        np.testing.assert_array_equal(got, want)
    assert fragments.rows == len(expected[0]) and (fragments.length > 0).all()


@pytest.mark.parametrize("opener", [False, True])
def test_fragments_of_some_rows_expand_to_exactly_those_rows(opener):
    """The fragments of any increasing subset of rows, renumbered (`Fragments.in_rows`), expand
    to exactly those rows of the whole layout: ids, segments, pieces and word starts, bitwise."""
    from embedlab.streams.packing import flatten_pieces, pack_fragments

    generator = np.random.default_rng(7)
    lengths = generator.integers(0, 70, 200)
    values, offsets = flatten_pieces([generator.integers(5, 1000, n).tolist() for n in lengths])
    flags = generator.integers(0, 2, len(values)).astype(np.int8)
    fragments = pack_fragments(lengths, sequence_length=32, opener=opener)
    whole = fragments.layout(offsets[:-1])
    whole_rows = whole.packed(values, PAD, 2 if opener else None)
    for keep in [np.arange(fragments.rows), np.arange(1, fragments.rows, 3), np.array([0, fragments.rows - 1]),
                 np.sort(generator.choice(fragments.rows, 40, replace=False)), np.zeros(0, dtype=np.int64)]:
        part = fragments.in_rows(keep).layout(offsets[:-1])
        rows = part.packed(values, PAD, 2 if opener else None)
        for got, want in zip((rows.input_ids, rows.segment_ids, rows.document_index),
                             (whole_rows.input_ids, whole_rows.segment_ids, whole_rows.document_index)):
            np.testing.assert_array_equal(got, want[keep])
        np.testing.assert_array_equal(part.word_starts(flags), whole.word_starts(flags)[keep])


def test_tokenize_pieces_equals_the_per_document_rule(frozen):
    """The batch-vectorised tokenising UDF gives, piece for piece, what cutting each document
    (tokens + SEP) every L positions with per-token word starts gives, for empty, short,
    word-splitting and multi-piece documents; other splits and sources are dropped."""
    import pyarrow as pa

    from embedlab.prepared.pieces import tokenize_pieces
    from embedlab.streams.packing import chunk_document

    texts = ["", "fox", "the quick brown fox jumps over the lazy dog " * 9, "antidisestablishmentarianism x",
             "the quick brown fox 42"]
    batch = pa.table({"split": ["train", "train", "train", "train", "dev"], "source": ["a", "a", "b", "c", "a"],
                      "doc_id": [f"d{i}" for i in range(5)], "title": ["", "", "t", "", ""], "text": texts})
    out = tokenize_pieces(batch, tokenizer_path=str(frozen.path), sequence_length=16, sources=["a", "b"])
    expected = []
    for row in range(3):  # d3 is source c, d4 is dev
        text = texts[row] if row != 2 else "t\n" + texts[row]
        encoding = frozen.tokenizer.encode(text, add_special_tokens=False)
        words = np.asarray(encoding.word_ids, dtype=np.int64)
        starts = np.ones(len(encoding.ids) + 1, dtype=np.int8)
        starts[1:len(encoding.ids)] = words[1:] != words[:-1]
        offset = 0
        # One position of every 16-token row is the CLS packing opens the segment with.
        for index, piece in enumerate(chunk_document(encoding.ids, sequence_length=15, sep_id=frozen.sep_id)):
            flags = starts[offset:offset + len(piece)].copy()
            flags[0] = 1
            expected.append({"source": batch["source"][row].as_py(), "doc_id": f"d{row}", "piece": index,
                             "ids": piece, "word_start": flags.tolist(), "doc_tokens": len(encoding.ids) + 1})
            offset += len(piece)
    assert out.to_pylist() == expected
    assert len(expected) > 5 and out.schema.field("ids").type == pa.list_(pa.int32())


def test_document_blocks_cover_the_documents_in_equal_parallel_blocks():
    """Blocks are consecutive slices that concatenate back to the documents, come in a multiple
    of the parallelism (or one a document), differ in size by at most one row and never exceed
    `max_rows`."""
    import pyarrow as pa

    from embedlab.prepared.pieces import document_blocks

    documents = pa.table({"doc_id": [f"d{i}" for i in range(1003)]})
    for parallelism, max_rows in [(1, 5000), (2, 5000), (2, 100), (3, 7), (4, 1003), (2, 1)]:
        blocks = document_blocks(documents, parallelism, max_rows)
        assert pa.concat_tables(blocks).equals(documents)
        sizes = [b.num_rows for b in blocks]
        assert max(sizes) <= max_rows and max(sizes) - min(sizes) <= 1
        assert len(blocks) % parallelism == 0 or len(blocks) == documents.num_rows
    assert len(document_blocks(documents, 2, 5000)) == 2 and len(document_blocks(documents, 2, 100)) == 12
    assert document_blocks(documents.slice(0, 0), 2)[0].num_rows == 0
    assert [b.num_rows for b in document_blocks(documents.slice(0, 3), 4)] == [1, 1, 1]
    with pytest.raises(ValueError, match="parallelism >= 1"):
        document_blocks(documents, 0)


def test_phase1_trains_the_layout_evaluation_encodes(tmp_path):
    """Every document phase 1 packs is the id sequence evaluation feeds the encoder for the
    same text, `[CLS] tokens [SEP]` from its segment's position 0; CLS is never maskable."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import synthetic

    from embedlab.model.encode import encode_texts
    from embedlab.model.encoder import Encoder, segment_positions
    from embedlab.streams.packed import pack_window
    from embedlab.prepared.pieces import tokenize_pieces

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    texts = synthetic.TEXTS[:5]
    documents = pa.table({"doc_id": [f"d{i}" for i in range(5)], "source": ["a"] * 5, "title": [""] * 5,
                          "text": texts, "split": ["train"] * 5})
    pieces = tokenize_pieces(documents, tokenizer_path=str(frozen.path), sequence_length=64, sources=["a"])
    pq.write_table(pieces, tmp_path / "pieces.parquet")
    packed = pack_window({"rows": [np.arange(5)], "source_index": [np.zeros(5, dtype=np.int32)]},
                         pieces_path=str(tmp_path / "pieces.parquet"), sequence_length=64,
                         pad_id=frozen.pad_id, cls_id=frozen.cls_id)
    trained = []
    for ids, segments in zip(packed["input_ids"], packed["segment_ids"]):
        positions = segment_positions(torch.from_numpy(segments[None].astype(np.int64)))[0].numpy()
        for segment in range(1, int(segments.max()) + 1):
            here = segments == segment
            assert positions[here][0] == 0 and ids[here][0] == frozen.cls_id
            trained.append(ids[here].tolist())
    encoder = Encoder(synthetic.MODEL).eval()
    evaluated = []
    encoder.embed.register_forward_hook(lambda module, args, out: evaluated.append(args[0][0].tolist()))
    for text in texts:
        encode_texts(encoder, frozen, [text], max_length=64)
    assert trained == evaluated
    assert frozen.cls_id in frozen.special_ids  # the masking ban: `Phase1Loop` never selects it


def test_every_fragment_of_a_split_piece_opens_with_the_opener():
    """With an opener, a piece split across rows opens each of its segments with it, and no
    piece token is lost or moved out of order."""
    from embedlab.streams.packing import flatten_pieces, pack_layout

    OPEN = 2
    pieces = [list(range(10, 70)), list(range(100, 110)), list(range(200, 203))]
    values, offsets = flatten_pieces(pieces)
    rows = pack_layout(offsets, sequence_length=32, opener=True).packed(values, PAD, OPEN)
    recovered: dict[int, list[int]] = {}
    for ids, segments, doc in zip(rows.input_ids, rows.segment_ids, rows.document_index):
        for segment in range(1, int(segments.max()) + 1):
            here = segments == segment
            assert ids[here][0] == OPEN and len(set(doc[here].tolist())) == 1
            recovered.setdefault(int(doc[here][0]), []).extend(ids[here][1:].tolist())
    assert [recovered[i] for i in range(3)] == pieces
    assert (rows.input_ids == OPEN).sum() == 4  # 60 tokens take two rows' segments (31 + 29)


def test_a_long_document_fills_whole_rows_behind_its_cls(tmp_path):
    """A document of several rows' length is cut into pieces one position shorter than a row,
    so each packs as one whole row, [CLS] and the next tokens, with no crumb spilling over."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import synthetic

    from embedlab.streams.packed import pack_window
    from embedlab.prepared.pieces import tokenize_pieces

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    text = " ".join(synthetic.TEXTS[:30])
    documents = pa.table({"doc_id": ["d0"], "source": ["a"], "title": [""], "text": [text], "split": ["train"]})
    pieces = tokenize_pieces(documents, tokenizer_path=str(frozen.path), sequence_length=32, sources=["a"])
    pq.write_table(pieces, tmp_path / "pieces.parquet")
    packed = pack_window({"rows": [np.arange(pieces.num_rows)], "source_index": [np.zeros(pieces.num_rows, np.int32)]},
                         pieces_path=str(tmp_path / "pieces.parquet"), sequence_length=32,
                         pad_id=frozen.pad_id, cls_id=frozen.cls_id)
    tokens = frozen.tokenizer.encode(text, add_special_tokens=False).ids + [frozen.sep_id]
    full_rows = len(tokens) // 31
    assert full_rows >= 3
    for row in range(full_rows):
        assert packed["segment_ids"][row].tolist() == [1] * 32
        assert packed["input_ids"][row].tolist() == [frozen.cls_id, *tokens[row * 31:(row + 1) * 31]]
