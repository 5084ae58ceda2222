"""A mined set's false-negative rate, judged by a stronger model on a fixed sample.

For a phase-3 trial with `contrastive.negatives.false_negative_sample` = n, n of the negatives
its rule selected are drawn by a fixed seed (`embedlab.negatives.false_negatives.negative_sample`)
and the judge (`JUDGE`, all-MiniLM-L6-v2) scores each sampled negative and its pair's positive
against the query, as cosines of its unit embeddings of the full texts (its own prefixes: none).
A negative it scores at or above the positive is a false negative by its judgment: a model's,
not a human one, which every record says. Beside it, with no model, the share in the query's own
source group or near-duplicate cluster (`same_group`). Stored once per mined set, judge, sample
size and seed under `false-negatives/<version>/`:

    sample.parquet   the sampled negatives: pair_id, doc_id, rank, query, positive, negative,
                     teacher_positive, teacher_negative (cosines), teacher_false_negative,
                     same_group (null for a pair without corpus documents)
    compute.json     what the judge's encoding cost (FlopCounterMode FLOPs, CPU and wall seconds)
    manifest.json    identity, counts, both rates and the disclosure, written last

A trial's row carries `data/false_negative_rate/teacher`, `data/false_negative_rate/same_group`,
`data/false_negative_sample` and `compute/false_negative_*` (`false_negative_figures`). The
sample's texts feed no training: they are the mined set's, which its gate has checked.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embedlab.artifacts.build import Artifact, build_once
from embedlab.core.code_identity import code_revision
from embedlab.negatives.false_negatives import SAMPLE_SEED, negative_sample, same_group
from embedlab.negatives.mining import NEGATIVES_FILE
from embedlab.teacher.labels import COST_FILE, TEACHER_TRAINING_DATA, load_teacher, measured_encode, set_cost

JUDGE = "all-MiniLM-L6-v2"
FORMAT = "embedlab-false-negatives/1"
SAMPLE_FILE = "sample.parquet"
MANIFEST_FILE = "manifest.json"
# A trial's row columns for its two rates (`false_negative_figures`), which the study table shows per arm.
RATES = ("data/false_negative_rate/teacher", "data/false_negative_rate/same_group")
CODE = ("teacher/false_negatives.py", "negatives/false_negatives.py", "tasks/baselines.py")
DISCLOSURE = (f"false negatives judged by {JUDGE}: a model's judgment, not a human one (a negative it scores at "
              f"or above the pair's positive); {TEACHER_TRAINING_DATA}")


def judge_negatives(encode: Callable[[list[str]], np.ndarray], sample: pa.Table) -> pa.Table:
    """`sample` (a mined set's rows) with the judge's cosines of each query against its positive
    and its negative, and whether the negative scores at or above the positive."""
    texts = sorted({*sample["query"].to_pylist(), *sample["positive"].to_pylist(), *sample["negative"].to_pylist()})
    vectors = encode(texts) if texts else np.zeros((0, 1), dtype=np.float32)
    row = {text: i for i, text in enumerate(texts)}

    def cosines(left: str, right: str) -> list[float]:
        return [float(np.dot(vectors[row[a]], vectors[row[b]]))
                for a, b in zip(sample[left].to_pylist(), sample[right].to_pylist())]

    positive, negative = cosines("query", "positive"), cosines("query", "negative")
    return (sample.append_column("teacher_positive", pa.array(positive, pa.float32()))
            .append_column("teacher_negative", pa.array(negative, pa.float32()))
            .append_column("teacher_false_negative", pa.array([n >= p for p, n in zip(positive, negative)])))


def rates(judged: pa.Table) -> dict[str, Any]:
    """The sample's counts and both rates (nan over an empty denominator)."""
    flags = judged["teacher_false_negative"].to_pylist()
    grouped = [flag for flag in judged["same_group"].to_pylist() if flag is not None]
    return {"sampled": len(flags), "teacher_false_negatives": sum(flags),
            "teacher_rate": sum(flags) / len(flags) if flags else math.nan,
            "with_corpus_documents": len(grouped), "same_group": sum(grouped),
            "same_group_rate": sum(grouped) / len(grouped) if grouped else math.nan}


def false_negatives_for_phase3(trial, prepared, pairs_path: Path, mined: Path, progress=print) -> Path:
    """The trial's false-negative sample of its mined set `mined`, judged now if no trial judged
    it before (module docstring)."""
    # here: the judge's identity reads its package (torch, transformers), which a table of the rates does not need
    from embedlab.teacher.phase3 import teacher_identity

    size = trial.contrastive.negatives.false_negative_sample
    identity = {"format": FORMAT, "mined": mined.name, "judge": teacher_identity(JUDGE), "sample": size,
                "seed": SAMPLE_SEED, "code": code_revision(sources=CODE)}
    version = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    directory = Artifact(kind="false-negatives", inputs={"version": version}).under(prepared.directory)

    def build(staging: Path) -> None:
        sample = negative_sample(pq.read_table(mined / NEGATIVES_FILE), size)
        pairs = pq.read_table(pairs_path, columns=["pair_id", "doc_ids"])
        corpus = prepared.corpus.read()
        groups = dict(zip(corpus["doc_id"].to_pylist(),
                          zip(corpus["group_id"].to_pylist(), corpus["split_group"].to_pylist())))
        flags = same_group(sample, dict(zip(pairs["pair_id"].to_pylist(), pairs["doc_ids"].to_pylist())), groups)
        progress(f"false negatives: {JUDGE} judging {sample.num_rows:,} sampled negatives of {mined.name}")
        encode, cost = measured_encode(load_teacher(JUDGE))
        judged = judge_negatives(encode, sample).append_column("same_group", pa.array(flags, pa.bool_()))
        pq.write_table(judged, staging / SAMPLE_FILE)
        (staging / COST_FILE).write_text(json.dumps(cost(), indent=2, sort_keys=True))
        found = rates(judged)
        (staging / MANIFEST_FILE).write_text(json.dumps(
            {**identity, "version": version, "counts": found, "disclosure": DISCLOSURE}, indent=2, sort_keys=True))
        progress(f"false negatives: {found['teacher_rate']:.1%} judged false by {JUDGE}, "
                 f"{found['same_group_rate']:.1%} in the query's own source group or cluster")

    return build_once(directory, build, progress=progress)


def false_negative_figures(directory: Path | None) -> dict[str, float]:
    """A trial's row figures of its false-negative sample (none without one)."""
    if directory is None:
        return {}
    counts = json.loads((directory / MANIFEST_FILE).read_text())["counts"]
    return {RATES[0]: float(counts["teacher_rate"]), RATES[1]: float(counts["same_group_rate"]),
            "data/false_negative_sample": float(counts["sampled"]),
            **{f"compute/false_negative_{key}": value for key, value in set_cost(directory).items()}}
