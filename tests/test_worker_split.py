"""Each worker reads only its own rows (`embedlab.streams.packed.WorkerSplit`): worker r's stream is
exactly the rows `worker_rows` took from every global batch of the whole stream, in the same
order, for packed phase-1 rows and tokenised pairs; a phase-1 worker packs only its own rows'
tokens; the shares are disjoint, cover the whole global batches, repeat run for run, and a
resumed worker reads the tail of its own share."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embedlab.sources.mixture import Schedule, sample_schedule
from embedlab.streams import packed as stream
from embedlab.streams.pair_stream import pair_windows, tokenize_pair_window
from embedlab.streams.packed import (
    WorkerSplit, pack_window, schedule_windows, worker_items, worker_rows,
)
from embedlab.train.session import LocalSession

import synthetic

LENGTH = 16  # phase-1 row length of the synthetic pieces
CLS = 1  # the opener `packed` packs with; the pieces' ids are 5 and up
WORLDS = [1, 2, 3, 4]


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of 5 draws, so a window's rows start at every offset modulo the world size."""
    monkeypatch.setattr(stream, "WINDOW_PIECES", 5)


@pytest.fixture(scope="module")
def pieces(tmp_path_factory) -> Path:
    """A pieces table as `build_pieces` freezes one (ids, word-start flags, token counts), with
    pieces from 1 token to a whole row's worth."""
    generator = np.random.default_rng(5)
    tokens = generator.integers(1, LENGTH, 60).astype(np.int32)
    ids = [generator.integers(5, 300, n).astype(np.int32) for n in tokens]
    starts = [generator.integers(0, 2, n).astype(np.int8) for n in tokens]
    path = tmp_path_factory.mktemp("pieces") / "pieces.parquet"
    pq.write_table(pa.table({"ids": pa.array(ids, pa.list_(pa.int32())), "word_start": pa.array(starts, pa.list_(pa.int8())),
                             "tokens": pa.array(tokens)}), path)
    return path


def schedule_of(draws: int, seed: int = 0) -> tuple[Schedule, dict[str, int]]:
    """Draws from two sources of 30 pieces each (file rows 0-29 and 30-59)."""
    generator = np.random.default_rng(seed)
    source = generator.integers(0, 2, draws).astype(np.int16)
    return Schedule(sources=("a", "b"), source=source, item=generator.integers(0, 30, draws),
                    units=np.ones(draws, dtype=np.int64), version="test", seed=seed), {"a": 0, "b": 30}


def packed(windows: list[dict[str, np.ndarray]], path: Path) -> dict[str, torch.Tensor]:
    """The windows packed one per task, as the Ray Dataset packs them, as one table of rows."""
    parts = [pack_window({k: [v] for k, v in window.items()}, pieces_path=str(path), sequence_length=LENGTH,
                         pad_id=0, cls_id=CLS) for window in windows]
    return {k: torch.as_tensor(np.concatenate([part[k] for part in parts])).long() for k in parts[0]}


def split_items(path: Path, world: int, batch_rows: int, draws: int = 80) -> list[list[dict[str, np.ndarray]]]:
    """Every worker's window items of the test schedule, as its Dataset packs them."""
    return worker_items(path, schedule_windows(*schedule_of(draws)), sequence_length=LENGTH, world=world,
                        batch_rows=batch_rows)


def whole_stream_shares(rows: dict[str, torch.Tensor], world: int, batch_rows: int, root: Path) -> list[list[dict]]:
    """Every worker's batches as they were taken before the split: the whole stream in global
    batches of world x batch_rows rows, `worker_rows` of each."""
    batches = list(LocalSession(rows, root).global_batches(world * batch_rows))
    return [[worker_rows(batch, rank, world) for batch in batches] for rank in range(world)]


def in_batches(rows: dict[str, torch.Tensor], batch_rows: int) -> list[dict[str, torch.Tensor]]:
    total = len(next(iter(rows.values())))
    assert total % batch_rows == 0  # a worker's share is whole batches only
    return [{k: v[i : i + batch_rows] for k, v in rows.items()} for i in range(0, total, batch_rows)]


