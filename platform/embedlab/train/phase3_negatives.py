"""Phase 3's negatives, made on the trial driver before its workers start.

Mined ones (`mine_for_phase3`: the parent encoder over the prepared corpus's training
split) and a user source's given ones screened under the parent encoder
(`given_negatives_for_phase3`), each set cached by version under the prepared data and
published to every node; what making a set cost is read back by `mining_compute`, the
screened set's counts by `given_negative_counts`. `embedlab.train.contrastive.run_contrastive`
calls them and passes the sets' paths to the pair stream; the workers only read them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from embedlab.config import TrialConfig
from embedlab.data.mining import (
    GIVEN_FORMAT, NEGATIVES_FILE, GivenPair, MiningConfig, mine_hard_negatives, mining_version, pairs_digest,
    screen_given_negatives, write_text_atomically,
)
from embedlab.data.pairs_table import group_positive_texts
from embedlab.data.prepare import code_revision
from embedlab.data.pairs import PAIR_BUILDERS, PAIR_SCHEMA, Pair
from embedlab.data.prepared_sync import node_path, publish_subtree
from embedlab.evaluate.checkpoint_eval import checkpoint_prefixes
from embedlab.evaluate.encode import encode_texts
from embedlab.store import file_sha256
from embedlab.train.checkpoint import load_encoder, verify_checkpoint
from embedlab.train.flops import FlopTally

# File names of the cached sets' layout, fixed rather than settings: every trial and node that
# needs a set looks for the one a trial before it wrote, under these names.
GIVEN_MANIFEST = "manifest.json"  # a screened set's identity and counts, written last: it marks the set complete
MINING_COST_FILE = "compute.json"  # what encoding a set cost, in mined and screened sets (`mining_compute`)
# The code that decides a mined or screened set beyond its inputs: the rules, the encoding
# (tokenising, the encoder's forward, pooling) and the search. Hashed into the sets' versions.
MINING_CODE = (
    "data/mining.py", "data/document.py", "train/phase3_negatives.py", "evaluate/encode.py", "evaluate/retrieval.py",
    "model/encoder.py", "model/pooling.py", "tokenizer/frozen.py",
)


def scheduled_rows(pairs_path: Path, schedule, offsets, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """The distinct pairs-table rows the schedule reads, in table order."""
    rows = np.unique(np.array([offsets[n] for n in schedule.sources], dtype=np.int64)[schedule.source] + schedule.item)
    return pq.read_table(pairs_path, columns=columns).take(rows).to_pylist()


@dataclass
class _ParentEncoder:
    """The parent encoder as `encode(texts)` (passages) and `encode_query(texts)` for mining and
    screening, each with the parent's prefix, with its FLOPs and clocks."""

    encode: Any
    encode_query: Any
    manifest: dict[str, Any]
    device: str
    tally: FlopTally
    cpu: float = field(default_factory=time.thread_time)
    wall: float = field(default_factory=time.perf_counter)

    def cost(self) -> dict[str, Any]:
        return {"flops": self.tally.flops, "seconds": time.thread_time() - self.cpu,
                "wall_seconds": time.perf_counter() - self.wall,
                "clock": "thread-cpu of the trial driver (encoding and the Faiss search)", "device": self.device}


def _parent_encoder(trial: TrialConfig, progress, label: str) -> _ParentEncoder:
    encoder, tokenizer, manifest = load_encoder(trial.parent)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    encoder.to(device)
    tally = FlopTally()
    prefixes = checkpoint_prefixes(manifest)
    encode = partial(encode_texts, encoder, tokenizer, max_length=trial.contrastive.pair_length,
                     pooling=manifest["pooling"]["method"], progress=progress, tally=tally, device=device)
    return _ParentEncoder(encode=partial(encode, prefix=prefixes["passage"], label=f"{label} passages"),
                          encode_query=partial(encode, prefix=prefixes["query"], label=f"{label} queries"),
                          manifest=manifest, device=device, tally=tally)



def _parent_identity(trial: TrialConfig) -> tuple[str, dict[str, Any]]:
    """The parent's content hash and how mining and screening run it (`_parent_encoder`), as
    the sets' versions record them: the encode length, the parent's pooling and the code."""
    manifest = verify_checkpoint(trial.parent)
    encoding = {"max_length": trial.contrastive.pair_length, "pooling": manifest["pooling"]["method"],
                "prefixes": checkpoint_prefixes(manifest), "code": code_revision(sources=MINING_CODE)}
    return manifest["content_hash"], encoding


