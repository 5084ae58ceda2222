"""Checkpoints: safetensors weights plus a JSON manifest; never pickle.

    encoder.safetensors    the encoder (the inference package needs only this file)
    mlm_head.safetensors   the MLM head without its tied decoder (the embedding table)
    config.json            a pretrained backbone's Hugging Face config (`embedlab.model.pretrained`)
    tokenizer.json         the frozen tokenizer, so a checkpoint is self-contained
    manifest.json          content hash, per-file hashes, parent hash, tokenizer hash,
                           model config, pooling, data revision, objective, precision,
                           distributed config, budget consumed, seeds, versions

The content hash is the sha256 of the weight files' hashes (and of config.json, which says
what the weights are); loading recomputes every file hash and refuses a mismatch, so a
corrupt or truncated file never loads silently.

Two backbones, told apart by one manifest field, `model.backbone`: "embedlab" (its own
`Encoder`, the default of older manifests) or a pretrained family ("bert", ...), whose encoder
file holds a `PretrainedEncoder`'s weights and whose manifest adds a `backbone` record and, down
the lineage, `pretrained_root`: the pinned pretrained parent (spec, revision, source file
hashes) every descendant, and its release, names (`embedlab.checkpoints.pretrained` makes one).

Every reader takes a location: a local directory, or a URI on object storage (`s3://`,
`gs://`, any pyarrow filesystem; `embedlab.core.store`). A remote checkpoint is fetched once into
this node's cache, `<EMBEDLAB_CACHE>/checkpoints/<manifest sha256>/`, each file checked against
the manifest's hash before the copy is published (`local_checkpoint`), and read from there.

A training checkpoint adds the complete training state (`embedlab.checkpoints.state`): optimizer,
progress counters and every worker's RNG states, recorded with their hashes under the
manifest's `training_state`; readers of the weights need none of it. A checkpoint is
written into a staging directory and renamed into place, so it is whole or absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform as stdlib_platform
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from embedlab.checkpoints.state import TrainingState, write_training_state
from embedlab.core import paths, store
from embedlab.checkpoints import CheckpointError, ENCODER_FILE, FORMAT, HEAD_FILE, HF_CONFIG_FILE, MANIFEST_FILE
from embedlab.core.code_identity import VERSION
from embedlab.core.config import ModelConfig
from embedlab.core.store import file_sha256, files_sha256
from embedlab.model.encoder import Encoder, MLMModel
from embedlab.model.pretrained import PretrainedEncoder, with_mlm_head
from embedlab.tokenizer.frozen import FILE_NAME as TOKENIZER_FILE, FrozenTokenizer, load_tokenizer

Location = str | Path  # a local checkpoint directory or a URI (`embedlab.core.store`)
CACHE_DIR = "checkpoints"  # under `store.cache_dir()`


def content_hash(files: dict[str, str]) -> str:
    """The checkpoint's identity: the sha256 of its weight files' hashes (name -> sha256)."""
    return files_sha256(files)


def versions() -> dict[str, str]:
    import ray

    return {
        "embedlab": VERSION,
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
    training_state: TrainingState | None = None,
) -> dict[str, Any]:
    """Write weights, tokenizer, manifest and (optionally) the training state into a new or
    empty `directory`; returns the manifest.

    `head` (an MLM head) is saved apart from the encoder, without its tied decoder, so the
    inference package is `encoder.safetensors` + `tokenizer.json` + `manifest.json`.
    Everything is written next to `directory` and renamed into place at the end.
    """
    with staged_directory(Path(directory), "a checkpoint goes into a new directory") as staging:
        return _write_checkpoint(staging, encoder, head, tokenizer, fields, pooling, prefixes, training_state)


@contextmanager
def staged_directory(directory: Path, rule: str) -> Iterator[Path]:
    """A sibling staging directory, renamed to `directory` when the block succeeds and removed
    when it fails, so `directory` is whole or absent. `directory` must be new or empty (else
    a CheckpointError ending in `rule`); a staging left by a killed writer is cleared first."""
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise CheckpointError(f"{directory}: exists and is not empty; {rule}")
    staging = directory.with_name(f".{directory.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        yield staging
        if directory.exists():
            directory.rmdir()  # empty, checked above
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_checkpoint(directory, encoder, head, tokenizer, fields, pooling, prefixes, training_state):
    encoder_state = {k: v.detach().cpu().contiguous() for k, v in encoder.state_dict().items()}
    save_file(encoder_state, str(directory / ENCODER_FILE))
    names = [ENCODER_FILE]
    if head is not None:
        save_file(_head_state(head), str(directory / HEAD_FILE))
        names.append(HEAD_FILE)
    pretrained = isinstance(encoder, PretrainedEncoder)
    if pretrained:
        (directory / HF_CONFIG_FILE).write_text(json.dumps(encoder.hf_config, indent=2, sort_keys=True))
        names.append(HF_CONFIG_FILE)
    (directory / TOKENIZER_FILE).write_bytes(tokenizer.path.read_bytes())
    files = {name: file_sha256(directory / name) for name in names}
    manifest = {
        "format": FORMAT,
        "content_hash": content_hash(files),
        "files": files,
        "parent_hash": None,
        "tokenizer_hash": tokenizer.hash,
        "model": dataclasses.asdict(encoder.config),
        **({"backbone": encoder.backbone_record()} if pretrained else {}),
        "pooling": pooling_record(pooling, prefixes or {"query": "", "passage": ""}),
        "versions": versions(),
        **fields,
    }
    if training_state is not None:
        manifest["training_state"] = write_training_state(directory, training_state)
    # Written last: a directory without a manifest is not a checkpoint.
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def _head_state(head: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The head's tensors without its decoder, which is the embedding table (saved once, in
    the encoder file)."""
    return {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items() if not _is_embedding(k)}


