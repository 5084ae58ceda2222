"""Cut tokenised documents into pieces and pack pieces into rows that keep boundaries.

Each document becomes its tokens followed by SEP (the boundary token), cut into pieces
of at most `sequence_length` tokens (`chunk_document`); a document longer than that is
never truncated, it continues in further pieces (each its own attention segment), and
the share of such documents is recorded as the truncation frequency. Rows of length
`sequence_length` are filled greedily in order; a piece that does not fit the rest of a
row continues in the next row as a new segment, unless fewer than `min_fragment`
positions are left, in which case the row is padded instead (a two-token fragment
teaches nothing). `segment_ids` number the segments inside a row from 1 and mark padding
with 0; the encoder restricts attention and restarts RoPE positions per segment, so no
token ever sees another document.

With an opener (`pack_layout(..., opener=True)`, phase 1's stream: CLS), every segment
starts with that token at its position 0, so a document trains in the layout evaluation
encodes it in, `[CLS] tokens [SEP]`; the opener takes a position of the row and is a
special token, never selected for masking. Phase 1's pieces are cut one position shorter
than a row (`embedlab.data.stream.tokenize_pieces`), so a full piece and its CLS fill a row
exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np


OPENER_POSITIONS = 1  # positions an opened segment spends on its opener (CLS)


@dataclass(frozen=True)
class PackedRows:
    """`input_ids` and `segment_ids`, both (R, L) int32; `document_index` (R, L) int32, -1 on PAD."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    document_index: np.ndarray

    @property
    def non_padding_tokens(self) -> int:
        return int((self.segment_ids > 0).sum())

    @property
    def efficiency(self) -> float:
        """Non-padding share of all positions."""
        return self.non_padding_tokens / max(self.segment_ids.size, 1)


def chunk_document(tokens: list[int], *, sequence_length: int, sep_id: int) -> list[list[int]]:
    """A document's tokens + SEP cut into consecutive pieces of at most `sequence_length`."""
    stream = list(tokens) + [sep_id]
    return [stream[i : i + sequence_length] for i in range(0, len(stream), sequence_length)]


def pack_documents(
    documents: Iterable[list[int]],
    *,
    sequence_length: int,
    sep_id: int,
    pad_id: int,
    min_fragment: int = 8,
) -> PackedRows:
    """Greedy boundary-preserving packing of token lists (without SEP) into (R, L) rows."""
    return pack_pieces(
        (list(tokens) + [sep_id] for tokens in documents),
        sequence_length=sequence_length, pad_id=pad_id, min_fragment=min_fragment,
    )


def pack_pieces(
    pieces: Iterable[list[int]],
    *,
    sequence_length: int,
    pad_id: int,
    min_fragment: int = 8,
) -> PackedRows:
    """Greedy packing of token pieces (boundary tokens already in place) into (R, L) rows;
    `document_index` holds each position's piece index in `pieces`."""
    values, offsets = flatten_pieces(pieces)
    return pack_flat(values, offsets, sequence_length=sequence_length, pad_id=pad_id, min_fragment=min_fragment)


