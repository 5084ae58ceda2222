"""Evaluate a checkpoint directory on a task, in this process (the actor and the CLI share it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from functools import partial
from pathlib import Path

import torch

from embedlab.config import EvalConfig
from embedlab.errors import UsageError
from embedlab.evaluate.beir import Task
from embedlab.evaluate.builtin_tasks import BUILTIN_TASKS
from embedlab.evaluate.encode import encode_texts
from embedlab.evaluate.hub_tasks import materialise_hub_task
from embedlab.evaluate.retention import mlm_accuracy_function, retention_scores
from embedlab.evaluate.retrieval import evaluate_encoder
from embedlab.train.checkpoint import load_encoder, local_checkpoint
from embedlab.train.flops import FlopTally


def evaluate_checkpoint(
    checkpoint_dir: str | Path, task: Task, split: str, *, batch_size: int = EvalConfig.batch_size,
    max_length: int = EvalConfig.max_length, index: str = "flat",
    retention_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
    dims: tuple[int, ...] = (),
) -> dict:
    """Retrieval metrics and representation health on `task`; with `retention_dir` (the
    prepared data's `retention/`), the retention panel too. `progress` gets throttled
    encoding lines (`embedlab.evaluate.encode.EncodingProgress`) for each pass: documents,
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


def checkpoint_prefixes(manifest: dict) -> dict[str, str]:
    """The query and passage prefixes a checkpoint was trained with (its manifest's pooling
    record), as evaluation and phase-3 mining encode with them: none for a phase-1 checkpoint."""
    return manifest["pooling"].get("prefixes", {"query": "", "passage": ""})


def resolve_task(name_or_path: str, prepared_dir: Path | None = None) -> Path:
    """A BEIR directory as given, or a built-in task's directory inside prepared data."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if name_or_path in BUILTIN_TASKS:
        if prepared_dir is None:
            raise UsageError(f"built-in task {name_or_path!r} needs prepared data")
        return Path(prepared_dir) / "tasks" / name_or_path
    raise FileNotFoundError(
        f"task {name_or_path!r} is neither a BEIR directory (corpus.jsonl, queries.jsonl, "
        f"qrels/test.tsv) nor a built-in task ({', '.join(BUILTIN_TASKS)})"
    )



def resolve_eval_tasks(config: EvalConfig, prepared_dir: Path | None = None,
                       cache_dir: Path | None = None) -> list[tuple[str, Path]]:
    """(name, BEIR directory) of every task `config` scores on: the main `task` first, then
    `tasks` (as `resolve_task`), then `hub_tasks`, materialised in `cache_dir` (default
    EMBEDLAB_CACHE) by `hub_tasks.materialise_hub_task`. One entry without a panel."""
    directories = [resolve_task(task, prepared_dir) for task in (config.task, *config.tasks)]
    directories += [materialise_hub_task(spec, cache_dir).directory for spec in config.hub_tasks]
    return list(zip(config.task_names, directories))


def arm_eval_tasks(config: EvalConfig, record: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, BEIR directory) of every task an arm is scored on, the main task first: as the
    sweep's `prepare_arms` resolved them into the arm's prepared record ("eval_tasks", a panel's
    only), else `resolve_eval_tasks` inside the arm's prepared data, `record["directory"]`."""
    if "eval_tasks" in record:
        return [(str(name), str(directory)) for name, directory in record["eval_tasks"]]
    return [(name, str(directory)) for name, directory in resolve_eval_tasks(config, Path(record["directory"]))]