def same_batches(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("batch_rows", [1, 3])
def test_split_rows_are_each_global_batchs_worker_rows_and_partition_it(world, batch_rows, tmp_path):
    """For every stream length, worker r's share in batches of batch_rows is `worker_rows` of
    each global batch, the shares are disjoint and their union is the whole global batches."""
    for total in range(0, 3 * world * batch_rows + 2):
        rows = {"index": torch.arange(total)}
        old = whole_stream_shares(rows, world, batch_rows, tmp_path)
        shares = [WorkerSplit(rank=rank, world=world, batch_rows=batch_rows).keep(0, total, total)
                  for rank in range(world)]
        for rank, share in enumerate(shares):
            assert same_batches(in_batches({"index": torch.as_tensor(share)}, batch_rows), old[rank])
        union = np.sort(np.concatenate(shares))
        assert np.array_equal(union, np.arange(total // (world * batch_rows) * world * batch_rows))


@pytest.mark.parametrize("world", WORLDS)
def test_each_workers_packed_stream_is_its_rows_of_the_whole_one(world, pieces, small_windows, tmp_path):
    """Phase 1: worker r's items, packed, are row for row (ids, segments, sources, word starts)
    its `worker_rows` of every global batch of the whole packed stream, with windows starting
    at every row offset modulo the world; together the workers hold each of its rows once."""
    path = pieces
    batch_rows = 2
    windows = schedule_windows(*schedule_of(80))
    whole = packed(windows, path)
    old = whole_stream_shares(whole, world, batch_rows, tmp_path)
    assert len(old[0]) >= 3  # several global batches, with windows straddling them
    counts = np.array([len(packed([w], path)["input_ids"]) for w in windows])
    assert set((np.cumsum(counts) - counts) % world) == set(range(world))
    shares = [packed(mine, path) for mine in split_items(path, world, batch_rows)]
    if world == 1:  # one worker reads the whole stream, to its last partial batch
        assert all(torch.equal(shares[0][k], whole[k]) for k in whole)
    else:
        for rank, rows in enumerate(shares):
            assert same_batches(in_batches(rows, batch_rows), old[rank])
        # `worker_rows` partitions each global batch, so equal shares are disjoint; and they add up.
        assert sum(len(rows["input_ids"]) for rows in shares) == len(old[0]) * world * batch_rows


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_worker_packs_only_its_own_rows(world, pieces, small_windows):
    """A worker's items hold the fragments of its rows only: their tokens are exactly its
    rows' non-padding tokens beside their CLS, and in those rows every row's first word-start
    flag is set, so is the token's after each CLS, and `source_index` is -1 exactly on padding."""
    path = pieces
    for mine in split_items(path, world, batch_rows=2):
        rows = packed(mine, path)
        real = rows["segment_ids"] > 0
        opener = rows["input_ids"] == CLS
        assert sum(int(item["length"].sum()) for item in mine) == int((real & ~opener).sum())
        assert any((item["start"] > 0).any() for item in mine)  # pieces continued from an earlier row
        assert sum(item["row_count"] for item in mine) == len(rows["input_ids"])
        assert torch.equal(rows["source_index"] == -1, ~real)
        assert (rows["word_start"][:, 0] == 1).all()
        after = torch.roll(opener, 1, dims=1)
        assert (rows["word_start"][after] == 1).all() and not after[:, 0].any()


@pytest.mark.parametrize("world", [2, 3])
def test_each_workers_pair_stream_is_its_rows_of_the_whole_one(world, frozen, tmp_path):
    """Phases 2-3: worker r tokenises only its draws, and they are row for row its
    `worker_rows` of every global batch of the whole tokenised stream."""
    table = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"pair_id": f"p{i:03d}", "query": synthetic.TEXTS[i], "positive": synthetic.TEXTS[i + 1],
         "positive_group": f"g{i // 2}"} for i in range(40)]), table)
    schedule = sample_schedule({"all": np.ones(40, dtype=np.int64)}, {"all": 1.0}, target_units=70, max_epochs=2,
                               seed=1)
    batch_rows = 3

    def tokenised(windows) -> dict[str, torch.Tensor]:
        parts = [tokenize_pair_window({k: [v] for k, v in w.items()}, pairs_path=str(table),
                                      tokenizer_path=str(frozen.path), length=16, query_prefix="query: ",
                                      passage_prefix="passage: ", negatives_path=None, negatives_per_pair=0)
                 for w in windows]
        return {k: torch.as_tensor(np.concatenate([p[k] for p in parts])).long() for k in parts[0]}

    old = whole_stream_shares(tokenised(pair_windows(schedule, {"all": 0})), world, batch_rows, tmp_path)
    for rank in range(world):
        mine = tokenised(pair_windows(schedule, {"all": 0}, WorkerSplit(rank=rank, world=world, batch_rows=batch_rows)))
        assert same_batches(in_batches(mine, batch_rows), old[rank])