def flatten_pieces(pieces: Iterable[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Pieces as one flat int64 array and offsets (piece k is `values[offsets[k]:offsets[k + 1]]`)."""
    arrays = [np.asarray(piece, dtype=np.int64) for piece in pieces]
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    return values, np.concatenate([[0], np.cumsum(lengths)])


@dataclass(frozen=True)
class PackLayout:
    """Where greedy packing puts every token: it depends on piece lengths only, so any array
    aligned with the tokens (ids, word-start flags) packs by the same layout."""

    rows: int
    sequence_length: int
    source: np.ndarray  # (N,) each placed token's index in the flat values
    target: np.ndarray  # (N,) its flat position in the (rows, sequence_length) output
    segment: np.ndarray  # (N,) its segment id inside its row, from 1
    piece: np.ndarray  # (N,) its piece's index in packing order
    # With an opener: one per segment, its flat position, segment id and piece (else empty).
    opener_target: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    opener_segment: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    opener_piece: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def place(self, values: np.ndarray, fill: int, opener: int | np.ndarray | None = None) -> np.ndarray:
        """(rows, L) int32: `values` (one per placed token) at their positions, `opener` (one
        value, or one per segment) at the segments' opening positions, `fill` elsewhere."""
        out = np.full((self.rows, self.sequence_length), fill, dtype=np.int32)
        flat = out.reshape(-1)
        flat[self.target] = values
        if len(self.opener_target):
            if opener is None:
                raise ValueError("this layout opens every segment with a token: give its value")
            flat[self.opener_target] = opener
        return out

    def packed(self, values: np.ndarray, pad_id: int, opener_id: int | None = None) -> PackedRows:
        """The flat token `values` packed: ids, segment ids and piece index per position."""
        return PackedRows(input_ids=self.place(values[self.source], pad_id, opener_id),
                          segment_ids=self.place(self.segment, 0, self.opener_segment),
                          document_index=self.place(self.piece, -1, self.opener_piece))

    def word_starts(self, starts: np.ndarray) -> np.ndarray:
        """Flat word-start flags packed like their tokens. A piece split across rows starts a
        word (and a segment) where the next row begins, so every row's first flag is set; an
        opener is a word of its own, and so is the token after it."""
        flags = self.place(starts[self.source], 1, 1)
        if len(self.opener_target):
            flags.reshape(-1)[self.opener_target + 1] = 1  # every segment has a token after its opener
        flags[:, 0] = 1
        return flags


def pack_layout(
    offsets: np.ndarray, *, sequence_length: int, min_fragment: int = 8, pieces: np.ndarray | None = None,
    opener: bool = False,
) -> PackLayout:
    """The greedy layout of the pieces given by `offsets` (or the `pieces`-selected ones, in
    that order), as Arrow list columns hold them; with `opener`, every segment (every
    fragment of a piece) opens with one extra position for the opener token.

    Which fragment of which piece goes to which row, column and segment is decided in a loop
    over pieces; the per-token indices are then built with array operations, so moving the
    tokens costs numpy's time per token, not Python's.
    """
    order = np.arange(len(offsets) - 1) if pieces is None else np.asarray(pieces, dtype=np.int64)
    starts, lengths = offsets[order], offsets[order + 1] - offsets[order]
    extra = OPENER_POSITIONS if opener else 0
    if sequence_length <= extra:
        raise ValueError(f"sequence_length {sequence_length}: no room for a token after the opener")
    frag_src, frag_len, frag_dst, frag_seg, frag_piece, opened = [], [], [], [], [], []
    row = fill = segment = 0
    for index, (source, remaining) in enumerate(zip(starts.tolist(), lengths.tolist())):
        while remaining:
            space = sequence_length - fill
            if space <= extra or space < min(min_fragment, remaining + extra):
                row, fill, segment = row + 1, 0, 0  # pad the rest of the row
                continue
            take = min(space - extra, remaining)
            segment += 1
            if opener:
                opened.append((row * sequence_length + fill, segment, index))
                fill += 1
            frag_src.append(source)
            frag_len.append(take)
            frag_dst.append(row * sequence_length + fill)
            frag_seg.append(segment)
            frag_piece.append(index)
            fill, source, remaining = fill + take, source + take, remaining - take
            if fill == sequence_length:
                row, fill, segment = row + 1, 0, 0
    frag_len_array = np.asarray(frag_len, dtype=np.int64)
    before = np.cumsum(frag_len_array) - frag_len_array  # tokens placed before each fragment
    within = np.arange(int(frag_len_array.sum())) - np.repeat(before, frag_len_array)

    def per_token(values: list[int]) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=np.int64), frag_len_array)

    openers = np.asarray(opened, dtype=np.int64).reshape(-1, 3)
    return PackLayout(rows=row + (fill > 0), sequence_length=sequence_length,
                      source=per_token(frag_src) + within, target=per_token(frag_dst) + within,
                      segment=per_token(frag_seg), piece=per_token(frag_piece),
                      opener_target=openers[:, 0], opener_segment=openers[:, 1], opener_piece=openers[:, 2])


def pack_flat(
    values: np.ndarray,
    offsets: np.ndarray,
    *,
    sequence_length: int,
    pad_id: int,
    min_fragment: int = 8,
    pieces: np.ndarray | None = None,
) -> PackedRows:
    """`pack_pieces` over pieces given as one flat token array and offsets (`pack_layout`)."""
    layout = pack_layout(offsets, sequence_length=sequence_length, min_fragment=min_fragment, pieces=pieces)
    return layout.packed(values, pad_id)
