"""The contamination gate covers what a trial trains on: a phase 2-3 arm's frozen pairs before
any trial starts (the sweep's gate), and a phase-3 trial's mined negatives after mining and
before training (`run_contrastive`). Leaks are real final-eval text of the built-in task,
planted into a copy of the session's prepared data."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedlab.contamination.audit import ContaminationError
from embedlab.core.beir import load_task
from embedlab.core.config import ContrastiveConfig, DistillationConfig, NegativesConfig
from embedlab.prepared.directory import PreparedData

from conftest import audit_would_find, plain_words, tiny_budget, tiny_trial

pytestmark = pytest.mark.timeout(300)

TASK = "python-docstrings"
BUILDERS = ("title-body",)
QUIET = {"progress": lambda line: None}


@pytest.fixture
def data(prepared, tmp_path) -> PreparedData:
    """A private copy of the session's prepared data, free to plant leaks in."""
    directory = tmp_path / "prepared"
    shutil.copytree(prepared.directory, directory)
    return PreparedData(directory, prepared.record)


def final_eval_items(data: PreparedData) -> tuple[str, str, str, str]:
    """A test-split query (id, text) and a test-split labelled document of 8+ words (id, body)
    that contains no other test item."""
    task = load_task(data.task_dir(TASK))
    judged = task.qrels["test"]
    query_id = sorted(judged)[0]
    labelled = sorted(d for grades in judged.values() for d, grade in grades.items() if grade > 0)
    # A body that quotes no other test item (conftest's plain-Python audit rules), so planting
    # it leaks exactly one item.
    queries = [plain_words(task.queries[q]) for q in judged]

    def quotes_nothing_else(doc: str) -> bool:
        body = [plain_words(task.corpus[doc][1])]
        others = queries + [plain_words(task.corpus[d][1]) for d in labelled if d != doc]
        return not any(audit_would_find(other, body) for other in others)

    doc_id = next(d for d in labelled if len(task.corpus[d][1].split()) >= 8 and quotes_nothing_else(d))
    return query_id, task.queries[query_id], doc_id, task.corpus[doc_id][1]


def phase2_study(disclosed_overlap: str | None = None):
    from embedlab import Budget, Study

    base = dataclasses.replace(tiny_trial(), phase=2, contrastive=ContrastiveConfig(pairs=((BUILDERS[0], 1.0),)))
    warm = dataclasses.replace(base, contrastive=dataclasses.replace(base.contrastive, temperature=0.1))
    return Study(name="gate", factor="contrastive.temperature", arms={"cold": base, "warm": warm}, seeds=(0,),
                 budget=Budget(tokens=10_000, pairs=64), disclosed_overlap=disclosed_overlap)


def test_sweep_gate_refuses_final_eval_items_planted_in_the_pairs(data):
    """The gate a sweep runs before any trial passes the clean pairs of a phase-2 arm's builders,
    refuses the same frozen table once a test query and a quoted test document are planted in
    it, naming the pairs stage, and with a disclosed-overlap policy returns exactly those two."""
    from embedlab.pairs.table import pair_table_path
    from embedlab.sweep.gate import check_contamination

    records = {arm: {**data.record, "directory": str(data.directory)} for arm in ("cold", "warm")}
    lines: list[str] = []
    assert check_contamination(phase2_study(), records, lines.append) == []
    assert lines[-1] == "audit: no final-eval item found in the training data"

    query_id, query, doc_id, body = final_eval_items(data)
    path = pair_table_path(data, list(BUILDERS), **QUIET)
    table = pq.read_table(path)
    pair_ids = table["pair_id"].to_pylist()
    queries, positives = table["query"].to_pylist(), table["positive"].to_pylist()
    queries[3] = query
    positives[7] = f'As the reference puts it: "{body}" That is all.'
    planted = table.set_column(table.schema.get_field_index("query"), "query", pa.array(queries))
    planted = planted.set_column(planted.schema.get_field_index("positive"), "positive", pa.array(positives))
    pq.write_table(planted, path)

    with pytest.raises(ContaminationError, match="stages contrastive-pairs") as refused:
        check_contamination(phase2_study(), records, lines.append)
    assert "training refused" in str(refused.value)
    findings = check_contamination(phase2_study("disclosed: two planted pairs"), records, lines.append)
    assert {(f["item_id"], f["stage"], f["stage_item_id"], f["match"]) for f in findings} == {
        (query_id, "contrastive-pairs", f"{pair_ids[3]}:query", "exact"),
        (doc_id, "contrastive-pairs", f"{pair_ids[7]}:positive", "contained"),
    }