def _is_embedding(key: str) -> bool:
    return key.startswith("embedding.") or ".embedding." in key


SPECIAL_TOKEN_POLICY = {
    "mean": "excluded (CLS and SEP are not averaged)",
    "mean_all": "included (CLS and SEP are averaged with the text's tokens, sentence-transformers' mean)",
    "cls": "CLS state only",
}


def pooling_record(method: str, prefixes: dict[str, str]) -> dict[str, Any]:
    return {
        "method": method,
        "special_tokens": SPECIAL_TOKEN_POLICY[method],
        "normalise": "l2; an all-zero vector stays zero",
        "input_template": "[CLS] prefix + text [SEP]",
        "prefixes": prefixes,
    }


def local_checkpoint(location: Location) -> Path:
    """A local directory holding the checkpoint at `location`: the directory itself when it is
    local; for a URI, this node's verified copy, fetched on first use. The copy holds the
    weights, the tokenizer and the manifest (not the training state, which only Ray Train's
    own resume reads); each file is checked against the manifest's hash before the copy is
    published, so a corrupt object is refused (CheckpointError naming it), never cached."""
    local = store.local_path(location)
    if local is not None:
        return local
    try:
        raw = store.read_bytes(store.join(location, MANIFEST_FILE))
    except FileNotFoundError:
        raise CheckpointError(f"{store.redact(location)}: no {MANIFEST_FILE}; not an embedlab checkpoint") from None
    manifest = _parse_manifest(raw, f"{location}/{MANIFEST_FILE}")
    target = store.cache_dir() / CACHE_DIR / hashlib.sha256(raw).hexdigest()[:32]
    if (target / MANIFEST_FILE).is_file():
        return target  # published only after every file matched its hash
    staging = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        staging.mkdir(parents=True)
        expected = {**manifest["files"], TOKENIZER_FILE: None}  # the tokenizer's hash is checked by load_tokenizer
        for name, sha in expected.items():
            store.download(store.join(location, name), staging / name)
            if sha is not None and file_sha256(staging / name) != sha:
                raise CheckpointError(f"{location}/{name}: content hash mismatch (corrupt or truncated object); "
                                      "refused, nothing cached")
        (staging / MANIFEST_FILE).write_bytes(raw)
        try:
            staging.rename(target)
        except OSError:  # another process on this node published the same copy first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _parse_manifest(raw: bytes, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{where}: not valid JSON ({error})") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def read_manifest(directory: Location) -> dict[str, Any]:
    directory = local_checkpoint(directory)
    path = directory / MANIFEST_FILE
    found = paths.kind(directory)
    if found is None:
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    if found != "a directory":
        raise CheckpointError(f"checkpoint {directory}: {found}, not a directory; a checkpoint is the directory "
                              f"holding {MANIFEST_FILE} and the weights")
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; not an embedlab checkpoint")
    return _parse_manifest(path.read_bytes(), str(path))


