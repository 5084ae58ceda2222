"""A joint phase-2 child of a dual-head phase-1 parent continues with the parent's head whose
masking ratio is nearest its own (the demo tour promotes dual heads into the joint arm)."""

import torch

from embedlab.checkpoints.io import load_parent, save_checkpoint
from embedlab.core.config import ModelConfig
from embedlab.model.heads import MultiHeadMLMModel

TINY = ModelConfig(preset="tiny", layers=1, width=32, heads=2, ffn_width=64, vocab_size=512, max_length=64)


def test_joint_child_takes_the_nearest_ratio_head(tmp_path):
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    texts = [f"a parent with two heads, line {i} of {i * 3}" for i in range(100)]
    tokenizer = save_tokenizer(train_tokenizer(texts, vocab_size=300), tmp_path / "tokenizer")
    torch.manual_seed(0)
    parent = MultiHeadMLMModel(TINY, ["mask5", "mask50"])
    save_checkpoint(tmp_path / "parent", parent.encoder, head=parent.heads, tokenizer=tokenizer,
                    fields={"objective": {"heads": ["mask5", "mask50"]}})
    for ratio, expected in ((0.15, "mask5"), (0.4, "mask50")):
        child = load_parent(tmp_path / "parent", tokenizer_hash=tokenizer.hash, need_head=True, masking_ratio=ratio)
        assert child.head_restored
        head = child.model.mlm_head.state_dict()
        for key, value in parent.heads[expected].state_dict().items():
            assert torch.equal(head[key], value), (ratio, key)


def test_retention_scores_a_dual_head_checkpoint_with_its_head_nearest_15_percent(tmp_path):
    """The retention panel's masked-token accuracy exists for a dual-head checkpoint, and
    equals that of a single-head checkpoint holding the same encoder and its mask5 head
    (nearest the panel's 15%), not its mask50 head."""
    from embedlab.tasks.retention import mlm_accuracy_function
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    texts = [f"the panel masks fifteen percent of line {i} and {i * 7} words" for i in range(200)]
    tokenizer = save_tokenizer(train_tokenizer(texts, vocab_size=300), tmp_path / "tokenizer")
    torch.manual_seed(1)
    dual = MultiHeadMLMModel(TINY, ["mask5", "mask50"])
    # Heads that answer differently: mask5 always predicts the commonest token, mask50 one
    # that never occurs, so the head used shows in the accuracy.
    from collections import Counter

    common = Counter(t for ids in tokenizer.encode_batch(texts[:50]) for t in ids).most_common(1)[0][0]
    with torch.no_grad():
        dual.heads["mask5"].bias[common] = 1e4
        dual.heads["mask50"].bias[TINY.vocab_size - 1] = 1e4  # beyond the tokenizer's 300
    save_checkpoint(tmp_path / "dual", dual.encoder, head=dual.heads, tokenizer=tokenizer,
                    fields={"objective": {"heads": ["mask5", "mask50"]}})
    scores = {}
    for name in ("mask5", "mask50"):
        save_checkpoint(tmp_path / name, dual.encoder, head=dual.heads[name], tokenizer=tokenizer, fields={})
        scores[name] = mlm_accuracy_function(tmp_path / name)(texts[:50])
    got = mlm_accuracy_function(tmp_path / "dual")(texts[:50])
    assert got == scores["mask5"] > 0 and scores["mask50"] == 0
    save_checkpoint(tmp_path / "encoder-only", dual.encoder, head=None, tokenizer=tokenizer, fields={})
    assert mlm_accuracy_function(tmp_path / "encoder-only") is None


def test_a_contrastive_only_child_keeps_its_parents_head_frozen(tmp_path):
    """A contrastive-only phase-2 child trains its encoder and saves its parent's MLM head
    unchanged (dense, norm, bias), so its masked-token accuracy can be scored."""
    import dataclasses
    import json

    from safetensors.torch import load_file

    import synthetic

    frozen = synthetic.tokenizer(tmp_path / "tokenizer")
    parent = synthetic.write_parent(tmp_path / "parent", frozen)
    trial = synthetic.contrastive_trial(parent)
    trial = dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, mlm_weight=0.0))
    synthetic.train(trial, frozen, tmp_path / "run")
    final = max((tmp_path / "run").rglob("manifest.json"), key=lambda p: p.stat().st_mtime).parent
    before, after = load_file(str(parent / "mlm_head.safetensors")), load_file(str(final / "mlm_head.safetensors"))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    encoder_before = load_file(str(parent / "encoder.safetensors"))
    encoder_after = load_file(str(final / "encoder.safetensors"))
    assert any(not torch.equal(encoder_before[k], encoder_after[k]) for k in encoder_before)  # it did train
    assert json.loads((final / "manifest.json").read_text())["objective"]["mlm_head"].startswith("the parent's")


def test_a_dual_head_checkpoint_is_scored_on_each_of_its_heads(tmp_path):
    """The retention panel of a dual-head checkpoint reports retention/mlm_accuracy/mask5 and
    /mask50, each equal to that head scored alone, and retention/mlm_accuracy is mask5's (the
    head nearest 15%); a single-head checkpoint reports the plain key only."""
    from collections import Counter

    import numpy as np
    import pyarrow as pa

    from embedlab.tasks.retention import build_panel, mlm_accuracy_function, retention_scores
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    texts = [f"panel passage {i} from source {i % 2} holds {i * 7} words and more of them" for i in range(40)]
    tokenizer = save_tokenizer(train_tokenizer(texts, vocab_size=300), tmp_path / "tokenizer")
    corpus = pa.table({"doc_id": [f"d{i}" for i in range(40)], "source": [f"s{i % 2}" for i in range(40)],
                       "title": [""] * 40, "hash": [f"h{i:02d}" for i in range(40)], "split": ["dev"] * 40,
                       "text": texts})
    build_panel(corpus, tmp_path / "panel")
    torch.manual_seed(2)
    dual = MultiHeadMLMModel(TINY, ["mask5", "mask50"])
    common = Counter(t for ids in tokenizer.encode_batch(texts) for t in ids).most_common(1)[0][0]
    with torch.no_grad():  # heads that answer differently, so each score shows which head made it
        dual.heads["mask5"].bias[common] = 1e4
        dual.heads["mask50"].bias[TINY.vocab_size - 1] = 1e4
    save_checkpoint(tmp_path / "dual", dual.encoder, head=dual.heads, tokenizer=tokenizer,
                    fields={"objective": {"heads": ["mask5", "mask50"]}})

    def encode(batch: list[str]) -> np.ndarray:  # any embedding: the masked-token scores ignore it
        rows = np.array([[len(text) % 7 + 1.0, 1.0, 0.0, 0.0] for text in batch])
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    alone = {}
    for name in ("mask5", "mask50"):
        save_checkpoint(tmp_path / name, dual.encoder, head=dual.heads[name], tokenizer=tokenizer, fields={})
        alone[name] = retention_scores(tmp_path / "panel", encode, mlm_accuracy_function(tmp_path / name))
    scores = retention_scores(tmp_path / "panel", encode, mlm_accuracy_function(tmp_path / "dual"))
    assert scores["retention/mlm_accuracy/mask5"] == alone["mask5"]["retention/mlm_accuracy"] > 0
    assert scores["retention/mlm_accuracy/mask50"] == alone["mask50"]["retention/mlm_accuracy"] == 0
    assert scores["retention/mlm_accuracy"] == scores["retention/mlm_accuracy/mask5"]
    assert not any(key.startswith("retention/mlm_accuracy/") for key in alone["mask5"])
