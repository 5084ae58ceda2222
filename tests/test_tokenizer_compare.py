"""Tokenizer kinds (BPE, Unigram, byte-level) and the held-out comparison between them."""

import json

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from embedlab.sources.builtin import iter_documents
from embedlab.tokenizer.frozen import (
    SPECIAL_TOKENS,
    TOKENIZER_KINDS,
    describe,
    save_tokenizer,
    train_tokenizer,
)
from embedlab.bench.tokenizers import ROW_KEYS, SOURCE_KEYS, compare_tokenizers, format_comparison

VOCAB = 800
# Characters Python's documentation does not contain (checked in the test that relies on it).
UNSEEN = [
    "Parrot 🦜 and snake 🐍 emoji.",
    "漢字とかなの混じった文です。",
    "Ελληνικά 🙂 κείμενο",
]
QUIET = {"progress": lambda _: None}


def _split(source: str, limit: int, held_out: int) -> tuple[list[str], list[str]]:
    texts = [doc.text for doc in iter_documents(source, limit=limit)]
    return texts[:-held_out], texts[-held_out:]


@pytest.fixture(scope="module")
def texts():
    """Real training texts and held-out texts per source, never overlapping."""
    docstrings_train, docstrings_eval = _split("python-docstrings", limit=1000, held_out=200)
    docs_train, docs_eval = _split("python-docs", limit=60, held_out=15)
    return docstrings_train + docs_train, {
        "python-docstrings": docstrings_eval,
        "python-docs": docs_eval,
        "unseen": UNSEEN,
    }


@pytest.fixture(scope="module")
def rows(texts):
    train, held_out = texts
    return compare_tokenizers(train, held_out, vocab_size=VOCAB, max_length=128, **QUIET)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_every_kind_trains_on_real_text_with_fixed_special_ids(kind, texts, tmp_path):
    """Each kind trains on real documentation, saves and reloads with PAD..MASK at ids 0-4."""
    frozen = save_tokenizer(train_tokenizer(texts[0], VOCAB, kind=kind), tmp_path)
    assert frozen.special_ids == (0, 1, 2, 3, 4)
    ids = (frozen.pad_id, frozen.unk_id, frozen.cls_id, frozen.sep_id, frozen.mask_id)
    assert ids == (0, 1, 2, 3, 4)
    assert describe(frozen)["kind"] == kind
    assert list(describe(frozen)["special_token_ids"].values()) == [0, 1, 2, 3, 4]
    ids = frozen.encode_batch(["Return a new list containing all items."])[0]
    assert ids and all(i >= len(SPECIAL_TOKENS) for i in ids)


def test_default_kind_is_the_original_bpe_with_the_same_hash(texts, tmp_path):
    """The default call, kind="bpe" and the pre-`kind` BPE recipe by hand save identical files."""
    original = Tokenizer(models.BPE(unk_token="[UNK]"))
    original.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    original.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    original.train_from_iterator(texts[0], trainer=trainer)
    expected = save_tokenizer(original, tmp_path / "original").hash
    default = train_tokenizer(texts[0], VOCAB)
    explicit = train_tokenizer(texts[0], VOCAB, kind="bpe")
    assert save_tokenizer(default, tmp_path / "default").hash == expected
    assert save_tokenizer(explicit, tmp_path / "bpe").hash == expected


def test_only_byte_level_avoids_unk_on_unseen_characters(texts, rows):
    """On emoji/CJK unseen in training BPE and Unigram emit UNK; byte-level falls back to bytes."""
    training_chars = set("".join(texts[0]).lower())
    assert not training_chars & set("🦜🐍🙂漢字混"), "precondition: characters unseen"
    unseen = {row["kind"]: row["sources"]["unseen"] for row in rows}
    assert unseen["bpe"]["unk_rate"] > 0 and unseen["unigram"]["unk_rate"] > 0
    assert unseen["byte-level"]["unk_rate"] == 0
    assert unseen["byte-level"]["byte_fallback_rate"] > 0
    assert unseen["bpe"]["byte_fallback_rate"] is None
    assert unseen["unigram"]["byte_fallback_rate"] is None


def test_byte_level_decodes_unseen_text_exactly(texts):
    """Byte-level keeps case, spacing and unseen characters: decode(encode(text)) is the text."""
    tokenizer = train_tokenizer(texts[0], VOCAB, kind="byte-level")
    for text in [*UNSEEN, "  Two  spaces,\nA newline and CamelCase."]:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids) == text


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_truncation_rate_counts_documents_longer_than_the_content_window(kind, texts):
    """max_length 10 leaves 8 content tokens: of documents of 7, 8, 9, 20 tokens, half truncate."""
    # "a" is one token in every word-level vocabulary, and each space-separated "a" is one word.
    held_out = {"known": [" ".join(["a"] * n) for n in (7, 8, 9, 20)]}
    [row] = compare_tokenizers(
        texts[0][:300], held_out, vocab_size=VOCAB, max_length=10, kinds=[kind], **QUIET
    )
    assert row["tokens"] == 7 + 8 + 9 + 20
    assert row["truncation_rate"] == 0.5
    assert row["sources"]["known"]["truncation_rate"] == 0.5


def test_unknown_kind_is_refused_with_the_valid_kinds():
    """An unknown kind raises ValueError naming the valid kinds, before any comparison work."""
    with pytest.raises(ValueError, match="bpe, unigram, byte-level"):
        train_tokenizer(["some text"], 300, kind="wordpiece")
    messages = []
    with pytest.raises(ValueError, match="bpe, unigram, byte-level"):
        compare_tokenizers(
            ["some text"],
            {"s": ["text"]},
            vocab_size=300,
            max_length=16,
            kinds=["bpe", "wordpiece"],
            progress=messages.append,
        )
    assert messages == []


def test_rows_have_every_documented_key_and_sensible_values(rows, texts):
    """One JSON-ready row per kind with the documented keys, positive speeds and rates in [0, 1]."""
    assert [row["kind"] for row in rows] == list(TOKENIZER_KINDS)
    json.dumps(rows)
    for row in rows:
        assert tuple(row) == ROW_KEYS
        assert list(row["sources"]) == list(texts[1])
        assert 5 < row["vocab_size"] <= VOCAB
        assert row["train_documents"] == len(texts[0]) and row["train_seconds"] > 0
        assert row["tokens_per_second"] > 0 and row["documents_per_second"] > 0
        assert row["tokenizer"]["kind"] == row["kind"]
        assert all(tuple(stats) == SOURCE_KEYS for stats in row["sources"].values())
        for stats in [row, *row["sources"].values()]:
            assert stats["tokens_per_document"] > 0 and stats["tokens_per_1k_chars"] > 0
            fallback = stats["byte_fallback_rate"]
            assert 0 <= stats["truncation_rate"] <= 1 and 0 <= stats["unk_rate"] <= 1
            assert fallback is None or 0 <= fallback <= 1
        assert row["documents"] == sum(s["documents"] for s in row["sources"].values())
        assert row["tokens"] == sum(s["tokens"] for s in row["sources"].values())
    # Full python-docs topics run to thousands of tokens: most cannot fit in 128.
    assert all(row["sources"]["python-docs"]["truncation_rate"] > 0.5 for row in rows)
    table = format_comparison(rows)
    assert all(kind in table for kind in TOKENIZER_KINDS)
    assert "python-docstrings" in table and "n/a" in table
