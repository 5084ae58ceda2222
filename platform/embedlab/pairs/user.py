"""A user's pair sources (`DataConfig.pair_files`, `hf_pairs`, `beir_pairs`), frozen once per
prepared directory and source content, for the phase 2-3 pairs tables (`pair_stream`).

    user-pairs/<key>/pairs.parquet   every pair of every source, all splits (`USER_PAIR_SCHEMA`),
                                     one row per (query, positive) (`pair_sources.user_pair_rows`)
    user-pairs/<key>/record.json     provenance per source (paths or dataset and revision,
                                     file hashes, rights note, conventions, read counts),
                                     what was skipped, dropped and deduplicated, split counts

The pairs of all sources are read (`pair_sources.read_pairs`), exact duplicates removed and
near duplicates joined into positive groups across sources (`group_pairs`, at
`data.near_duplicate_threshold`), then split train / dev / test by group with the data's
`dev_fraction`, `test_fraction` and `split_seed` (`split_pairs`, the corpus's rule), so a
group never straddles two splits. Only the train split is ever streamed.

Why here and not in `prepare_data`: the pairs decide no byte of phase 1 (corpus, tokenizer,
pieces), so the prepared directory's key leaves them out and a phase-3 study that adds its
own pairs trains in its phase-1 parent's directory, with its tokenizer. The key of this
directory holds what decides the pairs: the source configs, each source's content revision
(file sha256; a hub dataset's revision and resolved commit), the grouping and split settings
and the code that reads them, so an edited file is read afresh and an unchanged one never.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.core.config import DataConfig
from embedlab.sources.corpus import SPLITS
from embedlab.pairs.readers import (
    PairReadStats, group_pairs, pair_source_provenance, read_pairs, split_pairs, user_pairs_to_table,
)
from embedlab.core.config.sources import SourceError
from embedlab.artifacts.build import Artifact, build_once
from embedlab.prepared.build import refresh_card
from embedlab.prepared.directory import PreparedData

FORMAT = "embedlab-user-pairs/2"  # 2: one row per (query, positive), `pair_sources.row_ids`
DIRECTORY = "user-pairs"
PAIRS_FILE = "pairs.parquet"
RECORD_FILE = "record.json"
# The code that decides the frozen pairs, hashed into the key.
CODE = ("pairs/user.py", "pairs/readers.py", "core/config/sources.py", "sources/external.py",
        "sources/dedup.py", "sources/document.py", "pairs/builders.py", "core/beir.py")
_REVISION_FIELDS = ("revision", "resolved_revision", "content_revision")


def user_pairs_artifact(config: DataConfig) -> Artifact:
    """`config`'s frozen user pairs as an artifact: the sources, their revisions (every source's
    files read and hashed), the dedup and split settings, and the code that freezes them."""
    revisions = []
    for source in config.pair_sources:
        provenance = pair_source_provenance(source)
        revisions.append({k: provenance[k] for k in _REVISION_FIELDS if k in provenance})
    inputs = {
        "format": FORMAT,
        "sources": [{"kind": type(s).__name__, **dataclasses.asdict(s)} for s in config.pair_sources],
        "revisions": revisions,
        "near_duplicate_threshold": config.near_duplicate_threshold,
        "split": {"dev_fraction": config.dev_fraction, "test_fraction": config.test_fraction,
                  "split_seed": config.split_seed},
    }
    return Artifact(kind=DIRECTORY, inputs=inputs, code=CODE)


def user_pairs_key(config: DataConfig) -> str:
    """The key of `config`'s frozen user pairs: equal sources and content, equal key."""
    return user_pairs_artifact(config).name


