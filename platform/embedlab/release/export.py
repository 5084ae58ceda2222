"""Release packages: a checkpoint's encoder as a directory sentence-transformers loads.

    encoder.safetensors                the encoder only (MLM heads dropped), byte for byte the checkpoint's
    tokenizer.json                     the frozen tokenizer (its hash is in the manifest)
    manifest.json                      content hash, lineage and the embedding contract
    modules.json                       the sentence-transformers pipeline: EmbedlabTransformer, then Normalize
    config_sentence_transformers.json  the prefixes as the prompts "query" and "document"
    1_Normalize/config.json            sentence-transformers' own L2 normalisation

The contract in `manifest["pooling"]` is what `evaluate.encode.encode_texts` does when the
evaluator scores a checkpoint, and `EmbedlabTransformer` (`st_module.py`) does the same inside
sentence-transformers:

    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer("release/", trust_remote_code=True)
    queries = model.encode(["how do I sort a list"], prompt_name="query")
    passages = model.encode(["Return a new sorted list."], prompt_name="document")

`trust_remote_code=True` is how sentence-transformers >= 6 allows a module class from outside
its own package; it imports the installed `embedlab` and downloads nothing. The package is also
an embedlab checkpoint directory (`load_encoder` reads and verifies it).

A checkpoint with a pretrained backbone (`manifest["model"]["backbone"]`) is released instead
as a native sentence-transformers model in its own architecture, which loads without remote
code (`embedlab.release.native`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from embedlab.core import store
from embedlab.core.schema import upgrade
from embedlab.tokenizer.frozen import FILE_NAME as TOKENIZER_FILE
from embedlab.checkpoints.io import (
    ENCODER_FILE, MANIFEST_FILE, CheckpointError, content_hash, load_encoder, local_checkpoint, staged_directory,
)
from embedlab.release.native import is_native, native_manifest, write_native_package

# A string, not an import: exporting needs no sentence-transformers; the tests load the package.
# The stable path (`embedlab/st_module.py`), not the class's home, so releases load across versions.
MODULE_CLASS = "embedlab.st_module.EmbedlabTransformer"
NORMALIZE_CLASS = "sentence_transformers.base.modules.normalize.Normalize"
NORMALIZE_DIR = "1_Normalize"
# The query side is asked for by name; every other text is embedded as a passage, as the
# evaluator does for documents and the retention panel.
PROMPT_NAMES = {"query": "query", "passage": "document"}
DEFAULT_PROMPT_NAME = PROMPT_NAMES["passage"]
LINEAGE_FIELDS = ("config", "data_revision")
# L2 normalisation divides by max(norm, 1e-12): a zero row stays zero, never NaN.
ZERO_VECTOR_RULE = {
    "mean": "a row with no content token (empty prefix + text, or one the tokenizer maps to nothing) "
            "pools to the zero vector and stays zero after L2 normalisation (never NaN); it scores 0 "
            "against everything",
    "mean_all": "every row holds CLS and SEP, which are pooled, so no row is zero (an empty text embeds "
                "as its CLS and SEP states)",
    "cls": "the CLS state is pooled, present in every row; an all-zero state would stay zero after "
           "L2 normalisation (never NaN)",
}


def export_release_to(checkpoint: str | Path, out: str | Path) -> dict[str, Any]:
    """`export_release` into `out`, a local directory or a storage URI (`embedlab.core.store`). On
    object storage the package is built locally, then uploaded with its manifest last, so a
    reader that finds the manifest finds every file it names."""
    if store.local_path(out) is not None:
        return export_release(checkpoint, store.local_path(out))
    if store.list_tree(out):
        raise CheckpointError(f"{out}: exists and is not empty; export into a new or empty location")
    with tempfile.TemporaryDirectory(prefix="embedlab-release-") as scratch:
        local = Path(scratch) / "release"
        manifest = export_release(checkpoint, local)
        store.upload_tree(local, out, last=MANIFEST_FILE)
    return manifest


def export_release(checkpoint_dir: str | Path, out_dir: Path) -> dict[str, Any]:
    """Write the release package of a checkpoint into a new (or empty) `out_dir`; returns its manifest.

    The checkpoint is verified first (every file hash, the tokenizer hash, the weights against
    the recorded model config). The package is written next to `out_dir` and moved into place
    at the end, so a failed export leaves nothing behind.
    """
    checkpoint_dir, out_dir = local_checkpoint(checkpoint_dir), Path(out_dir)  # a URI: its verified copy
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):  # before the slow checks
        raise CheckpointError(f"{out_dir}: exists and is not empty; export into a new or empty directory")
    blocker = next((p for p in out_dir.absolute().parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise CheckpointError(f"{out_dir}: {blocker} is a file, not a directory; export into a new or empty directory")
    _, _, checkpoint = load_encoder(checkpoint_dir)
    missing = [name for name in LINEAGE_FIELDS if name not in checkpoint]
    if missing:
        raise CheckpointError(
            f"{checkpoint_dir / MANIFEST_FILE}: no {missing} recorded; a release states its lineage, "
            "so only checkpoints written by a training phase can be exported"
        )
    if is_native(checkpoint):
        return _export_native(checkpoint_dir, out_dir, checkpoint)
    manifest = _release_manifest(checkpoint)
    with staged_directory(out_dir, "export into a new or empty directory") as staging:
        for name in (ENCODER_FILE, TOKENIZER_FILE):
            shutil.copyfile(checkpoint_dir / name, staging / name)
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        _write_sentence_transformers_files(staging, manifest["pooling"]["prefixes"])
    return manifest


def _export_native(checkpoint_dir: Path, out_dir: Path, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The native sentence-transformers package of a pretrained backbone (`embedlab.release.native`)."""
    max_length = checkpoint["config"]["eval"]["max_length"]
    prompts = _prompts(checkpoint["pooling"]["prefixes"])
    contract = _embedding_contract(checkpoint["pooling"], max_length)
    with staged_directory(out_dir, "export into a new or empty directory") as staging:
        weights = write_native_package(checkpoint_dir, staging, checkpoint, max_length, prompts)
        manifest = native_manifest(checkpoint, weights, contract, _trained_widths(checkpoint), prompts)
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def export_inference(directory: str | Path, out: Path) -> dict[str, Any]:
    """The release package of a checkpoint at any location (`train.checkpoint.local_checkpoint`):
    `export_release` under its older name."""
    return export_release(local_checkpoint(directory), Path(out))


