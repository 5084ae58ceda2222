"""A joint phase-2 child of a dual-head phase-1 parent continues with the parent's head whose
masking ratio is nearest its own (the demo tour promotes dual heads into the joint arm)."""

import torch

from embedlab.config import ModelConfig
from embedlab.model.heads import MultiHeadMLMModel
from embedlab.train.checkpoint import load_parent, save_checkpoint

TINY = ModelConfig(preset="tiny", layers=1, width=32, heads=2, ffn_width=64, vocab_size=512, max_length=64)


def test_joint_child_takes_the_nearest_ratio_head(tmp_path):
    from embedlab.tokenizer import save_tokenizer, train_tokenizer

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
