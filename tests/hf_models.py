"""Tiny random Hugging Face encoders saved to a directory, as a user's checkpoint would be: a
BERT (with or without its masked-LM head, optionally as a sentence-transformers directory), a
RoBERTa and a ModernBERT, each with a fast tokenizer. Nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "how do I sort a list in python",
    "return a new sorted list from the items in iterable",
    "embeddings map text to vectors for retrieval",
    "a small random bert model for tests",
    "packing several documents into one row saves padding",
    "open file and return a corresponding file object",
] * 20
# BERT's specials are not the ids 0-4 (there [UNK] is 100, [CLS] 101, ...): here [MASK] is 5,
# which a range of "ids from len(specials) on" would draw as a random replacement.
BERT_SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # <mask> is added last, as in RoBERTa's vocabulary


def wordpiece(vocab_size: int = 200):
    """A BERT-style WordPiece tokenizer ([CLS] text [SEP] template)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(TEXTS, trainer=trainers.WordPieceTrainer(vocab_size=vocab_size,
                                                                            special_tokens=BERT_SPECIALS))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tokenizer


def byte_level_bpe(vocab_size: int = 300):
    """A RoBERTa-style byte-level BPE tokenizer (<s> text </s>), <mask> the last id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(TEXTS, trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=ROBERTA_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tokenizer


def _save_tokenizer(tokenizer, directory: Path, specials: dict[str, str], max_length: int, pad_to: int | None) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=max_length, **specials)
    fast.save_pretrained(directory)
    if pad_to:  # as the all-MiniLM-L6-v2 package's file does: it pads and truncates every text
        raw = json.loads((directory / "tokenizer.json").read_text())
        raw["padding"] = {"strategy": {"Fixed": pad_to}, "direction": "Right", "pad_to_multiple_of": None,
                          "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}
        raw["truncation"] = {"direction": "Right", "max_length": pad_to, "strategy": "LongestFirst", "stride": 0}
        (directory / "tokenizer.json").write_text(json.dumps(raw))


def save_bert(directory: Path, *, head: bool = True, dropout: float = 0.0, seed: int = 0, layers: int = 2,
              max_positions: int = 128, pad_to: int | None = None) -> Path:
    """A tiny random BERT (width 32, 4 heads) in Hugging Face layout: BertForMaskedLM with `head`,
    else BertModel (with its pooler, as a released base model has)."""
    import transformers
    from transformers import BertConfig, BertForMaskedLM, BertModel

    transformers.logging.set_verbosity_error()
    directory = Path(directory)
    tokenizer = wordpiece()
    _save_tokenizer(tokenizer, directory, dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                               sep_token="[SEP]", mask_token="[MASK]"), max_positions, pad_to)
    config = BertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=max_positions,
                        pad_token_id=0, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return _save_random(BertForMaskedLM if head else BertModel, config, directory, seed)


def save_roberta(directory: Path, *, seed: int = 0, family: str = "roberta") -> Path:
    """A tiny random RobertaForMaskedLM (or XLM-R's) with a byte-level BPE tokenizer."""
    import transformers
    from transformers import RobertaConfig, RobertaForMaskedLM, XLMRobertaConfig, XLMRobertaForMaskedLM

    transformers.logging.set_verbosity_error()
    directory = Path(directory)
    tokenizer = byte_level_bpe()
    _save_tokenizer(tokenizer, directory, dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                               cls_token="<s>", sep_token="</s>", mask_token="<mask>"), 64, None)
    kinds = {"roberta": (RobertaConfig, RobertaForMaskedLM), "xlm-roberta": (XLMRobertaConfig, XLMRobertaForMaskedLM)}
    config_class, model_class = kinds[family]
    config = config_class(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=66, pad_token_id=1,
                          bos_token_id=0, eos_token_id=2, type_vocab_size=1, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    return _save_random(model_class, config, directory, seed)


def save_modernbert(directory: Path, *, seed: int = 0, dropout: float = 0.0) -> Path:
    """A tiny random ModernBertForMaskedLM: 3 layers, the third global, the others with a
    16-token local window (so a 21-token text crosses it)."""
    import transformers
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    transformers.logging.set_verbosity_error()
    directory = Path(directory)
    tokenizer = wordpiece()
    _save_tokenizer(tokenizer, directory, dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                               sep_token="[SEP]", mask_token="[MASK]"), 64, None)
    ids = {name: tokenizer.token_to_id(name) for name in BERT_SPECIALS}
    config = ModernBertConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=32, num_hidden_layers=3,
                              num_attention_heads=4, intermediate_size=48, max_position_embeddings=64,
                              pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"],
                              bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"], global_attn_every_n_layers=3,
                              local_attention=16, attention_dropout=dropout, embedding_dropout=dropout,
                              mlp_dropout=dropout)
    return _save_random(ModernBertForMaskedLM, config, directory, seed)


def _save_random(model_class, config, directory: Path, seed: int) -> Path:
    """`model_class(config)` drawn from `seed` (the global RNG left as it was), its weights
    spread (`_spread`), saved in transformers' layout into `directory`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
        _spread(model)
    model.save_pretrained(directory)
    return directory


def _spread(model: torch.nn.Module) -> None:
    """Weights far from a fresh initialisation's 0.02, so a wrong mask, position or pooling moves the output."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)


def as_sentence_transformers(source: Path, directory: Path, *, pooling: str = "cls",
                             prompts: dict[str, str] | None = None, max_seq_length: int = 48,
                             modules: tuple[str, ...] = ("Transformer", "Pooling", "Normalize")) -> Path:
    """`source`'s files as a sentence-transformers directory (legacy module names and pooling keys)."""
    shutil.copytree(source, directory)
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    (directory / "modules.json").write_text(json.dumps([
        {"idx": i, "name": str(i), "path": paths[kind], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(modules)]))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 32, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": pooling == "max",
        "pooling_mode_mean_sqrt_len_tokens": False}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                      "do_lower_case": False}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts or {}}))
    return directory


def hub_layout(source: Path, cache: Path, repo_id: str, revision: str | None = None) -> str:
    """`source`'s files placed in a Hugging Face cache at `cache` as the Hub client lays them out
    (blobs by hash, a snapshot of symlinks, refs/main); returns the commit."""
    revision = revision or hashlib.sha1(repo_id.encode()).hexdigest()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, repo / "blobs" / digest)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / digest, link.parent), link)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return revision
