"""Phase 3's teacher labels, made on the trial driver after its negatives and before training.

`teacher_labels_for_phase3` scores the scheduled pairs' queries against their positives and
the negatives the stream gives them (`embedlab.data.pair_stream.pair_negatives`) with the
trial's `contrastive.teacher`, once per version under the prepared data
(`embedlab.data.teacher_labels`), publishes the set to every node and refuses a set whose
manifest names other inputs. `embedlab.train.contrastive.run_contrastive` calls it, audits the
set's texts against the evaluation tasks and passes its path to the pair stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedlab.config import TrialConfig
from embedlab.data.mining import NEGATIVES_FILE
from embedlab.data.pair_stream import pair_negatives
from embedlab.data.prepare import code_revision
from embedlab.data.prepared_sync import node_path, publish_subtree
from embedlab.data.teacher_labels import (
    MANIFEST_FILE, TEACHER_CODE, ScoredPair, TeacherLabelsError, labels_identity, labels_version,
    load_manifest, load_teacher, measured_encode, pairs_below_confidence, score_pairs, teacher_compute, write_labels,
)
from embedlab.evaluate.baselines import MINILM, minilm_identity
from embedlab.store import file_sha256
from embedlab.train.phase3_negatives import directory_lock, scheduled_rows


def teacher_identity(name: str) -> dict:
    """The named teacher's identity, read without loading its weights into a model."""
    if name != MINILM:
        raise TeacherLabelsError(f"unknown teacher {name!r}; valid: [{MINILM!r}]")
    return minilm_identity()


def teacher_labels_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets, *,
                              mined: Path | None, given: Path | None, progress=print) -> Path:
    """The trial's teacher-labels set (module docstring), scored now if no trial scored it before."""
    settings = trial.contrastive
    rows = scheduled_rows(pairs_path, schedule, offsets, ["pair_id", "query", "positive"])
    negatives_path = None if mined is None else str(mined / NEGATIVES_FILE)
    given_path = None if given is None else str(given / NEGATIVES_FILE)
    negatives = pair_negatives([r["pair_id"] for r in rows], negatives_path=negatives_path,
                               given_negatives_path=given_path, negatives_per_pair=settings.hard_negatives)
    identity = labels_identity(
        teacher=teacher_identity(settings.teacher), query_prefix=settings.teacher_query_prefix,
        passage_prefix=settings.teacher_passage_prefix, pairs_table=file_sha256(Path(pairs_path)),
        negative_sets={"mined": None if mined is None else mined.name, "given": None if given is None else given.name},
        negatives_per_pair=settings.hard_negatives, pair_ids=[r["pair_id"] for r in rows],
        code=code_revision(sources=TEACHER_CODE),
    )
    directory = prepared.directory / "teacher-labels" / labels_version(identity)[:16]
    node_path(directory)  # on a cluster with remote storage: another node's published set, fetched
    with directory_lock(directory):  # trials starting together score a set once, the rest reuse it
        if not (directory / MANIFEST_FILE).is_file():
            _score(trial, rows, negatives, identity, directory, progress)
    load_manifest(directory, identity)
    return directory


def _score(trial: TrialConfig, rows, negatives, identity: dict, directory: Path, progress) -> None:
    """Score the scheduled pairs' candidates with the trial's teacher and save the set."""
    settings = trial.contrastive
    pairs = [ScoredPair(r["pair_id"], r["query"], r["positive"], tuple(negatives[r["pair_id"]])) for r in rows]
    progress(f"teacher labels: scoring {len(pairs):,} pairs with {settings.teacher}")
    encode, cost = measured_encode(load_teacher(settings.teacher))
    table = score_pairs(encode, pairs, query_prefix=settings.teacher_query_prefix,
                        passage_prefix=settings.teacher_passage_prefix, progress=progress)
    write_labels(directory, table, identity, cost())
    progress(f"teacher labels: {table.num_rows:,} scores in {directory}, {cost()['flops']:.3g} teacher FLOPs")
    publish_subtree(directory)


def teacher_label_record(directory: Path | None, settings) -> dict[str, Any] | None:
    """What a trial's checkpoint and metrics record of its teacher labels: the set, its teacher
    and prefixes, its counts, the pairs the minimum confidence drops, and what scoring cost."""
    if directory is None:
        return None
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    return {
        "set": directory.name, "labels": "teacher (a model's judgments, not human ones)",
        "teacher": manifest["teacher"], "query_prefix": manifest["query_prefix"],
        "passage_prefix": manifest["passage_prefix"], "counts": manifest["counts"],
        "min_confidence": settings.teacher_min_confidence,
        "pairs_below_confidence": pairs_below_confidence(directory, settings.teacher_min_confidence),
        "compute": teacher_compute(directory), "disclosure": manifest["disclosure"],
    }


def teacher_compute_figures(record: dict[str, Any] | None) -> dict[str, float]:
    """A distilling trial's `compute/teacher_*` metrics and `data/teacher_*` counts (none without)."""
    if record is None:
        return {}
    counts = record["counts"]
    return {**record["compute"], "data/teacher_pairs": counts["pairs"],
            "data/teacher_disagrees": counts["teacher_disagrees"],
            "data/teacher_pairs_below_confidence": record["pairs_below_confidence"]}