def verify_checkpoint(directory: Location) -> dict[str, Any]:
    """The manifest, after checking every weight file against its recorded hash."""
    directory = local_checkpoint(directory)
    manifest = read_manifest(directory)
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing")
        if file_sha256(path) != expected:
            raise CheckpointError(f"{path}: content hash mismatch (corrupt or truncated file)")
    return manifest


def load_encoder(directory: Location) -> tuple[Encoder | PretrainedEncoder, FrozenTokenizer, dict[str, Any]]:
    """The verified encoder (eval mode), its tokenizer (hash checked) and the manifest."""
    directory = local_checkpoint(directory)
    manifest = verify_checkpoint(directory)
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE, expected_hash=manifest["tokenizer_hash"])
    encoder = build_encoder(directory, manifest)
    encoder.load_state_dict(load_file(str(directory / ENCODER_FILE)))
    encoder.eval()
    return encoder, tokenizer, manifest


def build_encoder(directory: Path, manifest: dict[str, Any]) -> Encoder | PretrainedEncoder:
    """An encoder of the checkpoint's architecture, its weights not yet loaded: dispatched on
    `manifest["model"]["backbone"]` alone (embedlab's `Encoder`, or a `PretrainedEncoder` of the
    checkpoint's config.json, whose derived config must be the one recorded)."""
    config = ModelConfig(**manifest["model"])
    if not config.pretrained:
        return Encoder(config)
    encoder = PretrainedEncoder(json.loads((directory / HF_CONFIG_FILE).read_text()))
    if encoder.config != config:
        raise CheckpointError(f"{directory / HF_CONFIG_FILE}: derives model {dataclasses.asdict(encoder.config)}, "
                              f"but the manifest records {manifest['model']}")
    return encoder


def pretrained_root(manifest: dict[str, Any]) -> dict[str, Any]:
    """{"pretrained_root": ...} naming the pinned pretrained parent a checkpoint descends from
    (its own `pretrained` record for a materialised parent), for a child's manifest; empty
    for a lineage of embedlab's own encoder."""
    root = manifest.get("pretrained_root") or manifest.get("pretrained")
    return {"pretrained_root": root} if root else {}


@dataclass(frozen=True)
class Parent:
    """A verified parent checkpoint loaded for a child phase."""

    model: torch.nn.Module  # MLMModel when the child needs an MLM head, else Encoder
    manifest: dict[str, Any]
    head_restored: bool


def load_parent(directory: Location, *, tokenizer_hash: str, need_head: bool, masking_ratio: float = 0.15) -> Parent:
    """Load a parent for training; refuses one whose tokenizer differs from the child's data.

    A joint child of a parent without an MLM head gets a freshly initialised head, and the
    manifest records that (`head_restored` False).
    """
    directory = local_checkpoint(directory)
    encoder, _, manifest = load_encoder(directory)
    if manifest["tokenizer_hash"] != tokenizer_hash:
        raise CheckpointError(
            f"{directory}: parent tokenizer {manifest['tokenizer_hash'][:12]}... differs from this phase's "
            f"tokenizer {tokenizer_hash[:12]}...; changing vocabulary needs a documented embedding migration"
        )
    encoder.train()
    if not need_head:
        return Parent(model=encoder, manifest=manifest, head_restored=False)
    model = _with_fresh_head(encoder)
    head_path = Path(directory) / HEAD_FILE
    if head_path.is_file():
        state = single_head_state(directory, manifest, masking_ratio)
        _check_head(head_path, *model.mlm_head.load_state_dict(state, strict=False))
    return Parent(model=model, manifest=manifest, head_restored=head_path.is_file())


