"""embedlab.tasks.hub_tasks and .panel: pinned Hub-layout tasks, frozen dev splits, task panels.

Every dataset here is a local directory in the Hub's layout, read through `datasets` with
the hub switched off; the text is real English: standard-library docstrings, whose first
line is a query and whose remaining lines are the document that answers it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import shutil
import textwrap
from pathlib import Path

import pytest

from embedlab.core.beir import Task, load_task, task_hash, write_task
from embedlab.tasks.baselines import evaluate_bm25
from embedlab.tasks.hub_tasks import (
    DEV_SPLIT,
    PROVENANCE_FILE,
    HubTask,
    HubTaskError,
    derive_dev_split,
    dev_query_ids,
    load_hub_task,
    local_dataset_revision,
    materialise_hub_task,
    resolve_revision,
)
from embedlab.evaluate.panel import (
    PanelError,
    PanelMetric,
    UnknownPanelMetric,
    panel_metric_names,
    resolve_study_metric,
    score_panel,
    split_scorer,
)

README = """\
---
configs:
- config_name: corpus
  data_files:
  - split: corpus
    path: corpus.jsonl
- config_name: queries
  data_files:
  - split: queries
    path: queries.jsonl
- config_name: default
  data_files:
{qrels}
---
# {name}

Standard-library docstrings: summary line as query, the rest as its document.
"""


def docstring_records(*modules) -> list[tuple[str, str, str]]:
    """(qualified name, summary line, rest) of each public object defined in `modules` with a body."""
    records = []
    for module in modules:
        for name, value in sorted(vars(module).items()):
            if name.startswith("_") or not callable(value) or getattr(value, "__module__", None) != module.__name__:
                continue
            doc = inspect.getdoc(value) or ""
            summary, _, rest = doc.partition("\n")
            if summary.strip() and len(rest.strip()) > 40:
                records.append((f"{module.__name__}.{name}", summary.strip(), rest.strip()))
    return records


def docstring_task(name: str, records: list[tuple[str, str, str]], *, test_every: int = 3) -> Task:
    """Every `test_every`-th query in test, the others in train; each query's one relevant document is
    its own docstring's body, the document before it is judged 0 (a graded, not only positive, qrel)."""
    corpus = {doc_id: (doc_id.rpartition(".")[2], body) for doc_id, _, body in records}
    queries = {f"q:{doc_id}": summary for doc_id, summary, _ in records}
    qrels: dict[str, dict[str, dict[str, int]]] = {"train": {}, "test": {}}
    for number, (doc_id, _, _) in enumerate(records):
        judged = {doc_id: 1}
        if number:
            judged[records[number - 1][0]] = 0
        qrels["test" if number % test_every == 0 else "train"][f"q:{doc_id}"] = judged
    return Task(name=name, corpus=corpus, queries=queries, qrels=qrels)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def qrels_rows(judged: dict[str, dict[str, int]]) -> list[dict]:
    return [{"query-id": q, "corpus-id": d, "score": g} for q, docs in judged.items() for d, g in docs.items()]


