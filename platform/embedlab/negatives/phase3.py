"""Phase 3's negatives, made on the trial driver before its workers start.

Mined ones in two artifacts: the search (`candidates_for_phase3`: the parent encoder over the
prepared corpus's training split, whose vectors are encoded once per parent and encoding and
reused by every search, `corpus_vectors`; every scheduled pair's top-k candidates and scores,
stored once per parent, encoding, pairs and top_k, `embedlab.negatives.candidates`), then the
trial's rule applied to them (`mine_for_phase3`: no encoder, no search), so trials that differ
only in the rule share one search and its cost. With `contrastive.negatives.mining_workers` > 1
the encoding and the search run on that many Ray workers (`embedlab.negatives.sharded`), with
the same result. A user source's given negatives are screened under the parent encoder
(`given_negatives_for_phase3`). Each set is cached by version under the prepared data and
published to every node; what making a set cost is read back by `mining_compute` (with
`mining_figures`: which search, whether this trial made it, each rule's drops), the screened
set's counts by `given_negative_counts`. `embedlab.train.contrastive.run_contrastive` calls
them and passes the sets' paths to the pair stream; the workers only read them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from embedlab.core.config import TrialConfig
from embedlab.negatives.candidates import (
    CANDIDATES_DIR, candidates_identity, candidates_version, load_candidates, read_cost, save_candidates,
)
from embedlab.negatives.mining import (
    GIVEN_FORMAT, MANIFEST_FILE, MINING_COVERAGE, MINING_SAMPLE, MINING_SEARCH, NEGATIVES_FILE, RULES, GivenPair,
    MiningConfig, checked_inputs, corpus_sample, mining_version, pairs_digest, screen_given_negatives,
    search_candidates, selected_set,
)
from embedlab.artifacts.build import Artifact, build_once
from embedlab.checkpoints.io import load_encoder, verify_checkpoint
from embedlab.core.store import file_sha256
from embedlab.checkpoints.io import checkpoint_prefixes
from embedlab.checkpoints.state import data_seed
from embedlab.model.encode import encode_texts
from embedlab.model.flops import FlopTally
from embedlab.pairs.builders import PAIR_BUILDERS, PAIR_SCHEMA, Pair
from embedlab.pairs.table import group_positive_texts
from embedlab.core.code_identity import code_revision

# File names of the cached sets' layout, fixed rather than settings: every trial and node that
# needs a set looks for the one a trial before it wrote, under these names.
GIVEN_MANIFEST = "manifest.json"  # a screened set's identity and counts, written last: it marks the set complete
MINING_COST_FILE = "compute.json"  # what encoding a set cost, in mined and screened sets (`mining_compute`)
CORPUS_VECTORS_DIR = "corpus-vectors"  # under the prepared data: <version>/vectors.npy + manifest.json
CORPUS_VECTORS_FILE = "vectors.npy"
CORPUS_VECTORS_FORMAT = "embedlab-corpus-vectors/1"
# The code that decides a mined or screened set beyond its inputs: the rules, the encoding
# (tokenising, the encoder's forward, pooling) and the search. Hashed into the sets' versions.
MINING_CODE = (
    "negatives/mining.py", "sources/document.py", "negatives/phase3.py", "model/encode.py", "tasks/retrieval.py",
    "model/encoder.py", "model/pooling.py", "tokenizer/frozen.py", "negatives/search.py", "negatives/candidates.py",
    "negatives/sharded.py",
)
SELECTION_COST = "compute/mining_selection_seconds"  # applying a rule to stored candidates (CPU seconds)


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
    search: Any = None  # the search, when it runs on workers (`embedlab.negatives.sharded`)
    workers: Any = None  # what the workers spent, and their count, when they run

    def spent(self) -> tuple[float, float]:
        """FLOPs and CPU seconds so far: this thread's, plus the workers' when they run."""
        if self.workers is None:
            return self.tally.flops, time.thread_time()
        return self.tally.flops + self.workers[0].flops, time.thread_time() + self.workers[0].seconds

    def cost(self) -> dict[str, Any]:
        flops, seconds = self.spent()
        cost = {"flops": flops, "seconds": seconds - self.cpu, "wall_seconds": time.perf_counter() - self.wall,
                "clock": "thread-cpu of the trial driver (encoding and the Faiss search)", "device": self.device}
        if self.workers is not None:
            spent, record = self.workers
            cost.update(clock="thread-cpu of the trial driver and of the Ray workers (encoding and the Faiss search)",
                        workers=record(spent))
        return cost


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


def _mining_encoder(trial: TrialConfig, progress, label: str) -> _ParentEncoder:
    """The parent encoder mining runs: in this process, or with `negatives.mining_workers` > 1
    encoding and searching on that many Ray workers, which give the same vectors and candidates."""
    count = trial.contrastive.negatives.mining_workers
    if count == 1:
        return _parent_encoder(trial, progress, label)
    # here: Ray, which mining in one process does not need
    from embedlab.negatives import sharded

    encoder, tokenizer, manifest = load_encoder(trial.parent)
    del encoder  # the workers load their own; this process only cuts the batches
    workers, spent = sharded.workers_for(count, trial.train.use_gpu), sharded.WorkerCost()
    encode, encode_query = sharded.worker_encoders(
        trial.parent, tokenizer, max_length=trial.contrastive.pair_length, pooling=manifest["pooling"]["method"],
        prefixes=checkpoint_prefixes(manifest), workers=workers, cost=spent, progress=progress, label=label)
    return _ParentEncoder(encode=encode, encode_query=encode_query, manifest=manifest,
                          device=f"{count} Ray workers", tally=FlopTally(),
                          search=partial(sharded.search_on_workers, workers=workers, cost=spent),
                          workers=(spent, partial(sharded.cost_record, workers=workers)))


def corpus_vectors(prepared, encoder_id: str, encoding: dict[str, Any], parent: "_ParentEncoder",
                   progress=print) -> tuple[Any, dict[str, Any]]:
    """`encode_corpus(texts)` for `mine_hard_negatives`: the training-split documents' passage
    vectors under the parent, encoded once per (parent, encoding, corpus revision) into
    `corpus-vectors/<version>/` and read back by every later set (each seed and each rung of a
    ladder mines its own pairs against the same documents); and a record that, once called,
    says which set it used, whether it was reused, and what encoding it cost when it was made.
    The texts' digest is checked, so a set is only ever read for the texts it was made from."""
    identity = {"format": CORPUS_VECTORS_FORMAT, "encoder_id": encoder_id, "encoding": encoding,
                "corpus_revision": prepared.data_revision}
    directory = Artifact(kind=CORPUS_VECTORS_DIR, inputs=identity).under(prepared.directory)
    record: dict[str, Any] = {"set": directory.name}

    def encode_corpus(texts: list[str]) -> np.ndarray:
        digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()
        built: dict[str, Any] = {}

        def build(staging: Path) -> None:
            (flops, cpu), wall = parent.spent(), time.perf_counter()
            built["vectors"] = np.ascontiguousarray(parent.encode(texts), dtype=np.float32)
            cost = {"flops": parent.spent()[0] - flops, "seconds": parent.spent()[1] - cpu,
                    "wall_seconds": time.perf_counter() - wall}
            with open(staging / CORPUS_VECTORS_FILE, "wb") as out:
                np.save(out, built["vectors"])
            (staging / "manifest.json").write_text(json.dumps({"identity": identity, "texts_digest": digest,
                                                              "texts": len(texts), "cost": cost},
                                                             indent=2, sort_keys=True))

        build_once(directory, build, progress=progress)
        made = json.loads((directory / "manifest.json").read_text())
        if (made["identity"], made["texts_digest"], made["texts"]) != (identity, digest, len(texts)):
            raise ValueError(f"{directory}: corpus vectors of other inputs than this mining's")
        record.update(reused="vectors" not in built, cost=made["cost"])
        if "vectors" in built:
            return built["vectors"]
        progress(f"mining: {len(texts):,} training documents' vectors reused from {directory}")
        return np.load(directory / CORPUS_VECTORS_FILE)

    return encode_corpus, record