def phase3_setup(data: PreparedData, tmp_path, **distillation):
    """A phase-3 trial from a random phase-2 parent (two mined negatives a pair; `distillation`
    the fields of its distillation section), its pairs table, the schedule and offsets `run_contrastive` derives, and the
    mined set it finds (mined here, so the run reuses it)."""
    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.checkpoints.state import data_seed
    from embedlab.model.encoder import MLMModel
    from embedlab.negatives.phase3 import mine_for_phase3
    from embedlab.pairs.table import pair_table_path
    from embedlab.sources.mixture import schedule_target
    from embedlab.streams.pair_stream import pair_schedule
    from embedlab.train.budget import schedule_units

    base = tiny_trial(budget=tiny_budget(pairs=32))
    parent = tmp_path / "parent"
    model = MLMModel(base.model)
    save_checkpoint(parent, model.encoder, head=model.mlm_head, tokenizer=data.tokenizer, fields={"phase": 2})
    trial = dataclasses.replace(base, phase=3, parent=str(parent), contrastive=ContrastiveConfig(
        pairs=((BUILDERS[0], 1.0),), pair_length=32, negatives=NegativesConfig(count=2, top_k=50),
        distillation=DistillationConfig(**distillation)))
    pairs_path = pair_table_path(data, list(BUILDERS), **QUIET)
    step_pairs = trial.train.num_workers * trial.train.batch_rows * trial.train.microbatches
    schedule, offsets = pair_schedule(pairs_path, dict(trial.contrastive.pairs),
                                      target_pairs=schedule_target(schedule_units(trial), step_pairs),
                                      max_epochs=trial.data.mixture.max_epochs, seed=data_seed(trial))
    mined = mine_for_phase3(trial, data, pairs_path, schedule, offsets, **QUIET)
    return trial, pairs_path, schedule, offsets, mined


def test_phase3_refuses_a_final_eval_document_planted_in_its_mined_negatives(data, tmp_path):
    """A phase-3 run mines its negatives, then refuses to train when they hold a test document:
    the mined set it finds (the one it would mine) passes the gate clean and, with the
    document planted, `run_contrastive` raises before any Ray Train run starts."""
    from embedlab.negatives.reading import check_mined_negatives
    from embedlab.negatives.mining import NEGATIVES_FILE, NEGATIVE_SCHEMA
    from embedlab.train.contrastive import run_contrastive

    trial, pairs_path, schedule, offsets, mined = phase3_setup(data, tmp_path)
    task_dir = data.task_dir(TASK)
    assert check_mined_negatives(data, task_dir, mined, None, **QUIET) == []

    _, _, doc_id, body = final_eval_items(data)
    negatives = pq.read_table(mined / NEGATIVES_FILE)
    pair_id = pq.read_table(pairs_path, columns=["pair_id"])["pair_id"][int(schedule.item[0])].as_py()
    leak = pa.Table.from_pylist([{"pair_id": pair_id, "doc_id": "planted", "rank": 99, "score": 0.0,
                                  "positive_score": 1.0, "query": "", "positive": "", "negative": body}],
                                schema=NEGATIVE_SCHEMA)
    pq.write_table(pa.concat_tables([negatives, leak]), mined / NEGATIVES_FILE)

    storage = tmp_path / "train"
    with pytest.raises(ContaminationError, match="stages mined-negatives") as refused:
        run_contrastive(trial, data, storage_path=storage, name="planted", **QUIET)
    assert f"{mined.name}:{pair_id}:planted" in str(refused.value) and doc_id in str(refused.value)
    assert not storage.exists()  # refused before the trainer started
    allowed = check_mined_negatives(data, task_dir, mined, "disclosed: one planted negative", **QUIET)
    assert [(f["item_id"], f["match"]) for f in allowed] == [(doc_id, "exact")]


