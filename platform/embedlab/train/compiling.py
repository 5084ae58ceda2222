"""`train.compile`: which parts of the encoder `torch.compile` compiles, and when.

Each block runs in three steps (`embedlab.model.encoder.Block`): its attention inputs
(LayerNorm, QKV projection, rotary), the attention kernel, and its residual outputs (output
projection, residual add, LayerNorm, feed-forward, residual add). The first and the last
are compiled, per block, by replacing the block's two methods with compiled ones: parameter
names, checkpoints and optimizer groups are unchanged, and every block shares one compiled
graph of each. The kernel stays eager: the variable-length path indexes by data-dependent
token counts and segment lengths that change every step.

Recompiles: torch compiles a new graph the first time a dimension changes (then treats it
as dynamic), and separately for grad and no-grad passes (GradCache runs both) and for
training and evaluation mode. A length schedule switching T and a contrastive batch ending
in a smaller chunk each add one, so a trial can hold about seven entries per method. The
entries belong to the two methods' code, which every block and every compiled model in the
process share, so `compile_blocks` raises dynamo's recompile limit (8 by default, past
which it silently runs eager) to `RECOMPILE_LIMIT`.

The compiled methods are instance attributes bound to their block: a deep copy of a
compiled model would call the original's. Nothing copies or pickles a compiled model
(checkpoints are state dicts).

Why methods and not `nn.Module.compile` on the sublayers: dynamo skips frames that start
inside torch's own modules, so `LayerNorm.compile()` compiled nothing (an earlier version
did that and its norms ran eager; `tests/test_training_controls.py` now checks which
operations the compiled graphs hold).

Random ops inside the compiled parts (dropout) run torch's own kernels
(`torch._inductor.config.fallback_random`), so a replay from a saved RNG state draws the same
masks as eager: GradCache's no-grad and grad passes rely on it.

"auto" compiles when the trial trains on GPUs. That default is unmeasured until the GPU
command (`workers/bench-gpu.sh`) runs: it reports compiled against eager. On this CPU,
`embedlab bench` and `embedlab bench train --ablations` measured these compiled blocks at
0.86-0.93x eager in five runs (a 26-27 s cold compile), so "auto" stays eager on CPU. The resolved choice is recorded in the manifest.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from embedlab.core.config import ModelConfig, TrainConfig

RECOMPILE_LIMIT = 64

COMPILED_PARTS = ("each block's attention inputs (LayerNorm, QKV, rotary) and residual outputs (output projection, "
                  "LayerNorm, feed-forward, residual adds), torch.compile; the attention kernel eager")


def resolve_compile(train: TrainConfig, model: ModelConfig | None = None) -> bool:
    """Whether a trial compiles: `train.compile`, with "auto" resolved by device; never a
    pretrained backbone's (`model`), whose blocks are transformers' own."""
    if model is not None and model.pretrained:
        return False
    if train.compile != "auto":
        return train.compile == "on"
    return train.use_gpu


def compile_blocks(encoder: nn.Module, backend: str | Callable = "inductor") -> None:
    """Compile every block's attention inputs and residual outputs of `encoder` in place
    (`backend`: torch.compile's; tests pass one that records the graphs)."""
    import torch._dynamo.config
    import torch._inductor.config

    torch._inductor.config.fallback_random = True  # eager RNG semantics: replayable dropout
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    for block in encoder.blocks:
        # Instance attributes shadow the class's methods; `Block.forward` calls these.
        block.attention_inputs = torch.compile(block.attention_inputs, backend=backend)
        block.residual_outputs = torch.compile(block.residual_outputs, backend=backend)


def compile_record(train: TrainConfig, model: ModelConfig | None = None) -> dict:
    """The manifest's record of the choice."""
    compiled = resolve_compile(train, model)
    return {"setting": train.compile, "compiled": compiled, "parts": COMPILED_PARTS if compiled else None}
