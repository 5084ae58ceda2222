"""Tests for embedlab.pairs.builders: contrastive pair builders over real built-in text."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from embedlab.contamination.audit import containment_words
from embedlab.core.config.sources import BUILDER_NAMES
from embedlab.sources.builtin import SOURCE_NAMES, iter_documents, source_status
from embedlab.sources.corpus import SPLITS
from embedlab.pairs.builders import (
    LEAD_MAX_WORDS,
    LEAD_MIN_WORDS,
    MIN_BODY_WORDS,
    KEYWORD_CONFIDENCE,
    KEYWORD_MAX_DOCUMENT_SHARE,
    KEYWORD_OPENING_WORDS,
    PAIR_BUILDERS,
    SPAN_MAX_WORDS,
    SPAN_MIN_WORDS,
    Pair,
    build_pairs,
    pair_stats,
    pairs_to_table,
    span_offsets,
)

# Documents read per source: enough for every builder to find material, small enough to be fast.
SAMPLE = {
    "python-docs": 30,
    "python-docstrings": 80,
    "bible-kjv": 30,
    "fortunes": 60,
    "dict-foldoc": 300,
    "dict-jargon": 300,
    "debian-handbook": 60,
    "postgresql-doc-15": 80,
    "manpages-dev": 40,
    "mythes-en-us": 300,
}
# The sources each builder reads; it is tested where at least one of them is installed.
BUILDER_SOURCES = {
    "same-source-spans": tuple(name for name in SOURCE_NAMES if name != "mythes-en-us"),  # lists, not prose
    "title-body": ("python-docs", "python-docstrings", "debian-handbook", "postgresql-doc-15", "manpages-dev"),
    "term-definition": ("dict-foldoc", "dict-jargon"),
    "synonyms": ("mythes-en-us",),
    "lead-rest": ("python-docs", "python-docstrings", "debian-handbook", "postgresql-doc-15", "manpages-dev"),
    "keyword": tuple(name for name in SOURCE_NAMES if name != "mythes-en-us"),  # lists, not prose
}
AVAILABLE = [name for name, reason in source_status().items() if reason is None]


def require(name: str) -> None:
    """Skip the calling test when a source's package is not installed here."""
    reason = source_status()[name]
    if reason is not None:
        pytest.skip(reason)


CORPUS_SCHEMA = pa.schema([(column, pa.string()) for column in ("doc_id", "source", "title", "text", "hash", "split")])


def corpus_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """Real documents of every available source, spread over the three splits in turn."""
    return [
        {"doc_id": d.doc_id, "source": d.source, "title": d.title, "text": d.text, "hash": d.hash,
         "split": SPLITS[i % len(SPLITS)]}
        for name in AVAILABLE
        for i, d in enumerate(iter_documents(name, limit=SAMPLE[name]))
    ]


@pytest.fixture(scope="module")
def by_id(rows: list[dict]) -> dict[str, dict]:
    return {row["doc_id"]: row for row in rows}


def built(rows: list[dict], builder: str) -> list[Pair]:
    """Run one builder directly on rows of mixed splits."""
    return list(PAIR_BUILDERS[builder](rows))


def test_the_registry_holds_exactly_the_builder_names_config_checks_against() -> None:
    """`config` refuses user pair sources named like a builder from BUILDER_NAMES, a leaf module;
    the registry must hold exactly those names, in that order, or the check would miss one."""
    assert tuple(PAIR_BUILDERS) == BUILDER_NAMES


@pytest.mark.parametrize("builder", list(PAIR_BUILDERS))
def test_builder_pairs_are_valid_and_traceable(builder: str, rows: list[dict], by_id: dict[str, dict]) -> None:
    """Each builder yields non-empty, distinct texts with confidence in (0, 1], and source/split/doc ids of its row."""
    if not set(BUILDER_SOURCES[builder]) & set(AVAILABLE):
        pytest.skip(f"none of {BUILDER_SOURCES[builder]} is installed")
    pairs = built(rows, builder)
    assert pairs
    assert {p.source for p in pairs} <= set(BUILDER_SOURCES[builder])
    assert len({p.pair_id for p in pairs}) == len(pairs)
    for pair in pairs:
        assert pair.builder == builder and pair.pair_id.startswith(f"{builder}:")
        assert pair.query.strip() and pair.positive.strip() and pair.query != pair.positive
        assert 0.0 < pair.confidence <= 1.0
        assert len(pair.doc_ids) == 1 and pair.positive_group
        row = by_id[pair.doc_ids[0]]
        assert (pair.source, pair.split) == (row["source"], row["split"])