def write_hub_directory(root: Path, task: Task, *, qrels: bool = True) -> Path:
    """`task` in MTEB's layout, all JSON lines: configs corpus, queries and (with `qrels`) default."""
    write_jsonl(root / "corpus.jsonl", [{"_id": d, "title": t, "text": x} for d, (t, x) in task.corpus.items()])
    write_jsonl(root / "queries.jsonl", [{"_id": q, "text": x} for q, x in task.queries.items()])
    entries = []
    if qrels:
        for split, judged in task.qrels.items():
            write_jsonl(root / "qrels" / f"{split}.jsonl", qrels_rows(judged))
            entries.append(f"  - split: {split}\n    path: qrels/{split}.jsonl")
    readme = README.format(name=task.name, qrels="\n".join(entries))
    if not qrels:  # the configs block without the qrels config
        readme = readme.replace("- config_name: default\n  data_files:\n\n", "")
    (root / "README.md").write_text(readme, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def shell_task() -> Task:
    return docstring_task("shell-utils", docstring_records(shutil, textwrap))


def hub_spec(root: Path, name: str = "shell-utils", **fields) -> HubTask:
    return HubTask(name=name, dataset=str(root), revision=local_dataset_revision(root), **fields)


# ---------------------------------------------------------------------------------------------
# Loading and materialising


def test_hub_directory_materialises_the_same_task_as_a_direct_beir_write(tmp_path, offline_hub, shell_task):
    """Loaded through datasets by revision, the task hashes like the BEIR folder written directly from
    the same records, and its provenance matches what was read and written."""
    hub = write_hub_directory(tmp_path / "hub", shell_task)
    direct = tmp_path / "direct" / "shell-utils"
    write_task(shell_task, direct)

    result = materialise_hub_task(hub_spec(hub), tmp_path / "cache")

    assert result.task == load_task(direct)
    assert result.task.hash == task_hash(shell_task.corpus, shell_task.queries, shell_task.qrels)
    assert result.task.name == "shell-utils" and result.directory.name == "shell-utils"
    record = result.provenance
    assert record["revision"] == {"requested": local_dataset_revision(hub), "resolved": local_dataset_revision(hub)}
    assert record["configs"] == {"corpus": "corpus", "queries": "queries", "qrels": "default"}
    assert record["rows_read"] == {
        "corpus": {"split": "corpus", "rows": len(shell_task.corpus)},
        "queries": {"split": "queries", "rows": len(shell_task.queries)},
        "qrels": {split: sum(map(len, judged.values())) for split, judged in shell_task.qrels.items()},
    }
    assert record["task_hash"] == result.task.hash
    written = {entry["path"]: entry["sha256"] for entry in record["files"]}
    assert written == {
        path: hashlib.sha256((direct / path).read_bytes()).hexdigest()
        for path in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "qrels/train.tsv")
    }


