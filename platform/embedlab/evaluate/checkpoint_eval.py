"""Evaluate a checkpoint directory on a task, in this process (the actor and the CLI share it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from embedlab.checkpoints.io import checkpoint_prefixes, load_encoder, local_checkpoint
from embedlab.core.beir import Task
from embedlab.core.config import EvalConfig
from embedlab.model.encode import encode_texts
from embedlab.model.flops import FlopTally
from embedlab.tasks.retention import mlm_accuracy_function, retention_scores
from embedlab.tasks.retrieval import evaluate_encoder


def evaluate_checkpoint(
    checkpoint_dir: str | Path, task: Task, split: str, *, batch_size: int = EvalConfig.batch_size,
    max_length: int = EvalConfig.max_length, index: str = "flat",
    retention_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    dims: tuple[int, ...] = (),
) -> dict:
    """Retrieval metrics and representation health on `task`; with `retention_dir` (the
    prepared data's `retention/`), the retention panel too. `progress` gets throttled
    encoding lines (`embedlab.model.encode.EncodingProgress`) for each pass: documents,
    queries, retention texts.

    Besides the means, "per_query" holds each query's values of the split
    (``{metric: {query_id: value}}``, what the means average), and the evaluation's cost:
    "eval_flops" (the forward FLOPs of every text encoded: documents, queries, retention
    texts; the retention panel's MLM-accuracy pass is not counted), "eval_seconds" (this
    thread's CPU time, `time.thread_time`) and "eval_wall_seconds", both over the whole call;
    "seconds" stays the wall time of the retrieval part alone. `dims` (`EvalConfig.dims`)
    scores truncated widths too (`retrieval.evaluate_encoder`)."""
    started_wall, started_thread = time.perf_counter(), time.thread_time()
    tally = FlopTally()
    checkpoint_dir = local_checkpoint(checkpoint_dir)  # a URI: this node's verified copy
    encoder, tokenizer, manifest = load_encoder(checkpoint_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    encoder.to(device)
    pooling = manifest["pooling"]
    prefixes = checkpoint_prefixes(manifest)
    encode = partial(
        encode_texts, encoder, tokenizer, batch_size=batch_size, max_length=max_length, device=device,
        pooling=pooling["method"], progress=progress, tally=tally,
    )
    where = f"evaluate {task.name}/{split}"
    metrics = evaluate_encoder(
        partial(encode, prefix=prefixes["query"], label=f"{where} queries"), task, split,
        encode_documents=partial(encode, prefix=prefixes["passage"], label=f"{where} documents"), index=index,
        dims=tuple(dims),
    )
    if retention_dir is not None:
        retention_encode = partial(encode, prefix=prefixes["passage"], label="evaluate retention panel")
        metrics.update(retention_scores(Path(retention_dir), retention_encode,
                                        mlm_accuracy_function(checkpoint_dir)))
    return {**metrics, "checkpoint_hash": manifest["content_hash"], "eval_flops": tally.flops,
            "eval_seconds": time.thread_time() - started_thread,
            "eval_wall_seconds": time.perf_counter() - started_wall}