def test_confidence_ranks_weak_spans_below_curated_pairs(rows: list[dict]) -> None:
    """Same-document spans are weaker positives than title-body pairs."""
    spans, titles = built(rows, "same-source-spans"), built(rows, "title-body")
    assert max(p.confidence for p in spans) < min(p.confidence for p in titles)


def test_pairs_are_stable_across_runs_and_row_order(rows: list[dict]) -> None:
    """The same rows, even reordered, give the same pairs in the same order."""
    builders = list(PAIR_BUILDERS)
    first = build_pairs(corpus_table(rows), builders, split="train", seed=0)
    again = build_pairs(corpus_table(rows[::-1]), builders, split="train", seed=0)
    assert first and first == again


def test_build_pairs_never_mixes_splits(rows: list[dict], by_id: dict[str, dict]) -> None:
    """From a table whose rows lie in all three splits, each split's pairs use only that split's documents."""
    table = corpus_table(rows)
    assert set(table["split"].to_pylist()) == set(SPLITS)
    seen: set[str] = set()
    for split in SPLITS:
        pairs = build_pairs(table, list(PAIR_BUILDERS), split=split, seed=0)
        assert pairs
        assert all(p.split == split and all(by_id[d]["split"] == split for d in p.doc_ids) for p in pairs)
        ids = {p.pair_id for p in pairs}
        assert not ids & seen
        seen |= ids


def test_spans_come_from_one_document_and_do_not_overlap(rows: list[dict], by_id: dict[str, dict]) -> None:
    """A span pair is two ordered, disjoint windows of 20-80 words of one document's text."""
    pairs = built(rows, "same-source-spans")
    assert pairs
    for pair in pairs:
        (qs, qe), (ps, pe) = span_offsets(pair)
        text = by_id[pair.doc_ids[0]]["text"]
        assert text[qs:qe] == pair.query and text[ps:pe] == pair.positive
        assert qe <= ps
        assert all(SPAN_MIN_WORDS <= len(t.split()) <= SPAN_MAX_WORDS for t in (pair.query, pair.positive))
        assert pair.positive_group == pair.doc_ids[0]


def test_title_body_python_docs_uses_the_heading() -> None:
    """A Python topic's query is its underlined heading, not its lookup key, and the underline is gone."""
    [doc] = [d for d in iter_documents("python-docs") if d.title == "assert"]
    row = {"doc_id": doc.doc_id, "source": doc.source, "title": doc.title, "text": doc.text, "split": "dev"}
    [pair] = built([row], "title-body")
    assert pair.query == 'The "assert" statement'
    assert pair.positive.startswith("Assert statements are") and "***" not in pair.positive


def test_title_body_manpage_is_name_line_to_description(rows: list[dict]) -> None:
    """A man page's query is 'page(section): NAME line'; its positive is DESCRIPTION text, not the synopsis."""
    require("manpages-dev")
    pairs = [p for p in built(rows, "title-body") if p.source == "manpages-dev"]
    assert pairs
    for pair in pairs:
        assert re.match(r"\S+\(\d\w*\): .+ - .+", pair.query)
        assert "SYNOPSIS" not in pair.positive and "#include" not in pair.positive


def test_title_body_postgres_reference_page_is_purpose_to_description(rows: list[dict]) -> None:
    """A PostgreSQL reference page pairs 'NAME — purpose' with its Description; section numbers leave titles."""
    require("postgresql-doc-15")
    pairs = [p for p in built(rows, "title-body") if p.source == "postgresql-doc-15"]
    reference = [p for p in pairs if " — " in p.query]
    assert reference and all("Synopsis" not in p.positive for p in reference)
    assert not [p for p in pairs if re.match(r"(Chapter |Appendix )?[\dA-Z]+(\.\d+)*\. ", p.query)]