def mine_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets, progress=print) -> Path:
    """Mine hard negatives for the scheduled pairs with the parent encoder (cached by version).

    The candidate pool is the prepared corpus's training split; known positives, their
    near-duplicate groups and every recipe-dev / final-eval document are never negatives.
    A user's own pairs (their builder no built-in one) have no corpus documents: they are
    mined with `outside_corpus` (`embedlab.data.mining.mine_hard_negatives`).
    The encoder runs on CUDA when this process sees a GPU (on a GPU cluster the sweep gives a
    mining trial's driver a GPU share: `embedlab.sweep.cluster.trial_driver_resources`).
    """
    table = scheduled_rows(pairs_path, schedule, offsets, PAIR_SCHEMA.names)
    pairs = [Pair(**{**row, "doc_ids": tuple(row["doc_ids"])}) for row in table]
    outside = frozenset(p.pair_id for p in pairs if p.builder not in PAIR_BUILDERS)
    config = MiningConfig(negatives_per_query=trial.contrastive.hard_negatives,
                          top_k=trial.contrastive.mining_top_k, false_negative_margin=trial.contrastive.mining_margin)
    encoder_id, encoding = _parent_identity(trial)
    # Every positive of each row's group, rows the schedule does not read included.
    group_positives = group_positive_texts(pairs_path)
    version = mining_version(encoder_id=encoder_id, corpus_revision=prepared.data_revision, config=config,
                             pair_ids=[p.pair_id for p in pairs], pairs_digest=pairs_digest(pairs, group_positives),
                             encoding=encoding)
    directory = prepared.directory / "mined" / version[:16]
    node_path(directory)  # on a cluster with remote storage: another node's published set, fetched
    if not (directory / "manifest.json").is_file():
        parent = _parent_encoder(trial, progress, "mining: encoding")
        mined = mine_hard_negatives(pairs, prepared.corpus.read(), parent.encode, encode_query=parent.encode_query,
                                    config=config,
                                    encoder_id=encoder_id, corpus_revision=prepared.data_revision,
                                    progress=progress, outside_corpus=outside, group_positives=group_positives,
                                    encoding=encoding)
        # The report and the cost first, the set last (its manifest marks it complete): a
        # trial that finds the manifest finds them too. Each file is staged under its
        # writer's own name, as trials needing the same set may mine it at once.
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomically(directory / "report.md", mined.report())
        write_text_atomically(directory / MINING_COST_FILE, json.dumps(parent.cost(), indent=2, sort_keys=True))
        mined.save(directory)
        progress(f"mining: {len(pairs):,} pairs, negatives in {directory} (version {version[:16]}) on "
                 f"{parent.device}, {parent.tally.flops:.3g} encode FLOPs")
        publish_subtree(directory)  # every node's trials read the same set
    return directory


def given_negatives_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets,
                               progress=print) -> Path | None:
    """The scheduled pairs' given negatives (a user source's own), screened by the false-negative
    margin under the parent encoder (`contrastive.given_negative_margin`), in
    `given-negatives/<version>/` (negatives.parquet in the mined sets' schema, manifest.json
    with the counts, compute.json with the encoding cost); None when no scheduled pair has any.
    Cached by version: the parent and how it encodes (`_parent_identity`), the pairs table's
    bytes, the margin and the pairs."""
    rows = scheduled_rows(pairs_path, schedule, offsets, ["pair_id", "query", "positive", "negatives"])
    pairs = [GivenPair(r["pair_id"], r["query"], r["positive"], tuple(r["negatives"])) for r in rows]
    if not any(p.negatives for p in pairs):
        return None
    margin = trial.contrastive.given_margin
    encoder_id, encoding = (None, None) if margin is None else _parent_identity(trial)
    identity = {"format": GIVEN_FORMAT, "encoder_id": encoder_id, "encoding": encoding,
                "code": code_revision(sources=MINING_CODE),
                "pairs_table": file_sha256(Path(pairs_path)), "margin": margin, "pair_ids": sorted(p.pair_id for p in pairs)}
    version = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    directory = prepared.directory / "given-negatives" / version[:16]
    node_path(directory)
    if not (directory / GIVEN_MANIFEST).is_file():
        parent = None if margin is None else _parent_encoder(trial, progress, "given negatives: encoding")
        table, counts = screen_given_negatives(pairs, None if parent is None else parent.encode, margin=margin,
                                               encode_query=None if parent is None else parent.encode_query)
        directory.mkdir(parents=True, exist_ok=True)
        staging = directory / f".{NEGATIVES_FILE}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        pq.write_table(table, staging)
        staging.rename(directory / NEGATIVES_FILE)
        if parent is not None:
            write_text_atomically(directory / MINING_COST_FILE, json.dumps(parent.cost(), indent=2, sort_keys=True))
        write_text_atomically(directory / GIVEN_MANIFEST, json.dumps({**identity, "version": version,
                                                                      "counts": counts}, indent=2, sort_keys=True))
        progress(f"given negatives: {counts['kept']:,} of {counts['given']:,} kept for {counts['pairs_with_given']:,} "
                 f"pairs; {counts['dropped']} (margin {margin})")
        publish_subtree(directory)
    return directory


def given_negative_counts(directory: Path | None) -> dict[str, Any] | None:
    """The counts of a screened set of given negatives (`given_negatives_for_phase3`)."""
    return None if directory is None else json.loads((directory / GIVEN_MANIFEST).read_text())["counts"]


def mining_compute(directory: Path | None, prefix: str = "compute/mining") -> dict[str, float]:
    """`compute/mining_*` of a trial: what mining its negatives cost (encode FLOPs, CPU and
    wall seconds), outside the training budget and reported beside it (a set is mined once
    per parent, pairs and settings, then shared by every trial that needs the same set, so a
    sum over trials counts it again).
    `prefix` "compute/given_negatives": the same for screening its given negatives."""
    if directory is None:
        return {}
    path = directory / MINING_COST_FILE
    cost = json.loads(path.read_text()) if path.is_file() else {}
    return {f"{prefix}_flops": float(cost.get("flops", math.nan)),
            f"{prefix}_seconds": float(cost.get("seconds", math.nan)),
            f"{prefix}_wall_seconds": float(cost.get("wall_seconds", math.nan))}