def test_two_writers_of_one_pairs_table_build_it_once(data):
    """Two trials that ask for the same frozen pairs table at once: one builds it under the
    artifact's lock while the other waits, then finds it (`embedlab.artifacts.build.build_once`);
    both get the table, whole, it is built once, and no staging file is left."""
    import threading
    import time

    from embedlab.pairs.builders import build_pairs
    from embedlab.pairs.table import builtin_pairs_table, pair_table_path

    shutil.rmtree(data.directory / "pairs", ignore_errors=True)
    started, builds = threading.Event(), []

    def progress(line: str) -> None:
        if line.startswith("data: building pairs"):
            builds.append(line)
            started.set()
            time.sleep(1.0)  # the other writer asks while this one builds

    paths, errors = [], []

    def build() -> None:
        try:
            paths.append(pair_table_path(data, list(BUILDERS), progress))
        except Exception as error:  # noqa: BLE001 - the test reports whatever a writer raised
            errors.append(error)

    first = threading.Thread(target=build)
    first.start()
    assert started.wait(timeout=120)
    second = threading.Thread(target=build)
    second.start()
    for writer in (first, second):
        writer.join(timeout=240)
    assert errors == [] and len(paths) == 2 and paths[0] == paths[1] and len(builds) == 1
    expected = builtin_pairs_table(build_pairs(data.corpus.read(split="train"), list(BUILDERS), split="train", seed=0))
    expected = expected.sort_by([("builder", "ascending"), ("pair_id", "ascending")])
    assert pq.read_table(paths[0]).equals(expected)
    # The table and its lock (a hidden file, kept), no staging copy left behind.
    assert sorted(p.name for p in paths[0].parent.iterdir() if not p.name.endswith(".lock")) == [paths[0].name]


def test_sweep_refuses_a_pair_budget_past_the_repetition_cap_before_any_trial(data):
    """A phase-2 arm whose schedule needs more pairs than the frozen table holds within
    `data.mixture.max_epochs` is refused before any trial starts, naming the study, the arm
    and the builder; the same study within the cap passes."""
    from embedlab.core.errors import UsageError
    from embedlab.pairs.table import pair_table_path
    from embedlab.sweep.gate import check_pair_schedules

    records = {arm: {**data.record, "directory": str(data.directory)} for arm in ("cold", "warm")}
    held = pq.read_table(pair_table_path(data, list(BUILDERS), **QUIET), columns=["builder"]).num_rows
    check_pair_schedules(phase2_study(), records, "/checkpoints/parent")  # 64 pairs: within the cap
    study = phase2_study()
    over = dataclasses.replace(study, budget=dataclasses.replace(study.budget, pairs=held * 4 + 1))
    with pytest.raises(UsageError, match=r"study gate, arm cold: .*'title-body' holds .*repetition cap"):
        check_pair_schedules(over, records, "/checkpoints/parent")


def test_phase3_refuses_a_final_eval_document_planted_in_its_teacher_labels(data, tmp_path):
    """A distilling phase-3 run scores its pairs with the teacher, then refuses to train when
    the scored texts hold a test document: the set it finds (the one it would score) passes
    the gate clean and, with the document planted, `run_contrastive` raises before any Ray
    Train run starts."""
    from embedlab.teacher.audit import check_teacher_labels
    from embedlab.teacher.labels import LABELS_FILE
    from embedlab.teacher.phase3 import teacher_labels_for_phase3
    from embedlab.train.contrastive import run_contrastive

    trial, pairs_path, schedule, offsets, mined = phase3_setup(data, tmp_path, teacher="all-MiniLM-L6-v2",
                                                               kl_weight=0.5)
    labels = teacher_labels_for_phase3(trial, data, pairs_path, schedule, offsets, mined=mined, given=None, **QUIET)
    task_dir = data.task_dir(TASK)
    assert check_teacher_labels(data, task_dir, labels, None, **QUIET) == []

    _, _, doc_id, body = final_eval_items(data)
    table = pq.read_table(labels / LABELS_FILE)
    texts = table["text"].to_pylist()
    planted = table["pair_id"][1].as_py(), table["doc_id"][1].as_py()  # the first pair's first negative
    texts[1] = body
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)),
                   labels / LABELS_FILE)

    storage = tmp_path / "train"
    with pytest.raises(ContaminationError, match="stages teacher-labels") as refused:
        run_contrastive(trial, data, storage_path=storage, name="planted", **QUIET)
    assert f"{labels.name}:{planted[0]}:{planted[1]}" in str(refused.value) and doc_id in str(refused.value)
    assert not storage.exists()  # refused before the trainer started
    allowed = check_teacher_labels(data, task_dir, labels, "disclosed: one planted text", **QUIET)
    assert [(f["item_id"], f["match"]) for f in allowed] == [(doc_id, "exact")]