def test_lead_rest_pairs_a_docstring_summary_with_the_rest() -> None:
    """A docstring's summary paragraph is the query and the paragraphs after it the positive;
    the summary never appears in the positive, and a docstring whose rest is too short yields
    no pair."""
    text = ("Return the number of items in a container.\n\n"
            "The argument may be a sequence (such as a string, bytes, tuple, list, or range) or a collection "
            "(such as a dictionary, set, or frozen set).\n\nRaises TypeError for other objects.")
    row = {"doc_id": "d1", "source": "python-docstrings", "title": "builtins.len", "text": text, "split": "train"}
    [pair] = built([row], "lead-rest")
    assert pair.query == "Return the number of items in a container."
    assert pair.positive == ("The argument may be a sequence (such as a string, bytes, tuple, list, or range) or a "
                             "collection (such as a dictionary, set, or frozen set). Raises TypeError for other objects.")
    assert (pair.pair_id, pair.positive_group, pair.confidence) == ("lead-rest:d1", "d1", 0.8)
    short = dict(row, doc_id="d2", text="Return the length of the given container object.\n\nSee len().")
    assert built([short], "lead-rest") == []
    # A lead too short for the audit's containment match could equal a held-out query unseen.
    generic = dict(row, doc_id="d4", text="Close the transport.\n\n" + text.split("\n\n", 1)[1])
    assert built([generic], "lead-rest") == []
    # A source without titled texts (a fortune, a dictionary entry) yields nothing.
    assert built([dict(row, doc_id="d3", source="fortunes")], "lead-rest") == []


def test_lead_rest_splits_a_long_opening_paragraph_after_its_first_sentence() -> None:
    """An opening paragraph longer than LEAD_MAX_WORDS is no summary: its first sentence is the
    lead (not cut at "e.g." or a number) and the rest of the paragraph opens the positive."""
    first = "The planner chooses a plan for each query, e.g. a sequential scan, from cost estimates."
    rest = " ".join(["Each estimate counts pages and rows read by one node of the plan tree."] * 5)
    row = {"doc_id": "p1", "source": "debian-handbook", "title": "1.2. Planning", "text": f"{first} {rest}",
           "split": "train"}
    [pair] = built([row], "lead-rest")
    assert len(f"{first} {rest}".split()) > LEAD_MAX_WORDS
    assert pair.query == first
    assert pair.positive == rest  # 65 words: under MAX_BODY_WORDS, so not truncated


def test_lead_rest_on_real_documents_keeps_the_lead_out_of_the_positive(rows: list[dict]) -> None:
    """On every available titled source: a prose lead of LEAD_MIN_WORDS..LEAD_MAX_WORDS words, a positive of at
    least MIN_BODY_WORDS words that does not contain it, one pair per document."""
    pairs = built(rows, "lead-rest")
    if not pairs:
        pytest.skip("no titled source is installed")
    assert len({p.doc_ids for p in pairs}) == len(pairs)
    for pair in pairs:
        assert len(containment_words(pair.query)) >= LEAD_MIN_WORDS and len(pair.query.split()) <= LEAD_MAX_WORDS
        assert len(pair.positive.split()) >= MIN_BODY_WORDS
        assert pair.query not in pair.positive


def test_term_definition_skips_stubs_and_labels(rows: list[dict]) -> None:
    """Cross-reference-only entries ('See X.') give no pair; subject tags and origin labels leave definitions."""
    if not {"dict-foldoc", "dict-jargon"} & set(AVAILABLE):
        pytest.skip("no dictd source installed")
    pairs = built(rows, "term-definition")
    stubs = [
        row["doc_id"] for row in rows
        if row["source"] in ("dict-foldoc", "dict-jargon") and re.fullmatch(r"[^\n]*\n\nSee [^.\n]*\.", row["text"])
    ]
    assert stubs  # the sample holds some, so the check below means something
    assert not {p.doc_ids[0] for p in pairs} & set(stubs)
    labelled = re.compile(r"(\d+\. )?(<[^<>]*>|\[[^\[\]]*\]) ")
    assert not [p for p in pairs if labelled.match(p.positive) or re.search(r"\(\d{4}-\d\d-\d\d\)$", p.positive)]