def _release_manifest(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The package manifest: the checkpoint's fields (lineage, config, versions) with the encoder
    as the only weight file, the checkpoint's hash as `exported_from`, and the full contract."""
    files = {ENCODER_FILE: checkpoint["files"][ENCODER_FILE]}
    # The scoring length of the resolved config the checkpoint was trained under (eval.max_length,
    # 128 by default: also `evaluate_checkpoint`'s default, which is what the evaluator passes today).
    max_length = checkpoint["config"]["eval"]["max_length"]
    # Training state stays with the checkpoint: a release holds the encoder and its contract.
    kept = {k: v for k, v in checkpoint.items() if k != "training_state"}
    return {
        **kept,
        "files": files,
        "content_hash": content_hash(files),
        "exported_from": checkpoint["content_hash"],
        "package": "release (encoder only; MLM heads dropped; loads in sentence-transformers)",
        "pooling": _embedding_contract(checkpoint["pooling"], max_length),
        "matryoshka": _trained_widths(checkpoint),
        "sentence_transformers": {
            "module": MODULE_CLASS,
            "prompts": _prompts(checkpoint["pooling"]["prefixes"]),
            "default_prompt_name": DEFAULT_PROMPT_NAME,
            "load": "SentenceTransformer(path, trust_remote_code=True)",
        },
    }


def _trained_widths(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The widths the checkpoint's phase trained its contrastive term at (`contrastive.matryoshka`;
    the full width alone without them), and how a consumer reproduces a truncated width."""
    config = upgrade(checkpoint["config"], "config")  # a checkpoint of any schema
    width = config["model"]["width"]
    matryoshka = config.get("contrastive", {}).get("matryoshka", {})
    dims = list(matryoshka.get("dims") or [width])
    weights = list(matryoshka.get("weights") or [1.0] * len(dims))
    return {
        "trained_widths": dims, "weights": weights, "phase": checkpoint.get("phase"),
        "truncate": "SentenceTransformer(path, truncate_dim=d) keeps the first d coordinates of the unit "
                    "embedding: score them with cosine similarity (the package's similarity function) or "
                    "re-normalise them first, as training and evaluation did; a dot product of truncated "
                    "rows is not what was trained",
    }


def _embedding_contract(pooling: dict[str, Any], max_length: int) -> dict[str, Any]:
    """The checkpoint's pooling record plus what a consumer needs to reproduce `encode_texts`."""
    return {
        **pooling,
        "max_length": max_length,
        "truncation": f"prefix + text is tokenised and its tokens cut to max_length - 2 = {max_length - 2} "
                      "before [CLS] and [SEP] are added (the prefix counts toward the limit)",
        "prefix_tokens": "content: they are embedded and, under mean pooling, averaged with the text's tokens",
        "zero_vector": ZERO_VECTOR_RULE[pooling["method"]],
    }


def _write_sentence_transformers_files(directory: Path, prefixes: dict[str, str]) -> None:
    """modules.json, config_sentence_transformers.json and the Normalize config, as
    sentence-transformers' own `save` lays them out."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": MODULE_CLASS},
        {"idx": 1, "name": "1", "path": NORMALIZE_DIR, "type": NORMALIZE_CLASS},
    ]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    config = {
        "model_type": "SentenceTransformer",
        "prompts": _prompts(prefixes),
        "default_prompt_name": DEFAULT_PROMPT_NAME,
        # Rows are unit (or zero) length, so cosine and dot product agree.
        "similarity_fn_name": "cosine",
    }
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (directory / NORMALIZE_DIR).mkdir()
    normalize = {"module_input_name": "sentence_embedding", "module_output_name": "sentence_embedding"}
    (directory / NORMALIZE_DIR / "config.json").write_text(json.dumps(normalize, indent=2))


def _prompts(prefixes: dict[str, str]) -> dict[str, str]:
    """embedlab's {"query", "passage"} prefixes under sentence-transformers' prompt names."""
    return {name: prefixes[side] for side, name in PROMPT_NAMES.items()}