def head_states(directory: Location, manifest: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    """Every MLM head of a checkpoint as one `MLMHead` state each (without the tied decoder),
    by name: "mlm" for a single head, mask<percent> for a dual-head checkpoint (whose tensors
    are stored under that prefix). Empty without a head."""
    head_path = local_checkpoint(directory) / HEAD_FILE
    if not head_path.is_file():
        return {}
    state = load_file(str(head_path))
    names = [h for h in manifest.get("objective", {}).get("heads", []) if h != "mlm"]
    if not names:
        return {"mlm": state}
    return {name: {k.split(".", 1)[1]: v for k, v in state.items() if k.startswith(f"{name}.")} for name in names}


def _with_fresh_head(encoder: Encoder | PretrainedEncoder) -> MLMModel:
    """`encoder`'s weights with a freshly initialised MLM head of its backbone."""
    if isinstance(encoder, PretrainedEncoder):
        return with_mlm_head(encoder)
    model = MLMModel(encoder.config)
    model.encoder.load_state_dict(encoder.state_dict())
    return model


def mlm_model(encoder: Encoder | PretrainedEncoder, head_state: dict[str, torch.Tensor]) -> MLMModel:
    """An evaluation `MLMModel` of `encoder`'s weights under one head state (`head_states`);
    the head's tied decoder is the encoder's embedding table."""
    model = _with_fresh_head(encoder).eval()
    model.mlm_head.load_state_dict(head_state, strict=False)
    return model


def head_ratio(name: str) -> float:
    """The masking ratio a dual-head checkpoint's head mask<percent> was trained at."""
    return float(name.removeprefix("mask").replace("_", ".")) / 100  # "mask2_5" is 2.5% (`ratio_names`)


def single_head_state(directory: Location, manifest: dict[str, Any], masking_ratio: float) -> dict[str, torch.Tensor] | None:
    """The checkpoint's MLM head as one `MLMHead` state, or None without a head. A dual-head
    checkpoint gives the head trained nearest `masking_ratio`: the one a phase-2 child
    continues with, and the one the retention panel scores at its 15%."""
    states = head_states(directory, manifest)
    if not states:
        return None
    return states["mlm"] if "mlm" in states else states[min(states, key=lambda h: abs(head_ratio(h) - masking_ratio))]


def load_weights(directory: Location, encoder: Encoder, head: torch.nn.Module | None) -> dict[str, Any]:
    """Copy a verified checkpoint's encoder (and head) weights into existing modules, in place
    (the resume path: the optimizer keeps pointing at the same parameters); returns the manifest."""
    directory = local_checkpoint(directory)
    manifest = verify_checkpoint(directory)
    encoder.load_state_dict(load_file(str(directory / ENCODER_FILE)))
    if head is not None:
        if HEAD_FILE not in manifest["files"]:
            raise CheckpointError(f"{directory / HEAD_FILE}: missing; the checkpoint holds no MLM head")
        _load_head(directory / HEAD_FILE, head)
    return manifest


def _load_head(path: Path, head: torch.nn.Module) -> None:
    _check_head(path, *head.load_state_dict(load_file(str(path)), strict=False))


def _check_head(path: Path, missing: list[str], unexpected: list[str]) -> None:
    if unexpected or [k for k in missing if not _is_embedding(k)]:
        raise CheckpointError(f"{path}: unexpected keys {unexpected}, missing {missing}")


def checkpoint_prefixes(manifest: dict) -> dict[str, str]:
    """The query and passage prefixes a checkpoint was trained with (its manifest's pooling
    record), as evaluation and phase-3 mining encode with them: none for a phase-1 checkpoint."""
    return manifest["pooling"].get("prefixes", {"query": "", "passage": ""})