def _parent_identity(trial: TrialConfig) -> tuple[str, dict[str, Any]]:
    """The parent's content hash and how mining and screening run it (`_parent_encoder`), as
    the sets' versions record them: the encode length, the parent's pooling and the code, and
    the corpus sample searched when there is one (`negatives.corpus_sample`; absent when every
    training document is, so the versions of unsampled sets are what they were before it)."""
    manifest = verify_checkpoint(trial.parent)
    encoding = {"max_length": trial.contrastive.pair_length, "pooling": manifest["pooling"]["method"],
                "prefixes": checkpoint_prefixes(manifest), "code": code_revision(sources=MINING_CODE)}
    if trial.contrastive.negatives.corpus_sample:
        encoding["corpus_sample"] = trial.contrastive.negatives.corpus_sample
    return manifest["content_hash"], encoding


def trial_config_hash(trial: TrialConfig) -> str:
    """The trial's config hash, as its row records it: which trial a search was made for."""
    return hashlib.sha256(trial.to_json().encode()).hexdigest()


def _scheduled_pairs(pairs_path: Path, schedule, offsets) -> tuple[list[Pair], frozenset[str]]:
    """The scheduled rows as pairs, and the ids of those from a user's source (no corpus documents)."""
    table = scheduled_rows(pairs_path, schedule, offsets, PAIR_SCHEMA.names)
    pairs = [Pair(**{**row, "doc_ids": tuple(row["doc_ids"])}) for row in table]
    return pairs, frozenset(p.pair_id for p in pairs if p.builder not in PAIR_BUILDERS)


