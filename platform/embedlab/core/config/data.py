"""What a run's data is: which sources are built, how they are deduplicated, split, tokenised,
mixed and packed (`DataConfig`, `MixtureConfig`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from embedlab.core.config.checks import check, check_fields, check_positive, check_seed
from embedlab.core.config.sources import BEIRPairs, BUILDER_NAMES, HFDataset, HFPairs, LocalFiles, PairFiles


SAMPLING_SCHEDULES = ("deficit/1",)
TOKENIZER_KINDS = ("bpe", "unigram", "byte-level")  # the kinds embedlab trains
# A pretrained parent's own tokenizer, taken as it is (its sha256 in `DataConfig.tokenizer_hash`).
PRETRAINED_TOKENIZER = "pretrained"


@dataclass(frozen=True, kw_only=True)
class MixtureConfig:
    """Shares of consumed non-padding tokens per source (phase 1), and how they are drawn.

    `shares` pairs source names with shares summing to 1; empty means the recipe's phase-1
    pilot mixture mapped onto the available built-in sources (`embedlab.sources.mixture`).
    `max_epochs` caps repetition: no source is read more than that many times over.
    `schedule` names the versioned sampling algorithm; `seed` orders documents within sources.
    """

    shares: tuple[tuple[str, float], ...] = ()
    max_epochs: float = 4.0
    seed: int = 0
    schedule: str = "deficit/1"

    def __post_init__(self) -> None:
        check_fields(self, "data.mixture")
        check_seed(self.seed, "data.mixture.seed")
        names = [name for name, _ in self.shares]
        check(len(set(names)) == len(names), "data.mixture.shares", f"names repeat: {names}")
        for name, share in self.shares:
            check(share > 0, "data.mixture.shares", f"share of {name!r} must be positive, got {share}")
        if self.shares:
            total = sum(share for _, share in self.shares)
            check(abs(total - 1.0) < 1e-6, "data.mixture.shares", f"must sum to 1, got {total:.6f}")
        check(self.max_epochs > 0, "data.mixture.max_epochs", "must be positive")
        check(self.schedule in SAMPLING_SCHEDULES, "data.mixture.schedule",
              f"{self.schedule!r}; valid: {list(SAMPLING_SCHEDULES)}")

    @property
    def share_map(self) -> dict[str, float]:
        return dict(self.shares)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Which sources are built, how they are deduplicated, split, tokenised, mixed and packed."""

    sources: tuple[str, ...] = ()  # empty: every built-in source available on this machine
    local_files: tuple[LocalFiles, ...] = ()  # extra sources: jsonl / parquet / txt files or directories
    hf_datasets: tuple[HFDataset, ...] = ()  # extra sources: Hugging Face datasets pinned by revision
    # A user's own labelled pairs for phases 2-3 (`embedlab.pairs.readers`), named beside the
    # built-in pair builders in `contrastive.pairs`. They take no part in phase 1's corpus,
    # tokenizer or pieces, so they are not in the prepared directory's key (`prepare.prepare_key`).
    pair_files: tuple[PairFiles, ...] = ()
    hf_pairs: tuple[HFPairs, ...] = ()
    beir_pairs: tuple[BEIRPairs, ...] = ()
    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    near_duplicate_threshold: float = 0.8
    tokenizer_kind: str = "bpe"
    tokenizer_vocab_size: int = 4096
    # With `tokenizer_kind` "pretrained": the sha256 of the parent's canonical tokenizer.json,
    # which preparing copies instead of training one (`embedlab.tokenizer.frozen.stored_tokenizer`).
    tokenizer_hash: str | None = None
    tokenizer_sample_documents: int = 20000
    sequence_length: int = 128
    split_seed: int = 0
    dev_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        check(isinstance(self.sources, tuple), "data.sources", "must be a tuple of source names")
        check_fields(self, "data")
        check_seed(self.split_seed, "data.split_seed")
        check_positive(self, "data", "tokenizer_sample_documents")
        check(0.0 < self.near_duplicate_threshold < 1.0, "data.near_duplicate_threshold",
              f"{self.near_duplicate_threshold} is not strictly between 0 and 1 (MinHash banding needs a "
              "threshold below 1; exact duplicates are removed before it)")
        check(self.tokenizer_kind in (*TOKENIZER_KINDS, PRETRAINED_TOKENIZER), "data.tokenizer_kind",
              f"{self.tokenizer_kind!r}; valid: {[*TOKENIZER_KINDS, PRETRAINED_TOKENIZER]}")
        if self.tokenizer_kind == PRETRAINED_TOKENIZER:
            check(self.tokenizer_hash is not None, "data.tokenizer_hash",
                  "a pretrained tokenizer is named by its sha256 (set from the parent, `Study.with_pretrained_parent`)")
        else:
            check(self.tokenizer_hash is None, "data.tokenizer_hash",
                  f"names a pretrained tokenizer; data.tokenizer_kind {self.tokenizer_kind!r} trains its own")
            check(self.tokenizer_vocab_size >= 256, "data.tokenizer_vocab_size", "must be >= 256")
        check(self.sequence_length >= 8, "data.sequence_length", "must be >= 8")
        check(
            0 < self.dev_fraction and 0 < self.test_fraction and self.dev_fraction + self.test_fraction < 1,
            "data.dev_fraction",
            "dev and test fractions must be positive and sum to less than 1",
        )
        external = [s.name for s in (*self.local_files, *self.hf_datasets)]
        check(len(set(external)) == len(external), "data.local_files", f"external source names repeat: {external}")
        users = self.pair_source_names
        check(len(set(users)) == len(users), "data.pair_files", f"pair source names repeat: {list(users)}")
        clashes = sorted(set(users) & (set(external) | set(BUILDER_NAMES)))
        check(not clashes, "data.pair_files", f"pair source names {clashes} are also document source or built-in "
              f"pair builder names ({', '.join(BUILDER_NAMES)}); a share must name one thing")
        if self.sources and self.mixture.shares:
            outside = sorted(set(self.mixture.share_map) - set(self.sources) - set(external))
            check(not outside, "data.mixture.shares", f"names sources that are not built: {outside}")

    @property
    def pair_sources(self) -> tuple[PairFiles | HFPairs | BEIRPairs, ...]:
        """The user's pair sources, files then datasets then BEIR folders."""
        return (*self.pair_files, *self.hf_pairs, *self.beir_pairs)

    @property
    def pair_source_names(self) -> tuple[str, ...]:
        return tuple(source.name for source in self.pair_sources)

    def phase1_dict(self) -> dict[str, Any]:
        """The fields that decide the prepared directory: all but the pair sources."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in PAIR_SOURCE_FIELDS}


PAIR_SOURCE_FIELDS = ("pair_files", "hf_pairs", "beir_pairs")