def test_keyword_pairs_a_word_of_two_openings_with_the_first_opening_to_pick_it() -> None:
    """A word qualifies when 2 openings (at most 1% of them, and at least 2) hold it: here only
    "sailors", which goes to the first document (by id) alone; the thesaurus, which is no prose,
    is neither paired nor counted; identifiers and words under 4 letters never qualify."""
    def row(doc_id: str, text: str, source: str = "fortunes") -> dict:
        return {"doc_id": doc_id, "source": source, "title": "", "text": text, "split": "train"}

    rows = [
        row("d1", "The lantern glowed over the harbour while sailors slept."),
        row("d2", "A lantern hung by the door of the harbour inn at night, read_file and utf8 too."),
        row("d3", "Sailors sang about the harbour and the lantern until dawn came."),
        row("d4", "Nothing here shares words: quiet meadows, distant hills, silver brooks, read_file, utf8."),
        row("t1", "glowed\nnoun: sailors, seamen, mariners, seafarers, tars, crews, hands", "mythes-en-us"),
    ]
    pairs = list(PAIR_BUILDERS["keyword"](list(reversed(rows))))
    assert [(p.doc_ids, p.query, p.positive) for p in pairs] == [(("d1",), "sailors", rows[0]["text"])]
    assert (pairs[0].builder, pairs[0].confidence, pairs[0].positive_group) == ("keyword", KEYWORD_CONFIDENCE, "d1")


def test_keyword_queries_are_distinct_rare_words_inside_a_short_opening(rows: list[dict]) -> None:
    """On real text, split by split: every query is a whole word of its positive (found by a
    case-insensitive word-boundary search), letters only, in at most max(2, 1%) of the
    split's keyword openings' texts; no two pairs share a query; positives are short."""
    for split in SPLITS:
        in_split = [row for row in rows if row["split"] == split]
        pairs = built(in_split, "keyword")
        openings = {pair.doc_ids[0]: pair.positive for pair in pairs}
        assert len({pair.query for pair in pairs}) == len(pairs)
        for pair in pairs:
            assert pair.query.isalpha() and len(pair.query) >= 4 and pair.query == pair.query.lower()
            assert re.search(rf"\b{pair.query}\b", pair.positive, re.IGNORECASE)
            assert len(pair.positive.split()) <= KEYWORD_OPENING_WORDS
            holding = sum(bool(re.search(rf"\b{pair.query}\b", text, re.IGNORECASE)) for text in openings.values())
            # Openings of the split that hold the word, among those paired: a lower bound of all.
            assert holding <= max(2, int(KEYWORD_MAX_DOCUMENT_SHARE * len(in_split))), pair


def test_synonyms_pair_a_headword_with_a_sense_grouped_by_entry(rows: list[dict]) -> None:
    """Synonym pairs exclude the headword, labelled relations and pertainym senses, and group by entry."""
    require("mythes-en-us")
    pairs = built(rows, "synonyms")
    assert pairs
    for pair in pairs:
        assert pair.positive_group == pair.doc_ids[0] == f"mythes-en-us:{pair.query}"
        assert pair.query.casefold() not in [w.casefold() for w in pair.positive.split(", ")]
        assert ":" not in pair.positive  # no "a kind of: ..." hypernym groups
    words_with_several = {p.query for p in pairs if sum(q.query == p.query for q in pairs) > 1}
    assert words_with_several  # some headwords have more than one sense, all in one group
    pertainyms = {
        f"synonyms:{row['doc_id']}#{number}"
        for row in rows if row["source"] == "mythes-en-us"
        for number, sense in enumerate(row["text"].splitlines()[1:], start=1)
        if sense.startswith("adjective: ") and "; related to: " in sense
    }
    assert pertainyms and not pertainyms & {p.pair_id for p in pairs}


def test_unknown_builder_and_split_errors_list_valid_names(rows: list[dict]) -> None:
    """An unknown builder or split is refused with every valid name in the message."""
    table = corpus_table(rows)
    with pytest.raises(ValueError) as error:
        build_pairs(table, ["title-body", "nope"], split="train", seed=0)
    assert "nope" in str(error.value) and all(name in str(error.value) for name in PAIR_BUILDERS)
    with pytest.raises(ValueError, match="train, dev, test"):
        build_pairs(table, ["title-body"], split="validation", seed=0)


