"""`train.compile`: which parts of the encoder `torch.compile` compiles, and when.

Each block's feed-forward and its two LayerNorms are compiled in place
(`nn.Module.compile`, so parameter names, checkpoints and optimizer groups are unchanged).
Their shapes are static, (B, T, d), with no data-dependent indexing; attention stays eager
around the variable-length kernels, whose segment counts change every step and would
recompile. "auto" compiles when the trial trains on GPUs, where fusing the GELU, dropout
and norm kernels pays; on CPU `embedlab bench` measured compiled training at 0.98x eager
after a 34 s cold compile, so "auto" stays eager there. The resolved choice is recorded in
the manifest.
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
    for block in encoder.blocks:
        for part in (block.ffn, block.attn_norm, block.ffn_norm):
            part.compile()


def compile_record(train: TrainConfig) -> dict:
    """The manifest's record of the choice."""
    compiled = resolve_compile(train)
    return {"setting": train.compile, "compiled": compiled, "parts": COMPILED_PARTS if compiled else None}
