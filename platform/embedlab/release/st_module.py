"""`EmbedlabTransformer`: an embedlab encoder as the first module of a sentence-transformers model.

A release package (`release/export.py`) lists it in `modules.json`, by its stable path
`embedlab.st_module.EmbedlabTransformer`, followed by
sentence-transformers' own `Normalize`. Together they embed a text as
`evaluate.encode.encode_texts` does: `[CLS] prompt + text [SEP]` with the content cut to
`max_seq_length - 2` tokens, then the checkpoint's pooling (`embedlab.model.pooling.pool`: the
mean over content tokens, CLS, SEP and padding excluded, zero if there are none; the mean over
every token; or the CLS state), then L2 (an all-zero row stays zero).
The release tests hold the two paths equal.

Follows the module protocol of sentence-transformers >= 6 (`InputModule.preprocess`,
`forward(features)`, classmethod `load`, `save`); imports no Ray.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from sentence_transformers.base.modules import InputModule

from embedlab.core.config import POOLING_METHODS
from embedlab.model.encoder import Encoder
from embedlab.model.pooling import pool
from embedlab.core.store import file_sha256
from embedlab.tokenizer.frozen import FILE_NAME as TOKENIZER_FILE, FrozenTokenizer
from embedlab.checkpoints.io import (
    ENCODER_FILE,
    MANIFEST_FILE,
    CheckpointError,
    content_hash,
    load_encoder,
)


class EmbedlabTransformer(InputModule):
    """Texts -> `token_embeddings` (B, T, d) and pooled, not yet normalised, `sentence_embedding` (B, d).

    Pooling and the maximum length come from the package manifest's `pooling` contract;
    `max_seq_length` may be changed after loading (and is saved with the package).
    """

    # The stable path (embedlab/st_module.py), which SentenceTransformer.save writes to
    # modules.json from `type(module).__module__`: a resaved release names the class as an
    # exported one does and loads with every embedlab version that has it.
    __module__ = "embedlab.st_module"

    def __init__(self, encoder: Encoder, tokenizer: FrozenTokenizer, manifest: dict[str, Any]) -> None:
        super().__init__()
        contract = manifest["pooling"]
        if contract["method"] not in POOLING_METHODS:
            raise ValueError(f"pooling {contract['method']!r}; valid: {list(POOLING_METHODS)}")
        if contract["max_length"] < 3:
            raise ValueError(f"max_length {contract['max_length']} leaves no room besides [CLS] and [SEP]")
        self.encoder = encoder.eval()
        self.frozen_tokenizer = tokenizer
        self.tokenizer = tokenizer.tokenizer  # sentence-transformers expects a `tokenizers.Tokenizer` here
        self.manifest = manifest
        self.pooling: str = contract["method"]
        self.max_seq_length: int = contract["max_length"]

    def preprocess(
        self, inputs: Sequence[str], prompt: str | None = None, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """(B,) texts -> `input_ids` and `attention_mask`, (B, T) each, padded to the longest row."""
        if not all(isinstance(text, str) for text in inputs):
            kinds = sorted({type(text).__name__ for text in inputs})
            raise TypeError(f"{type(self).__name__} embeds single texts (str); got {kinds}")
        texts = [(prompt or "") + text for text in inputs]
        content = [ids[: self.max_seq_length - 2] for ids in self.frozen_tokenizer.encode_batch(texts)]
        length = max(len(ids) for ids in content) + 2
        input_ids = torch.full((len(texts), length), self.frozen_tokenizer.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(texts), length), dtype=torch.long)
        for row, ids in enumerate(content):
            input_ids[row, : len(ids) + 2] = torch.tensor(
                [self.frozen_tokenizer.cls_id, *ids, self.frozen_tokenizer.sep_id]
            )
            attention_mask[row, : len(ids) + 2] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, features: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, torch.Tensor]:
        attention_mask = features["attention_mask"]
        # The mask doubles as segment ids: one document per row (1), padding (0) attends only to padding.
        hidden = self.encoder(features["input_ids"], attention_mask)
        pooled = pool(hidden, attention_mask, self.pooling)
        features["token_embeddings"] = hidden
        features["sentence_embedding"] = pooled.float()  # as encode_texts: normalised in float32
        return features

    def get_embedding_dimension(self) -> int:
        return self.encoder.config.width

    def get_config_dict(self) -> dict[str, Any]:
        return {"pooling": self.pooling, "max_seq_length": self.max_seq_length}

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> EmbedlabTransformer:
        """The verified encoder, tokenizer and manifest of a local release package; the Hub
        arguments sentence-transformers also passes are not used."""
        directory = Path(model_name_or_path, subfolder)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: not a directory; embedlab release packages load from a local path")
        encoder, tokenizer, manifest = load_encoder(directory)
        if "max_length" not in manifest["pooling"]:
            raise CheckpointError(
                f"{directory / MANIFEST_FILE}: a training checkpoint, not a release package "
                "(no pooling.max_length); write one with `embedlab export`"
            )
        return cls(encoder, tokenizer, manifest)

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        """Write encoder, tokenizer and manifest back as a package that `load` (and embedlab) reads.

        Weights changed since loading (e.g. fine-tuned here) get a new content hash, and the
        loaded package becomes their parent; the contract records the current `max_seq_length`.
        """
        directory = Path(output_path)
        state = {k: v.detach().cpu().contiguous() for k, v in self.encoder.state_dict().items()}
        save_file(state, str(directory / ENCODER_FILE))
        if self.frozen_tokenizer.path.resolve() != (directory / TOKENIZER_FILE).resolve():
            shutil.copyfile(self.frozen_tokenizer.path, directory / TOKENIZER_FILE)  # bytes kept: the hash holds
        files = {ENCODER_FILE: file_sha256(directory / ENCODER_FILE)}
        manifest = {
            **self.manifest,
            "files": files,
            "content_hash": content_hash(files),
            "pooling": {**self.manifest["pooling"], "max_length": self.max_seq_length},
        }
        if manifest["content_hash"] != self.manifest["content_hash"]:
            manifest["parent_hash"] = self.manifest["content_hash"]
            manifest["package"] = "release, weights changed through sentence-transformers after export"
        (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
