"""The training data stream on Ray Data: sample -> pack -> split, over the frozen pieces.

    pieces     the training-split documents of the mixture's sources, tokenised once per
               prepared data directory and frozen as `pieces.parquet` (`embedlab.prepared.pieces`)
    sample     `mixture.sample_schedule`: which piece comes next, by share of tokens
    pack       `map_batches(pack_window)` over windows of the schedule -> rows of L tokens
               with `segment_ids` (document boundaries) and `source_index` per position
    assign     the stream is read in global batches of W x batch_rows rows, and worker r's
               rows of each are rows r, r + W, ... (`worker_rows`). Each worker reads and packs
               only those (`WorkerSplit`): packing depends on piece lengths only, so the driver
               decides every window's fragments (`pack_fragments`, one greedy pass over the
               schedule), which fixes each window's first global row, and gives worker r the
               fragments of its rows of each window (`worker_shares`); its Dataset only expands
               those to tokens. Its k-th batch of batch_rows rows is exactly its share of
               global batch k, in order (`preserve_order`, never split by Ray Train), so which
               worker trains on which row is fixed, never decided by task timing, and a
               resumed run skips exactly the batches already consumed

Pieces are stored in a canonical order (source, doc_id, piece), so a schedule of piece
indices names the same text on every machine and run.
"""

from __future__ import annotations


from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.artifacts.sync import node_path
from embedlab.sources.mixture import Schedule
from embedlab.streams.packing import Fragments, pack_flat, pack_fragments

if TYPE_CHECKING:
    import torch

WINDOW_PIECES = 2048
DATA_ASSIGNMENT = (
    "the stream is read in global batches of W x batch_rows rows; rank r trains on rows r, r + W, ... "
    "of each and reads only those (its own Ray Dataset, split by global row index before training); "
    "a resumed run skips the global batches already consumed"
)
# A worker's window item carries its fragments as these columns (`worker_shares`); their
# columns and segment ids follow from them (`Fragments.side_by_side`), so items stay small.
FRAGMENT_COLUMNS = ("piece", "start", "length", "row")
_pieces: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def units_by_source(pieces_path: Path) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Token counts of every piece per source, and each source's first row in the file."""
    table = pq.read_table(pieces_path, columns=["source", "tokens"])
    sources = table["source"].to_numpy(zero_copy_only=False)
    tokens = table["tokens"].to_numpy()
    units: dict[str, np.ndarray] = {}
    offsets: dict[str, int] = {}
    for name in dict.fromkeys(sources.tolist()):
        rows = np.flatnonzero(sources == name)
        units[name] = tokens[rows]
        offsets[name] = int(rows[0])
    return units, offsets


