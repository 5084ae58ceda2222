"""Contamination audit (embedlab.contamination.audit) on a small in-memory task made of real docstrings."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from embedlab.contamination import audit as audit_module
from embedlab.contamination.audit import ContaminationError, audit, enforce
from embedlab.core.beir import Task
from embedlab.sources.builtin import iter_documents
from embedlab.sources.dedup import shingle_words
from embedlab.tasks.builtin_tasks import split_docstring

STAGES = ("pretraining", "tokenizer-sample", "contrastive-pairs", "mined-negatives")
TASK = "docstrings-mini"


@dataclass(frozen=True)
class Setup:
    task: Task
    test_queries: list[str]  # query ids, one planted per stage
    test_documents: list[str]  # doc ids, one planted per stage
    dev_queries: list[str]
    distractor: str  # an unlabelled corpus doc id
    background: list[str]  # docstrings sharing no shingle with the task


def shingles(text: str) -> set[tuple[str, ...]]:
    words = shingle_words(text)
    return {tuple(words[i : i + 5]) for i in range(max(len(words) - 4, 1))}


def change_words(text: str, count: int) -> str:
    words = text.split()
    for k in range(count):
        words[len(words) * (k + 1) // (count + 1)] = f"changed{k}"
    return " ".join(words)


@pytest.fixture(scope="module")
def setup() -> Setup:
    docs = list(iter_documents("python-docstrings", limit=2000))
    # Docstrings with a long summary (a query "contained" needs >= 8 words) and a long body
    # (so 1-2 changed words keep the Jaccard well above 0.8), sharing no shingle with each
    # other: then every finding below is one we planted.
    chosen: list[tuple[str, str, str, str]] = []
    seen: set[tuple[str, ...]] = set()
    for doc in docs:
        parts = split_docstring(doc.text)
        if parts is None or len(parts[0].split()) < 8 or len(parts[1].split()) < 150:
            continue
        own = shingles(parts[0]) | shingles(parts[1])
        if not own & seen and len(chosen) < 17:
            chosen.append((doc.doc_id, doc.title, *parts))
            seen |= own
    assert len(chosen) == 17
    corpus = {doc_id: (title, body) for doc_id, title, _, body in chosen}
    queries = {f"q:{doc_id}": summary for doc_id, _, summary, _ in chosen}
    test, dev, distractor = chosen[:8], chosen[8:16], chosen[16]
    qrels = {
        "test": {f"q:{d}": {d: 1} for d, *_ in test},
        "dev": {f"q:{d}": {d: 1} for d, *_ in dev},
    }
    del queries[f"q:{distractor[0]}"]
    task = Task(name=TASK, corpus=corpus, queries=queries, qrels=qrels)
    background = [d.text for d in docs if d.text.strip() and not shingles(d.text) & seen][:200]
    return Setup(
        task=task,
        test_queries=[f"q:{d}" for d, *_ in test[:4]],
        test_documents=[d for d, *_ in test[4:8]],
        dev_queries=[f"q:{d}" for d, *_ in dev[:4]],
        distractor=distractor[0],
        background=background,
    )


def stage_items(setup: Setup, number: int, *, plants: bool = True) -> list[tuple[str, str]]:
    """Background text for stage `number`, plus (if `plants`) its three planted overlaps."""
    stage = STAGES[number] if plants else "clean"
    items = [(f"{stage}:bg{i}", text) for i, text in enumerate(setup.background[number::5])]
    if plants:
        task = setup.task
        dev_query = task.queries[setup.dev_queries[number]]
        near_copy = change_words(task.corpus[setup.test_documents[number]][1], 1 + number % 2)
        # Items 12-14 straddle the second and third chunks of 7 (CHUNK_ITEMS is patched).
        items[12:12] = [
            (f"{stage}:exact", f"  {task.queries[setup.test_queries[number]]}\n"),
            (f"{stage}:near", near_copy),
            (f"{stage}:contains", f'As the manual says: "{dev_query.upper()}" That is all.'),
        ]
    else:
        items.append(("clean:distractor", setup.task.doc_text(setup.distractor)))
    return items


@pytest.fixture(scope="module")
def report(setup):
    stages = {name: iter(stage_items(setup, k)) for k, name in enumerate(STAGES)}
    stages["clean"] = iter(stage_items(setup, 4, plants=False))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(audit_module, "CHUNK_ITEMS", 7)  # several chunks per stage
        messages: list[str] = []
        result = audit([setup.task], stages, progress=messages.append)
    assert len(messages) == 5 and all("findings" in m for m in messages)
    return result


def test_audit_finds_every_plant_and_nothing_else(setup, report):
    """Each stage's exact test query, near test document and contained dev query are found."""
    expected = set()
    for k, stage in enumerate(STAGES):
        expected |= {
            ("test", "query", setup.test_queries[k], stage, f"{stage}:exact", "exact"),
            ("test", "document", setup.test_documents[k], stage, f"{stage}:near", "near"),
            ("dev", "query", setup.dev_queries[k], stage, f"{stage}:contains", "contained"),
        }
    found = {
        (f.split, f.item_kind, f.item_id, f.stage, f.stage_item_id, f.match)
        for f in report.findings
    }
    assert found == expected
    assert all(f.task == TASK for f in report.findings)
    for f in report.findings:
        assert (f.similarity == 1.0) if f.match != "near" else (0.8 <= f.similarity < 1.0)


