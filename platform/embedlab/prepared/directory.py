"""A prepared data directory and its record (`embedlab.prepared.build` builds them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedlab.sources.corpus import Corpus, load_corpus
from embedlab.prepared.pieces import PIECES_FILE
from embedlab.tokenizer.frozen import FrozenTokenizer, load_tokenizer


@dataclass(frozen=True)
class PreparedData:
    """A prepared data directory and its record."""

    directory: Path
    record: dict

    @property
    def corpus(self) -> Corpus:
        return load_corpus(self.directory / "corpus")

    @property
    def pieces_path(self) -> Path:
        return self.directory / PIECES_FILE

    @property
    def tokenizer_sample_path(self) -> Path:
        return self.directory / "tokenizer_sample.parquet"

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / "tokenizer.json"

    @property
    def tokenizer(self) -> FrozenTokenizer:
        return load_tokenizer(self.tokenizer_path, expected_hash=self.record["tokenizer_hash"])

    @property
    def audits_dir(self) -> Path:
        """Where the audits of this data and of the stage files made from it are saved."""
        return self.directory / "audits"

    @property
    def near_duplicate_threshold(self) -> float:
        """The threshold the data was deduplicated at, and its audits run at."""
        return self.record["config"]["near_duplicate_threshold"]

    def task_dir(self, name: str) -> Path:
        return self.directory / "tasks" / name

    @property
    def data_revision(self) -> str:
        return self.record["data_revision"]
