"""`embedlab data build/audit`, `tokenizer compare`, `bench data`, and the contamination gate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from embedlab.cli import main
from embedlab.core.beir import Task, write_task
from embedlab.core.config import DataConfig, MixtureConfig
from embedlab.sources.builtin import iter_documents
from embedlab.sources.external import LocalFiles
from embedlab.tasks.builtin_tasks import split_docstring

from conftest import TEST_DATA, tiny_trial

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def spec(tmp_path_factory, prepared) -> Path:
    path = tmp_path_factory.mktemp("spec") / "data.json"
    path.write_text(json.dumps(dataclasses.asdict(TEST_DATA)))
    return path


def test_data_build_reuses_the_prepared_directory(spec, prepared, capsys):
    """`data build` on a JSON spec equal to the test config finds the same prepared data and its
    card; the record names the code revision it was prepared with."""
    from embedlab.prepared.build import build_code_revision

    assert main(["data", "build", str(spec)]) == 0
    out = capsys.readouterr().out
    assert str(prepared.directory) in out and "data_card.md" in out
    assert prepared.record["code_revision"] == build_code_revision()


def test_prepare_key_follows_the_code_that_builds_the_data(tmp_path):
    """The cache key holds a hash of the preparation code (`BUILD_SOURCES`): a byte-equal copy of
    those files elsewhere gives the same key, and one changed byte in one of them another; the
    key is otherwise stable from call to call."""
    from embedlab.core.code_identity import PACKAGE_DIR, code_revision
    from embedlab.prepared.build import BUILD_SOURCES, build_code_revision, prepare_key

    copy = tmp_path / "embedlab"
    for name in BUILD_SOURCES:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_bytes((PACKAGE_DIR / name).read_bytes())
    assert code_revision(BUILD_SOURCES, copy) == code_revision(BUILD_SOURCES) == build_code_revision()
    assert prepare_key(TEST_DATA) == prepare_key(TEST_DATA) == prepare_key(TEST_DATA, code=code_revision(BUILD_SOURCES, copy))
    assert {"prepared/build.py", "sources/corpus.py", "streams/packed.py", "tokenizer/frozen.py"} <= set(BUILD_SOURCES)
    stream = copy / "streams" / "packed.py"
    stream.write_bytes(stream.read_bytes().replace(b"def ", b"def  ", 1))
    changed = code_revision(BUILD_SOURCES, copy)
    assert changed != code_revision(BUILD_SOURCES)
    assert prepare_key(TEST_DATA, code=changed) != prepare_key(TEST_DATA)
    stream.unlink()
    with pytest.raises(FileNotFoundError, match="streams/packed.py"):
        code_revision(BUILD_SOURCES, copy)


def test_preparing_data_prints_no_ray_log_line(tmp_path, ray_session, capfd):
    """Preparing data through the real path (corpus, tokenizer, pieces on Ray Data) prints
    embedlab's progress lines and none of Ray Data's own (its execution plan, the progress it
    logs at INFO), which stay in Ray's log files."""
    import re

    from embedlab.prepared.build import prepare_data

    small = DataConfig(sources=("python-docs",), tokenizer_vocab_size=256, sequence_length=32)
    prepare_data(small, cache_dir=tmp_path)
    out, err = capfd.readouterr()
    assert "data: tokenising training documents into pieces on Ray Data" in out and "data: prepared in" in out
    ray_lines = [line for line in (out + err).splitlines()
                 if re.search(r"\b(INFO|WARNING)\b \w+\.py:\d+ --|MapBatches|streaming_executor", line)]
    assert not ray_lines, ray_lines


