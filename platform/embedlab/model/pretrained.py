"""A pretrained Hugging Face encoder behind embedlab's encoder interface.

`PretrainedEncoder` holds a `transformers` base model (BERT, MiniLM, RoBERTa, XLM-R or
ModernBERT: `FAMILIES`) and takes what embedlab's `Encoder` takes: token ids (B, T) and
segment ids (B, T), 0 on padding, documents numbered from 1 inside a packed row, giving the
final hidden states (B, T, d). So pooling, GradCache, gathering across workers, distillation,
Matryoshka, mining, evaluation and the retention panel run on it unchanged. A packed row
computes what its documents compute one per row (tests/test_pretrained.py holds it to
transformers' own forward of each document alone), by three rules found by experiment:

    attention   scaled_dot_product_attention ("sdpa") with the (B, 1, T, T) boolean
                same-segment mask, passed through as it is (the "eager" path would add a boolean
                mask to the scores as 0/1, silently wrong); ModernBERT gets one mask per layer
                type, its sliding layers' also banded to |i - j| <= sliding_window (one mask for
                both would drop the window)
    positions   restart at every segment start, plus the family's offset (RoBERTa and XLM-R
                count from pad_token_id + 1)
    precision   float32 weights whatever the checkpoint stores; no pooler (BERT's is not part of
                an embedding, and a missing one would be initialised from the global RNG)

A masked-language-modelling head of the checkpoint, where it has one, is embedlab's `MLMHead`
with the family's activation and biases, its decoder tied to the input embeddings
(`with_mlm_head`). The shape the FLOP counter reads is a `ModelConfig` derived from the
checkpoint's config (`model_config`), never declared. `transformers` is imported only when a
pretrained backbone is built (it loads SciPy, a harness library, and takes seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from embedlab.core.config import ModelConfig
from embedlab.core.errors import UserError
from embedlab.model.encoder import MLMModel, SegmentLayout, segment_attention_mask, segment_positions

ATTENTION = "sdpa"  # the only attention path whose boolean-mask semantics embedlab relies on


@dataclass(frozen=True)
class Family:
    """What differs between the supported families of pretrained encoders: its base class in
    `transformers`, the prefix of its base model's keys inside a masked-LM checkpoint, its
    masked-LM head's keys (`MLMHead` key -> checkpoint key), the feed-forward matrices a
    layer multiplies by, and whether it has a pooler (built without) or sliding layers."""

    name: str
    architecture: str
    prefix: str
    head_keys: dict[str, str]
    decoder_key: str  # a stored decoder matrix: tied to the input embeddings, or refused
    ffn_matrices: int = 2
    pooler: bool = True
    sliding: bool = False


BERT_HEAD = {"dense.weight": "cls.predictions.transform.dense.weight",
             "dense.bias": "cls.predictions.transform.dense.bias",
             "norm.weight": "cls.predictions.transform.LayerNorm.weight",
             "norm.bias": "cls.predictions.transform.LayerNorm.bias",
             "bias": "cls.predictions.bias"}
ROBERTA_HEAD = {"dense.weight": "lm_head.dense.weight", "dense.bias": "lm_head.dense.bias",
                "norm.weight": "lm_head.layer_norm.weight", "norm.bias": "lm_head.layer_norm.bias",
                "bias": "lm_head.bias"}
MODERNBERT_HEAD = {"dense.weight": "head.dense.weight", "dense.bias": "head.dense.bias",
                   "norm.weight": "head.norm.weight", "norm.bias": "head.norm.bias", "bias": "decoder.bias"}
FAMILIES: dict[str, Family] = {
    "bert": Family("bert", "BertModel", "bert.", BERT_HEAD, "cls.predictions.decoder.weight"),
    "roberta": Family("roberta", "RobertaModel", "roberta.", ROBERTA_HEAD, "lm_head.decoder.weight"),
    "xlm-roberta": Family("xlm-roberta", "XLMRobertaModel", "roberta.", ROBERTA_HEAD, "lm_head.decoder.weight"),
    "modernbert": Family("modernbert", "ModernBertModel", "model.", MODERNBERT_HEAD, "decoder.weight",
                         ffn_matrices=3, pooler=False, sliding=True),
}
SUPPORTED = "bert (BERT, MiniLM), roberta, xlm-roberta, modernbert"


class PretrainedBackboneError(UserError, ValueError):
    """A Hugging Face config embedlab cannot run behind its encoder interface."""


def family_of(hf_config: dict[str, Any]) -> Family:
    """The family of a Hugging Face config (its `model_type`), or PretrainedBackboneError naming
    what is supported."""
    model_type = hf_config.get("model_type")
    if model_type not in FAMILIES:
        architecture = (hf_config.get("architectures") or ["?"])[0]
        raise PretrainedBackboneError(f"model_type {model_type!r} ({architecture}) is not supported; "
                                      f"supported: {SUPPORTED}")
    return FAMILIES[model_type]


def model_config(hf_config: dict[str, Any]) -> ModelConfig:
    """The `ModelConfig` of a pretrained encoder, derived from its Hugging Face config: the
    shape the FLOP counter and the width checks read, the positions it has and its attention
    dropout (which decides the attention kernel's backward, `embedlab.model.flops`)."""
    family = family_of(hf_config)
    if family.sliding:  # ModernBERT
        return ModelConfig(
            preset="pretrained", backbone=family.name, layers=hf_config["num_hidden_layers"],
            width=hf_config["hidden_size"], heads=hf_config["num_attention_heads"],
            ffn_width=hf_config["intermediate_size"], vocab_size=hf_config["vocab_size"],
            max_length=hf_config["max_position_embeddings"], dropout=hf_config.get("attention_dropout", 0.0),
            layer_norm_eps=hf_config.get("norm_eps", 1e-5), attention="dense", ffn_matrices=family.ffn_matrices)
    kind = hf_config.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise PretrainedBackboneError(f"position_embedding_type {kind!r} is not supported; supported: absolute")
    offset = hf_config["pad_token_id"] + 1 if family.prefix == "roberta." else 0
    return ModelConfig(
        preset="pretrained", backbone=family.name, layers=hf_config["num_hidden_layers"],
        width=hf_config["hidden_size"], heads=hf_config["num_attention_heads"],
        ffn_width=hf_config["intermediate_size"], vocab_size=hf_config["vocab_size"],
        max_length=hf_config["max_position_embeddings"] - offset,
        dropout=hf_config.get("attention_probs_dropout_prob", 0.0), layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
        attention="dense", ffn_matrices=family.ffn_matrices, position_offset=offset)


def head_options(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the `MLMHead` that computes the family's masked-LM head."""
    family = family_of(hf_config)
    if family.sliding:
        return {"activation": hf_config.get("classifier_activation", "gelu"),
                "dense_bias": hf_config.get("classifier_bias", False), "norm_bias": hf_config.get("norm_bias", False)}
    # RoBERTa's head applies the exact GELU whatever the encoder's `hidden_act`.
    return {"activation": hf_config.get("hidden_act", "gelu") if family.name == "bert" else "gelu"}


def build_backbone(hf_config: dict[str, Any], seed: int) -> nn.Module:
    """The family's `transformers` base model of `hf_config`, in float32 with sdpa attention and
    no pooler, initialised from `seed` (a fresh draw of the architecture; a checkpoint's weights
    are loaded over it). The global RNG is left as it was."""
    family = family_of(hf_config)
    # here: transformers, which loads SciPy (a harness library) and takes seconds; only a
    # pretrained backbone needs it
    import transformers

    raw = {k: v for k, v in hf_config.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(hf_config["model_type"], **raw)
    extra = {"add_pooling_layer": False} if family.pooler else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModel.from_config(config, attn_implementation=ATTENTION, dtype=torch.float32,
                                                   **extra)
    if type(model).__name__ != family.architecture:
        raise PretrainedBackboneError(f"model_type {hf_config['model_type']!r} built {type(model).__name__}, "
                                      f"expected {family.architecture}")
    return model


class PretrainedEncoder(nn.Module):
    """Token ids (B, T) and segment ids (B, T) -> final hidden states (B, T, d), computed by a
    pretrained Hugging Face encoder (module docstring). `hf_config` is its config.json as a
    mapping; the weights are a fresh draw from `seed` until a checkpoint's are loaded
    (`load_state_dict`: keys are the base model's, under `model.`)."""

    def __init__(self, hf_config: dict[str, Any], *, seed: int = 0) -> None:
        super().__init__()
        # A plain JSON copy saying float32, the dtype it trains and is saved in: transformers
        # loads a checkpoint in its config's dtype, so a release must not say bfloat16.
        self.hf_config = {k: v for k, v in json.loads(json.dumps(hf_config)).items() if k != "torch_dtype"}
        self.hf_config["dtype"] = "float32"
        self.family = family_of(self.hf_config)
        self.config = model_config(self.hf_config)
        self.model = build_backbone(self.hf_config, seed)

    @property
    def embed(self) -> nn.Embedding:
        """The input embedding table (an MLM head's tied decoder): a property, so the state
        dict holds it once, under the base model's own key."""
        return self.model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor,
                layout: SegmentLayout | None = None) -> torch.Tensor:
        """`layout` is accepted for the interface and unused: the dense path only."""
        positions = segment_positions(segment_ids) + self.config.position_offset
        same = segment_attention_mask(segment_ids)  # (B, 1, T, T) bool; padding attends to padding
        mask: torch.Tensor | dict[str, torch.Tensor] = same
        if self.family.sliding:
            index = torch.arange(segment_ids.shape[1], device=segment_ids.device)
            band = (index[:, None] - index[None, :]).abs() <= self.hf_config_value("sliding_window")
            mask = {"full_attention": same, "sliding_attention": same & band}
        return self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions).last_hidden_state

    def hf_config_value(self, name: str) -> Any:
        """A value of the built model's config (with transformers' derived fields)."""
        return getattr(self.model.config, name)

    def backbone_record(self) -> dict[str, Any]:
        """What a manifest says of the backbone, beside the derived `model` config."""
        import transformers  # here: transformers (see `build_backbone`), loaded by now

        return {"family": self.family.name, "model_type": self.hf_config["model_type"],
                "architecture": self.family.architecture, "attn_implementation": ATTENTION,
                "dtype": "float32", "pooler": "not built (not part of an embedding)",
                "max_positions": self.config.max_length, "position_offset": self.config.position_offset,
                "transformers": transformers.__version__}


def with_mlm_head(encoder: PretrainedEncoder, head_state: dict[str, torch.Tensor] | None = None, *,
                  seed: int = 0) -> MLMModel:
    """`encoder` with the family's masked-LM head (`MLMModel`), its decoder tied to the encoder's
    embeddings, loaded from `head_state` (`MLMHead` keys) when given, else drawn from `seed`.
    The global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLMModel(encoder.config, encoder=encoder, **head_options(encoder.hf_config))
    if head_state is not None:
        missing, unexpected = model.mlm_head.load_state_dict(head_state, strict=False)
        left = [k for k in missing if not k.startswith("embedding.")]
        if left or unexpected:
            raise PretrainedBackboneError(f"MLM head state: missing {left}, unexpected {unexpected}")
    return model.train(encoder.training)
