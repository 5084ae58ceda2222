"""Checkpoints: safetensors weights plus a JSON manifest; never pickle.

    encoder.safetensors    the encoder (the inference package needs only this file)
    mlm_head.safetensors   the MLM head without its tied decoder (the embedding table)
    tokenizer.json         the frozen tokenizer, so a checkpoint is self-contained
    manifest.json          content hash, per-file hashes, parent hash, tokenizer hash,
                           model config, pooling, data revision, objective, precision,
                           distributed config, budget consumed, seeds, versions

The content hash is the sha256 of the weight files' hashes; loading recomputes every
file hash and refuses a mismatch, so a corrupt or truncated file never loads silently.
"""

from __future__ import annotations

import hashlib
import json
import platform as stdlib_platform
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embedlab import __version__
from embedlab.config import ModelConfig
from embedlab.model.encoder import Encoder, MLMModel
from embedlab.tokenizer import FILE_NAME as TOKENIZER_FILE
from embedlab.tokenizer import FrozenTokenizer, load_tokenizer

FORMAT = "embedlab-checkpoint/1"
ENCODER_FILE = "encoder.safetensors"
HEAD_FILE = "mlm_head.safetensors"
MANIFEST_FILE = "manifest.json"
POOLING = {
    "method": "mean",
    "special_tokens": "excluded (CLS and SEP are not averaged)",
    "normalise": "l2; an all-zero vector stays zero",
    "input_template": "[CLS] text [SEP]",
}


class CheckpointError(ValueError):
    """A checkpoint directory is missing, incomplete or corrupt; the message names the file."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def versions() -> dict[str, str]:
    import ray

    return {
        "embedlab": __version__,
        "torch": torch.__version__,
        "ray": ray.__version__,
        "python": stdlib_platform.python_version(),
    }


def save_checkpoint(
    directory: Path,
    model: MLMModel,
    *,
    tokenizer: FrozenTokenizer,
    fields: dict[str, Any],
) -> dict[str, Any]:
    """Write weights, tokenizer and manifest into `directory`; returns the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    encoder_state = {k: v.detach().cpu().contiguous() for k, v in model.encoder.state_dict().items()}
    # The head's decoder is the embedding table: saved once, in the encoder file.
    head_state = {
        k: v.detach().cpu().contiguous()
        for k, v in model.mlm_head.state_dict().items()
        if not k.startswith("embedding.")
    }
    save_file(encoder_state, str(directory / ENCODER_FILE))
    save_file(head_state, str(directory / HEAD_FILE))
    (directory / TOKENIZER_FILE).write_bytes(tokenizer.path.read_bytes())
    files = {name: _sha256(directory / name) for name in (ENCODER_FILE, HEAD_FILE)}
    manifest = {
        "format": FORMAT,
        "content_hash": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
        "files": files,
        "parent_hash": None,
        "tokenizer_hash": tokenizer.hash,
        "model": model.encoder.config.__dict__ | {},
        "pooling": POOLING,
        "versions": versions(),
        **fields,
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def read_manifest(directory: Path) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; not an embedlab checkpoint")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def verify_checkpoint(directory: Path) -> dict[str, Any]:
    """The manifest, after checking every weight file against its recorded hash."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        if _sha256(path) != expected:
            raise CheckpointError(f"{path}: content hash mismatch (corrupt or truncated file)")
    return manifest


def load_encoder(directory: Path) -> tuple[Encoder, FrozenTokenizer, dict[str, Any]]:
    """The verified encoder (eval mode), its tokenizer (hash checked) and the manifest."""
    directory = Path(directory)
    manifest = verify_checkpoint(directory)
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE, expected_hash=manifest["tokenizer_hash"])
    encoder = Encoder(ModelConfig(**manifest["model"]))
    encoder.load_state_dict(load_file(str(directory / ENCODER_FILE)))
    encoder.eval()
    return encoder, tokenizer, manifest
