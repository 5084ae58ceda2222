"""From sources to training rows: corpus -> tokenizer -> packed rows -> evaluation task.

Everything a study's trials share is prepared once, before any trial starts, in a
directory named by the hash of the data config and the source revisions, so repeated
runs reuse it and two configs never share one by accident. The directory is written
under a temporary name and renamed when complete, so a half-built one is never used.

    corpus/              documents.parquet + manifest.json (see data.corpus)
    tokenizer.json       trained on training-split documents only
    rows.parquet         packed training rows: input_ids, segment_ids (fixed-size lists)
    tasks/<name>/        the built-in retrieval task in BEIR format
    prepared.json        hashes, counts, token shares per source, packing efficiency
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.config import DataConfig
from embedlab.data import builtin
from embedlab.data.corpus import Corpus, build_corpus, load_corpus, resolve_sources
from embedlab.data.packing import pack_documents
from embedlab.evaluate.builtin_tasks import BUILTIN_TASKS, build_builtin_task
from embedlab.tokenizer import FrozenTokenizer, load_tokenizer, save_tokenizer, train_tokenizer

FORMAT = "embedlab-prepared/1"


def default_cache_dir() -> Path:
    return Path(os.environ.get("EMBEDLAB_CACHE", Path.home() / ".cache" / "embedlab"))


@dataclass(frozen=True)
class PreparedData:
    """A prepared data directory and its record."""

    directory: Path
    record: dict

    @property
    def corpus(self) -> Corpus:
        return load_corpus(self.directory / "corpus")

    @property
    def rows_path(self) -> Path:
        return self.directory / "rows.parquet"

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / "tokenizer.json"

    @property
    def tokenizer(self) -> FrozenTokenizer:
        return load_tokenizer(self.tokenizer_path, expected_hash=self.record["tokenizer_hash"])

    def task_dir(self, name: str) -> Path:
        return self.directory / "tasks" / name

    @property
    def data_revision(self) -> str:
        return self.record["data_revision"]


def prepare_key(config: DataConfig) -> str:
    """Hash of everything that decides the prepared bytes."""
    names = resolve_sources(config)
    payload = {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "sources": {n: builtin.source_revision(n) for n in names},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def prepare_data(
    config: DataConfig,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = print,
) -> PreparedData:
    """Prepare (or reuse) the data directory for `config`."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    directory = cache_dir / f"prepared-{prepare_key(config)}"
    record_path = directory / "prepared.json"
    if record_path.is_file():
        progress(f"data: reusing {directory}")
        return PreparedData(directory=directory, record=json.loads(record_path.read_text()))
    staging = cache_dir / f".staging-{directory.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    progress(f"data: preparing {directory}")
    record = _prepare_into(config, staging, progress)
    (staging / "prepared.json").write_text(json.dumps(record, indent=2, sort_keys=True))
    try:
        staging.rename(directory)
    except OSError:
        # Another process finished the same directory first; its content is identical.
        shutil.rmtree(staging, ignore_errors=True)
    return PreparedData(directory=directory, record=json.loads(record_path.read_text()))


def _prepare_into(config: DataConfig, directory: Path, progress: Callable[[str], None]) -> dict:
    started = time.perf_counter()
    corpus = build_corpus(config, directory / "corpus", progress)
    train = _training_documents(corpus, config)
    texts = [_training_text(t, x) for t, x in zip(train["title"], train["text"])]
    progress(f"data: training tokenizer (BPE, vocab {config.tokenizer_vocab_size}) on {len(texts)} training documents")
    sample = texts[: config.tokenizer_sample_documents]
    tokenizer = save_tokenizer(train_tokenizer(sample, config.tokenizer_vocab_size), directory)
    progress("data: tokenising and packing training rows")
    token_lists = tokenizer.encode_batch(texts)
    packed = pack_documents(
        token_lists,
        sequence_length=config.sequence_length,
        sep_id=tokenizer.sep_id,
        pad_id=tokenizer.pad_id,
    )
    order = np.random.default_rng(config.split_seed).permutation(len(packed.input_ids))
    _write_rows(packed.input_ids[order], packed.segment_ids[order], directory / "rows.parquet")
    sources = train["source"]
    tokens_by_source: dict[str, int] = {}
    for source, tokens in zip(sources, token_lists):
        tokens_by_source[source] = tokens_by_source.get(source, 0) + len(tokens) + 1
    total_tokens = sum(tokens_by_source.values())
    for name in BUILTIN_TASKS:
        if name in corpus.manifest["sources"]:
            task = build_builtin_task(name, corpus, directory / "tasks" / name)
            progress(f"data: built task {name}: {len(task.corpus)} documents, "
                     f"{ {s: len(q) for s, q in task.qrels.items()} } queries per split")
    progress(
        f"data: {len(packed.input_ids)} rows x {config.sequence_length} tokens, "
        f"packing efficiency {packed.efficiency:.3f} ({time.perf_counter() - started:.1f}s)"
    )
    return {
        "format": FORMAT,
        "config": dataclasses.asdict(config),
        "corpus_hash": corpus.hash,
        "tokenizer_hash": tokenizer.hash,
        "tokenizer_vocab_size": tokenizer.vocab_size,
        "data_revision": hashlib.sha256(
            f"{corpus.hash}:{tokenizer.hash}:{_file_hash(directory / 'rows.parquet')}".encode()
        ).hexdigest(),
        "rows": int(len(packed.input_ids)),
        "sequence_length": config.sequence_length,
        "non_padding_tokens": packed.non_padding_tokens,
        "packing_efficiency": packed.efficiency,
        "training_documents": len(texts),
        "token_share_by_source": {s: n / total_tokens for s, n in sorted(tokens_by_source.items())},
        "tokens_by_source": dict(sorted(tokens_by_source.items())),
        "row_order_seed": config.split_seed,
    }


def _training_documents(corpus: Corpus, config: DataConfig) -> dict[str, list]:
    """Training-split documents, at most `max_documents_per_source` per source.

    The cap keeps the documents with the smallest content hashes: a deterministic sample
    that does not favour the start of a source (Genesis over Revelation).
    """
    table = corpus.read(split="train").sort_by([("source", "ascending"), ("hash", "ascending")])
    columns = table.select(["source", "title", "text"]).to_pydict()
    kept: dict[str, list] = {"source": [], "title": [], "text": []}
    per_source: dict[str, int] = {}
    for source, title, text in zip(columns["source"], columns["title"], columns["text"]):
        if per_source.get(source, 0) >= config.max_documents_per_source:
            continue
        per_source[source] = per_source.get(source, 0) + 1
        kept["source"].append(source)
        kept["title"].append(title)
        kept["text"].append(text)
    return kept


def _training_text(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


def _write_rows(input_ids: np.ndarray, segment_ids: np.ndarray, path: Path) -> None:
    length = input_ids.shape[1]

    def fixed(array: np.ndarray) -> pa.FixedSizeListArray:
        return pa.FixedSizeListArray.from_arrays(pa.array(array.ravel()), length)

    pq.write_table(pa.table({"input_ids": fixed(input_ids), "segment_ids": fixed(segment_ids)}), path)


def _file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
