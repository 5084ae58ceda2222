"""`embedlab bench mining`: hard-negative mining on N Ray workers against one process, same run.

    embedlab bench mining [--workers 2] [--documents N] [--pairs 2000] [--preset small] [--address ADDR] [--json]

Both sides mine the same title-body pairs of the prepared corpus's training documents with the
same random-initialised parent (`bench.contrastive.write_parent`): encode the documents, the
queries and the positives, then search every query's top-k (`embedlab.negatives.mining.search_candidates`).

- reference: today's single-process mining, in this process with torch's default threads;
- embedlab: `contrastive.negatives.mining_workers = N`: the encoding as Ray Data batches over N
  encoder actors and the search over N workers (`embedlab.negatives.sharded`), timed from the
  first batch handed to Ray to the last result back, actor start-up and model loading included.

The sides alternate over `repeats` (reference first), the median of each reported; the ratio is
embedlab / reference seconds (lower is better) and `same_candidates` says whether the two found
identical scores and rows, which they must. On one node the workers share its cores with
each other and with Ray, so the ratio there shows the fixed cost of going through Ray; mining
time falls with nodes only when each worker has cores of its own (run it with `--address` on a
cluster, or on the loopback fleet, `workers/rehearse.sh`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pyarrow.compute as pc

from embedlab.bench.contrastive import write_parent
from embedlab.bench.measure import Comparison
from embedlab.checkpoints.io import checkpoint_prefixes, load_encoder
from embedlab.model.encode import encode_texts
from embedlab.negatives.mining import TRAIN_SPLIT, Candidates, search_candidates
from embedlab.negatives.sharded import WorkerCost, Workers, search_on_workers, worker_encoders
from embedlab.pairs.builders import build_pairs


@dataclass(frozen=True, kw_only=True)
class MiningBench:
    """What one bench run mines: `pairs` title-body pairs among the first `documents` training
    documents (None: all), `top_k` candidates each, with a random `preset` parent at `pair_length`,
    on `workers` Ray workers against one process, `repeats` times each."""

    workers: int = 2
    documents: int | None = None
    pairs: int = 2000
    preset: str = "small"
    top_k: int = 100
    pair_length: int = 64
    repeats: int = 1


def _one_process(parent: Path, pair_length: int) -> dict[str, Callable]:
    encoder, tokenizer, manifest = load_encoder(parent)
    prefixes, pooling = checkpoint_prefixes(manifest), manifest["pooling"]["method"]

    def encoder_for(prefix: str) -> Callable[[list[str]], np.ndarray]:
        return lambda texts: encode_texts(encoder, tokenizer, texts, max_length=pair_length, pooling=pooling,
                                          prefix=prefix)

    return {"encode": encoder_for(prefixes["passage"]), "encode_query": encoder_for(prefixes["query"])}


def _on_workers(parent: Path, pair_length: int, workers: Workers, progress) -> dict[str, Callable]:
    _, tokenizer, manifest = load_encoder(parent)
    spent = WorkerCost()
    encode, encode_query = worker_encoders(str(parent), tokenizer, max_length=pair_length,
                                           pooling=manifest["pooling"]["method"], prefixes=checkpoint_prefixes(manifest),
                                           workers=workers, cost=spent, progress=progress, label="bench mining")
    return {"encode": encode, "encode_query": encode_query,
            "search_queries": lambda docs, queries, k: search_on_workers(docs, queries, k, workers=workers, cost=spent)}


def bench_mining(prepared, bench: MiningBench = MiningBench(), progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Seconds to mine the bench's pairs on `bench.workers` Ray workers vs one process, the
    candidates' identity, and the sizes; `comparisons` as every bench reports them."""
    corpus = prepared.corpus.read()
    train = corpus.filter(pc.equal(corpus["split"], TRAIN_SPLIT))
    train = train if bench.documents is None else train.slice(0, bench.documents)
    pairs = build_pairs(train, ["title-body"], split=TRAIN_SPLIT, seed=0)[:bench.pairs]
    workers = Workers(count=bench.workers)
    with tempfile.TemporaryDirectory() as scratch:
        parent = write_parent(prepared, bench.preset, Path(scratch) / "parent")
        sides = {"reference": lambda: _one_process(parent, bench.pair_length),
                 "embedlab": lambda: _on_workers(parent, bench.pair_length, workers, progress)}
        runs: dict[str, list[float]] = {"reference": [], "embedlab": []}
        found: dict[str, Candidates] = {}
        for _ in range(bench.repeats):
            for side, functions in sides.items():
                progress(f"bench mining: {side}, {len(pairs):,} pairs over {train.num_rows:,} documents")
                started = time.perf_counter()
                found[side] = search_candidates(pairs, train, train, top_k=bench.top_k, encoder_id="bench",
                                                progress=progress, **functions())
                runs[side].append(time.perf_counter() - started)
    same = all(np.array_equal(getattr(found["embedlab"], name), getattr(found["reference"], name))
               for name in ("scores", "rows", "positive_scores"))
    comparison = Comparison(
        name=f"mining: seconds, {bench.workers} Ray workers vs one process", embedlab=median(runs["embedlab"]),
        reference=median(runs["reference"]), unit="s", better="lower",
        embedlab_measures=f"encoding as Ray Data batches over {bench.workers} encoder actors and the exact search "
                          f"over {bench.workers} workers (actor start and model loading included)",
        reference_measures="today's single-process mining: encoding and the exact search in this process",
        runs=runs)
    return {"workers": bench.workers, "documents": train.num_rows, "pairs": len(pairs), "top_k": bench.top_k,
            "preset": bench.preset, "same_candidates": bool(same), "comparisons": [comparison]}


def mining_notes(result: dict[str, Any]) -> list[str]:
    """The lines printed under the comparison: sizes, and whether both sides found the same candidates."""
    return [f"mining: {result['pairs']:,} pairs, {result['documents']:,} documents, top {result['top_k']}, "
            f"a random {result['preset']} parent; same candidates on both sides: {result['same_candidates']}"]