def test_embedding_distillation_refuses_a_final_eval_document_planted_in_its_teacher_documents(data, tmp_path):
    """A trial with `embedding_mse_weight` gives each scheduled pair a training-split document
    and encodes it with the real teacher: the set is reproducible (reused, and the teacher's
    projected vector of a stored text is its stored target), the stream carries each row's
    document and target, the set passes the gate clean, and with a test document planted in
    it `run_contrastive` raises before any Ray Train run starts."""
    from embedlab.teacher.audit import check_teacher_embeddings
    from embedlab.streams.pair_stream import pair_windows, tokenize_pair_window
    from embedlab.tasks.baselines import load_minilm
    from embedlab.teacher import embeddings as te
    from embedlab.teacher.phase3 import teacher_embeddings_for_trial
    from embedlab.train.contrastive import run_contrastive

    trial, pairs_path, schedule, offsets, _ = phase3_setup(data, tmp_path, teacher="all-MiniLM-L6-v2",
                                                           embedding_mse_weight=0.5)
    documents = teacher_embeddings_for_trial(trial, data, pairs_path, schedule, offsets, **QUIET)
    assert teacher_embeddings_for_trial(trial, data, pairs_path, schedule, offsets, **QUIET) == documents
    table = pq.read_table(documents / te.EMBEDDINGS_FILE)
    train_ids = set(data.corpus.read(split="train")["doc_id"].to_pylist())
    assert set(table["doc_id"].to_pylist()) <= train_ids and table.num_rows == len(set(table["doc_id"].to_pylist()))
    texts = table["text"].to_pylist()[:3]
    again = te.project(load_minilm().encode(texts), trial.model.width)
    stored = np.stack(table["target"].to_pylist()[:3])
    np.testing.assert_allclose(again, stored, atol=1e-5)

    window = {key: [value] for key, value in pair_windows(schedule, offsets)[0].items()}  # a batch of one window
    row = tokenize_pair_window(window, pairs_path=str(pairs_path), tokenizer_path=str(data.tokenizer_path),
                               length=32, query_prefix="", passage_prefix="passage: ", negatives_path=None,
                               negatives_per_pair=0, teacher_embeddings_path=str(documents / te.EMBEDDINGS_FILE))
    first = pq.read_table(pairs_path).take(pa.array(np.asarray(window["rows"][0][:1], dtype=np.int64)))
    at = table["pair_id"].to_pylist().index(first["pair_id"][0].as_py())
    tokens = data.tokenizer.encode_batch(["passage: " + table["text"][at].as_py()])[0]
    assert len(tokens) <= 30 and list(row["distill_ids"][0][:len(tokens) + 2]) == [
        data.tokenizer.cls_id, *tokens, data.tokenizer.sep_id]
    np.testing.assert_array_equal(row["teacher_embedding"][0], np.asarray(table["target"][at].as_py(), dtype=np.float32))

    task_dir = data.task_dir(TASK)
    assert check_teacher_embeddings(data, task_dir, documents, None, **QUIET) == []
    _, _, doc_id, body = final_eval_items(data)
    planted = table["pair_id"][1].as_py(), table["doc_id"][1].as_py()
    all_texts = table["text"].to_pylist()
    all_texts[1] = body
    pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(all_texts)),
                   documents / te.EMBEDDINGS_FILE)
    storage = tmp_path / "train"
    with pytest.raises(ContaminationError, match="stages teacher-labels") as refused:
        run_contrastive(trial, data, storage_path=storage, name="planted", **QUIET)
    assert f"{documents.name}:{planted[0]}:{planted[1]}" in str(refused.value) and doc_id in str(refused.value)
    assert not storage.exists()
