"""Train, save and load the frozen BPE tokenizer (HF `tokenizers`).

Normalisation: NFKC then lowercase. Pre-tokenisation: split on whitespace and
punctuation, digits one at a time. No byte fallback: characters unseen in training map to
UNK. Special tokens have fixed ids 0-4: PAD, UNK, CLS, SEP (document boundary), MASK.
The tokenizer is trained on the training split only and identified by the sha256 of its
`tokenizer.json`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
FILE_NAME = "tokenizer.json"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A BPE tokenizer trained on `texts` with the special tokens at ids 0-4."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class FrozenTokenizer:
    """A saved tokenizer with its content hash and the ids the objectives need."""

    tokenizer: Tokenizer
    hash: str
    path: Path

    @property
    def pad_id(self) -> int:
        return self.tokenizer.token_to_id(PAD)

    @property
    def unk_id(self) -> int:
        return self.tokenizer.token_to_id(UNK)

    @property
    def cls_id(self) -> int:
        return self.tokenizer.token_to_id(CLS)

    @property
    def sep_id(self) -> int:
        return self.tokenizer.token_to_id(SEP)

    @property
    def mask_id(self) -> int:
        return self.tokenizer.token_to_id(MASK)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def special_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]


def save_tokenizer(tokenizer: Tokenizer, directory: Path) -> FrozenTokenizer:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAME
    tokenizer.save(str(path))
    return load_tokenizer(path)


def load_tokenizer(path: Path, expected_hash: str | None = None) -> FrozenTokenizer:
    """Load `tokenizer.json` (or a directory holding it); refuse a hash mismatch."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    digest = file_hash(path)
    if expected_hash is not None and digest != expected_hash:
        raise ValueError(
            f"tokenizer {path} has hash {digest[:12]}..., expected {expected_hash[:12]}...: "
            "the checkpoint was trained with a different tokenizer"
        )
    tokenizer = Tokenizer.from_file(str(path))
    missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
    if missing:
        raise ValueError(f"tokenizer {path} lacks special tokens {missing}")
    return FrozenTokenizer(tokenizer=tokenizer, hash=digest, path=path)
