"""The release of a checkpoint with a pretrained backbone: a native sentence-transformers model
in the checkpoint's own architecture, which loads without `trust_remote_code`.

    model.safetensors                  the backbone's weights under transformers' own keys
    config.json                        its Hugging Face config (architectures: the family's base class)
    tokenizer.json                     the frozen tokenizer (its hash is in the manifest)
    tokenizer_config.json              its special tokens and maximum length
    modules.json                       sentence_transformers.models.Transformer, Pooling, Normalize
    sentence_bert_config.json          max_seq_length (the trained config's eval.max_length)
    1_Pooling/config.json              the checkpoint's pooling (mean over every token, or CLS)
    2_Normalize/                       L2 normalisation
    config_sentence_transformers.json  the prefixes as the prompts "query" and "document"
    manifest.json                      content hash, lineage back to the pinned pretrained parent
                                       (`pretrained_root`), the embedding contract

The module names and pooling keys are sentence-transformers' long-standing ones, which its
versions from 2 to 6 read. Loaded, it embeds as the evaluator does
(`embedlab.model.encode.encode_texts`): sentence-transformers' Transformer puts the prompt before
the text, cuts the tokens to `max_seq_length` with the tokenizer's [CLS] ... [SEP] around them,
runs the same weights, and its Pooling averages every token of the row (CLS and SEP included:
embedlab's "mean_all") or takes the CLS state; tests/test_pretrained.py holds the two equal.

    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer("release/")
    queries = model.encode(["how do I sort a list"], prompt_name="query")

Writing it needs `safetensors` and `json` only (no sentence-transformers, no transformers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from embedlab.checkpoints import ENCODER_FILE, HF_CONFIG_FILE, CheckpointError
from embedlab.checkpoints.io import content_hash
from embedlab.core.store import file_sha256
from embedlab.model.pretrained import FAMILIES
from embedlab.tokenizer.frozen import FILE_NAME as TOKENIZER_FILE, SPECIAL_ROLES, load_tokenizer

WEIGHTS_FILE = "model.safetensors"
ENCODER_PREFIX = "model."  # `PretrainedEncoder` keeps the base model under this attribute
MODULES = (("Transformer", ""), ("Pooling", "1_Pooling"), ("Normalize", "2_Normalize"))
ST_POOLING = {"mean_all": "mean", "cls": "cls"}  # embedlab's pooling -> sentence-transformers' mode


def native_manifest(checkpoint: dict[str, Any], weights: dict[str, str], contract: dict[str, Any],
                    trained_widths: dict[str, Any], prompts: dict[str, str]) -> dict[str, Any]:
    """The package manifest: the checkpoint's lineage with the pretrained root it descends from,
    the weights and config as its files, and the contract."""
    kept = {k: v for k, v in checkpoint.items() if k != "training_state"}
    return {
        **kept,
        "files": weights,
        "content_hash": content_hash(weights),
        "exported_from": checkpoint["content_hash"],
        "package": "release (native sentence-transformers: Transformer + Pooling + Normalize in the checkpoint's own "
                   "architecture; MLM heads dropped; loads without trust_remote_code)",
        "pretrained_root": checkpoint.get("pretrained_root") or checkpoint.get("pretrained"),
        "pooling": contract,
        "matryoshka": trained_widths,
        "sentence_transformers": {
            "modules": [f"sentence_transformers.models.{kind}" for kind, _ in MODULES],
            "prompts": prompts,
            "default_prompt_name": "document",
            "load": "SentenceTransformer(path)",
        },
    }


def write_native_package(checkpoint_dir: Path, staging: Path, checkpoint: dict[str, Any],
                         max_length: int, prompts: dict[str, str]) -> dict[str, str]:
    """Write the package's files (module docstring) but its manifest into `staging`; returns
    the weights' {name: sha256}."""
    method = checkpoint["pooling"]["method"]
    if method not in ST_POOLING:
        raise CheckpointError(f"{checkpoint_dir}: pooling {method!r} of a pretrained backbone; a native "
                              f"sentence-transformers release states {sorted(ST_POOLING)} only")
    state = load_file(str(checkpoint_dir / ENCODER_FILE))
    save_file({key.removeprefix(ENCODER_PREFIX): tensor for key, tensor in state.items()},
              str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
    hf_config = json.loads((checkpoint_dir / HF_CONFIG_FILE).read_text())
    family = FAMILIES[hf_config["model_type"]]
    (staging / HF_CONFIG_FILE).write_text(json.dumps({**hf_config, "architectures": [family.architecture]},
                                                     indent=2, sort_keys=True))
    shutil.copyfile(checkpoint_dir / TOKENIZER_FILE, staging / TOKENIZER_FILE)
    tokenizer = load_tokenizer(staging / TOKENIZER_FILE, expected_hash=checkpoint["tokenizer_hash"])
    tokens = {f"{role}_token": name for role, name in zip(SPECIAL_ROLES, tokenizer.specials)}
    positions = checkpoint["model"]["max_length"]
    (staging / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": positions,
         "clean_up_tokenization_spaces": False, **tokens}, indent=2, sort_keys=True))
    _write_modules(staging, checkpoint, max_length, prompts)
    return {name: file_sha256(staging / name) for name in (WEIGHTS_FILE, HF_CONFIG_FILE)}


def _write_modules(staging: Path, checkpoint: dict[str, Any], max_length: int, prompts: dict[str, str]) -> None:
    (staging / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
         for i, (kind, path) in enumerate(MODULES)], indent=2))
    (staging / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_length,
                                                                   "do_lower_case": False}, indent=2))
    mode = ST_POOLING[checkpoint["pooling"]["method"]]
    (staging / "1_Pooling").mkdir()
    (staging / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": checkpoint["model"]["width"], "pooling_mode_cls_token": mode == "cls",
        "pooling_mode_mean_tokens": mode == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}, indent=2, sort_keys=True))
    (staging / "2_Normalize").mkdir()
    (staging / "config_sentence_transformers.json").write_text(json.dumps({
        "model_type": "SentenceTransformer", "prompts": prompts, "default_prompt_name": "document",
        # Rows are unit length, so cosine and dot product agree.
        "similarity_fn_name": "cosine"}, indent=2, sort_keys=True))


def is_native(manifest: dict[str, Any]) -> bool:
    """Whether a checkpoint's release is a native sentence-transformers package (a pretrained backbone)."""
    return manifest["model"].get("backbone", "embedlab") != "embedlab"