def candidates_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets,
                          progress=print) -> Path:
    """The scheduled pairs' stored search (`embedlab.negatives.candidates`): each pair's
    `negatives.top_k` nearest training documents under the parent, with their scores and the
    positive's, made once per (parent and encoding, corpus, pairs table, pairs, top_k) and read
    by every trial whose rule selects from it. Its cost file names the trial it was made for."""
    pairs, outside = _scheduled_pairs(pairs_path, schedule, offsets)
    encoder_id, encoding = _parent_identity(trial)
    identity = candidates_identity(encoder_id=encoder_id, encoding=encoding, corpus_revision=prepared.data_revision,
                                   top_k=trial.contrastive.negatives.top_k, pairs_table=file_sha256(Path(pairs_path)),
                                   pair_ids=[p.pair_id for p in pairs])
    # The version hashes the code that searches (`encoding`): it names the artifact alone.
    directory = Artifact(kind=CANDIDATES_DIR, inputs={"version": candidates_version(identity)}).under(
        prepared.directory)

    def build(staging: Path) -> None:
        parent = _mining_encoder(trial, progress, "mining: encoding")
        encode_corpus, corpus = corpus_vectors(prepared, encoder_id, encoding, parent, progress)
        table = prepared.corpus.read()
        _, train = checked_inputs(pairs, table, outside)
        train = corpus_sample(train, trial.contrastive.negatives.corpus_sample)
        found = search_candidates(pairs, table, train, parent.encode, top_k=trial.contrastive.negatives.top_k,
                                  encoder_id=encoder_id, progress=progress, encode_query=parent.encode_query,
                                  encode_corpus=encode_corpus, search_queries=parent.search)
        cost = {**_mining_cost(parent, corpus), "built_for": trial_config_hash(trial)}
        save_candidates(staging, found, identity, cost)
        progress(f"mining: {len(pairs):,} pairs' top {trial.contrastive.negatives.top_k} candidates in {directory} "
                 f"on {parent.device}, {cost['flops']:.3g} encode FLOPs")

    build_once(directory, build, progress=progress)
    load_candidates(directory, identity)  # a set of other inputs is refused
    return directory


def mining_config(trial: TrialConfig) -> MiningConfig:
    """The trial's `contrastive.negatives` as mining reads it; a sampled rule draws by the trial's data seed."""
    negatives = trial.contrastive.negatives
    return MiningConfig(negatives_per_query=negatives.count, top_k=negatives.top_k,
                        false_negative_margin=negatives.margin, skip_top=negatives.skip_top, rule=negatives.rule,
                        relative_fraction=negatives.relative_fraction, window=negatives.window,
                        sample_seed=data_seed(trial) if negatives.sample else None)


