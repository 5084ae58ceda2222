"""Train, save, load and describe the frozen tokenizer (HF `tokenizers`).

Three kinds (`TOKENIZER_KINDS`); `bpe` is the default and the one training data is prepared with:

    bpe         BPE merges. Normalisation: NFKC, then lowercase (case is not kept).
                Pre-tokenisation: split on whitespace and punctuation, digits one at a time;
                whitespace is dropped, so decoding cannot restore the original spacing.
                No byte fallback: a character unseen in training becomes UNK.
    unigram     A Unigram language model (SentencePiece-style vocabulary pruning) with the same
                normaliser and pre-tokenizer as `bpe`: NFKC, lowercase, whitespace dropped.
                No byte fallback: an unseen character becomes UNK (a run of them, one UNK).
    byte-level  The GPT-2-style byte-level BPE baseline. No normaliser: case and Unicode forms
                are kept. Text is split with the GPT-2 pattern (letters, digit runs,
                punctuation) and mapped to UTF-8 bytes; a space stays attached to the word after
                it, so decoding restores the text exactly. All 256 byte symbols are in the
                vocabulary from the start (byte fallback): an unseen character is spelled out as
                its bytes and nothing is ever UNK.

Special tokens have fixed ids 0-4 in every kind: PAD, UNK, CLS, SEP (document boundary), MASK.
The tokenizer is trained on the training split only and identified by the sha256 of its
`tokenizer.json`; `describe` summarises one for run manifests.

A pretrained parent brings its own tokenizer (`canonical_tokenizer`): the checkpoint's
`tokenizer.json` with its padding and truncation switched off (a file that pads or truncates
would pad every text embedlab encodes to its length, so `load_tokenizer` refuses one), frozen
and hashed the same way. Its special tokens are named as its family names them
(`SPECIAL_TOKEN_SETS`: BERT's are embedlab's own names, at other ids; RoBERTa's are `<pad>`
...), and a masked position's random replacement is drawn from every id that is not an added
special token (`FrozenTokenizer.replacement_ids`), which for embedlab's own tokenizers is
exactly the ids 5..V-1 it always was.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from embedlab.core.config import TOKENIZER_KINDS
from embedlab.core import store
from embedlab.core.errors import UserError
from embedlab.core.store import file_sha256

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
# The names of the five special tokens (pad, unk, cls, sep, mask) in the tokenizers embedlab
# reads, first match wins: its own and BERT's (MiniLM, ModernBERT), then RoBERTa's and XLM-R's.
SPECIAL_TOKEN_SETS = {"bert": SPECIAL_TOKENS, "roberta": ("<pad>", "<unk>", "<s>", "</s>", "<mask>")}
SPECIAL_ROLES = ("pad", "unk", "cls", "sep", "mask")
STORE_DIR = "tokenizers"  # pretrained tokenizers by sha256, under `store.cache_dir()`
FILE_NAME = "tokenizer.json"
PROGRESS_SECONDS = 10.0  # at most one "documents read" line per 10 s


class TokenizerMismatchError(UserError, ValueError):
    """A tokenizer file that is not the one a checkpoint or release recorded (its hash), or
    lacks the special tokens every embedlab tokenizer has."""


def train_tokenizer(texts: Iterable[str], vocab_size: int, kind: str = "bpe", *,
                    progress: Callable[[str], None] | None = None,
                    progress_seconds: float = PROGRESS_SECONDS) -> Tokenizer:
    """A tokenizer of `kind` trained on `texts` with the special tokens at ids 0-4.

    With `progress`: a line every `progress_seconds` while the texts are read (documents
    read of the total, documents per second), one when reading ends and the vocabulary is
    computed, and one when training ends. The texts reach the trainer unchanged and in
    order, so the tokenizer (and its hash) is the same with or without progress."""
    tokenizer, trainer = _UNTRAINED[check_kind(kind)](vocab_size)
    started = time.perf_counter()
    if progress is not None:
        texts = _reading(texts, kind, progress, progress_seconds)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if progress is not None:
        progress(f"tokenizer: {kind} vocabulary of {tokenizer.get_vocab_size():,} trained in "
                 f"{time.perf_counter() - started:.1f}s")
    return tokenizer


def _reading(texts: Iterable[str], kind: str, progress: Callable[[str], None], every_seconds: float) -> Iterator[str]:
    """`texts`, reporting how many the trainer has read: it pre-tokenises and counts words as
    it reads (most of the time on a large sample), then computes the vocabulary."""
    total = len(texts) if isinstance(texts, Sized) else None
    started = last = time.perf_counter()
    count = 0
    for count, text in enumerate(texts, start=1):
        yield text
        now = time.perf_counter()
        if now - last >= every_seconds:
            last = now
            of = f"/{total:,} ({count / total:.0%})" if total else ""
            progress(f"tokenizer: {count:,}{of} documents read, {count / (now - started):,.0f} documents/s")
    progress(f"tokenizer: {count:,} documents read in {time.perf_counter() - started:.1f}s; computing the {kind} "
             "vocabulary")


def check_kind(kind: str) -> str:
    """`kind` if it is one of `TOKENIZER_KINDS`, else ValueError naming the valid ones."""
    if kind not in TOKENIZER_KINDS:
        valid = ", ".join(TOKENIZER_KINDS)
        raise ValueError(f"unknown tokenizer kind {kind!r}; valid kinds: {valid}")
    return kind


def _word_pipeline(tokenizer: Tokenizer) -> Tokenizer:
    """NFKC + lowercase, split on whitespace/punctuation and single digits: `bpe` and `unigram`."""
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    return tokenizer


def _untrained_bpe(vocab_size: int) -> tuple[Tokenizer, trainers.Trainer]:
    # Must stay exactly as it was: prepared data and checkpoints are keyed by this file's hash.
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    return _word_pipeline(Tokenizer(models.BPE(unk_token=UNK))), trainer


def _untrained_unigram(vocab_size: int) -> tuple[Tokenizer, trainers.Trainer]:
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        unk_token=UNK,
        show_progress=False,
    )
    return _word_pipeline(Tokenizer(models.Unigram())), trainer


def _untrained_byte_level(vocab_size: int) -> tuple[Tokenizer, trainers.Trainer]:
    # No unk_token on the model: with every byte in the initial alphabet it could never be used.
    # UNK stays in the vocabulary (id 1) so every kind has the same special ids.
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False: a leading space would be invented, and decoding would not round-trip.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tokenizer, trainer


_UNTRAINED = {
    "bpe": _untrained_bpe,
    "unigram": _untrained_unigram,
    "byte-level": _untrained_byte_level,
}


@dataclass(frozen=True)
class FrozenTokenizer:
    """A saved tokenizer with its content hash and the ids the objectives need. `specials`
    are its (pad, unk, cls, sep, mask) tokens' names (`SPECIAL_TOKEN_SETS`)."""

    tokenizer: Tokenizer
    hash: str
    path: Path
    specials: tuple[str, ...] = SPECIAL_TOKENS

    @property
    def pad_id(self) -> int:
        return self.tokenizer.token_to_id(self.specials[0])

    @property
    def unk_id(self) -> int:
        return self.tokenizer.token_to_id(self.specials[1])

    @property
    def cls_id(self) -> int:
        return self.tokenizer.token_to_id(self.specials[2])

    @property
    def sep_id(self) -> int:
        return self.tokenizer.token_to_id(self.specials[3])

    @property
    def mask_id(self) -> int:
        return self.tokenizer.token_to_id(self.specials[4])

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    @property
    def special_ids(self) -> tuple[int, ...]:
        """The ids of (pad, unk, cls, sep, mask): never masked, never a prediction target."""
        return tuple(self.tokenizer.token_to_id(t) for t in self.specials)

    @property
    def replacement_ids(self) -> torch.Tensor:
        """(R,) long: the ids a masked position's random replacement is drawn from, in order:
        every id below `vocab_size` that is not an added special token. For embedlab's own
        tokenizers (specials at 0-4, nothing else added) that is 5..V-1, and drawing
        `ids[randint(0, R)]` is bitwise the `randint(5, V)` it replaced
        (`embedlab.objectives.masking.mask_tokens`); BERT's specials sit at 0 and 100-103,
        RoBERTa's mask at the last id, which a range would get wrong."""
        special = {i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special}
        special |= set(self.special_ids)
        return torch.tensor([i for i in range(self.vocab_size) if i not in special], dtype=torch.long)

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
    digest = file_sha256(path)
    if expected_hash is not None and digest != expected_hash:
        raise TokenizerMismatchError(
            f"tokenizer {path} has hash {digest[:12]}..., expected {expected_hash[:12]}...: "
            "the checkpoint was trained with a different tokenizer (or the file was edited)"
        )
    tokenizer = Tokenizer.from_file(str(path))
    specials = special_tokens(tokenizer)
    if specials is None:
        missing = [t for t in SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        raise TokenizerMismatchError(f"tokenizer {path} lacks special tokens {missing}")
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        raise TokenizerMismatchError(
            f"tokenizer {path} pads or truncates every text it encodes ({_pads_or_truncates(tokenizer)}); "
            "embedlab pads and cuts itself: freeze it with canonical_tokenizer")
    return FrozenTokenizer(tokenizer=tokenizer, hash=digest, path=path, specials=specials)


def special_tokens(tokenizer: Tokenizer) -> tuple[str, ...] | None:
    """The (pad, unk, cls, sep, mask) names of `tokenizer`: the first of `SPECIAL_TOKEN_SETS`
    whose five tokens it holds, or None."""
    return next((names for names in SPECIAL_TOKEN_SETS.values()
                 if all(tokenizer.token_to_id(t) is not None for t in names)), None)


def _pads_or_truncates(tokenizer: Tokenizer) -> str:
    parts = []
    if tokenizer.padding is not None:
        parts.append(f"padding to {tokenizer.padding.get('length') or 'the longest'}")
    if tokenizer.truncation is not None:
        parts.append(f"truncation at {tokenizer.truncation.get('max_length')}")
    return ", ".join(parts)


def canonical_tokenizer(path: Path) -> str:
    """A pretrained checkpoint's `tokenizer.json` as embedlab freezes it: the same normaliser,
    pre-tokenizer, model, post-processor and added tokens, with padding and truncation off
    (embedlab pads and cuts texts itself). Its sha256 is the tokenizer's hash."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer.to_str()


def stored_tokenizer(digest: str) -> Path:
    """Where a pretrained tokenizer of sha256 `digest` is kept on this node (`store_tokenizer`)."""
    return store.cache_dir() / STORE_DIR / digest / FILE_NAME


def store_tokenizer(data: bytes) -> str:
    """Keep a frozen tokenizer file's bytes by their sha256 on this node, so data prepared for
    a pretrained parent finds it by the hash its config names (`DataConfig.tokenizer_hash`);
    returns the hash."""
    digest = hashlib.sha256(data).hexdigest()
    target = stored_tokenizer(digest)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{FILE_NAME}.{digest[:8]}.{time.time_ns()}")
        staging.write_bytes(data)
        staging.replace(target)  # whole or absent
    return digest


def describe(tokenizer: Tokenizer | FrozenTokenizer, *, pretrained: bool = False) -> dict:
    """Kind, vocabulary size, pipeline, special ids and library version, for run manifests;
    `pretrained`: a parent's own tokenizer, whose kind is "pretrained" and its model named."""
    if isinstance(tokenizer, FrozenTokenizer):
        tokenizer = tokenizer.tokenizer
    config = json.loads(tokenizer.to_str())
    if pretrained:
        return {
            "kind": "pretrained",
            "model": config["model"]["type"],
            "vocab_size": tokenizer.get_vocab_size(),
            "normalizer": _summary(config["normalizer"]),
            "pre_tokenizer": _summary(config["pre_tokenizer"]),
            "special_token_ids": {token: tokenizer.token_to_id(token) for token in special_tokens(tokenizer) or ()},
            "tokenizers_version": tokenizers.__version__,
        }
    kind = _kind(config)
    return {
        "kind": kind,
        "vocab_size": tokenizer.get_vocab_size(),
        "normalizer": _summary(config["normalizer"]),
        "pre_tokenizer": _summary(config["pre_tokenizer"]),
        # Only the type: the ByteLevel decoder serialises settings it ignores.
        "decoder": config["decoder"]["type"] if config["decoder"] else "none",
        "byte_fallback": kind == "byte-level",
        "special_token_ids": {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS},
        "tokenizers_version": tokenizers.__version__,
    }


def _kind(config: dict) -> str:
    """Which of `TOKENIZER_KINDS` a serialised tokenizer was built as."""
    model = config["model"]["type"]
    pre_tokenizer = (config["pre_tokenizer"] or {}).get("type")
    if model == "Unigram":
        return "unigram"
    if model == "BPE":
        return "byte-level" if pre_tokenizer == "ByteLevel" else "bpe"
    raise ValueError(f"not a kind this module trains: model {model}, pre-tokenizer {pre_tokenizer}")


def _summary(component: dict | None) -> str:
    """A pipeline component as text: `NFKC + Lowercase`, `Digits(individual_digits=True)`."""
    if component is None:
        return "none"
    if component["type"] == "Sequence":
        # The list's key differs by component ("normalizers", "pretokenizers").
        parts = next(value for value in component.values() if isinstance(value, list))
        return " + ".join(_summary(part) for part in parts)
    settings = ", ".join(f"{key}={value}" for key, value in component.items() if key != "type")
    return f"{component['type']}({settings})" if settings else component["type"]
