"""What the false-negative rate of a mined set is measured on, and its model-free half.

`negative_sample` draws a fixed sample of a set's selected negatives: the rows ordered by (pair
id, rank), whatever order the file holds them in, and `size` of them drawn without replacement
by a generator of `seed`, so the same set and seed give the same sample anywhere. A teacher then
judges it (`embedlab.teacher.false_negatives`); `same_group` is the judgment that needs no
model: whether a negative lies in the query's own source group (the page or module its
documents were cut from, `split_group`) or near-duplicate cluster (`group_id`) of one of the
pair's documents. The mining rules drop the pair's own near-duplicate cluster, so what this
share finds is the rest of its page or module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pyarrow as pa

SAMPLE_SEED = 0  # the false-negative sample's seed: one fixed sample per set


def negative_sample(negatives: pa.Table, size: int, seed: int = SAMPLE_SEED) -> pa.Table:
    """`size` rows (all, when fewer) of a mined set's table (`NEGATIVE_SCHEMA`), drawn without
    replacement by `seed` from its rows in (pair id, rank) order, kept in that order."""
    ordered = negatives.sort_by([("pair_id", "ascending"), ("rank", "ascending")])
    if ordered.num_rows <= size:
        return ordered
    chosen = np.random.default_rng(seed).choice(ordered.num_rows, size=size, replace=False)
    return ordered.take(np.sort(chosen))


def same_group(sample: pa.Table, pair_documents: Mapping[str, Iterable[str]],
               groups: Mapping[str, tuple[str, str]]) -> list[bool | None]:
    """For each sampled negative, whether it shares a source group or near-duplicate cluster
    (`groups`: doc id -> (group_id, split_group)) with one of its pair's documents
    (`pair_documents`); None for a pair with no corpus document (a user's own pair)."""
    flags: list[bool | None] = []
    for pair_id, doc_id in zip(sample["pair_id"].to_pylist(), sample["doc_id"].to_pylist()):
        own = [groups[d] for d in pair_documents.get(pair_id, ()) if d in groups]
        if not own:
            flags.append(None)
            continue
        cluster, source = groups[doc_id]
        flags.append(any(cluster == c or source == s for c, s in own))
    return flags
