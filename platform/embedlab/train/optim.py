"""AdamW with one parameter group per category, and the learning-rate schedule.

Every parameter falls in exactly one category (`embedlab.core.config.PARAMETER_CATEGORIES`),
decided by the module that owns it, not by its name or shape:

    embedding    an `nn.Embedding` table (also the MLM decoder, which is tied to it)
    norm         a LayerNorm's weight and bias
    temperature  a learnable contrastive temperature
    bias         any other bias (Linear biases, the MLM vocabulary bias)
    weight       every other matrix

Weight decay is switched off exactly for `train.optimizer.no_decay`; each group may scale
the learning rate and override betas and epsilon. `optimizer_record` is what the manifest
keeps: every group with its settings and member names, so a run states which tensors were
decayed. `lr_multiplier` is the schedule (`ScheduleConfig`) on the consumed budget.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from embedlab.core.config import PARAMETER_CATEGORIES, ScheduleConfig, TrainConfig
from embedlab.objectives.contrastive import LearnableTemperature


def parameter_categories(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """{category: [(qualified name, parameter)]} with every unique parameter in one category.

    A tied tensor is named where `named_parameters` first meets it, and is an embedding if
    any module that owns it is an `nn.Embedding`.
    """
    owners: dict[int, set[str]] = {}
    for module in model.modules():
        for local_name, param in module.named_parameters(recurse=False):
            if isinstance(module, nn.Embedding):
                kind = "embedding"
            elif isinstance(module, nn.LayerNorm):
                kind = "norm"
            elif isinstance(module, LearnableTemperature):
                kind = "temperature"
            elif local_name == "bias":
                kind = "bias"
            else:
                kind = "weight"
            owners.setdefault(id(param), set()).add(kind)
    categories: dict[str, list[tuple[str, nn.Parameter]]] = {c: [] for c in PARAMETER_CATEGORIES}
    for name, param in model.named_parameters():
        kinds = owners[id(param)]
        kind = "embedding" if "embedding" in kinds else min(kinds, key=PARAMETER_CATEGORIES.index)
        categories[kind].append((name, param))
    return categories


def fused_available(device: torch.device) -> bool:
    """PyTorch's fused AdamW kernel exists for CPU and CUDA tensors (torch >= 2.4)."""
    return device.type in ("cpu", "cuda")


def build_optimizer(model: nn.Module, train: TrainConfig, device: torch.device | None = None) -> torch.optim.AdamW:
    """AdamW over `model`'s parameters, one group per non-empty category (module docstring).

    Each group carries `category` and `lr_scale`; `set_learning_rate` sets its `lr` to
    peak x schedule x lr_scale.
    """
    settings = train.optimizer
    overrides = {g.category: g for g in settings.groups}
    device = device or next(model.parameters()).device
    fused = settings.fused == "on" or (settings.fused == "auto" and fused_available(device))
    if settings.fused == "on" and not fused_available(device):
        raise ValueError(f"train.optimizer.fused='on': no fused AdamW kernel for {device.type} tensors")
    groups = []
    for category, members in parameter_categories(model).items():
        if not members:
            continue
        override = overrides.get(category)
        groups.append({
            "params": [param for _, param in members],
            "category": category,
            "names": [name for name, _ in members],
            "weight_decay": 0.0 if category in settings.no_decay else train.weight_decay,
            "lr_scale": override.lr_scale if override else 1.0,
            "lr": train.learning_rate * (override.lr_scale if override else 1.0),
            "betas": tuple(override.betas) if override and override.betas else tuple(settings.betas),
            "eps": override.eps if override and override.eps else settings.eps,
        })
    return torch.optim.AdamW(groups, lr=train.learning_rate, fused=fused)


def optimizer_record(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The manifest's optimizer entry: name, kernel and every group's settings and members."""
    return {
        "name": "AdamW",
        "fused": bool(optimizer.defaults.get("fused")),
        "groups": [
            {
                "category": group["category"],
                "weight_decay": group["weight_decay"],
                "lr_scale": group["lr_scale"],
                "betas": list(group["betas"]),
                "eps": group["eps"],
                "parameters": sum(p.numel() for p in group["params"]),
                "names": list(group["names"]),
            }
            for group in optimizer.param_groups
        ],
    }


def lr_multiplier(consumed: float, budget: float, schedule: ScheduleConfig) -> float:
    """The learning rate as a fraction of the peak after `consumed` of `budget` units.

    Warmup: (consumed + 1) / warmup units (never exactly 0, so the first step moves).
    After it, with p the fraction of the post-warmup budget consumed and m the floor:
    linear m + (1-m)(1-p); cosine m + (1-m)(1+cos(pi p))/2; wsd 1 until the final
    `decay_fraction` of the budget, then linear to m over it; constant 1.
    """
    warmup = schedule.warmup_fraction * budget
    if warmup > 0 and consumed < warmup:
        return min(1.0, (consumed + 1) / warmup)
    floor = schedule.min_lr_fraction
    if schedule.kind == "constant":
        return 1.0
    if schedule.kind == "wsd":
        decay_start = budget * (1.0 - schedule.decay_fraction)
        if consumed < decay_start:
            return 1.0
        progress = (consumed - decay_start) / max(budget - decay_start, 1e-12)
    else:
        progress = (consumed - warmup) / max(budget - warmup, 1e-12)
    progress = min(max(progress, 0.0), 1.0)
    if schedule.kind == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * (1.0 - progress)


def set_learning_rate(optimizer: torch.optim.Optimizer, consumed: float, budget: float, train: TrainConfig) -> float:
    """Set every group's `lr` for a step taken at `consumed` units; returns the peak-scaled rate."""
    rate = train.learning_rate * lr_multiplier(consumed, budget, train.schedule)
    for group in optimizer.param_groups:
        group["lr"] = rate * group["lr_scale"]
    return rate
