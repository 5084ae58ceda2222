"""`train.compile`: which parts of the encoder `torch.compile` compiles, and when.

Each block's feed-forward and its two LayerNorms are compiled in place
(`nn.Module.compile`, so parameter names, checkpoints and optimizer groups are unchanged).
They hold no data-dependent indexing; attention stays eager around the variable-length
kernels, whose segment counts change every step. Their input shape (B, T, d) changes when
a length schedule switches or a contrastive batch ends in a smaller chunk; torch then
recompiles once with dynamic shapes.

Random ops inside the compiled parts (dropout) run torch's own kernels
(`torch._inductor.config.fallback_random`), so a replay from a saved RNG state draws the same
masks as eager: GradCache's no-grad and grad passes rely on it.

"auto" compiles when the trial trains on GPUs. That default is unmeasured until the GPU
command (`workers/bench-gpu.sh`) runs: it reports compiled against eager. On this CPU,
`embedlab bench` measured a compiled encoder at 0.98x eager after a 34 s cold compile, so
"auto" stays eager on CPU. The resolved choice is recorded in the manifest.
"""

from __future__ import annotations

from torch import nn

from embedlab.config import TrainConfig

COMPILED_PARTS = "each block's feed-forward and LayerNorms (torch.compile, in place); attention eager"


def resolve_compile(train: TrainConfig) -> bool:
    """Whether a trial compiles: `train.compile`, with "auto" resolved by device."""
    if train.compile != "auto":
        return train.compile == "on"
    return train.use_gpu


def compile_blocks(encoder: nn.Module) -> None:
    """Compile every block's feed-forward and norms of `encoder` in place."""
    import torch._inductor.config

    torch._inductor.config.fallback_random = True  # eager RNG semantics: replayable dropout
    for block in encoder.blocks:
        for part in (block.ffn, block.attn_norm, block.ffn_norm):
            part.compile()


def compile_record(train: TrainConfig) -> dict:
    """The manifest's record of the choice."""
    compiled = resolve_compile(train)
    return {"setting": train.compile, "compiled": compiled, "parts": COMPILED_PARTS if compiled else None}
