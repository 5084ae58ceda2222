"""Phase 3's teacher labels, made on the trial driver after its negatives and before training.

`teacher_labels_for_phase3` scores the scheduled pairs' queries against their positives and
the negatives the stream gives them (`embedlab.negatives.reading.pair_negatives`), each text
cut as the student sees it (`as_student_sees`), with the trial's `contrastive.distillation.teacher`, once
per version under the prepared data (`embedlab.teacher.labels`), publishes the set to
every node and refuses a set whose manifest names other inputs.
`embedlab.train.contrastive.run_contrastive` calls it, audits the set's texts against the
evaluation tasks and passes its path to the pair stream.

`teacher_embeddings_for_trial` does the same for embedding distillation (phase 2 or 3): one
training-split document per scheduled pair, cut to the student's pair length, encoded by the
teacher and projected to the student's width (`embedlab.teacher.embeddings`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedlab.artifacts.build import Artifact, build_once
from embedlab.core.config import ContrastiveConfig, TrialConfig
from embedlab.negatives.mining import NEGATIVES_FILE
from embedlab.core.code_identity import code_revision
from embedlab.negatives.reading import pair_negatives
from embedlab.teacher.labels import (
    MANIFEST_FILE, TEACHER_CODE, ScoredPair, TeacherLabelsError, labels_identity, labels_version,
    load_manifest, load_teacher, measured_encode, pairs_below_confidence, score_pairs, set_cost, teacher_compute,
    write_labels,
)
from embedlab.checkpoints.state import data_seed
from embedlab.core.store import file_sha256
from embedlab.negatives.mining import TRAIN_SPLIT
from embedlab.negatives.phase3 import scheduled_rows
from embedlab.tasks.baselines import MINILM, minilm_identity
from embedlab.teacher import embeddings as embeddings
from embedlab.teacher.student_view import cut_to_tokens
from embedlab.tokenizer.frozen import FrozenTokenizer


def teacher_identity(name: str) -> dict:
    """The named teacher's identity, read without loading its weights into a model."""
    if name != MINILM:
        raise TeacherLabelsError(f"unknown teacher {name!r}; valid: [{MINILM!r}]")
    return minilm_identity()


def teacher_labels_for_phase3(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets, *,
                              mined: Path | None, given: Path | None, progress=print,
                              check: Callable[[Path], Any] | None = None) -> Path:
    """The trial's teacher-labels set (module docstring), scored now if no trial scored it before;
    `check`, its post-condition, the contamination gate."""
    settings = trial.contrastive
    rows = scheduled_rows(pairs_path, schedule, offsets, ["pair_id", "query", "positive"])
    negatives_path = None if mined is None else str(mined / NEGATIVES_FILE)
    given_path = None if given is None else str(given / NEGATIVES_FILE)
    negatives = pair_negatives([r["pair_id"] for r in rows], negatives_path=negatives_path,
                               given_negatives_path=given_path, negatives_per_pair=settings.negatives.count)
    identity = labels_identity(
        teacher=teacher_identity(settings.distillation.teacher), query_prefix=settings.distillation.query_prefix,
        passage_prefix=settings.distillation.passage_prefix, pairs_table=file_sha256(Path(pairs_path)),
        negative_sets={"mined": None if mined is None else mined.name, "given": None if given is None else given.name},
        negatives_per_pair=settings.negatives.count, pair_ids=[r["pair_id"] for r in rows],
        student_view=student_view(settings, prepared.tokenizer), code=code_revision(sources=TEACHER_CODE),
    )
    # The set's version hashes the code that scores it (`identity["code"]`): it names the artifact alone.
    directory = Artifact(kind="teacher-labels", inputs={"version": labels_version(identity)}).under(prepared.directory)
    build_once(directory, lambda staging: _score(trial, prepared.tokenizer, rows, negatives, identity, staging,
                                                 directory, progress), check=check, progress=progress)
    load_manifest(directory, identity)
    return directory


def student_view(settings: ContrastiveConfig, tokenizer: FrozenTokenizer) -> dict[str, Any]:
    """What decides the text the student sees of a pair, and so the teacher's cut."""
    return {"tokenizer": tokenizer.hash, "pair_length": settings.pair_length,
            "query_prefix": settings.prefixes.query, "passage_prefix": settings.prefixes.passage}


def as_student_sees(pairs: list[ScoredPair], settings: ContrastiveConfig,
                    tokenizer: FrozenTokenizer) -> list[ScoredPair]:
    """`pairs` with every query and candidate cut as the stream gives it to the student: the
    student's prefix plus the text within `pair_length` tokens with [CLS] and [SEP]
    (`cut_to_tokens`); each distinct text cut once."""
    cuts: dict[tuple[str, str], str] = {}

    def cut(text: str, prefix: str) -> str:
        if (prefix, text) not in cuts:
            cuts[prefix, text] = cut_to_tokens(tokenizer, text, prefix=prefix, max_tokens=settings.pair_length - 2)
        return cuts[prefix, text]

    query, passage = settings.prefixes.query, settings.prefixes.passage
    return [ScoredPair(p.pair_id, cut(p.query, query), cut(p.positive, passage),
                       tuple((doc_id, cut(text, passage)) for doc_id, text in p.negatives)) for p in pairs]


