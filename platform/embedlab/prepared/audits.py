"""The phase-1 stages of a prepared data directory as audit items, and their saved audit.

`phase1_stages` reads the pretraining text (training-split documents of the mixture's
sources) and the tokenizer sample as (doc id, text) streams; `task_audit` audits them against
one task and saves the report as `audits/<task hash>.json`. `prepare_data` runs it for every
task built with the data, and the data card reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from embedlab.contamination.audit import audit
from embedlab.artifacts.build import write_json_staged
from embedlab.contamination.saved import report_content
from embedlab.contamination.stages import PHASE1_STAGES
from embedlab.core import timing
from embedlab.core.beir import load_task
from embedlab.prepared.directory import PreparedData
from embedlab.sources.document import document_text


def _documents(prepared: PreparedData, doc_ids: set[str] | None) -> Iterator[tuple[str, str]]:
    sources = list(prepared.record["mixture"]["shares"])
    table = prepared.corpus.read(split="train", sources=sources).select(["doc_id", "title", "text"])
    if doc_ids is not None:
        table = table.filter(pc.is_in(table["doc_id"], value_set=pc.cast(list(doc_ids), "string")))
    for doc_id, title, text in zip(*(table[c].to_pylist() for c in ("doc_id", "title", "text"))):
        yield doc_id, document_text(title, text)


def phase1_stages(prepared: PreparedData) -> dict[str, Callable[[], Iterator[tuple[str, str]]]]:
    """The phase-1 stages (`PHASE1_STAGES`) of `prepared`, each a function giving its items."""
    def tokenizer_sample() -> Iterator[tuple[str, str]]:
        yield from _documents(prepared, set(pq.read_table(prepared.tokenizer_sample_path)["doc_id"].to_pylist()))

    return {"pretraining": lambda: _documents(prepared, None), "tokenizer-sample": tokenizer_sample}


@timing.charged("audit")
def task_audit(prepared: PreparedData, task_dir: Path, progress: Callable[[str], None] = print) -> dict:
    """The phase-1 audit of one task against this data, computed once per task content and
    saved as `audits/<task hash>.json` (findings, counts and the markdown report)."""
    task = load_task(task_dir)
    path = prepared.audits_dir / f"{task.hash}.json"
    if path.is_file():
        return json.loads(path.read_text())
    progress(f"audit: task {task.name} ({task_dir}) against stages {', '.join(PHASE1_STAGES)}")
    stages = {name: items() for name, items in phase1_stages(prepared).items()}
    content = report_content(audit([task], stages, threshold=prepared.near_duplicate_threshold, progress=progress))
    write_json_staged(path, content)
    return content