def user_pairs_dir(prepared: PreparedData, config: DataConfig, progress: Callable[[str], None] = print) -> Path:
    """The frozen pairs of `config`'s pair sources inside `prepared`, built on first use (once:
    `embedlab.artifacts.build`; the sweep publishes them with the prepared data)."""
    if not config.pair_sources:
        raise ValueError("the data config names no pair sources (data.pair_files, hf_pairs, beir_pairs)")
    artifact = user_pairs_artifact(config)
    directory = artifact.under(prepared.directory)
    if (directory / RECORD_FILE).is_file():
        return directory

    def build(staging: Path) -> None:
        progress(f"data: reading pair sources {', '.join(config.pair_source_names)}")
        pairs, provenance = [], []
        for source in config.pair_sources:
            stats = PairReadStats()
            read = read_pairs(source, stats=stats)
            if not read:  # frozen as 0 pairs, it would fail later as a mixture share with no items
                raise SourceError(f"pair source {source.name!r} ({getattr(source, 'path', None) or source.dataset}): "
                                  f"no pairs in {stats.records:,} records: an empty source is refused")
            pairs += read
            provenance.append(pair_source_provenance(source, stats))
        grouped = group_pairs(pairs, config.near_duplicate_threshold)
        split = split_pairs(grouped, config.dev_fraction, config.test_fraction, config.split_seed)
        record = _record(artifact.name, config, provenance, split, grouped.duplicates, pairs)
        pq.write_table(pa.concat_tables([user_pairs_to_table(split, name) for name in SPLITS]), staging / PAIRS_FILE)
        (staging / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
        counts = record["splits"]
        progress(f"data: {len(split):,} user pairs in {record['groups']:,} groups frozen in {directory} "
                 f"({sum(c['train'] for c in counts.values()):,} train, "
                 f"{sum(c['dev'] for c in counts.values()):,} dev, {sum(c['test'] for c in counts.values()):,} "
                 f"test; {len(grouped.duplicates):,} exact duplicates removed)")

    build_once(directory, build, shared=False, progress=progress)
    refresh_card(prepared, progress)
    return directory


def _record(key: str, config: DataConfig, provenance: list[dict], split, duplicates, read) -> dict[str, Any]:
    source_of = {pair.pair_id: pair.source for pair in read}
    duplicates_by_source = Counter(source_of[removed] for removed in duplicates)
    splits = {name: dict.fromkeys(SPLITS, 0) for name in config.pair_source_names}
    rows = {name: dict.fromkeys(SPLITS, 0) for name in config.pair_source_names}
    for pair in split:
        splits[pair.source][pair.split] += 1
        rows[pair.source][pair.split] += len(pair.positives)
    exclusions = []
    for entry in provenance:
        read_stats = entry["read"]
        exclusions += [{"source": entry["name"], "reason": f"pair skipped: {reason}", "count": n}
                       for reason, n in sorted(read_stats["skipped"].items())]
        exclusions += [{"source": entry["name"], "reason": f"text dropped: {reason}", "count": n}
                       for reason, n in sorted(read_stats["dropped"].items())]
        if duplicates_by_source[entry["name"]]:
            exclusions.append({"source": entry["name"], "reason": "pair removed: exact duplicate of another pair",
                               "count": duplicates_by_source[entry["name"]]})
    return {
        "format": FORMAT,
        "key": key,
        "sources": provenance,
        "splits": splits,  # pairs
        "rows": rows,  # training rows, one per (query, positive): the unit of shares and budgets
        "groups": len({pair.positive_group for pair in split}),
        "duplicates": dict(sorted(duplicates.items())),
        "exclusions": exclusions,
        "near_duplicate_threshold": config.near_duplicate_threshold,
        "split_rule": f"sha256(split_seed:positive group), dev {config.dev_fraction}, test {config.test_fraction}, "
                      f"seed {config.split_seed}; only train is streamed",
    }


def user_pair_table(directory: Path, names: list[str], split: str = "train") -> pa.Table:
    """One split's frozen pairs of the named sources, in `USER_PAIR_SCHEMA`."""
    import pyarrow.compute as pc

    table = pq.read_table(Path(directory) / PAIRS_FILE)
    keep = pc.and_(pc.equal(table["split"], split), pc.is_in(table["builder"], value_set=pa.array(names, pa.string())))
    return table.filter(keep)