def _score(trial: TrialConfig, tokenizer, rows, negatives, identity: dict, staging: Path, directory: Path,
           progress) -> None:
    """Score the scheduled pairs' candidates, as the student sees them, with the trial's teacher
    and save the set in `staging` (renamed to `directory` once whole)."""
    settings = trial.contrastive
    pairs = [ScoredPair(r["pair_id"], r["query"], r["positive"], tuple(negatives[r["pair_id"]])) for r in rows]
    progress(f"teacher labels: cutting {len(pairs):,} pairs' texts to the student's {settings.pair_length} "
             f"tokens and scoring them with {settings.distillation.teacher}")
    pairs = as_student_sees(pairs, settings, tokenizer)
    encode, cost = measured_encode(load_teacher(settings.distillation.teacher))
    table = score_pairs(encode, pairs, query_prefix=settings.distillation.query_prefix,
                        passage_prefix=settings.distillation.passage_prefix, progress=progress)
    write_labels(staging, table, identity, cost())
    progress(f"teacher labels: {table.num_rows:,} scores in {directory}, {cost()['flops']:.3g} teacher FLOPs")


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
        "min_confidence": settings.distillation.min_confidence,
        "pairs_below_confidence": pairs_below_confidence(directory, settings.distillation.min_confidence),
        "compute": teacher_compute(directory), "disclosure": manifest["disclosure"],
    }


def teacher_compute_figures(record: dict[str, Any] | None,
                            embedding_record: dict[str, Any] | None = None) -> dict[str, float]:
    """A distilling trial's `compute/teacher_*` metrics (its labels' and its embeddings' encoding,
    summed: what the teacher cost in all) and `data/teacher_*` counts (none without either)."""
    figures: dict[str, float] = {}
    if record is not None:
        counts = record["counts"]
        figures.update({**record["compute"], "data/teacher_pairs": counts["pairs"],
                        "data/teacher_disagrees": counts["teacher_disagrees"],
                        "data/teacher_pairs_without_negatives": counts["pairs_without_negatives"],
                        "data/teacher_pairs_below_confidence": record["pairs_below_confidence"]})
    if embedding_record is not None:
        for key, value in embedding_record["compute"].items():
            name = f"compute/teacher_{key}"
            figures[name] = figures.get(name, 0.0) + value
        figures["data/teacher_embedding_texts"] = embedding_record["counts"]["pairs"]
    return figures


def teacher_embeddings_for_trial(trial: TrialConfig, prepared, pairs_path: Path, schedule, offsets, *,
                                 progress=print, check: Callable[[Path], Any] | None = None) -> Path:
    """The trial's teacher-embeddings set (module docstring), encoded now if no trial encoded it;
    `check`, its post-condition, the contamination gate."""
    settings = trial.contrastive
    pair_ids = [r["pair_id"] for r in scheduled_rows(pairs_path, schedule, offsets, ["pair_id"])]
    tokenizer = prepared.tokenizer
    identity = embeddings.embeddings_identity(
        teacher=teacher_identity(settings.distillation.teacher), passage_prefix=settings.distillation.passage_prefix,
        student_prefix=settings.prefixes.passage, corpus_revision=prepared.data_revision,
        tokenizer_hash=tokenizer.hash, pair_length=settings.pair_length, student_width=trial.model.width,
        seed=data_seed(trial), pair_ids=pair_ids, code=code_revision(sources=embeddings.EMBEDDINGS_CODE),
    )
    directory = Artifact(kind="teacher-embeddings",
                         inputs={"version": embeddings.embeddings_version(identity)}).under(prepared.directory)
    build_once(directory, lambda staging: _encode_documents(trial, prepared, tokenizer, sorted(set(pair_ids)),
                                                            identity, staging, directory, progress),
               check=check, progress=progress)
    embeddings.load_manifest(directory, identity)
    return directory


def _encode_documents(trial: TrialConfig, prepared, tokenizer, pair_ids: list[str], identity: dict,
                      staging: Path, directory: Path, progress) -> None:
    """Assign, cut and encode each pair's training-split document; save the set in `staging`
    (renamed to `directory` once whole)."""
    settings = trial.contrastive
    train = prepared.corpus.read(split=TRAIN_SPLIT)
    doc_ids = train["doc_id"].to_pylist()
    text_of = {d: embeddings.document_text(title, text) for d, title, text in
               zip(doc_ids, train["title"].to_pylist(), train["text"].to_pylist())}
    assigned = embeddings.assign_documents(pair_ids, doc_ids, data_seed(trial))
    progress(f"teacher embeddings: cutting {len(pair_ids):,} training-split documents to "
             f"{settings.pair_length} tokens and encoding them with {settings.distillation.teacher}")
    texts = [cut_to_tokens(tokenizer, text_of[assigned[p]], prefix=settings.prefixes.passage,
                           max_tokens=settings.pair_length - 2) for p in pair_ids]
    encode, cost = measured_encode(load_teacher(settings.distillation.teacher))
    vectors = embeddings.encode_texts(encode, texts, prefix=settings.distillation.passage_prefix, progress=progress)
    table = embeddings.embeddings_table(pair_ids, [assigned[p] for p in pair_ids], texts,
                                        embeddings.project(vectors, trial.model.width))
    embeddings.write_embeddings(staging, table, identity, cost())
    progress(f"teacher embeddings: {table.num_rows:,} targets in {directory}, {cost()['flops']:.3g} teacher FLOPs")


def teacher_embedding_record(directory: Path | None) -> dict[str, Any] | None:
    """What a trial's checkpoint and metrics record of its teacher embeddings: the set, its
    teacher, prefixes, projection, counts and what encoding cost."""
    if directory is None:
        return None
    manifest = json.loads((directory / embeddings.MANIFEST_FILE).read_text())
    return {"set": directory.name, "labels": manifest["labels"], "teacher": manifest["teacher"],
            "passage_prefix": manifest["passage_prefix"], "student_prefix": manifest["student_prefix"],
            "texts": "one training-split document per scheduled pair, cut to the pair length",
            "projection": manifest["projection"], "counts": manifest["counts"],
            "compute": set_cost(directory), "disclosure": manifest["disclosure"]}