def mine_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets, progress=print, *,
                    check: Callable[[Path], Any] | None = None) -> Path:
    """Mine hard negatives for the scheduled pairs with the parent encoder (cached by version):
    the trial's rule (`contrastive.negatives`) applied to the stored search
    (`candidates_for_phase3`, made first if no trial made it).

    The candidate pool is the prepared corpus's training split; known positives, their
    near-duplicate groups and every recipe-dev / final-eval document are never negatives.
    A user's own pairs (their builder no built-in one) have no corpus documents: they are
    mined with `outside_corpus` (`embedlab.negatives.mining.mine_hard_negatives`). `check` is the
    set's post-condition (`embedlab.artifacts.build.build_once`): the contamination gate.
    The encoder runs on CUDA when this process sees a GPU (on a GPU cluster the sweep gives a
    mining trial's driver a GPU share: `embedlab.sweep.cluster.trial_driver_resources`).
    """
    pairs, outside = _scheduled_pairs(pairs_path, schedule, offsets)
    config = mining_config(trial)
    encoder_id, encoding = _parent_identity(trial)
    # Every positive of each row's group, rows the schedule does not read included.
    group_positives = group_positive_texts(pairs_path)
    version = mining_version(encoder_id=encoder_id, corpus_revision=prepared.data_revision, config=config,
                             pair_ids=[p.pair_id for p in pairs], pairs_digest=pairs_digest(pairs, group_positives),
                             encoding=encoding)
    # The set's version hashes the code that mines it (`encoding`): it names the artifact alone.
    directory = Artifact(kind="mined", inputs={"version": version}).under(prepared.directory)

    def build(staging: Path) -> None:
        searched = candidates_for_phase3(trial, prepared, pairs_path, schedule, offsets, progress)
        started = time.thread_time()
        group_of, _ = checked_inputs(pairs, prepared.corpus.read(), outside)
        mined = selected_set(pairs, load_candidates(searched), group_of, config=config, encoder_id=encoder_id,
                             corpus_revision=prepared.data_revision, progress=progress,
                             group_positives=group_positives, encoding=encoding)
        (staging / "report.md").write_text(mined.report())
        cost = {**read_cost(searched), "candidates": searched.name, "selection_seconds": time.thread_time() - started}
        (staging / MINING_COST_FILE).write_text(json.dumps(cost, indent=2, sort_keys=True))
        mined.save(staging)
        progress(f"mining: {len(pairs):,} pairs, negatives in {directory} (version {version[:16]}) selected by "
                 f"{config.describe()} from the candidates {searched.name}")

    return build_once(directory, build, check=check, progress=progress)


def _mining_cost(parent: "_ParentEncoder", corpus: dict[str, Any]) -> dict[str, Any]:
    """What a search cost: its own encoding and search, plus the corpus vectors' encoding
    when they were reused (counted in every search that uses them, as a shared set is counted in
    each trial's row), so a search's recorded cost does not depend on which trial made it first."""
    cost = parent.cost()
    if corpus.get("reused"):
        for key in ("flops", "seconds", "wall_seconds"):
            cost[key] += corpus["cost"][key]
    return {**cost, "corpus_vectors": corpus}


