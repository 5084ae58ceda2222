"""A pair's negatives as a trial trains on them, and the gate for a mined set.

`pair_negatives` gives each pair its given negatives first, then mined ones that repeat no
given text: exactly what the pair stream gives training (`embedlab.streams.pair_stream`) and
what a teacher scores (`embedlab.teacher.labels`). `mined_set_items` reads a mined set's
negatives as the mined-negatives stage of the contamination audit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq

from embedlab.artifacts.sync import node_path
from embedlab.contamination.gate import check_stage_set
from embedlab.contamination.stages import MINED_STAGE
from embedlab.negatives.mining import NEGATIVES_FILE
from embedlab.prepared.directory import PreparedData
from embedlab.sources.document import normalise_text

_negative_maps: dict[str, dict[str, list[tuple[str, str]]]] = {}


def pair_negatives(pair_ids, *, negatives_path: str | None, given_negatives_path: str | None,
                   negatives_per_pair: int) -> dict[str, list[tuple[str, str]]]:
    """pair_id -> its (doc id, text) negatives as the stream gives them to training: the given
    ones, then mined ones that repeat no given text, the first `negatives_per_pair`. What a
    teacher scores (`embedlab.teacher.labels`) is exactly what a trial trains on."""
    given = _negatives(given_negatives_path) if given_negatives_path is not None else {}
    mined = _negatives(negatives_path) if negatives_path is not None else {}
    return {pair_id: _given_first(given.get(pair_id, []), mined.get(pair_id, []))[:negatives_per_pair]
            for pair_id in pair_ids}


def _given_first(given: list[tuple[str, str]], mined: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A pair's (doc id, text) negatives: its given ones, then its mined ones but those whose text
    (NFKC, whitespace and case folded) is a given one's, which would count twice."""
    seen = {normalise_text(text).casefold() for _, text in given}
    return [*given, *(n for n in mined if normalise_text(n[1]).casefold() not in seen)]


def _negatives(path: str) -> dict[str, list[tuple[str, str]]]:
    """pair_id -> [(doc_id, text)] in mined rank order, from a mined set's `negatives.parquet`."""
    if path not in _negative_maps:
        table = pq.read_table(node_path(path)).sort_by([("pair_id", "ascending"), ("rank", "ascending")])
        mapping: dict[str, list[tuple[str, str]]] = {}
        for pair_id, doc_id, text in zip(
            table["pair_id"].to_pylist(), table["doc_id"].to_pylist(), table["negative"].to_pylist()
        ):
            mapping.setdefault(pair_id, []).append((doc_id, text))
        _negative_maps[path] = mapping
    return _negative_maps[path]


def mined_set_items(directory: Path) -> Iterator[tuple[str, str]]:
    """The negative texts of one mined set (`directory/negatives.parquet`), as
    "<set>:<pair id>:<doc id>"."""
    directory = Path(directory)
    table = pq.read_table(directory / NEGATIVES_FILE, columns=["pair_id", "doc_id", "negative"])
    for pair_id, doc_id, text in zip(*(table[c].to_pylist() for c in ("pair_id", "doc_id", "negative"))):
        yield f"{directory.name}:{pair_id}:{doc_id}", text


def check_mined_negatives(
    prepared: PreparedData, task_dir: Path, mined_dir: Path, policy: str | None,
    progress: Callable[[str], None] = print,
) -> list[dict]:
    """Final-eval findings of the task in one mined set's negatives (checked after mining,
    before training on them); raises ContaminationError if any and no policy."""
    mined_dir = Path(mined_dir)
    return check_stage_set(prepared.audits_dir, prepared.near_duplicate_threshold, task_dir, MINED_STAGE, mined_dir,
                           mined_dir / NEGATIVES_FILE, mined_set_items(mined_dir), "the mined negatives", policy,
                           progress)
