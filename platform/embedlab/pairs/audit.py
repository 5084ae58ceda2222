"""A pairs table's texts as audit items, and the gate for the data a phase 2-3 trial trains on.

`pair_table_items` reads one frozen pairs table (`embedlab.pairs.table.pair_table_path`) as the
contrastive-pairs stage; `check_training_data` checks an arm's phase-1 stages and its pairs
table against one evaluation task (`embedlab.contamination.gate`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.core import timing
from embedlab.contamination.gate import final_eval, refuse_unless_disclosed
from embedlab.contamination.saved import stage_file_audit
from embedlab.contamination.stages import PAIRS_STAGE
from embedlab.prepared.audits import task_audit
from embedlab.prepared.directory import PreparedData


def pair_texts(pairs: Iterable[tuple[str, str, str]]) -> Iterator[tuple[str, str]]:
    """(pair id, query, positive) triples as items "<pair id>:query" and "<pair id>:positive"."""
    for pair_id, query, positive in pairs:
        yield f"{pair_id}:query", query
        yield f"{pair_id}:positive", positive


def pair_table_items(path: Path) -> Iterator[tuple[str, str]]:
    """The texts of one frozen pairs table (`pair_table_path`): "<row id>:query" and
    "<row id>:positive" (a user pair has a row per positive, `embedlab.pairs.readers.row_ids`),
    then a user pair's given negatives ("<row id>:negative:<i>"), when the table has that column."""
    names = pq.read_schema(path).names
    yield from table_items(pq.read_table(path, columns=["pair_id", "query", "positive",
                                                         *(["negatives"] if "negatives" in names else [])]))


def table_items(table: pa.Table) -> Iterator[tuple[str, str]]:
    """The texts of a pairs table's rows (`pair_table_items`' layout, also a frozen user pair table's)."""
    ids = table["pair_id"].to_pylist()
    yield from pair_texts(zip(ids, table["query"].to_pylist(), table["positive"].to_pylist()))
    if "negatives" in table.column_names:
        for pair_id, texts in zip(ids, table["negatives"].to_pylist()):
            for i, text in enumerate(texts):
                yield f"{pair_id}:negative:{i}", text


@timing.charged("audit")
def check_training_data(
    prepared: PreparedData, task_dir: Path, policy: str | None, progress: Callable[[str], None] = print,
    *, pairs_path: Path | None = None,
) -> list[dict]:
    """Final-eval findings of the task in the phase-1 stages of this data and, with
    `pairs_path` (a phase 2-3 trial's frozen pairs table), in its pairs; raises
    ContaminationError if any and no policy."""
    final = final_eval(task_audit(prepared, task_dir, progress))
    if pairs_path is not None:
        content = stage_file_audit(prepared.audits_dir, prepared.near_duplicate_threshold, task_dir, PAIRS_STAGE,
                                   pairs_path, pair_table_items(pairs_path), progress)
        final += final_eval(content)
    refuse_unless_disclosed(final, prepared.directory, policy)
    return final
