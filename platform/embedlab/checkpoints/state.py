"""Complete training state: what a checkpoint holds beyond its weights so a run resumes exactly.

Files next to a checkpoint's weights (`embedlab.checkpoints.io`), each hashed in the
manifest under `training_state`:

    training_state.safetensors  optimizer state (`optimizer/<param index>/<key>`) and any
                                trained tensor outside the weight files (`extra/<name>`,
                                e.g. a learnable temperature)
    training_state.json         step, workers, the phase's progress counters (data position
                                in global batches, consumed tokens / pairs / FLOPs, step and
                                skip counts), optimizer hyperparameters, the trial config hash
    rank-<r>.safetensors        worker r's RNG states: torch CPU (dropout), the masking
                                generator, numpy's MT19937 key, CUDA when in use
    rank-<r>.json               worker r's Python `random` state and numpy's position

Model weights are not duplicated: they are `encoder.safetensors` and `mlm_head.safetensors`.
Each worker's RNG state is gathered to rank 0, which writes the checkpoint. A checkpoint is
taken only at a step that also reports, when every since-the-last-report window (losses,
per-source counts) is empty, so nothing else is per worker. Loading checks every file
against its recorded hash and refuses a different config or worker count.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file, save, save_file

from embedlab.checkpoints import CheckpointError, MANIFEST_FILE
from embedlab.core.config import TrialConfig
from embedlab.core.store import file_sha256

STATE_FORMAT = "embedlab-training-state/1"
STATE_TENSORS = "training_state.safetensors"
STATE_RECORD = "training_state.json"
RESUME_POLICY = (
    "exact within phase: a run resumed from any checkpoint of the same trial config and worker "
    "count gives bitwise the losses and weights of an uninterrupted run"
)
# Separate streams, each derived from the trial seed by `seed_for`
# (a hash of seed, stream name and rank), so a change that draws more from one stream (say,
# a higher masking ratio) leaves every other stream's draws as they were.
RNG_STREAMS = {
    "init": "weight initialisation: seed_for(seed, 'init'), the same on every worker",
    "dropout": "torch's default generator on each worker: seed_for(seed, 'dropout', rank)",
    "masking": "a torch.Generator on each worker for corruption and ratio assignment: seed_for(seed, 'masking', rank)",
    "sampling": "the document or pair order: seed_for(data.mixture.seed, 'data-order:<seed>'), shared by all workers",
    "library": "Python's and numpy's global generators on each worker: seed_for(seed, 'python', rank)",
}


def rank_files(rank: int) -> tuple[str, str]:
    return f"rank-{rank}.safetensors", f"rank-{rank}.json"


@dataclass(frozen=True)
class RankState:
    """One worker's RNG states: tensors (safetensors) and plain values (JSON)."""

    tensors: dict[str, torch.Tensor]
    record: dict[str, Any]


@dataclass(frozen=True)
class TrainingState:
    """What `save_checkpoint(..., training_state=...)` writes besides the weights."""

    step: int
    progress: dict[str, Any]  # the phase's counters, JSON values
    optimizer: torch.optim.Optimizer
    ranks: list[RankState]  # index = rank
    config_hash: str
    extra: dict[str, torch.Tensor]  # trained tensors outside the weight files
    final: bool


@dataclass(frozen=True)
class LoadedState:
    """One worker's view of a checkpoint's training state."""

    step: int
    progress: dict[str, Any]
    optimizer_tensors: dict[str, torch.Tensor]
    optimizer_record: dict[str, Any]
    extra: dict[str, torch.Tensor]
    rank: RankState


def config_hash(trial_json: str) -> str:
    return hashlib.sha256(trial_json.encode()).hexdigest()