def test_the_split_repeats_run_for_run_and_a_resumed_worker_reads_its_tail(pieces, small_windows, tmp_path):
    """Built twice from the same schedule (two runs, or a restarted worker group), every
    worker's windows and packed rows are identical; and a worker resumed after k global
    batches, skipping k of its own batches as the loop does, reads exactly the uninterrupted
    run's batches from k on."""
    path = pieces
    world, batch_rows, consumed = 3, 2, 2
    first, second = split_items(path, world, batch_rows), split_items(path, world, batch_rows)
    for a, b in zip(first, second):
        assert len(a) == len(b) and all(x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
                                        for x, y in zip(a, b))
    old = whole_stream_shares(packed(schedule_windows(*schedule_of(80)), path), world, batch_rows, tmp_path)
    for rank in range(world):
        uninterrupted = in_batches(packed(first[rank], path), batch_rows)
        resumed = list(itertools.islice(iter(in_batches(packed(second[rank], path), batch_rows)), consumed, None))
        assert len(resumed) == len(uninterrupted) - consumed > 0
        assert same_batches(resumed, uninterrupted[consumed:]) and same_batches(resumed, old[rank][consumed:])


def test_local_sessions_deal_the_split(tmp_path):
    """The in-process session the training oracles run on reads each rank's rows through the
    same split: its worker batches are `worker_rows` of its global batches."""
    rows = {"index": torch.arange(23), "twice": 2 * torch.arange(23)}
    for world in (1, 2, 3):
        old = whole_stream_shares(rows, world, 3, tmp_path)
        for rank in range(world):
            session = LocalSession(rows, tmp_path, rank=rank, world=world)
            assert same_batches(list(session.worker_batches(3)), old[rank])


def test_split_refuses_a_rank_outside_the_world():
    """A rank must name one of the workers; the error says which values were given."""
    with pytest.raises(ValueError, match="rank 2, world 2"):
        WorkerSplit(rank=2, world=2, batch_rows=4)


# Real Ray (the session's one cluster): the Datasets training reads, through Ray Data.

@pytest.mark.timeout(300)
def test_ray_worker_datasets_are_the_whole_streams_worker_rows(ray_session, prepared):
    """The phase-1 Datasets `trial_streams` builds for 3 workers, read through Ray Data as a
    worker reads its own, are row for row its `worker_rows` of the whole packed stream."""
    from embedlab.streams.packed import packed_dataset
    from embedlab.train.phase1 import trial_schedule, trial_streams
    from embedlab.train.session import DatasetSession

    from conftest import tiny_budget, tiny_trial

    trial = tiny_trial(num_workers=3, batch_rows=4, budget=tiny_budget(tokens=20_000))
    schedule, offsets = trial_schedule(trial, prepared)
    whole = packed_dataset(prepared.pieces_path, schedule, offsets, sequence_length=trial.data.sequence_length,
                           pad_id=prepared.tokenizer.pad_id, cls_id=prepared.tokenizer.cls_id)
    global_batches = list(DatasetSession(whole).worker_batches(3 * 4))
    assert len(global_batches) >= 3
    for rank, dataset in enumerate(trial_streams(trial, prepared, schedule, offsets)):
        mine = list(DatasetSession(dataset).worker_batches(4))
        assert same_batches(mine, [worker_rows(batch, rank, 3) for batch in global_batches])