def given_negatives_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets,
                               progress=print) -> Path | None:
    """The scheduled pairs' given negatives (a user source's own), screened by the false-negative
    margin under the parent encoder (`contrastive.negatives.given_margin`), in
    `given-negatives/<version>/` (negatives.parquet in the mined sets' schema, manifest.json
    with the counts, compute.json with the encoding cost); None when no scheduled pair has any.
    Cached by version: the parent and how it encodes (`_parent_identity`), the pairs table's
    bytes, the margin and the pairs."""
    rows = scheduled_rows(pairs_path, schedule, offsets, ["pair_id", "query", "positive", "negatives"])
    pairs = [GivenPair(r["pair_id"], r["query"], r["positive"], tuple(r["negatives"])) for r in rows]
    if not any(p.negatives for p in pairs):
        return None
    margin = trial.contrastive.negatives.given_threshold
    encoder_id, encoding = (None, None) if margin is None else _parent_identity(trial)
    identity = {"format": GIVEN_FORMAT, "encoder_id": encoder_id, "encoding": encoding,
                "code": code_revision(sources=MINING_CODE),
                "pairs_table": file_sha256(Path(pairs_path)), "margin": margin, "pair_ids": sorted(p.pair_id for p in pairs)}
    artifact = Artifact(kind="given-negatives", inputs=identity)
    directory = artifact.under(prepared.directory)

    def build(staging: Path) -> None:
        parent = None if margin is None else _parent_encoder(trial, progress, "given negatives: encoding")
        table, counts = screen_given_negatives(pairs, None if parent is None else parent.encode, margin=margin,
                                               encode_query=None if parent is None else parent.encode_query)
        pq.write_table(table, staging / NEGATIVES_FILE)
        if parent is not None:
            (staging / MINING_COST_FILE).write_text(json.dumps(parent.cost(), indent=2, sort_keys=True))
        (staging / GIVEN_MANIFEST).write_text(json.dumps({**identity, "version": artifact.key, "counts": counts},
                                                         indent=2, sort_keys=True))
        progress(f"given negatives: {counts['kept']:,} of {counts['given']:,} kept for {counts['pairs_with_given']:,} "
                 f"pairs; {counts['dropped']} (margin {margin})")

    return build_once(directory, build, progress=progress)


def given_negative_counts(directory: Path | None) -> dict[str, Any] | None:
    """The counts of a screened set of given negatives (`given_negatives_for_phase3`)."""
    return None if directory is None else json.loads((directory / GIVEN_MANIFEST).read_text())["counts"]


def mining_compute(directory: Path | None, prefix: str = "compute/mining") -> dict[str, float]:
    """`compute/mining_*` of a trial: what its negatives' encoding and search cost (encode FLOPs,
    CPU and wall seconds), outside the training budget and reported beside it. A mined set's
    figures are its search's whole cost (`candidates_for_phase3`), the same in every trial that
    reads the search, whichever made it; a table sums them once per search
    (`embedlab.stats.table.mining_line`), and `mining_figures` says which search and whether this
    trial made it. `prefix` "compute/given_negatives": the same for screening its given negatives."""
    if directory is None:
        return {}
    path = directory / MINING_COST_FILE
    cost = json.loads(path.read_text()) if path.is_file() else {}
    figures = {f"{prefix}_flops": float(cost.get("flops", math.nan)),
               f"{prefix}_seconds": float(cost.get("seconds", math.nan)),
               f"{prefix}_wall_seconds": float(cost.get("wall_seconds", math.nan))}
    if "selection_seconds" in cost:
        figures[SELECTION_COST] = float(cost["selection_seconds"])
    return figures


def mining_figures(directory: Path | None, trial: TrialConfig) -> dict[str, Any]:
    """A mining trial's row figures beyond its cost: the search it read (`data/mining_candidates`),
    whether this trial made it (`compute/mining_built`: 1.0, else 0.0: another trial or run did,
    and this one reused it), every rule's drops (`data/negatives_dropped/<reason>`, `RULES`), the
    share of its queries left with a negative (`MINING_COVERAGE`) and,
    when it searched a sample of the corpus, how many documents (`MINING_SAMPLE`)."""
    if directory is None:
        return {}
    cost = json.loads((directory / MINING_COST_FILE).read_text())
    counts = json.loads((directory / MANIFEST_FILE).read_text())["counts"]
    sample = trial.contrastive.negatives.corpus_sample
    return {MINING_SEARCH: cost["candidates"],
            "compute/mining_built": float(cost.get("built_for") == trial_config_hash(trial)),
            **{f"data/negatives_dropped/{rule}": float(counts["dropped"][rule]) for rule in RULES},
            MINING_COVERAGE: counts["queries_with_negatives"] / max(counts["queries"], 1),
            **({MINING_SAMPLE: float(counts["training_documents_indexed"])} if sample else {})}
