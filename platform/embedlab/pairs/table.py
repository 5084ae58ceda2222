"""The frozen pairs table of phases 2-3: every pair the builders make from the training split,
with a user's own pair sources, once per prepared data directory and builder set.

`pair_table_path` builds it (`pairs/<key>.parquet`) and the sweep records it per arm before any
trial starts (`recorded_pair_table`). The key hashes the table's format, the code that builds it
(`PAIR_SOURCES`: this module and the builders), the builder names and the user pairs' own key,
so a table frozen by other code or other inputs is rebuilt, never reused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.core.config import ConfigError, DataConfig
from embedlab.pairs.builders import PAIR_BUILDERS, PAIR_SCHEMA, Pair, build_pairs, merge_positive_groups, pairs_to_table
from embedlab.pairs.readers import USER_PAIR_SCHEMA
from embedlab.pairs.user import user_pair_table, user_pairs_dir
from embedlab.artifacts.build import Artifact, build_once
from embedlab.prepared.directory import PreparedData

# 3: USER_PAIR_SCHEMA (positives, negatives, scores) and user pair sources; 4: a user pair's every positive a row
PAIRS_FORMAT = "embedlab-pairs/4"
PAIR_SOURCES = ("pairs/builders.py", "pairs/table.py")  # the code that builds a pairs table, hashed into its key


PAIR_TABLES = "pair_tables"  # a prepared record's {pair_table_name: path in the directory}, set by the sweep


def pair_table_name(builders: list[str]) -> str:
    """The name a prepared record files a pair table under: its builders, sorted."""
    return ",".join(sorted(builders))


def recorded_pair_table(prepared: PreparedData, builders: list[str]) -> Path | None:
    """The pair table the sweep froze for these builders before any trial started (in the
    prepared record), or None for a run without one (`pair_table_path` builds it)."""
    recorded = prepared.record.get(PAIR_TABLES, {}).get(pair_table_name(builders))
    return None if recorded is None else prepared.directory / recorded


def check_pair_shares(names: Iterable[str], data: DataConfig) -> None:
    """Every name (of `contrastive.pairs`) is a built-in pair builder or one of `data`'s pair sources.

    Checked where a pairs table is frozen (`pair_table_path`), which the sweep does for every
    arm before any trial starts."""
    valid = [*PAIR_BUILDERS, *data.pair_source_names]
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise ConfigError(f"contrastive.pairs: unknown pair builder or pair source {unknown}; valid: {valid} "
                          "(the built-in builders, then the names of data.pair_files, hf_pairs and beir_pairs)")


def pair_table_path(
    prepared: PreparedData, builders: list[str], progress: Callable[[str], None] = print, *,
    data: DataConfig | None = None,
) -> Path:
    """Build (once) and freeze every pair the builders make from the training split.

    A name that is no built-in builder names one of `data`'s pair sources (a ConfigError
    lists the valid names otherwise): its train split (`embedlab.pairs.user`) joins the
    table under its own name, one row per (query, positive), positive groups merged with the
    built-in pairs' wherever the positives are the same text. The key holds the user pairs' key, so a changed file is a
    new table."""
    data = data if data is not None else DataConfig()
    check_pair_shares(builders, data)
    users = [name for name in builders if name not in PAIR_BUILDERS]
    built_in = [name for name in builders if name in PAIR_BUILDERS]
    user_dir = user_pairs_dir(prepared, data, progress) if users else None
    # The builders' code is part of the key: pairs frozen by older code are rebuilt, not reused.
    artifact = Artifact(kind="pairs", inputs={"format": PAIRS_FORMAT, "builders": sorted(builders),
                                              "user_pairs": None if user_dir is None else user_dir.name},
                        code=PAIR_SOURCES, suffix=".parquet", length=12)
    path = artifact.under(prepared.directory)
    if path.is_file():
        return path

    def build(staging: Path) -> None:
        progress(f"data: building pairs ({', '.join(builders)}) from the training split")
        pairs = build_pairs(prepared.corpus.read(split="train"), built_in, split="train", seed=0) if built_in else []
        table = builtin_pairs_table(pairs)
        if user_dir is not None:
            table = _with_user_pairs(table, user_pair_table(user_dir, users))
        table = table.sort_by([("builder", "ascending"), ("pair_id", "ascending")])
        pq.write_table(table, staging)
        progress(f"data: {table.num_rows:,} pairs frozen in {path}")

    # Published with the prepared data by the sweep, which records the table before any trial.
    return build_once(path, build, shared=False, progress=progress)


def builtin_pairs_table(pairs: list[Pair]) -> pa.Table:
    """Built-in pairs in `USER_PAIR_SCHEMA`: their one positive, no negatives, no score."""
    table = pairs_to_table(pairs)
    lists = {"positives": pa.array([[p] for p in table["positive"].to_pylist()], pa.list_(pa.string())),
             "negatives": pa.array([[] for _ in range(table.num_rows)], pa.list_(pa.string())),
             "scores": pa.array([[None] for _ in range(table.num_rows)], pa.list_(pa.float64()))}
    for name, column in lists.items():
        table = table.append_column(name, column)
    return table.cast(USER_PAIR_SCHEMA)


def _with_user_pairs(table: pa.Table, user: pa.Table) -> pa.Table:
    """Both tables as one, positive groups joined where a user positive is a built-in one's text."""
    combined = pa.concat_tables([table, user.cast(USER_PAIR_SCHEMA)])
    rows = combined.select(PAIR_SCHEMA.names).to_pylist()
    merged = merge_positive_groups([Pair(**{**row, "doc_ids": tuple(row["doc_ids"])}) for row in rows], {})
    index = combined.schema.get_field_index("positive_group")
    return combined.set_column(index, "positive_group", pa.array([p.positive_group for p in merged], pa.string()))


def group_positive_texts(pairs_path: Path) -> dict[str, list[str]]:
    """Positive group -> every positive of its rows in a frozen pairs table (a user pair's
    `positives` included), for mining's positive-text rule (`mining.mine_hard_negatives`)."""
    table = pq.read_table(pairs_path, columns=["positive_group", "positive", "positives"])
    texts: dict[str, set[str]] = {}
    for group, positive, positives in zip(*(table[c].to_pylist() for c in table.column_names)):
        texts.setdefault(group, set()).update([positive, *positives])
    return {group: sorted(found) for group, found in texts.items()}