def _piece_arrays(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets, token ids and word-start flags of every piece (ids and flags share offsets)."""
    if path not in _pieces:
        table = pq.read_table(node_path(path), columns=["ids", "word_start"])
        ids = table["ids"].combine_chunks()
        starts = table["word_start"].combine_chunks()
        _pieces[path] = (ids.offsets.to_numpy(), ids.values.to_numpy(), starts.values.to_numpy())
    return _pieces[path]


def pack_window(
    batch: dict[str, np.ndarray], *, pieces_path: str, sequence_length: int, pad_id: int, cls_id: int
) -> dict[str, np.ndarray]:
    """Ray Data UDF: schedule windows -> packed rows, every segment opening with CLS as
    evaluation encodes a text (`embedlab.streams.packing`): `input_ids`, `segment_ids` (0 on
    padding), `source_index` (-1 on padding) and `word_start`, each (R, L) int32.

    A window of the whole stream (`rows`: piece rows of the file, `source_index`: their
    sources, both (P,)) is packed by the greedy rule. A worker's window (`worker_shares`) also
    holds the driver's fragments of its rows (`FRAGMENT_COLUMNS`, indexing its pieces, and
    `row_count`); those are only expanded to tokens, so a worker packs only its own rows.
    """
    offsets, values, starts = _piece_arrays(pieces_path)
    rows_out: dict[str, list[np.ndarray]] = {"input_ids": [], "segment_ids": [], "source_index": [], "word_start": []}
    for item in range(len(batch["rows"])):
        piece_rows = np.asarray(batch["rows"][item], dtype=np.int64)
        if "row_count" in batch:
            fragments = Fragments.side_by_side(
                rows=int(batch["row_count"][item]), sequence_length=sequence_length, opener=True,
                **{name: np.asarray(batch[name][item], dtype=np.int64) for name in FRAGMENT_COLUMNS})
        else:
            fragments = pack_fragments(offsets[piece_rows + 1] - offsets[piece_rows],
                                       sequence_length=sequence_length, opener=True)
        layout = fragments.layout(offsets[piece_rows])
        packed = layout.packed(values, pad_id, cls_id)
        source_of = np.asarray(batch["source_index"][item], dtype=np.int32)
        rows_out["word_start"].append(layout.word_starts(starts))
        rows_out["input_ids"].append(packed.input_ids)
        rows_out["segment_ids"].append(packed.segment_ids)
        rows_out["source_index"].append(
            np.where(packed.document_index >= 0, source_of[np.maximum(packed.document_index, 0)], -1)
        )
    return {k: np.concatenate(v).astype(np.int32) for k, v in rows_out.items()}


def schedule_windows(schedule: Schedule, offsets: dict[str, int],
                     positions: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
    """The schedule (or its draws at `positions`, in that order) as windows of file rows
    (`rows`) and source indices (`source_index`), `WINDOW_PIECES` draws each: the unit one
    Ray Data task packs or tokenises."""
    rows = np.array([offsets[name] for name in schedule.sources], dtype=np.int64)[schedule.source] + schedule.item
    source = schedule.source.astype(np.int32)
    if positions is not None:
        rows, source = rows[positions], source[positions]
    return [
        {"rows": rows[i : i + WINDOW_PIECES], "source_index": source[i : i + WINDOW_PIECES]}
        for i in range(0, len(rows), WINDOW_PIECES)
    ]


@dataclass(frozen=True, kw_only=True)
class WorkerSplit:
    """Worker `rank` of `world`'s share of a stream read in global batches of `world` x
    `batch_rows` rows: global rows rank, rank + world, ... of the whole global batches, in
    stream order. Global batch k holds rows [k W B, (k + 1) W B) and W divides W B, so the
    share's k-th run of B rows is `worker_rows(global batch k, rank, world)`, row for row.
    The last partial global batch is no worker's, as `drop_last` drops it from the whole
    stream: every worker has the same number of batches."""

    rank: int
    world: int
    batch_rows: int

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world or self.batch_rows < 1:
            raise ValueError(f"WorkerSplit needs world >= 1, 0 <= rank < world and batch_rows >= 1, "
                             f"got rank {self.rank}, world {self.world}, batch_rows {self.batch_rows}")

    def stream_rows(self, total_rows: int) -> int:
        """Rows in the whole global batches of a stream of `total_rows` rows."""
        span = self.world * self.batch_rows
        return total_rows // span * span

    def keep(self, first_row: int, count: int, total_rows: int) -> np.ndarray:
        """This worker's rows among `count` consecutive stream rows from global row
        `first_row` of a stream of `total_rows` rows, as indices into those `count`."""
        stop = min(count, self.stream_rows(total_rows) - first_row)
        return np.arange((self.rank - first_row) % self.world, max(stop, 0), self.world, dtype=np.int64)


def worker_splits(world: int, batch_rows: int) -> list[WorkerSplit | None]:
    """Each of `world` workers' split of the stream; None for a single worker, which reads it whole."""
    if world == 1:
        return [None]
    return [WorkerSplit(rank=rank, world=world, batch_rows=batch_rows) for rank in range(world)]


def window_fragments(windows: list[dict[str, np.ndarray]], piece_tokens: np.ndarray,
                     sequence_length: int) -> list[Fragments]:
    """Each window's fragments as `pack_window` packs it. Packing depends on piece lengths only,
    so the pieces' token counts (`piece_tokens`, one per file row) decide it."""
    return [pack_fragments(piece_tokens[window["rows"]], sequence_length=sequence_length, opener=True)
            for window in windows]


