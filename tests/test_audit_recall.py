"""The audit finds edited copies of evaluation items: planted copies of real docstrings at each
edit level (`embedlab.contamination.recall`), with the recall each cell must reach.

The floors are what the matcher's rules guarantee by construction, not what one run
happened to give: formatting edits leave the compared words unchanged (found every time, by
`exact` alone and `contained` in a paragraph); a 75-word document keeps runs of at least 18
unchanged words under any of the word edits (found by `shared-window` every time) and,
alone, a Jaccard near 0.87 or more with one word changed (LSH recall >= 0.95 at 0.8). Word
edits to a query under ten words leave no rule that can find it: those cells are asserted at
zero so that a change that starts finding them (or false positives posing as them) is seen.
"""

from __future__ import annotations

import pytest

from embedlab.contamination import recall as audit_recall
from embedlab.contamination.recall import EDITS, PLACEMENTS

FORMATTING = ("verbatim", "case", "punctuation", "whitespace", "full-width (NFKC)", "accents added",
              "all formatting at once")
WORD_EDITS = ("one word substituted", "one word inserted", "two words swapped", "three words substituted")


@pytest.fixture(scope="module")
def table():
    return audit_recall.measure(per_kind=100, controls=30)


def test_every_formatting_edit_is_found_for_every_kind_and_placement(table):
    for kind in audit_recall.KINDS:
        for edit in FORMATTING:
            for placement in PLACEMENTS:
                assert table.recall(kind, edit, placement) == 1.0, (kind, edit, placement)


def test_documents_are_found_under_every_word_edit(table):
    for edit in WORD_EDITS:
        for placement in PLACEMENTS:
            assert table.recall("document", edit, placement) == 1.0, (edit, placement)


def test_a_document_with_one_word_changed_joins_its_originals_dedup_cluster(table):
    rows = {r.edit: r for r in table.rows if r.kind == "document" and r.placement == "alone"}
    for edit in FORMATTING:
        assert rows[edit].same_cluster == rows[edit].items, edit
    # Jaccard about 0.87-0.9 with one word changed in 75: LSH finds a pair at 0.8 with p >= 0.95.
    for edit in ("one word substituted", "one word inserted", "two words swapped"):
        assert rows[edit].same_cluster >= 0.95 * rows[edit].items, edit


def test_a_long_query_with_its_middle_word_changed_is_found_when_a_ten_word_run_survives(table):
    """One substitution at word L // 2 of an L-word query leaves a run of L // 2 words before it:
    ten or more when L >= 20. No other rule reaches such a copy (too few shingles for 0.8), so
    the recall is exactly the share of the planted queries that long."""
    items, _ = audit_recall.evaluation_items(130)
    long_enough = sum(len(text.split()) >= 20 for _, text in items["long query"][:100]) / 100
    assert 0.0 < long_enough < 1.0
    for placement in PLACEMENTS:
        assert table.recall("long query", "one word substituted", placement) == long_enough


def test_word_edits_to_short_queries_are_beyond_every_rule(table):
    for edit in WORD_EDITS:
        for placement in PLACEMENTS:
            assert table.recall("short query", edit, placement) == 0.0, (edit, placement)


def test_controls_without_copies_are_not_found(table):
    assert table.controls == 90 and table.false_positives == 0 and table.overlapping < table.controls


def test_the_table_names_every_cell():
    assert set(EDITS) >= set(FORMATTING) | set(WORD_EDITS)
