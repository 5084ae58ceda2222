"""The BPE tokenizer: special ids, training-split only, hash identity."""

import pytest

from embedlab.tokenizer.frozen import SPECIAL_TOKENS, load_tokenizer, save_tokenizer, train_tokenizer

TEXTS = [
    "Return a new list containing all items from the iterable in ascending order.",
    "Open file and return a corresponding file object.",
    "In the beginning God created the heaven and the earth.",
] * 50


def test_special_tokens_have_fixed_ids_and_hash_is_stable(tmp_path):
    """PAD, UNK, CLS, SEP, MASK are ids 0-4; retraining on the same text gives the same hash."""
    first = save_tokenizer(train_tokenizer(TEXTS, 300), tmp_path / "a")
    second = save_tokenizer(train_tokenizer(TEXTS, 300), tmp_path / "b")
    assert [first.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (first.pad_id, first.unk_id, first.cls_id, first.sep_id, first.mask_id) == (0, 1, 2, 3, 4)
    assert first.hash == second.hash
    ids = first.encode_batch(["Return a new list."])[0]
    assert ids and all(i >= len(SPECIAL_TOKENS) for i in ids)


def test_hash_mismatch_is_refused(tmp_path):
    """Loading with a different expected hash fails with a message about the checkpoint."""
    frozen = save_tokenizer(train_tokenizer(TEXTS, 300), tmp_path)
    with pytest.raises(ValueError, match="different tokenizer"):
        load_tokenizer(frozen.path, expected_hash="0" * 64)


def test_prepared_tokenizer_never_saw_evaluation_text(prepared):
    """The prepared tokenizer was trained on train-split documents only: the evaluation task's
    documents all come from dev/test splits of the corpus."""
    import pyarrow.compute as pc

    from embedlab.core.beir import load_task

    corpus = prepared.corpus.read()
    task = load_task(prepared.task_dir("python-docstrings"))
    splits = dict(zip(corpus["doc_id"].to_pylist(), corpus["split"].to_pylist()))
    assert {splits[d] for d in task.corpus} <= {"dev", "test"}
    train_ids = set(pc.filter(corpus["doc_id"], pc.equal(corpus["split"], "train")).to_pylist())
    assert not train_ids & set(task.corpus)
    for split in ("dev", "test"):
        assert {splits[next(iter(rel))] for rel in task.qrels[split].values()} == {split}
