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

import dataclasses
import hashlib
import json
import platform as stdlib_platform
from dataclasses import dataclass
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
    encoder: Encoder,
    *,
    head: torch.nn.Module | None,
    tokenizer: FrozenTokenizer,
    fields: dict[str, Any],
    pooling: str = "mean",
    prefixes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write weights, tokenizer and manifest into `directory`; returns the manifest.

    `head` (an MLM head) is saved apart from the encoder, without its tied decoder, so the
    inference package is `encoder.safetensors` + `tokenizer.json` + `manifest.json`.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    encoder_state = {k: v.detach().cpu().contiguous() for k, v in encoder.state_dict().items()}
    save_file(encoder_state, str(directory / ENCODER_FILE))
    names = [ENCODER_FILE]
    if head is not None:
        # The head's decoder is the embedding table: saved once, in the encoder file.
        head_state = {
            k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()
            if not (k.startswith("embedding.") or ".embedding." in k)
        }
        save_file(head_state, str(directory / HEAD_FILE))
        names.append(HEAD_FILE)
    (directory / TOKENIZER_FILE).write_bytes(tokenizer.path.read_bytes())
    files = {name: _sha256(directory / name) for name in names}
    manifest = {
        "format": FORMAT,
        "content_hash": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
        "files": files,
        "parent_hash": None,
        "tokenizer_hash": tokenizer.hash,
        "model": dataclasses.asdict(encoder.config),
        "pooling": pooling_record(pooling, prefixes or {"query": "", "passage": ""}),
        "versions": versions(),
        **fields,
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def pooling_record(method: str, prefixes: dict[str, str]) -> dict[str, Any]:
    return {
        "method": method,
        "special_tokens": "excluded (CLS and SEP are not averaged)" if method == "mean" else "CLS state only",
        "normalise": "l2; an all-zero vector stays zero",
        "input_template": "[CLS] prefix + text [SEP]",
        "prefixes": prefixes,
    }


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


@dataclass(frozen=True)
class Parent:
    """A verified parent checkpoint loaded for a child phase."""

    model: torch.nn.Module  # MLMModel when the child needs an MLM head, else Encoder
    manifest: dict[str, Any]
    head_restored: bool


def load_parent(directory: Path, *, tokenizer_hash: str, need_head: bool) -> Parent:
    """Load a parent for training; refuses one whose tokenizer differs from the child's data.

    A joint child of a parent without an MLM head gets a freshly initialised head, and the
    manifest records that (`head_restored` False).
    """
    encoder, _, manifest = load_encoder(directory)
    if manifest["tokenizer_hash"] != tokenizer_hash:
        raise CheckpointError(
            f"{directory}: parent tokenizer {manifest['tokenizer_hash'][:12]}... differs from this phase's "
            f"tokenizer {tokenizer_hash[:12]}...; changing vocabulary needs a documented embedding migration"
        )
    encoder.train()
    if not need_head:
        return Parent(model=encoder, manifest=manifest, head_restored=False)
    model = MLMModel(encoder.config)
    model.encoder.load_state_dict(encoder.state_dict())
    head_path = Path(directory) / HEAD_FILE
    if head_path.is_file():
        missing, unexpected = model.mlm_head.load_state_dict(load_file(str(head_path)), strict=False)
        if unexpected or [k for k in missing if not k.startswith("embedding.")]:
            raise CheckpointError(f"{head_path}: unexpected keys {unexpected}, missing {missing}")
    return Parent(model=model, manifest=manifest, head_restored=head_path.is_file())


def export_inference(directory: Path, out: Path) -> dict[str, Any]:
    """Copy the inference package of a checkpoint: encoder weights, tokenizer and a manifest
    that keeps the consumer contract (pooling, prefixes, tokenizer hash) and the lineage, and
    drops every MLM head. Refuses an existing non-empty `out`."""
    manifest = verify_checkpoint(Path(directory))
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out}: exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    for name in (ENCODER_FILE, TOKENIZER_FILE):
        (out / name).write_bytes((Path(directory) / name).read_bytes())
    files = {ENCODER_FILE: manifest["files"][ENCODER_FILE]}
    exported = {
        **manifest,
        "files": files,
        "content_hash": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
        "exported_from": manifest["content_hash"],
        "package": "inference (encoder only; MLM heads dropped)",
    }
    (out / MANIFEST_FILE).write_text(json.dumps(exported, indent=2, sort_keys=True))
    return exported
