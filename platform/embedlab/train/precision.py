"""The precision policy: which arithmetic runs in bf16 and which stays fp32.

"fp32": everything in fp32 (the CPU default). "bf16": the forward passes run under bf16
autocast, so the matmuls of the encoder and heads take bf16 inputs, while

    master weights    stay fp32 (autocast casts copies for each op; parameters never change dtype)
    gradients         are fp32 (they flow to the fp32 parameters)
    optimizer state   is fp32 (AdamW's moments follow the parameters' dtype)
    loss reductions   are fp32 or wider: `mlm_loss_sum` and the contrastive losses upcast
                      bf16 logits and embeddings before any log-sum-exp or sum, and
                      counts and cross-worker sums are float64 tensors

There is no loss scaling: bf16 has fp32's exponent range. "auto" resolves to bf16 when the
trial trains on GPUs and to fp32 on CPUs; the resolved policy is recorded in the manifest.
"""

from __future__ import annotations

import contextlib

import torch

from embedlab.core.config import TrainConfig

PRECISION_POLICY = {
    "fp32": "fp32 weights, activations, gradients, optimizer state and reductions",
    "bf16": "bf16 autocast forward; fp32 master weights, gradients and optimizer state; "
            "loss sums in fp32 (bf16 logits and embeddings upcast); counts and cross-worker sums in float64",
}


def resolve_precision(train: TrainConfig) -> str:
    """The policy a trial runs: `train.precision`, with "auto" resolved by device."""
    if train.precision != "auto":
        return train.precision
    return "bf16" if train.use_gpu else "fp32"


def forward_precision(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The context forward passes run in: bf16 autocast on `device`, or nothing."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def half_activations(precision: str, device: torch.device) -> bool:
    """Whether the encoder's attention inputs are half precision under `precision` on `device`
    (what `embedlab.model.encoder.use_varlen` sees): bf16 autocast on CUDA. On the CPU the
    embedding output that attention first reads stays fp32 under autocast."""
    return precision == "bf16" and device.type == "cuda"