def test_max_pairs_per_builder_is_a_seeded_deterministic_subsample(rows: list[dict]) -> None:
    """The cap holds per builder; the subsample is an order-kept subset fixed by the seed."""
    table = corpus_table(rows)
    builders = ["same-source-spans", "title-body"]
    full = build_pairs(table, builders, split="train", seed=0)
    capped = build_pairs(table, builders, split="train", seed=7, max_pairs_per_builder=5)
    counts = pair_stats(full)["by_builder"]
    assert all(count > 5 for count in counts.values())
    assert pair_stats(capped)["by_builder"] == dict.fromkeys(counts, 5)
    assert capped == [p for p in full if p in capped]  # a subset, in the original order
    assert capped == build_pairs(table, builders, split="train", seed=7, max_pairs_per_builder=5)
    assert capped != build_pairs(table, builders, split="train", seed=8, max_pairs_per_builder=5)


def test_pairs_to_table_and_stats(rows: list[dict]) -> None:
    """The table has one row per pair with every field; stats count builders and sources and average lengths."""
    pairs = build_pairs(corpus_table(rows), list(PAIR_BUILDERS), split="dev", seed=0)
    table = pairs_to_table(pairs)
    assert table.num_rows == len(pairs)
    assert table.column_names == list(Pair.__dataclass_fields__)
    assert table.slice(0, 1).to_pylist()[0]["doc_ids"] == list(pairs[0].doc_ids)
    stats = pair_stats(pairs)
    assert stats["pairs"] == len(pairs) == sum(stats["by_builder"].values()) == sum(stats["by_source"].values())
    assert stats["mean_query_chars"] == pytest.approx(sum(len(p.query) for p in pairs) / len(pairs))
    assert pairs_to_table([]).num_rows == 0 and pair_stats([])["pairs"] == 0


def test_near_duplicates_and_equal_positives_share_a_positive_group():
    """Pairs of one near-duplicate cluster, or with the same positive text, end in one group;
    the rest keep their own, and the merge does not depend on the pairs' order."""
    from embedlab.pairs.builders import Pair, merge_positive_groups

    def pair(pair_id, doc, group, positive):
        return Pair(pair_id=pair_id, builder="b", query=f"q {pair_id}", positive=positive, source="s",
                    doc_ids=(doc,), split="train", confidence=0.9, positive_group=group)

    pairs = [pair("1", "d1", "d1", "an inherited docstring"), pair("2", "d2", "d2", "the same docstring, copied"),
             pair("3", "d3", "w-amsterdam", "Dutch capital"), pair("4", "d4", "w-capital", "dutch  Capital"),
             pair("5", "d5", "d5", "something else")]
    clusters = {"d1": "d1", "d2": "d1", "d3": "d3", "d4": "d4", "d5": "d5"}
    groups = [p.positive_group for p in merge_positive_groups(pairs, clusters)]
    assert groups == ["d1", "d1", "w-amsterdam", "w-amsterdam", "d5"]
    again = [p.positive_group for p in merge_positive_groups(pairs[::-1], clusters)][::-1]
    assert again == groups


def test_build_pairs_groups_by_the_corpus_clusters(rows):
    """`build_pairs` on a table with `group_id` puts two documents of one cluster in one group."""
    import dataclasses as dc

    table = corpus_table(rows)
    pairs = build_pairs(table, ["title-body"], split="train", seed=0)
    first, second = sorted({p.doc_ids[0] for p in pairs})[:2]
    clusters = [first if doc in (first, second) else doc for doc in table["doc_id"].to_pylist()]
    clustered = build_pairs(table.append_column("group_id", pa.array(clusters)), ["title-body"], split="train", seed=0)
    group = {p.doc_ids[0]: p.positive_group for p in clustered}
    assert group[first] == group[second]
    assert {p.positive_group for p in pairs if p.doc_ids[0] == second} != {group[second]}
    assert [dc.replace(p, positive_group="") for p in clustered] == [dc.replace(p, positive_group="") for p in pairs]
