"""The encoder: a bidirectional pre-LayerNorm Transformer with rotary positions.

Every block is  x + Attn(LN1(x))  then  x + FFN(LN2(x)); a final LayerNorm closes the
stack. Attention and feed-forward linears carry no bias; the feed-forward is two
matrices with a GELU between; positions come only from RoPE, so the parameter count is

    V*d + L*(4*d^2 + 2*d*f + 4*d) + 2*d

(embeddings; Q/K/V/output; two FFN matrices; two affine LayerNorms per block; final norm).

Packed rows: `segment_ids` (B, T) numbers the documents inside each row from 1 and marks
padding with 0. A token attends only to tokens of its own segment, and RoPE positions
restart at 0 at every document start, so a packed row computes exactly what the same
documents would compute one per row. Two attention paths compute it: a dense
block-diagonal boolean mask for `scaled_dot_product_attention` (any device), or the
variable-length path that computes real tokens only, cut into segments (`cu_seqlens`): torch's
flash `varlen_attn` on CUDA, sequences batched by length buckets on CPU
(`ModelConfig.attention`; "auto" is `use_varlen`). Dropout inside attention applies on the
dense path and the CPU kernel; the flash kernel has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embedlab.core.config import ModelConfig


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Position of each token inside its own segment. (B, T) int -> (B, T) long."""
    batch, length = segment_ids.shape
    index = torch.arange(length, device=segment_ids.device).expand(batch, length)
    starts_here = torch.ones_like(segment_ids, dtype=torch.bool)
    starts_here[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_index = torch.where(starts_here, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - start_index


def segment_attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, T, T) mask: True where query i may attend key j (same segment).

    Padding (segment 0) attends only to padding, which keeps every softmax row non-empty;
    real tokens never see padding or another document.
    """
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None, :, :]


@dataclass(frozen=True)
class SegmentLayout:
    """Packed rows as variable-length sequences: the non-padding positions of the flattened
    (B*T) batch in row-major order (`token_index`, (N,)), and the cumulative segment lengths
    over them (`cu_seqlens`, (S+1,) int32, starting at 0) with the longest segment."""

    token_index: torch.Tensor
    cu_seqlens: torch.Tensor
    max_length: int

    def to(self, device: torch.device) -> SegmentLayout:
        """The same layout on `device`, copied without waiting on it (`to_device`)."""
        return SegmentLayout(token_index=to_device(self.token_index, device),
                             cu_seqlens=to_device(self.cu_seqlens, device), max_length=self.max_length)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To CUDA through pinned memory without blocking: a copy from
    pageable memory waits for the device to finish all queued work, a synchronisation per batch."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def segment_layout(segment_ids: torch.Tensor) -> SegmentLayout:
    """(B, T) segment ids -> the variable-length layout of their non-padding tokens.

    Its sizes depend on the data, so on a GPU computing it reads the device back; a step
    computes it from the batch's host tensors and sends it with the batch (`SegmentLayout.to`)."""
    length = segment_ids.shape[1]
    flat = segment_ids.reshape(-1)
    token_index = (flat > 0).nonzero().squeeze(1)
    row, segment = token_index // length, flat[token_index]
    starts = torch.ones_like(token_index, dtype=torch.bool)
    starts[1:] = (row[1:] != row[:-1]) | (segment[1:] != segment[:-1])
    cu_seqlens = torch.cat([starts.nonzero().squeeze(1), token_index.new_tensor([len(token_index)])]).int()
    max_length = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if len(token_index) else 0
    return SegmentLayout(token_index=token_index, cu_seqlens=cu_seqlens, max_length=max_length)


def reference_varlen_attention(q, k, v, cu_seqlens: torch.Tensor, max_length: int) -> torch.Tensor:
    """(N, H, Dh) packed queries/keys/values -> (N, H, Dh): plain attention inside each
    sequence of `cu_seqlens`, one call per sequence: the test oracle of the variable-length
    kernels."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        part = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]  # (1, H, L, Dh)
        out[start:end] = F.scaled_dot_product_attention(*part)[0].transpose(0, 1)
    return out


BUCKET_MIN = 16  # the shortest length bucket of the CPU variable-length kernel


def length_buckets(lengths: torch.Tensor) -> torch.Tensor:
    """(S,) sequence lengths -> (S,) their buckets: the next power of two, at least `BUCKET_MIN`."""
    return torch.clamp(2 ** torch.ceil(torch.log2(lengths.double().clamp(min=1))), min=BUCKET_MIN).long()


def bucketed_varlen_attention(q, k, v, cu_seqlens: torch.Tensor, max_length: int,
                              dropout_p: float = 0.0) -> torch.Tensor:
    """(N, H, Dh) packed queries/keys/values -> (N, H, Dh): attention inside each sequence of
    `cu_seqlens`, batched. Sequences are grouped by length, in buckets of powers of two (at
    least 16), and each bucket is one `scaled_dot_product_attention` call over its sequences
    padded to the bucket's longest, with the padded keys masked out. Work is the sum over
    sequences of (bucket length)^2, never the packed row's T^2, and one call per bucket
    (at most log2(T) of them) instead of one per sequence. `dropout_p` drops attention
    weights as the dense path does. The CPU variable-length kernel; `max_length` is unused,
    kept so both kernels take the same arguments."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # (S,)
    if lengths.numel() == 0:
        return q.new_zeros(q.shape)
    buckets = length_buckets(lengths)
    positions, results = [], []
    for bucket in torch.unique(buckets).tolist():
        members = (buckets == bucket).nonzero().squeeze(1)  # (S_b,)
        member_lengths = lengths[members]
        width = int(member_lengths.max())
        offsets = torch.arange(width, device=q.device)
        valid = offsets[None, :] < member_lengths[:, None]  # (S_b, W)
        index = torch.where(valid, cu_seqlens[members].long()[:, None] + offsets[None, :], 0)  # (S_b, W)
        part = [t[index].transpose(1, 2) for t in (q, k, v)]  # each (S_b, H, W, Dh)
        mask = None if bool(valid.all()) else valid[:, None, None, :]  # keys only; padded queries are dropped
        attended = F.scaled_dot_product_attention(*part, attn_mask=mask, dropout_p=dropout_p)
        positions.append(index[valid])
        results.append(attended.transpose(1, 2)[valid])  # (tokens of the bucket, H, Dh)
    # Every token is in exactly one bucket, so one scatter fills the whole output.
    values = torch.cat(results)
    return values.new_zeros(q.shape).index_put((torch.cat(positions),), values)


def flash_varlen_attention(q, k, v, cu_seqlens: torch.Tensor, max_length: int) -> torch.Tensor:
    """torch's variable-length flash attention (CUDA, bf16/fp16)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_length, max_length)


# "auto" on CPU switches to the bucketed variable-length kernel from this row length on:
# `embedlab bench --scaling` measured it, over two runs, at 0.81-0.83x dense at 128 tokens,
# 0.90-0.93x at 512, 1.17-1.27x at 1,024 and 1.81-1.84x at 2,048 on the tiny preset
# (docs/results/benchmarks.md).
CPU_VARLEN_MIN_LENGTH = 1024


def varlen_rule(attention: str, *, cuda: bool, half: bool, length: int, training: bool, dropout: float) -> bool:
    """Whether attention takes the variable-length path. "dense" / "varlen" force one; "auto":
    on CUDA the flash kernel, which takes bf16/fp16 only (`half`: autocast or half weights)
    and has no attention dropout, so not while dropout is training; on CPU the bucketed
    kernel from `CPU_VARLEN_MIN_LENGTH` tokens a row, where it beats the dense mask."""
    if attention != "auto":
        return attention == "varlen"
    if cuda:
        return half and not (training and dropout > 0)
    return length >= CPU_VARLEN_MIN_LENGTH


def use_varlen(config: ModelConfig, x: torch.Tensor, training: bool = False) -> bool:
    """`varlen_rule` for (B, T, d) inputs `x` of a model with `config`."""
    half = x.dtype in (torch.float16, torch.bfloat16) or (x.is_cuda and torch.is_autocast_enabled("cuda"))
    return varlen_rule(config.attention, cuda=x.is_cuda, half=half, length=x.shape[1], training=training,
                       dropout=config.dropout)


class Rotary(nn.Module):
    """Rotary position embedding applied to (B, H, T, Dh) queries and keys."""

    def __init__(self, head_width: int, base: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_width, 2, dtype=torch.float32) / head_width))
        # A buffer, not a parameter: RoPE adds no trainable weights; recomputed, never saved.
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None, :, None].float() * self.inv_freq  # (B, 1, T, Dh/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return rotated.flatten(-2)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.heads = config.heads
        self.head_width = config.head_width
        self.qkv = nn.Linear(config.width, 3 * config.width, bias=False)
        self.out = nn.Linear(config.width, config.width, bias=False)
        self.rotary = Rotary(config.head_width, config.rope_base)
        self.dropout = config.dropout

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, layout: SegmentLayout | None = None
    ) -> torch.Tensor:
        """(B, T, d) normalised inputs -> (B, T, d) attention outputs after the projection."""
        return self.out(self.attend(*self.project(x, positions), mask, layout))

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, d) -> queries, keys, values, each (B, H, T, Dh), rotary applied to q and k."""
        batch, length, _ = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, self.head_width)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, Dh)
        return self.rotary(q, positions), self.rotary(k, positions), v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        layout: SegmentLayout | None,
    ) -> torch.Tensor:
        """The attention kernel: (B, H, T, Dh) q, k, v -> (B, T, d), heads concatenated."""
        batch, _, length, _ = q.shape
        if layout is None:
            attended = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
            ).transpose(1, 2)  # (B, T, H, Dh)
        else:
            # Only real tokens are computed: (N, H, Dh) sequences cut at segment boundaries;
            # padding positions get zeros (nothing downstream reads them).
            packed = [t.transpose(1, 2).reshape(batch * length, self.heads, self.head_width)[layout.token_index]
                      for t in (q, k, v)]
            # The bucketed kernel on the CPU; flash anywhere else: CUDA, or the meta device, whose
            # tensors hold no data, which tests run the step on to prove it never reads one back.
            if q.device.type == "cpu":
                result = bucketed_varlen_attention(*packed, layout.cu_seqlens, layout.max_length,
                                                   dropout_p=self.dropout if self.training else 0.0)
            else:
                result = flash_varlen_attention(*packed, layout.cu_seqlens, layout.max_length)
            attended = result.new_zeros(batch * length, self.heads, self.head_width)
            attended[layout.token_index] = result
            attended = attended.view(batch, length, self.heads, self.head_width)
        return attended.reshape(batch, length, self.heads * self.head_width)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.width, config.ffn_width, bias=False)
        self.down = nn.Linear(config.ffn_width, config.width, bias=False)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.attn = SelfAttention(config)
        self.ffn_norm = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, layout: SegmentLayout | None
    ) -> torch.Tensor:
        # Three steps so that `train.compile` can compile the two around the attention kernel
        # (`embedlab.train.compiling`); x + Attn(LN1(x)), then x + FFN(LN2(x)).
        q, k, v = self.attention_inputs(x, positions)
        return self.residual_outputs(x, self.attn.attend(q, k, v, mask, layout))

    def attention_inputs(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """LN1, the QKV projection and rotary: (B, T, d) -> q, k, v, each (B, H, T, Dh)."""
        return self.attn.project(self.attn_norm(x), positions)

    def residual_outputs(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The output projection and both residual adds around the feed-forward sublayer:
        (B, T, d) block input and (B, T, d) attention output -> (B, T, d) block output."""
        x = x + self.attn.out(attended)
        return x + self.ffn(self.ffn_norm(x))


class Encoder(nn.Module):
    """Token ids (B, T) and segment ids (B, T) -> final hidden states (B, T, d)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor,
                layout: SegmentLayout | None = None) -> torch.Tensor:
        """`layout`: `segment_layout(segment_ids)` computed on the host, used when attention
        takes the variable-length path (else computed here, a read-back on a GPU)."""
        positions = segment_positions(segment_ids)
        x = self.embed_dropout(self.embed(input_ids))
        varlen = use_varlen(self.config, x, self.training)
        if varlen and layout is None:
            layout = segment_layout(segment_ids)
        layout = layout if varlen else None
        mask = None if varlen else segment_attention_mask(segment_ids)
        for block in self.blocks:
            x = block(x, positions, mask, layout)
        return self.final_norm(x)


# The head's activation by the name a Hugging Face config gives it: "gelu" is the exact erf
# form (`F.gelu`, embedlab's), "gelu_pytorch_tanh" its tanh approximation.
HEAD_ACTIVATIONS = {"gelu": "none", "gelu_pytorch_tanh": "tanh"}


class MLMHead(nn.Module):
    """Dense transform + GELU + affine LayerNorm, then a decoder tied to the input embeddings.

    The decoder matrix is the encoder's embedding table (not a parameter of the head), so the
    head adds d*d + d (dense) + 2*d (norm) + V (vocabulary bias) parameters. A pretrained
    family's head is the same function with its own `activation` (`HEAD_ACTIVATIONS`) and,
    for ModernBERT, no dense or norm bias (`dense_bias`, `norm_bias`).
    """

    def __init__(self, config: ModelConfig, embedding: nn.Embedding, *, activation: str = "gelu",
                 dense_bias: bool = True, norm_bias: bool = True) -> None:
        super().__init__()
        if activation not in HEAD_ACTIVATIONS:
            raise ValueError(f"MLM head activation {activation!r}; valid: {list(HEAD_ACTIVATIONS)}")
        self.approximate = HEAD_ACTIVATIONS[activation]
        self.dense = nn.Linear(config.width, config.width, bias=dense_bias)
        self.norm = nn.LayerNorm(config.width, eps=config.layer_norm_eps, bias=norm_bias)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.embedding = embedding
        _init_weights(self.dense)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(N, d) hidden states at selected positions -> (N, V) logits."""
        return F.linear(self.norm(F.gelu(self.dense(hidden), approximate=self.approximate)),
                        self.embedding.weight, self.bias)


class MLMModel(nn.Module):
    """Encoder + tied MLM head, the phase-1 training model.

    `encoder`: an encoder built elsewhere (a pretrained backbone,
    `embedlab.model.pretrained.with_mlm_head`), with `head` the keyword arguments of its
    `MLMHead`; by default embedlab's `Encoder(config)` and its head."""

    def __init__(self, config: ModelConfig, *, encoder: nn.Module | None = None, **head: Any) -> None:
        super().__init__()
        self.encoder = Encoder(config) if encoder is None else encoder
        self.mlm_head = MLMHead(config, self.encoder.embed, **head)

    def forward(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor, selected: torch.Tensor,
        layout: SegmentLayout | None = None,
    ) -> torch.Tensor:
        """Logits only at selected positions: (B, T) inputs and the selected positions
        (`selected_states`) -> (N_selected, V), in row-major order.

        Projecting only the selected positions to the vocabulary skips ~85% of the largest
        matmul at 15% masking.
        """
        hidden = self.encoder(input_ids, segment_ids, layout)
        return self.mlm_head(selected_states(hidden, selected))


def selected_positions(selected: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (N,) long flat row-major indices of its True entries."""
    return selected.reshape(-1).nonzero().squeeze(1)


def selected_states(hidden: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """(B, T, d) states at the selected positions -> (N, d), row-major. `selected` is a (B, T)
    bool mask, or its (N,) flat indices (`selected_positions`), which a training step computes
    on the host: gathering by a mask on a GPU reads its count back before the head can run."""
    if selected.dtype == torch.bool:
        return hidden[selected]
    return hidden.flatten(0, 1).index_select(0, selected)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (a tied tensor counted once); `parameters()` already dedups by identity."""
    return sum(p.numel() for p in module.parameters())


def parameter_counts(config: ModelConfig) -> dict[str, int]:
    """Counted from the real module tree built on the meta device (no memory allocated)."""
    with torch.device("meta"):
        model = MLMModel(config)
    return {"encoder": count_parameters(model.encoder), "with_mlm_head": count_parameters(model)}
