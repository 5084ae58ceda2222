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
than a row (`embedlab.prepared.pieces.tokenize_pieces`), so a full piece and its CLS fill a row
exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from embedlab.prepared.pieces import OPENER_POSITIONS


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


@dataclass(frozen=True)
class Fragments:
    """Greedy packing's decision: where each fragment (the part of a piece that one row holds,
    one segment) goes. It depends on piece lengths only. One entry per fragment, in packing
    order; every array (F,) int64."""

    rows: int
    sequence_length: int
    opener: bool  # every fragment opens with an opener token, at `column - 1`
    piece: np.ndarray  # its piece's index among the packed pieces
    start: np.ndarray  # its first token's position within its piece
    length: np.ndarray  # its tokens
    row: np.ndarray
    column: np.ndarray  # its first token's column (after its opener)
    segment: np.ndarray  # its segment id inside its row, from 1

    @classmethod
    def side_by_side(cls, *, piece: np.ndarray, start: np.ndarray, length: np.ndarray, row: np.ndarray, rows: int,
                     sequence_length: int, opener: bool) -> Fragments:
        """Fragments in packing order (`row` nondecreasing, every row of `rows` holding one): a
        row holds its fragments side by side from column 0, each after its opener, so each
        one's column and segment follow from the fragments before it in its row."""
        index = np.arange(len(row))
        opens_row = np.ones(len(row), dtype=bool)
        opens_row[1:] = row[1:] != row[:-1]
        row_first = np.maximum.accumulate(np.where(opens_row, index, 0))  # the first fragment of each one's row
        extra = OPENER_POSITIONS if opener else 0
        width = length + extra  # positions a fragment takes in its row
        before = np.cumsum(width) - width  # positions taken before each fragment, rows laid end to end
        return cls(rows=rows, sequence_length=sequence_length, opener=opener, piece=piece, start=start, length=length,
                   row=row, column=before - before[row_first] + extra, segment=index - row_first + 1)

    def in_rows(self, keep: np.ndarray) -> Fragments:
        """The fragments of rows `keep` (increasing row indices), renumbered so that row keep[i]
        becomes row i. Rows are independent (segments, openers and word starts never cross
        one), so these expand to exactly the kept rows of the whole layout."""
        renumbered = np.full(self.rows, -1, dtype=np.int64)
        renumbered[keep] = np.arange(len(keep))
        row = renumbered[self.row]
        mine = row >= 0
        return Fragments(rows=len(keep), sequence_length=self.sequence_length, opener=self.opener,
                         piece=self.piece[mine], start=self.start[mine], length=self.length[mine], row=row[mine],
                         column=self.column[mine], segment=self.segment[mine])

    def layout(self, piece_starts: np.ndarray) -> PackLayout:
        """The per-token layout, `piece_starts[p]` the flat index of piece p's first token in the
        values: array operations over the tokens, so moving them costs numpy's time per token,
        not Python's."""
        before = np.cumsum(self.length) - self.length  # tokens placed before each fragment
        within = np.arange(int(self.length.sum())) - np.repeat(before, self.length)
        target = self.row * self.sequence_length + self.column
        opened = slice(None) if self.opener else slice(0)

        def per_token(values: np.ndarray) -> np.ndarray:
            return np.repeat(values, self.length)

        return PackLayout(rows=self.rows, sequence_length=self.sequence_length,
                          source=per_token(piece_starts[self.piece] + self.start) + within,
                          target=per_token(target) + within, segment=per_token(self.segment),
                          piece=per_token(self.piece), opener_target=target[opened] - OPENER_POSITIONS,
                          opener_segment=self.segment[opened], opener_piece=self.piece[opened])


def pack_fragments(lengths: np.ndarray, *, sequence_length: int, min_fragment: int = 8,
                   opener: bool = False) -> Fragments:
    """Greedy packing of pieces of these lengths, in order, into rows of `sequence_length`; with
    `opener`, every fragment takes one extra position for the opener token before its tokens.

    A piece that does not fit the rest of a row fills it and continues in the next row as a new
    fragment, unless fewer than `min_fragment` positions are left (or only the opener's): then
    the row is padded and the piece starts the next. This is packing's only loop over pieces,
    and it records only each fragment's length and where rows close; the other per-fragment
    arrays follow from those with array operations (`Fragments.side_by_side`).
    """
    extra = OPENER_POSITIONS if opener else 0
    if sequence_length <= extra:
        raise ValueError(f"sequence_length {sequence_length}: no room for a token after the opener")
    lengths = np.asarray(lengths, dtype=np.int64)
    takes: list[int] = []  # each fragment's tokens
    row_ends: list[int] = []  # fragments placed when each row closed
    fill = 0
    for remaining in lengths.tolist():
        while remaining:
            space = sequence_length - fill
            # An empty row is never padded: the next one would have no more room.
            if fill and (space <= extra or space < min(min_fragment, remaining + extra)):
                row_ends.append(len(takes))  # pad the rest of the row
                fill = 0
                continue
            take = min(space - extra, remaining)
            takes.append(take)
            fill, remaining = fill + extra + take, remaining - take
            if fill == sequence_length:
                row_ends.append(len(takes))
                fill = 0
    length = np.asarray(takes, dtype=np.int64)
    # Laid end to end, the fragments' tokens are the pieces' tokens: a fragment is the piece's
    # that holds its first token.
    first_token = np.cumsum(length) - length
    piece_ends = np.cumsum(lengths)
    piece = np.searchsorted(piece_ends, first_token, side="right")
    row = np.searchsorted(np.asarray(row_ends, dtype=np.int64), np.arange(len(length)), side="right")
    return Fragments.side_by_side(piece=piece, start=first_token - (piece_ends - lengths)[piece], length=length,
                                  row=row, rows=len(row_ends) + (fill > 0), sequence_length=sequence_length,
                                  opener=opener)


def pack_layout(
    offsets: np.ndarray, *, sequence_length: int, min_fragment: int = 8, pieces: np.ndarray | None = None,
    opener: bool = False,
) -> PackLayout:
    """The greedy layout (`pack_fragments`) of the pieces given by `offsets` (or the
    `pieces`-selected ones, in that order), as Arrow list columns hold them; with `opener`,
    every segment (every fragment of a piece) opens with one extra position for the opener
    token."""
    order = np.arange(len(offsets) - 1) if pieces is None else np.asarray(pieces, dtype=np.int64)
    starts = np.asarray(offsets[order], dtype=np.int64)
    fragments = pack_fragments(offsets[order + 1] - starts, sequence_length=sequence_length,
                               min_fragment=min_fragment, opener=opener)
    return fragments.layout(starts)


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