def test_counts_and_checked(setup, report):
    """Counts give one item per planted kind, zeros for the clean stage; checked sizes are right."""
    counts = report.counts[TASK]
    for stage in STAGES:
        assert counts["test"][stage] == {"exact": 1, "contained": 0, "near": 1, "shared-window": 0}
        assert counts["dev"][stage] == {"exact": 0, "contained": 1, "near": 0, "shared-window": 0}
    for split in ("test", "dev"):
        assert counts[split]["clean"] == {"exact": 0, "contained": 0, "near": 0, "shared-window": 0}
    assert report.checked["eval"][TASK] == {
        "test": {"query": 8, "document": 8}, "dev": {"query": 8, "document": 8}
    }
    sizes = {stage: len(stage_items(setup, k)) for k, stage in enumerate(STAGES)}
    assert report.checked["stages"] == {**sizes, "clean": len(stage_items(setup, 4, plants=False))}


def test_final_eval_findings_are_the_test_split(report):
    """final_eval_findings() keeps exactly the test-split findings."""
    final = report.final_eval_findings()
    assert len(final) == 8 and {f.split for f in final} == {"test"}


def test_enforce_refuses_test_contamination_without_policy(report):
    """enforce raises, naming counts and examples, unless a disclosed-overlap policy is given."""
    with pytest.raises(ContaminationError, match="8 final-eval") as error:
        enforce(report, None)
    assert "pretraining: 1 exact, 1 near" in str(error.value)
    with pytest.raises(ContaminationError):
        enforce(report, "   ")
    assert enforce(report, "disclosed: 4 test queries and 4 test documents overlap") is None


def test_dev_only_findings_do_not_raise(setup):
    """Contamination of the dev split alone passes enforce without a policy."""
    dev_query = setup.task.queries[setup.dev_queries[0]]
    report = audit(
        [setup.task], {"pretraining": [("p1", f"Intro. {dev_query} Outro.")]}, progress=None
    )
    assert [(f.split, f.match) for f in report.findings] == [("dev", "contained")]
    enforce(report, None)


def test_markdown_and_dict(report):
    """to_markdown shows the per-cell counts and examples; to_dict is JSON-serialisable."""
    text = report.to_markdown(examples_per_cell=1)
    assert "| split | stage | queries | documents | exact | contained | near | shared-window |\n" in text
    assert "| test | pretraining | 8 | 8 | 1 | 0 | 1 |" in text
    assert "| dev | mined-negatives | 8 | 8 | 0 | 1 | 0 |" in text
    assert "| test | clean | 8 | 8 | 0 | 0 | 0 |" in text
    assert "### docstrings-mini / test / pretraining (2 findings)" in text
    assert "pretraining:exact" in text or "pretraining:near" in text
    assert json.loads(json.dumps(report.to_dict()))["counts"] == report.counts


def test_containment_needs_four_words():
    """A 3-word query inside a stage text is not flagged (too common to mean a copy); a 9-word
    one is, whatever its quoting."""
    task = Task(
        name="mini",
        corpus={"d": ("", "An unrelated document about the weather in spring and autumn.")},
        queries={"short": "open a file", "long": "open a file for reading and return its handle"},
        qrels={"test": {"short": {"d": 1}, "long": {"d": 1}}},
    )
    stage = [
        ("s1", "You can open a file with the builtin."),
        ("s2", "Tip: (Open a FILE, for reading -- and return its handle!) easily."),
    ]
    report = audit([task], {"docs": stage}, progress=None)
    assert [(f.item_id, f.stage_item_id, f.match) for f in report.findings] == [
        ("long", "s2", "contained")
    ]


def test_empty_stage_and_no_findings(setup):
    """An empty stage is audited as zero items with zero counts, and enforce passes."""
    report = audit([setup.task], {"empty": []}, progress=None)
    assert report.findings == () and report.checked["stages"] == {"empty": 0}
    assert report.counts[TASK]["test"]["empty"] == {"exact": 0, "contained": 0, "near": 0, "shared-window": 0}
    enforce(report, None)
