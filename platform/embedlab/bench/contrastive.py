"""`embedlab bench contrastive`: pairs per second of the phase-2 step with and without GradCache.

Both sides are the real `ContrastiveLoop.step` (embedding, gathered InfoNCE, clipping,
AdamW) on one worker, built from the same random-initialised parent checkpoint of the
preset, on the same batch of real pairs from the prepared training split (tokenised as
the pair stream does). The only difference is `contrastive.gradcache_chunk`: GradCache
encodes the batch in chunks without a graph, computes the loss on the cached embeddings,
then re-encodes chunk by chunk with gradients, so it pays one extra forward pass per
chunk for encoder activations of one chunk at a time. Its peak memory is measured in a
fresh process per side (`embedlab.bench.measure`).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from embedlab.bench.measure import Comparison, interleaved_rates, median, peak_since, start_peak_window
from embedlab.checkpoints.io import save_checkpoint
from embedlab.core.config import ContrastiveConfig, DEFAULT_BUDGET, DataConfig, TrainConfig, TrialConfig, model_preset
from embedlab.core.errors import UsageError
from embedlab.model.encoder import MLMModel
from embedlab.pairs.table import pair_table_path
from embedlab.prepared.directory import PreparedData
from embedlab.streams.pair_stream import tokenize_pair_window
from embedlab.train.contrastive import ContrastiveLoop
from embedlab.train.worker import WorkerConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContrastiveBench:
    preset: str = "small"
    batch_pairs: int = 64
    gradcache_chunk: int = 16
    pair_length: int = 64
    steps: int = 3  # steps per timed pass
    repeats: int = 3
    threads: int = 1
    memory: bool = True

    def __post_init__(self) -> None:
        for name in ("batch_pairs", "gradcache_chunk", "pair_length", "steps", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise UsageError(f"bench.{name}: must be >= 1, got {getattr(self, name)}")
        model_preset(self.preset)


def pair_batch(prepared, bench: ContrastiveBench) -> dict[str, torch.Tensor]:
    """The first `batch_pairs` pairs of the frozen pair table, tokenised like the pair stream."""
    settings = ContrastiveConfig(pair_length=bench.pair_length)
    builders = [name for name, _ in settings.pairs]
    path = pair_table_path(prepared, builders, progress=lambda message: None)
    builder_of = pq.read_table(path, columns=["builder"])["builder"].to_pylist()
    # Spread over builders in table order, as a schedule window mixes them.
    rows = np.linspace(0, len(builder_of) - 1, bench.batch_pairs).astype(np.int64)
    window = {"rows": [rows], "source_index": [np.array([builders.index(builder_of[r]) for r in rows], np.int32)]}
    batch = tokenize_pair_window(
        window, pairs_path=str(path), tokenizer_path=str(prepared.tokenizer_path), length=bench.pair_length,
        query_prefix=settings.prefixes.query, passage_prefix=settings.prefixes.passage, negatives_path=None,
        negatives_per_pair=0,
    )
    return {name: torch.from_numpy(np.asarray(column)) for name, column in batch.items()}


def contrastive_loop(prepared, parent: Path, bench: ContrastiveBench, gradcache_chunk: int):
    """A one-worker phase-2 loop on the CPU of `bench`'s preset from `parent`, at `gradcache_chunk`
    (0: the plain loss); its budget never ends a bench."""
    settings = ContrastiveConfig(pair_length=bench.pair_length, gradcache_chunk=gradcache_chunk)
    preset = model_preset(bench.preset)
    trial = TrialConfig(
        model=preset, phase=2, parent=str(parent), contrastive=settings,
        data=DataConfig(tokenizer_vocab_size=min(prepared.tokenizer.vocab_size, preset.vocab_size)),
        train=TrainConfig(batch_rows=bench.batch_pairs, num_workers=1, torch_threads=bench.threads,
                          budget=dataclasses.replace(DEFAULT_BUDGET, pairs=10**9)),
    )
    builders = [name for name, _ in settings.pairs]
    config = WorkerConfig(trial=trial, tokenizer_path=str(prepared.tokenizer_path),
                          tokenizer_hash=prepared.record["tokenizer_hash"], data_revision=prepared.data_revision,
                          sources=tuple(builders), intended_shares=dict(settings.pairs), schedule={"version": "bench"})
    return ContrastiveLoop(config, rank=0, world=1, device=torch.device("cpu"))


def write_parent(prepared, preset: str, directory: Path) -> Path:
    """A random-initialised phase-1 checkpoint of `preset` with the prepared tokenizer."""
    torch.manual_seed(0)
    model = MLMModel(model_preset(preset))
    save_checkpoint(directory, model.encoder, head=model.mlm_head, tokenizer=prepared.tokenizer,
                    fields={"phase": 1})
    return directory


def _peak_child() -> None:
    """Fresh-process entry: {"prepared": dir, "parent": dir, "bench": {...}, "chunk": n} on stdin."""
    request = json.loads(sys.stdin.read())
    directory = Path(request["prepared"])
    prepared = PreparedData(directory=directory, record=json.loads((directory / "prepared.json").read_text()))
    bench = ContrastiveBench(**request["bench"])
    torch.set_num_threads(bench.threads)
    batch = pair_batch(prepared, bench)
    start = start_peak_window()
    loop = contrastive_loop(prepared, Path(request["parent"]), bench, request["chunk"])
    loop.step([batch])
    print(json.dumps({"peak_mib": peak_since(start)}))


def _peak(prepared, parent: Path, bench: ContrastiveBench, chunk: int) -> float:
    request = {"prepared": str(prepared.directory), "parent": str(parent), "bench": dataclasses.asdict(bench),
               "chunk": chunk}
    done = subprocess.run([sys.executable, "-c", "from embedlab.bench.contrastive import _peak_child; _peak_child()"],
                          input=json.dumps(request), capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"peak-memory process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]


def bench_contrastive(prepared, bench: ContrastiveBench = ContrastiveBench(),
                      progress: Callable[[str], None] = print) -> dict:
    torch.set_num_threads(bench.threads)
    batch = pair_batch(prepared, bench)
    with tempfile.TemporaryDirectory(prefix="embedlab-bench-") as scratch:
        parent = write_parent(prepared, bench.preset, Path(scratch) / "parent")
        loops = {"embedlab": contrastive_loop(prepared, parent, bench, bench.gradcache_chunk),
                 "reference": contrastive_loop(prepared, parent, bench, 0)}
        progress(f"bench contrastive: {bench.batch_pairs} pairs per step, GradCache chunks of "
                 f"{bench.gradcache_chunk}, preset {bench.preset}")

        def epoch(loop) -> int:
            for _ in range(bench.steps):
                loop.step([batch])
            return bench.steps * bench.batch_pairs

        for loop in loops.values():
            loop.step([batch])  # warm-up
        rates = interleaved_rates({side: (lambda loop=loop: epoch(loop)) for side, loop in loops.items()},
                                  bench.repeats)
        comparisons = [Comparison(
            name="contrastive: pairs/s", embedlab=median(rates["embedlab"]), reference=median(rates["reference"]),
            unit="pairs/s", better="higher",
            embedlab_measures=f"ContrastiveLoop.step with GradCache (chunks of {bench.gradcache_chunk})",
            reference_measures="the same step without GradCache (one graph for the whole batch)", runs=rates,
        )]
        if bench.memory:
            peaks = {side: _peak(prepared, parent, bench, chunk)
                     for side, chunk in (("embedlab", bench.gradcache_chunk), ("reference", 0))}
            comparisons.append(Comparison(
                name="contrastive: peak memory", embedlab=peaks["embedlab"], reference=peaks["reference"],
                unit="MiB", better="lower", embedlab_measures="one GradCache step, fresh process (RSS high-water mark)",
                reference_measures="one plain step, fresh process", runs={k: [v] for k, v in peaks.items()},
            ))
    return {"comparisons": comparisons, "bench": dataclasses.asdict(bench)}