def test_materialised_folder_is_reused_and_checked(tmp_path, offline_hub, shell_task):
    """A second load reuses the folder untouched; an edited dataset no longer matches its pin, and an
    edited cache folder is refused."""
    hub = write_hub_directory(tmp_path / "hub", shell_task)
    spec = hub_spec(hub)
    first = materialise_hub_task(spec, tmp_path / "cache")
    written_at = (first.directory / PROVENANCE_FILE).stat().st_mtime_ns

    again = materialise_hub_task(spec, tmp_path / "cache")

    assert again.directory == first.directory and again.task == first.task
    assert (first.directory / PROVENANCE_FILE).stat().st_mtime_ns == written_at
    assert load_hub_task(spec, tmp_path / "cache") == first.task

    with (first.directory / "queries.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps({"_id": "extra", "text": "An unjudged query."}) + "\n")
    with pytest.raises(HubTaskError, match="folder was modified"):
        materialise_hub_task(spec, tmp_path / "cache")

    with (hub / "README.md").open("a", encoding="utf-8") as out:
        out.write("\nEdited.\n")
    with pytest.raises(HubTaskError, match=f"content is now {local_dataset_revision(hub)}"):
        materialise_hub_task(spec, tmp_path / "cache")


def test_separate_tsv_qrels_directory_keeps_leading_zero_ids(tmp_path, offline_hub, shell_task):
    """Qrels in their own directory as TSV files (splits named by file, no README): read as strings,
    so the id "0007" is not turned into 7; that directory is pinned by its own revision."""
    numbered = {doc_id: f"{n:04d}" for n, doc_id in enumerate(sorted(shell_task.corpus))}
    task = Task(
        name="shell-utils",
        corpus={numbered[d]: v for d, v in shell_task.corpus.items()},
        queries={f"q{numbered[q[2:]]}": v for q, v in shell_task.queries.items()},
        qrels={split: {f"q{numbered[q[2:]]}": {numbered[d]: g for d, g in docs.items()} for q, docs in judged.items()}
               for split, judged in shell_task.qrels.items()},
    )
    hub = write_hub_directory(tmp_path / "hub", task, qrels=False)
    qrels = tmp_path / "hub-qrels"
    qrels.mkdir()
    for split, judged in task.qrels.items():
        lines = [f"{r['query-id']}\t{r['corpus-id']}\t{r['score']}\n" for r in qrels_rows(judged)]
        (qrels / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(lines), encoding="utf-8")

    spec = hub_spec(hub, qrels_dataset=str(qrels), qrels_revision=local_dataset_revision(qrels))
    loaded = load_hub_task(spec, tmp_path / "cache")

    assert loaded.hash == task.hash
    assert "0007" in loaded.corpus and loaded.qrels["test"]["q0000"] == {"0000": 1}
    with pytest.raises(HubTaskError, match="needs a qrels_revision"):
        hub_spec(hub, qrels_dataset=str(qrels))


def test_revision_is_required_and_errors_name_the_fix(tmp_path, offline_hub, shell_task):
    """No revision, a wrong local pin, a directory without a configs block: each raises a clear error."""
    hub = write_hub_directory(tmp_path / "hub", shell_task)
    for missing in ("", "  ", None):
        with pytest.raises(HubTaskError, match="needs a revision .* could change between runs"):
            HubTask(name="t", dataset=str(hub), revision=missing)
    with pytest.raises(HubTaskError, match=f"does not match the directory, whose content is now {local_dataset_revision(hub)}"):
        materialise_hub_task(HubTask(name="t", dataset=str(hub), revision="v1"), tmp_path / "cache")
    with pytest.raises(HubTaskError, match="include 'test'"):
        hub_spec(hub, splits=("train",))

    (hub / "README.md").write_text("# no configs block\n", encoding="utf-8")
    with pytest.raises(HubTaskError, match="BuilderConfig 'corpus' not found.*`configs:` block"):
        materialise_hub_task(hub_spec(hub), tmp_path / "cache")

    sha = "0123456789abcdef0123456789abcdef01234567"
    assert resolve_revision("mteb/scifact", sha) == sha  # a full commit sha needs no lookup


# ---------------------------------------------------------------------------------------------
# A derived dev split


def test_derived_dev_split_is_deterministic_disjoint_and_exact(shell_task):
    """The same call gives the same split; dev and train partition the old train queries, judgements
    and all; dev holds floor(fraction * n + 0.5) queries, those with the smallest seeded hash."""
    train = shell_task.qrels["train"]
    derived, record = derive_dev_split(shell_task, 0.25, seed=7)
    again, record_again = derive_dev_split(dataclasses.replace(shell_task, name="renamed"), 0.25, seed=7)

    dev_ids, train_ids = set(derived.qrels[DEV_SPLIT]), set(derived.qrels["train"])
    assert record == record_again and again.qrels == derived.qrels
    assert not dev_ids & train_ids and dev_ids | train_ids == set(train)
    assert len(dev_ids) == math.floor(0.25 * len(train) + 0.5)
    ranked = sorted(train, key=lambda q: (hashlib.sha256(f"7:{q}".encode()).digest(), q))
    assert dev_ids == set(ranked[: len(dev_ids)])
    assert record.query_ids == tuple(sorted(dev_ids)) and record.origin == "derived"
    assert {q: derived.qrels[DEV_SPLIT][q] for q in dev_ids} == {q: train[q] for q in dev_ids}
    assert derived.qrels["test"] == shell_task.qrels["test"]
    assert dev_query_ids(list(reversed(sorted(train))), 0.25, 7) == record.query_ids
    assert derive_dev_split(shell_task, 0.25, seed=8)[1].query_ids != record.query_ids


def test_dev_split_keeps_a_dataset_dev_and_refuses_without_train(shell_task):
    """A task with its own dev split is returned unchanged; one with neither dev nor train is refused,
    and so is a fraction that would leave dev or train empty."""
    own_dev = dataclasses.replace(shell_task, qrels={"dev": shell_task.qrels["train"], "test": shell_task.qrels["test"]})
    kept, record = derive_dev_split(own_dev, 0.25, seed=0)
    assert kept is own_dev and record.origin == "dataset" and record.query_ids == tuple(sorted(own_dev.qrels["dev"]))

    test_only = dataclasses.replace(shell_task, qrels={"test": shell_task.qrels["test"]})
    with pytest.raises(HubTaskError, match="neither 'dev' nor 'train'"):
        derive_dev_split(test_only, 0.25, seed=0)
    with pytest.raises(HubTaskError, match="both dev and train need at least one"):
        derive_dev_split(shell_task, 0.001, seed=0)
    with pytest.raises(HubTaskError, match="strictly between 0 and 1"):
        derive_dev_split(shell_task, 1.0, seed=0)


def test_materialised_dev_split_is_frozen_as_qrels_dev_tsv(tmp_path, offline_hub, shell_task):
    """HubTask.dev_fraction writes the derived split as qrels/dev.tsv and records which queries moved."""
    hub = write_hub_directory(tmp_path / "hub", shell_task)

    result = materialise_hub_task(hub_spec(hub, dev_fraction=0.25, dev_seed=3), tmp_path / "cache")

    expected, record = derive_dev_split(shell_task, 0.25, seed=3)
    assert (result.directory / "qrels" / "dev.tsv").is_file()
    assert result.task.hash == expected.hash
    assert result.provenance["dev_split"] == record.as_dict()
    assert result.provenance["dev_split"]["query_ids"] == sorted(expected.qrels[DEV_SPLIT])
    assert load_task(result.directory, splits=["dev"]).qrels["dev"] == expected.qrels[DEV_SPLIT]


# ---------------------------------------------------------------------------------------------
# Panels


@pytest.fixture(scope="module")
def panel_tasks(shell_task) -> list[Task]:
    data = docstring_task("data-formats", docstring_records(json, inspect))
    return [derive_dev_split(task, 0.3, seed=0)[0] for task in (shell_task, data)]


def test_panel_per_task_metrics_equal_single_runs_and_mean_is_unweighted(panel_tasks):
    """Each task's panel columns are its single-task BM25 scores; the mean is the plain mean of two."""
    score_one = split_scorer(evaluate_bm25, "dev")
    single = {task.name: score_one(task) for task in panel_tasks}

    panel = score_panel(score_one, panel_tasks, ["dev/ndcg@10", "dev/recall@100"])

    expected = {f"{name}/{key}": value for name, scores in single.items() for key, value in scores.items()}
    first, second = (single[task.name]["dev/ndcg@10"] for task in panel_tasks)
    assert first != second  # a mean of equal numbers would not test the averaging
    assert {k: v for k, v in panel.items() if not k.startswith("mean/")} == expected
    assert panel["mean/dev/ndcg@10"] == (first + second) / 2
    sizes = [single[task.name]["dev/queries"] for task in panel_tasks]
    assert sizes[0] != sizes[1]  # so the unweighted mean differs from the per-query one
    assert panel["mean/dev/ndcg@10"] != (sizes[0] * first + sizes[1] * second) / (sizes[0] + sizes[1])
    recall = [single[task.name]["dev/recall@100"] for task in panel_tasks]
    assert panel["mean/dev/recall@100"] == (recall[0] + recall[1]) / 2
    assert set(single["shell-utils"]) >= {"dev/ndcg@10", "dev/mrr@10", "dev/map", "dev/queries", "dev/docs"}


def test_panel_refuses_ambiguous_names_and_missing_metrics(panel_tasks):
    """Task names must prefix columns one way only; a metric a task did not report is named."""
    score_one = split_scorer(evaluate_bm25, "dev")
    with pytest.raises(PanelError, match="repeat"):
        score_panel(score_one, [panel_tasks[0], panel_tasks[0]], "dev/ndcg@10")
    for bad in ("mean", "a/b"):
        with pytest.raises(PanelError, match="cannot name panel columns"):
            score_panel(score_one, [dataclasses.replace(panel_tasks[0], name=bad)], "dev/ndcg@10")
    with pytest.raises(PanelError, match="reported no number 'test/ndcg@10'; it reported: dev/docs"):
        score_panel(score_one, panel_tasks, "test/ndcg@10")


def test_study_metric_resolves_task_and_mean_names():
    """`<task>/dev/ndcg@10` and `mean/dev/ndcg@10` resolve; anything else lists every valid name."""
    tasks = ["shell-utils", "data-formats"]
    assert resolve_study_metric("mean/dev/ndcg@10", tasks) == PanelMetric(task=None, metric="dev/ndcg@10")
    resolved = resolve_study_metric("data-formats/dev/recall@100", tasks)
    assert resolved == PanelMetric(task="data-formats", metric="dev/recall@100")
    assert resolved.key == "data-formats/dev/recall@100"
    valid = panel_metric_names(tasks)
    assert valid[0] == "mean/dev/ndcg@10" and "shell-utils/dev/map" in valid and len(valid) == 12
    for wrong in ("dev/ndcg@10", "scifact/dev/ndcg@10", "mean/test/ndcg@10"):
        with pytest.raises(UnknownPanelMetric, match=f"{wrong!r} is not a metric.*valid names: mean/dev/ndcg@10, "):
            resolve_study_metric(wrong, tasks)