def worker_shares(windows: list[dict[str, np.ndarray]], fragments: list[Fragments],
                  splits: list[WorkerSplit]) -> list[list[dict[str, np.ndarray]]]:
    """Each split's share of the packed stream, one item per window holding any of its rows:
    the fragments of those rows (`Fragments.in_rows`: renumbered to them, in order) as
    `FRAGMENT_COLUMNS` of (F,) int32 and `row_count`, and only the pieces they cut from
    (`rows`, `source_index`, the fragments' `piece` indexing them)."""
    counts = np.array([whole.rows for whole in fragments], dtype=np.int64)
    total = int(counts.sum())
    firsts = (np.cumsum(counts) - counts).tolist()  # each window's first global row
    shares: list[list[dict[str, np.ndarray]]] = [[] for _ in splits]
    for window, whole, first in zip(windows, fragments, firsts):
        for share, split in zip(shares, splits):
            keep = split.keep(first, whole.rows, total)
            if len(keep):
                share.append(_share_item(window, whole.in_rows(keep)))
    return shares


def _share_item(window: dict[str, np.ndarray], fragments: Fragments) -> dict[str, np.ndarray]:
    # Kept fragments come in packing order, so their pieces are already sorted.
    pieces, piece = np.unique(fragments.piece, return_inverse=True)
    fragments = replace(fragments, piece=piece)
    return {"rows": window["rows"][pieces], "source_index": window["source_index"][pieces],
            "row_count": fragments.rows,
            **{name: getattr(fragments, name).astype(np.int32) for name in FRAGMENT_COLUMNS}}


def packed_dataset(
    pieces_path: Path, schedule: Schedule, offsets: dict[str, int], *, sequence_length: int, pad_id: int,
    cls_id: int,
):
    """The Ray Dataset of packed rows for one trial, in schedule order: the whole stream."""
    return _packed(schedule_windows(schedule, offsets), pieces_path, sequence_length=sequence_length,
                   pad_id=pad_id, cls_id=cls_id)


def packed_datasets(
    pieces_path: Path, schedule: Schedule, offsets: dict[str, int], *, sequence_length: int, pad_id: int,
    cls_id: int, world: int, batch_rows: int,
) -> list:
    """One Ray Dataset per worker of `world`: worker r's packed rows (`WorkerSplit`), in
    stream order (`worker_items`)."""
    items = worker_items(pieces_path, schedule_windows(schedule, offsets), sequence_length=sequence_length,
                         world=world, batch_rows=batch_rows)
    return [_packed(share, pieces_path, sequence_length=sequence_length, pad_id=pad_id, cls_id=cls_id)
            for share in items]


def worker_items(pieces_path: Path, windows: list[dict[str, np.ndarray]], *, sequence_length: int, world: int,
                 batch_rows: int) -> list[list[dict[str, np.ndarray]]]:
    """What each of `world` workers' Dataset packs (`pack_window`), one item per window: the
    driver's fragments of the worker's rows (`worker_shares`). One worker reads the whole
    stream, so its items are the windows themselves, whose packing its Dataset's tasks decide
    (no pass on the driver)."""
    if world == 1:
        return [windows]
    tokens = pq.read_table(node_path(pieces_path), columns=["tokens"])["tokens"].to_numpy()
    return worker_shares(windows, window_fragments(windows, tokens, sequence_length), worker_splits(world, batch_rows))


def _packed(windows: list[dict[str, np.ndarray]], pieces_path: Path, *, sequence_length: int, pad_id: int,
            cls_id: int):
    import ray.data

    return ray.data.from_items(windows).map_batches(
        pack_window,
        fn_kwargs={"pieces_path": str(pieces_path), "sequence_length": sequence_length, "pad_id": pad_id,
                   "cls_id": cls_id},
        batch_size=1,
        batch_format="numpy",
        num_cpus=0.25,
    )


def worker_rows(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """Worker `rank`'s rows of a global batch: rows rank, rank + world, rank + 2 world, ..."""
    if world == 1:
        return batch
    return {name: column[rank::world].contiguous() for name, column in batch.items()}


def pack_batch(batch: pa.Table, *, sequence_length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Ray Data UDF: a batch of pieces (in order) -> packed rows, no mixture schedule."""
    ids = batch["ids"].combine_chunks()
    packed = pack_flat(ids.values.to_numpy(), ids.offsets.to_numpy(), sequence_length=sequence_length, pad_id=pad_id)
    return {"input_ids": packed.input_ids, "segment_ids": packed.segment_ids}