def seed_for(seed: int, stream: str, rank: int = 0) -> int:
    """Independent RNG streams (init, masking, ...) derived from one trial seed."""
    digest = hashlib.sha256(f"{seed}:{stream}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def data_seed(trial: TrialConfig) -> int:
    """The seed of the order documents (phase 1) or pairs (phases 2-3) are drawn in: the
    mixture's seed with the trial seed, so seeds replicate over data order as well as
    initialisation and masking, while every arm sees the same order at one seed (paired).
    A phase-2 arm from one parent would otherwise train identically at every seed."""
    return seed_for(trial.data.mixture.seed, f"data-order:{trial.train.seed}")


def seed_everything(seed: int) -> None:
    """Python's and numpy's global generators, so even a library draw is reproducible."""
    random.seed(seed)
    np.random.seed(seed % 2**32)


def capture_rng(masking: torch.Generator, device: torch.device) -> RankState:
    """This worker's generators: torch CPU (dropout), masking, numpy, Python, CUDA if in use."""
    _, key, position, has_gauss, cached_gaussian = np.random.get_state()
    tensors = {
        "torch_cpu": torch.get_rng_state(),
        "masking": masking.get_state(),
        "numpy_mt19937": torch.from_numpy(key.astype(np.int64)),
    }
    if device.type == "cuda":
        tensors["cuda"] = torch.cuda.get_rng_state(device)
    version, internal, gauss_next = random.getstate()
    record = {
        "python_random": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {"position": int(position), "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
    }
    return RankState(tensors, record)


def restore_rng(state: RankState, masking: torch.Generator, device: torch.device) -> None:
    torch.set_rng_state(state.tensors["torch_cpu"])
    masking.set_state(state.tensors["masking"])
    numpy = state.record["numpy"]
    np.random.set_state((
        "MT19937", state.tensors["numpy_mt19937"].numpy().astype(np.uint32),
        numpy["position"], numpy["has_gauss"], numpy["cached_gaussian"],
    ))
    python = state.record["python_random"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
    if device.type == "cuda":
        torch.cuda.set_rng_state(state.tensors["cuda"], device)


def gather_rank_states(state: RankState, world: int, device: torch.device) -> list[RankState]:
    """Every worker's state on every worker (a collective: all ranks call it)."""
    if world == 1:
        return [state]
    payloads = all_gather_bytes(save(state.tensors), device)
    records = all_gather_bytes(json.dumps(state.record).encode(), device)
    return [RankState(load_bytes(p), json.loads(r)) for p, r in zip(payloads, records)]


def all_gather_bytes(payload: bytes, device: torch.device) -> list[bytes]:
    """Every rank's `payload`, in rank order (a collective: all ranks call it); payloads may
    differ in length, so sizes are gathered first and each buffer padded to the longest."""
    world = dist.get_world_size()
    size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    longest = max(int(s) for s in sizes)
    buffer = torch.zeros(longest, dtype=torch.uint8)
    buffer[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    buffer = buffer.to(device)
    buffers = [torch.zeros_like(buffer) for _ in range(world)]
    dist.all_gather(buffers, buffer)
    return [b[: int(s)].cpu().numpy().tobytes() for b, s in zip(buffers, sizes)]


def write_training_state(directory: Path, state: TrainingState) -> dict[str, Any]:
    """Write the state files into `directory`; returns the manifest's `training_state` entry."""
    optimizer = state.optimizer.state_dict()
    tensors = {f"extra/{name}": t.detach().cpu().contiguous() for name, t in state.extra.items()}
    state_keys: dict[str, list[str]] = {}
    for index, values in optimizer["state"].items():
        state_keys[str(index)] = sorted(values)
        for key, value in values.items():
            if not torch.is_tensor(value):
                raise TypeError(f"optimizer state {index}/{key} is not a tensor ({type(value).__name__})")
            tensors[f"optimizer/{index}/{key}"] = value.detach().cpu().contiguous()
    save_file(tensors, str(directory / STATE_TENSORS))
    record = {
        "format": STATE_FORMAT,
        "step": state.step,
        "world": len(state.ranks),
        "config_hash": state.config_hash,
        "progress": state.progress,
        "optimizer": {"param_groups": optimizer["param_groups"], "state_keys": state_keys},
    }
    (directory / STATE_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True))
    names = [STATE_TENSORS, STATE_RECORD]
    for rank, rank_state in enumerate(state.ranks):
        tensor_file, record_file = rank_files(rank)
        save_file({k: v.contiguous() for k, v in rank_state.tensors.items()}, str(directory / tensor_file))
        (directory / record_file).write_text(json.dumps(rank_state.record, sort_keys=True))
        names += [tensor_file, record_file]
    return {
        "format": STATE_FORMAT,
        "files": {name: file_sha256(directory / name) for name in names},
        "step": state.step,
        "world": len(state.ranks),
        "final": state.final,
    }


def read_training_state(directory: Path, manifest: dict[str, Any], *, rank: int, world: int,
                        expected_config_hash: str) -> LoadedState:
    """Worker `rank`'s state from a verified checkpoint, after checking the files it needs;
    a missing, corrupt or mismatched file is a `CheckpointError` naming it."""
    directory = Path(directory)
    entry = manifest.get("training_state")
    if entry is None:
        raise CheckpointError(f"{directory / MANIFEST_FILE}: no training state recorded; this checkpoint "
                              "cannot be resumed")
    if entry.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{directory / MANIFEST_FILE}: training state format {entry.get('format')!r}, "
                    f"expected {STATE_FORMAT!r}")
    if entry["world"] != world:
        raise CheckpointError(f"{directory}: saved by {entry['world']} workers, resumed by {world}; an exact resume "
                    "needs the same worker count (each worker's RNG state and rows)")
    tensor_file, record_file = rank_files(rank)
    for name in (STATE_TENSORS, STATE_RECORD, tensor_file, record_file):
        path = directory / name
        if name not in entry["files"] or not path.is_file():
            raise CheckpointError(f"{path}: missing")
        if file_sha256(path) != entry["files"][name]:
            raise CheckpointError(f"{path}: content hash mismatch (corrupt or truncated file)")
    record = json.loads((directory / STATE_RECORD).read_text())
    if record["config_hash"] != expected_config_hash:
        raise CheckpointError(f"{directory / STATE_RECORD}: written by a different trial config; an exact resume "
                    "needs the same config")
    tensors = load_file(str(directory / STATE_TENSORS))
    return LoadedState(
        step=record["step"],
        progress=record["progress"],
        optimizer_tensors={k.removeprefix("optimizer/"): v for k, v in tensors.items() if k.startswith("optimizer/")},
        optimizer_record=record["optimizer"],
        extra={k.removeprefix("extra/"): v for k, v in tensors.items() if k.startswith("extra/")},
        rank=RankState(load_file(str(directory / tensor_file)), json.loads((directory / record_file).read_text())),
    )


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                         record: dict[str, Any]) -> None:
    """Restore the optimizer's per-parameter state and hyperparameters (JSON lists back to tuples)."""
    groups = []
    for saved, current in zip(record["param_groups"], optimizer.param_groups, strict=True):
        groups.append({k: tuple(v) if isinstance(current.get(k), tuple) else v for k, v in saved.items()})
    state = {
        int(index): {key: tensors[f"{index}/{key}"] for key in keys}
        for index, keys in record["state_keys"].items()
    }
    optimizer.load_state_dict({"state": state, "param_groups": groups})