def test_data_audit_covers_every_stage(spec, capsys):
    """`data audit --json` checks pretraining, tokenizer sample, contrastive pairs, mined negatives
    and teacher labels (none saved with this data yet)."""
    assert main(["data", "audit", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    stages = report["checked"]["stages"]
    assert set(stages) == {"pretraining", "tokenizer-sample", "contrastive-pairs", "mined-negatives", "teacher-labels"}
    assert stages["pretraining"] > 0 and stages["contrastive-pairs"] > 0 and stages["mined-negatives"] == 0
    assert stages["teacher-labels"] == 0
    # Every builder's pairs are audited and hold no final-eval item. The one the earlier splits
    # let through (email.parser.BytesParser.__init__, a near-duplicate of the lead-rest positive
    # of Parser.__init__) is gone: the docstrings of one module share a split group, so the two
    # are never on both sides of the split.
    final = [(f["item_id"], f["stage"], f["stage_item_id"], f["match"]) for f in report["findings"]
             if f["split"] == "test"]
    assert final == []


def test_tokenizer_compare_reports_three_kinds(spec, capsys):
    """`tokenizer compare --json` trains BPE, unigram and byte-level and reports each on held-out sources."""
    assert main(["tokenizer", "compare", str(spec), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["kind"] for r in rows] == ["bpe", "unigram", "byte-level"]
    assert all(r["tokens_per_second"] > 0 and 0 <= r["truncation_rate"] <= 1 for r in rows)


def test_bench_data_measures_both_sides(spec, capsys):
    """`bench data --json` reports the Ray Data pipeline and raw encode_batch from the same run, with their ratio."""
    assert main(["bench", "data", str(spec), "--documents", "300", "--repeats", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    comparison = result["comparisons"][0]
    assert comparison["embedlab"] > 0 and comparison["reference"] > 0
    assert comparison["ratio"] == pytest.approx(comparison["embedlab"] / comparison["reference"])
    # Medians of the interleaved passes, each pass kept; both sides counted the same documents.
    assert all(len(comparison["runs"][side]) == 2 for side in ("embedlab", "reference"))
    assert comparison["embedlab"] == pytest.approx(float(np.median(comparison["runs"]["embedlab"])))
    assert result["documents"] == 300 and result["tokens"]["embedlab"] == result["tokens"]["reference"] + 300


def test_bench_prefetch_trains_both_sides_on_the_same_stream(spec, prepared, capsys):
    """`bench prefetch --json`: the phase-1 loop on its Ray Data stream with the iterator's
    prefetch and without, each pass consuming the same tokens, plus the stream's own rate and
    its rate per worker at 1, 2 and 4 workers, split and whole (the bench fails unless both
    deliver the same tokens in all), and each worker's packing split and whole (the bench fails
    if the split packs a token the whole stream does not); and the session the bench reads through delivers rows in
    order whatever the prefetch depth (Ray Data alone may reorder blocks; Ray Train's ingest is
    set to preserve order)."""
    import ray.data
    import torch

    from embedlab.train.session import DatasetSession, PREFETCH_BATCHES

    assert main(["bench", "prefetch", str(spec), "--budget-tokens", "3000", "--preset", "tiny",
                 "--repeats", "1", "--packing-tokens", "20000", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    per_worker = {f"data: tokens/s per worker, {n} workers" for n in (1, 2, 4)}
    packing = {f"data: packing per worker, {n} workers" for n in (1, 2, 4)}
    assert set(rows) == {"opt: data prefetch", "data: wait share of training", "data: stream vs training tokens/s",
                         *per_worker, *packing}
    assert all(rows[name]["embedlab"] > 0 and rows[name]["reference"] > 0 for name in per_worker | packing)
    assert all(rows[name]["unit"] == "ms" and rows[name]["better"] == "lower" for name in packing)
    rates, wait, stream = rows["opt: data prefetch"], rows["data: wait share of training"], rows[
        "data: stream vs training tokens/s"]
    assert min(rates["embedlab"], rates["reference"], stream["embedlab"]) > 0
    assert 0 <= wait["embedlab"] <= 100 and 0 <= wait["reference"] <= 100 and wait["unit"] == "%"
    assert stream["reference"] == rates["embedlab"]  # the loop's consumption, against the stream's delivery
    assert f"prefetching {PREFETCH_BATCHES} batch" in rates["embedlab_measures"]
    assert len(rates["runs"]["embedlab"]) == len(rates["runs"]["reference"]) == 1
    seen = []
    for prefetch in (0, PREFETCH_BATCHES, 3):
        dataset = ray.data.from_items([{"x": i} for i in range(23)]).map_batches(lambda b: b, batch_size=4)
        batches = list(DatasetSession(dataset, prefetch).worker_batches(5))
        assert all(b["x"].dtype == torch.long for b in batches)
        seen.append([b["x"].tolist() for b in batches])
    assert seen[0] == seen[1] == seen[2] == [list(range(i, i + 5)) for i in range(0, 20, 5)]


def leaked_setup(tmp_path: Path) -> tuple[Path, DataConfig, Task]:
    """A BEIR task from real docstrings, and training data that holds one test query verbatim
    inside a longer text and one test document with two words changed."""
    docstrings = []
    for doc in iter_documents("python-docstrings"):
        parts = split_docstring(doc.text)
        if parts and len(parts[0].split()) >= 8 and len(parts[1].split()) >= 120:
            docstrings.append((doc.doc_id, doc.title, *parts))
        if len(docstrings) == 6:
            break
    task = Task(
        name="leaky",
        corpus={d: (t, body) for d, t, _, body in docstrings},
        queries={f"q{i}": summary for i, (_, _, summary, _) in enumerate(docstrings)},
        qrels={"test": {f"q{i}": {d: 1} for i, (d, _, _, _) in enumerate(docstrings)}},
    )
    task_dir = tmp_path / "leaky-task"
    write_task(task, task_dir)
    near_copy = docstrings[1][3].split()
    near_copy[10], near_copy[50] = "changed", "words"
    leak = tmp_path / "leak.jsonl"
    leak.write_text("\n".join(json.dumps(r) for r in [
        {"id": "quote", "text": f"As the manual puts it: {docstrings[0][2]} That is all it says."},
        {"id": "copy", "text": " ".join(near_copy)},
    ]) + "\n")
    config = DataConfig(
        sources=("python-docs",),
        local_files=(LocalFiles(name="leak", path=str(leak)),),
        mixture=MixtureConfig(shares=(("python-docs", 0.5), ("leak", 0.5)), max_epochs=1000),
        tokenizer_vocab_size=512,
        sequence_length=64,
        dev_fraction=0.001,
        test_fraction=0.001,
    )
    return task_dir, config, task


def test_training_refuses_final_eval_items_unless_disclosed(tmp_path, ray_session, capsys):
    """A sweep whose training data holds a test query and a near-copy of a test document is refused
    before any trial runs; with a disclosed-overlap policy the same data passes the gate."""
    from embedlab.pairs.audit import check_training_data
    from embedlab.prepared.build import prepare_data

    task_dir, config, _ = leaked_setup(tmp_path)
    base = dataclasses.replace(tiny_trial(), data=config)
    base = dataclasses.replace(base, eval=dataclasses.replace(base.eval, task=str(task_dir), split="test"),
                               model=dataclasses.replace(base.model, vocab_size=512))
    study = tmp_path / "leaky_study.py"
    study.write_text(
        "from dataclasses import replace\n"
        "from embedlab import Study\nfrom embedlab.core.config import DEFAULT_BUDGET, TrialConfig\n"
        f"base = TrialConfig.from_dict({base.to_dict()!r})\n"
        "def study():\n"
        "    return Study(name='leaky', factor='masking.ratio', seeds=(0,),\n"
        "                 budget=replace(DEFAULT_BUDGET, tokens=10_000),\n"
        "                 arms={'a': base, 'b': replace(base, masking=replace(base.masking, ratio=0.3))},\n"
        "                 final_report=True)\n"  # its task has only a test split
    )
    assert main(["sweep", str(study), "--storage", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "final-eval" in err and "training refused" in err
    assert not (tmp_path / "runs").exists()
    prepared = prepare_data(config, progress=lambda m: None)
    findings = check_training_data(prepared, task_dir, "overlap disclosed: leak.jsonl quotes the manual",
                                   progress=lambda m: None)
    matches = {(f["item_kind"], f["match"]) for f in findings}
    assert ("query", "contained") in matches and ("document", "near") in matches
    assert {f["stage"] for f in findings} == {"pretraining", "tokenizer-sample"}
