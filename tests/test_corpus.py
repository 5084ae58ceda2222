"""The prepared corpus: provenance, dedup before split, group-aware splits, data card, stream."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from conftest import FIXTURES


def planted_rows() -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / "planted_docstrings.jsonl").read_text().splitlines()]


def test_no_near_duplicate_cluster_spans_two_splits(prepared):
    """Every group id maps to exactly one split."""
    table = prepared.corpus.read()
    splits_per_group: dict[str, set[str]] = {}
    for group, split in zip(table["group_id"].to_pylist(), table["split"].to_pylist()):
        splits_per_group.setdefault(group, set()).add(split)
    assert all(len(s) == 1 for s in splits_per_group.values())
    assert prepared.corpus.manifest["dedup"]["multi_document_clusters"] > 0


def test_split_groups_join_clusters_and_source_groups_transitively():
    """a and b come from one page, b and c are near-duplicates, d is alone, e and f share a
    module: three split groups, each named by its smallest id, as the connected components."""
    from embedlab.sources.corpus import split_groups
    from embedlab.sources.document import Document

    groups = {"a": "page1", "b": "page1", "c": "", "d": "", "e": "mod", "f": "mod"}
    docs = [Document(doc_id=d, source="s", title="", text=f"text {d}", group=g) for d, g in groups.items()]
    clusters = {"a": "a", "b": "b", "c": "b", "d": "d", "e": "e", "f": "f"}
    assert split_groups(docs, clusters) == {"a": "a", "b": "a", "c": "a", "d": "d", "e": "e", "f": "e"}


def test_the_docstrings_of_one_module_share_a_split(prepared):
    """Source groups reach the splits: every python-docstrings module (the reader's
    `Document.group`) lies in one split, and the corpus does have modules of several documents."""
    from embedlab.sources.builtin import iter_documents

    table = prepared.corpus.read()
    split_of = dict(zip(table["doc_id"].to_pylist(), table["split"].to_pylist()))
    splits_per_module: dict[str, set[str]] = {}
    for document in iter_documents("python-docstrings"):
        if document.doc_id in split_of:
            splits_per_module.setdefault(document.group, set()).add(split_of[document.doc_id])
    assert sum(1 for s in splits_per_module.values() if s) > 100
    assert all(len(s) == 1 for s in splits_per_module.values())
    assert len(set.union(*splits_per_module.values())) == 3
    assert prepared.corpus.manifest["split_groups"]["multi_document_split_groups"] > 100


def test_planted_near_duplicates_join_their_original_and_exact_copies_are_dropped(prepared):
    """Near-copies from another source share their original's group (hence split); exact copies are excluded and counted."""
    table = prepared.corpus.read().to_pydict()
    group = dict(zip(table["doc_id"], table["group_id"]))
    split = dict(zip(table["doc_id"], table["split"]))
    rows = [r for r in planted_rows() if r["original"] in group]
    near = [r for r in rows if r["id"].startswith("near-")]
    assert len(near) >= 4
    for row in near:
        planted_id = f"planted:{row['id']}"
        assert group[planted_id] == group[row["original"]]
        assert split[planted_id] == split[row["original"]]
    exact = [r for r in rows if r["id"].startswith("exact-")]
    assert all(f"planted:{r['id']}" not in group for r in exact)
    exclusions = prepared.corpus.manifest["exclusions"]
    assert {"source": "planted", "reason": "exact duplicate of an earlier document", "count": len(exact)} in exclusions


def test_provenance_records_every_source(prepared):
    """Each source records revision, acquisition, rights, language, domain and retained counts per split."""
    sources = prepared.corpus.manifest["sources"]
    assert set(sources) == {"python-docs", "python-docstrings", "planted"}
    for name, record in sources.items():
        assert record["revision"] and record["acquisition"] and record["rights"]
        assert set(record["retained"]) == {"train", "dev", "test"}
        assert sum(record["retained"].values()) <= record["documents_read"]
    assert sources["planted"]["acquisition"] == "local-files"
    assert sources["python-docs"]["rights"]["licenses"] == ["PSF-2.0"]
    assert len(prepared.corpus.hash) == 64


def test_data_card_and_frozen_manifests_are_written(prepared):
    """data_card.md/json, sources.parquet and the task's decontamination record exist and agree."""
    card = json.loads((prepared.directory / "data_card.json").read_text())
    assert card["corpus_hash"] == prepared.corpus.hash
    assert "## Exclusion report" in (prepared.directory / "data_card.md").read_text()
    assert pq.read_table(prepared.corpus.directory / "sources.parquet").num_rows == 3
    decontamination = json.loads((prepared.task_dir("python-docstrings") / "decontamination.json").read_text())
    assert set(decontamination["queries_kept"]) == {"dev", "test"}


def test_pieces_are_whole_documents_never_truncated(prepared):
    """Concatenating a document's pieces gives its full token sequence plus SEP."""
    pieces = pq.read_table(prepared.pieces_path)
    tokenizer = prepared.tokenizer
    corpus = prepared.corpus.read(split="train").to_pydict()
    text = {d: f"{t}\n{x}" if t else x for d, t, x in zip(corpus["doc_id"], corpus["title"], corpus["text"])}
    longest = pieces.filter(pc.greater(pieces["doc_tokens"], prepared.record["sequence_length"]))
    doc_id = longest["doc_id"][0].as_py()
    mine = pieces.filter(pc.equal(pieces["doc_id"], doc_id)).sort_by("piece")
    joined = [t for ids in mine["ids"].to_pylist() for t in ids]
    assert joined == tokenizer.encode_batch([text[doc_id]])[0] + [tokenizer.sep_id]
    stats = prepared.record["pieces"]["python-docs"]
    assert 0 < stats["truncation_frequency"] <= 1


def test_stream_is_deterministic_and_honours_shares(prepared, ray_session):
    """The packed Ray Data stream is the same for the same seed, and its tokens follow the mixture within 1 point."""
    from embedlab.streams.packed import packed_dataset
    from embedlab.train.phase1 import trial_schedule

    from conftest import tiny_budget, tiny_trial

    trial = tiny_trial(budget=tiny_budget(tokens=200_000))

    def rows():
        schedule, offsets = trial_schedule(trial, prepared)
        dataset = packed_dataset(prepared.pieces_path, schedule, offsets,
                                 sequence_length=trial.data.sequence_length, pad_id=prepared.tokenizer.pad_id,
                                 cls_id=prepared.tokenizer.cls_id)
        # In order, as training reads it (`launch.fit`): Ray Data's default yields blocks as they finish.
        dataset.context.execution_options.preserve_order = True
        batches = list(dataset.iter_batches(batch_size=None, batch_format="numpy"))
        return {k: np.concatenate([b[k] for b in batches]) for k in ("input_ids", "segment_ids", "source_index")}, schedule

    first, schedule = rows()
    second, _ = rows()
    for key in first:
        assert np.array_equal(first[key], second[key])
    tokens = first["segment_ids"] > 0
    assert int(tokens.sum()) >= 200_000
    intended = prepared.record["mixture"]["shares"]
    for index, name in enumerate(schedule.sources):
        observed = float((first["source_index"][tokens] == index).sum() / tokens.sum())
        assert abs(observed - intended[name]) < 0.01
    assert not (first["source_index"][~tokens] >= 0).any()
