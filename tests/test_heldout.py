"""Held-out tasks: each builder on tiny inputs in the real formats (dpkg status, GNU Info,
dictd), the written task's round trip through `beir`, decontamination against training text
that holds a task item, the one-line error for a missing source, the CLI, and (where the
real sources are installed) zero audit findings of the real tasks against the built-in corpus."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest
import torch

from embedlab.cli import main
from embedlab.contamination.audit import audit
from embedlab.core.beir import Task, load_task
from embedlab.sources.builtin import SOURCE_NAMES, available_sources
from embedlab.tasks import heldout
from embedlab.tasks.heldout import (
    HELDOUT_TASKS, SHARED_WINDOW, SOURCES, HeldoutSourceMissing, TrainingText, build_heldout,
    build_heldout_tasks, builtin_training_text, read_dpkg_status, read_provenance,
)
from embedlab.evaluate.heldout_scores import WORD_MATCH_RULE, group_means, word_groups, word_matched

UNRELATED = TrainingText({"what": "fixture"}, lambda: [("train:1", "Nothing in here is about packages or devils.")])

# --- fixtures in the real formats ------------------------------------------------------------

STATUS = """\
Package: hello
Status: install ok installed
Architecture: amd64
Version: 2.10-3
Description: example package based on GNU hello
 The GNU hello program produces a familiar, friendly greeting.  It
 allows non-programmers to use a classic computer science tool.
 .
 Its output looks like this:
   Hello, world!

Package: fortunes
Status: install ok installed
Architecture: all
Source: fortune-mod
Description: Data files containing fortune cookies
 There are far over 15000 different 'fortune cookies' in this package.
 You'll need the fortune-mod package to display the cookies.

Package: fortunes-min
Status: install ok installed
Architecture: all
Source: fortune-mod (1:1.99.1-7.3)
Description: Data files containing selected fortune cookies
 This package contains a small number of 'fortune cookies' for the
 fortune-mod program, the ones of the upstream release.

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Description: a package removed but for its configuration files
 This description belongs to a package that is no longer installed on
 the machine, so it must not become part of the task at all.

Package: terse
Status: install ok installed
Architecture: amd64
Description: a package with a short description
 Too short to retrieve.

Package: twin-a
Status: install ok installed
Architecture: amd64
Description: shared synopsis of two packages
 The first of two packages that share their synopsis, so the synopsis has
 no single answer and neither package becomes a query.

Package: twin-b
Status: install ok installed
Architecture: amd64
Description: Shared synopsis of two packages
 The second of two packages that share their synopsis, so the synopsis has
 no single answer and neither package becomes a query.

Package: copy-a
Status: install ok installed
Architecture: amd64
Description: first package with a copied description
 Two packages whose long descriptions are word for word the same: only the
 first of them is kept, and it answers its own synopsis.

Package: copy-b
Status: install ok installed
Architecture: i386
Description: second package with a copied description
 Two packages whose long descriptions are word for word the same: only the
 first of them is kept, and it answers its own synopsis.
"""

HELLO = ("The GNU hello program produces a familiar, friendly greeting.  It allows non-programmers to use "
         "a classic computer science tool.\n\nIts output looks like this:\nHello, world!")
TWIN_A = ("The first of two packages that share their synopsis, so the synopsis has no single answer and "
          "neither package becomes a query.")
TWIN_B = TWIN_A.replace("The first", "The second")
COPY = ("Two packages whose long descriptions are word for word the same: only the first of them is kept, "
        "and it answers its own synopsis.")

OPTIONS_TEXT = ("The tiny program accepts the following options, which can be given in any order and combined\n"
                "freely with the file arguments described above.\n\n"
                "'--verbose'\n     Print the name of each file as it is processed, so that a long run\n"
                "     shows where it has got to.")
NO_HEADING_TEXT = ("A node without a heading of its own: its query is the node name, and its text is everything\n"
                   "after the header line, wrapped as makeinfo wraps it, at seventy-two columns or so, kept as\n"
                   "is, line breaks and all.")
INVOKING_TEXT = ("The general synopsis of the tiny command line is shown below; the subsections that follow\n"
                 "describe its options and its exit status in turn.\n\n"
                 "     tiny [OPTION]... [FILE]...\n\n"
                 "   Nothing else is printed unless an option asks for it: this paragraph follows the menu.")
EXIT_TEXT = ("An exit status of zero indicates success, and a nonzero value indicates failure of some kind;\n"
             "the split manual keeps this node in its second file, which the Indirect table names, so it is\n"
             "read only by following that table.")


def _node(manual: str, name: str, body: str) -> str:
    return f"\x1f\nFile: {manual}.info,  Node: {name},  Next: Somewhere,  Up: Top\n\n{body}\n"


def _heading(title: str, underline: str) -> str:
    return f"{title}\n{underline * len(title)}\n\n"


TINY_INFO = (
    "This is tiny.info, produced by makeinfo version 6.8 from tiny.texi.\n\nINFO-DIR-SECTION Tests\n"
    + _node("tiny", "Top", _heading("tiny", "*") + "This manual is for tiny, a program in a test.\n\n* Menu:\n\n"
            "* Invoking::    How to run it.\n")
    + _node("tiny", "Invoking", _heading("2 Invoking 'tiny'", "*") + INVOKING_TEXT.split("\n\n")[0]
            + "\n\n" + INVOKING_TEXT.split("\n\n")[1] + "\n\n* Menu:\n\n* Options::          What the options do.\n"
            "* Exit status::      What the program\n                      returns.\n\n"
            + INVOKING_TEXT.split("\n\n")[2])
    + _node("tiny", "Options", _heading("2.1 Options", "=") + OPTIONS_TEXT)
    + _node("tiny", "Odd node", NO_HEADING_TEXT)
    + _node("tiny", "Brief", _heading("2.2 Brief", "=") + "Too short to be a document.")
    + _node("tiny", "GNU Free Documentation License",
            _heading("Appendix A GNU Free Documentation License", "*") + "Licence text. " * 40)
    + _node("tiny", "Index", _heading("Index", "*") + "\x00\x08[index\x00\x08]\n* Menu:\n\n"
            + "* options:        Options.     (line 6)\n" * 20)
    + "\x1f\nTag Table:\nNode: Top\x7f10\n\x1f\nEnd Tag Table\n"
)
SPLIT_MAIN = ("This is split.info, produced by makeinfo version 6.8 from split.texi.\n\n"
              "\x1f\nIndirect:\nsplit.info-1: 100\nsplit.info-2: 2000\n\x1f\nTag Table:\n(Indirect)\n"
              "Node: Top\x7f100\n\x1f\nEnd Tag Table\n")
SPLIT_1 = "This is split.info, produced by makeinfo.\n" + _node("split", "Top", _heading("split", "*") + "Top.")
SPLIT_2 = "This is split.info, produced by makeinfo.\n" + _node(
    "split", "Exit status", _heading("A.1 Exit status", "-") + EXIT_TEXT)


def _gzip(path, text: str):
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    return path


def _dictd_number(value: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = ""
    while True:
        digits = alphabet[value % 64] + digits
        value //= 64
        if not value:
            return digits


DEVIL_ENTRIES = {
    "00databaseinfo": "This is the Devil's Dictionary, by Ambrose Bierce.\n",
    "abasement": ("ABASEMENT, n.  A decent and customary mental attitude in the presence\n"
                  "of wealth of power.  Peculiarly appropriate in an employee when\naddressing an employer.\n\n"),
    "abracadabra": "ABRACADABRA.\n\n    By _Abracadabra_ we signify\n        An infinite number of things.\n\n",
    "babe": ("BABE or BABY, n.  A misshapen creature of no particular age, sex, or\ncondition, chiefly "
             "remarkable for the _violence_ of the sympathies.\n\n    A verse of two lines\n        "
             "indented as Bierce printed it.\n\n"),
    "bore": "BORE, n.  A person who talks when you wish him to listen.\n\n",
    "lowbred": "LOW-BRED, adj.  \"Raised\" instead of brought up.\n\n",
}
ABASEMENT = ("A decent and customary mental attitude in the presence of wealth of power. Peculiarly appropriate "
             "in an employee when addressing an employer.")
BABE = ("A misshapen creature of no particular age, sex, or condition, chiefly remarkable for the violence of "
        "the sympathies.\n\nA verse of two lines\nindented as Bierce printed it.")
BORE = "A person who talks when you wish him to listen."
LOWBRED = '"Raised" instead of brought up.'


def _dictd(tmp_path):
    data, index, offset = b"", [], 0
    for headword, entry in DEVIL_ENTRIES.items():
        raw = entry.encode("utf-8")
        index.append(f"{headword}\t{_dictd_number(offset)}\t{_dictd_number(len(raw))}")
        data, offset = data + raw, offset + len(raw)
    (tmp_path / "devil.index").write_text("\n".join(index) + "\n")
    (tmp_path / "devil.dict.dz").write_bytes(gzip.compress(data))
    return tmp_path / "devil.index", tmp_path / "devil.dict.dz"


def fixture_sources(tmp_path) -> dict:
    """Every registered task pointed at the fixture files, allowed to be tiny."""
    status = tmp_path / "status"
    status.write_text(STATUS)
    info = tmp_path / "info"
    info.mkdir()
    _gzip(info / "tiny.info.gz", TINY_INFO)
    _gzip(info / "split.info.gz", SPLIT_MAIN)
    _gzip(info / "split.info-1.gz", SPLIT_1)
    _gzip(info / "split.info-2.gz", SPLIT_2)
    small = {"min_queries": 1}
    return {
        "debian-packages": dataclasses.replace(SOURCES["debian-packages"].at(status), **small),
        "gnu-info": dataclasses.replace(
            SOURCES["gnu-info"], needs=(("tiny-doc", info / "tiny.info.gz"), ("split-doc", info / "split.info.gz")),
            **small),
        "devils-dictionary": dataclasses.replace(SOURCES["devils-dictionary"].at(*_dictd(tmp_path)), **small),
    }


EXPECTED = {
    "debian-packages": {
        "queries": {"q:hello:amd64": "example package based on GNU hello",
                    "q:copy-a:amd64": "first package with a copied description"},
        "corpus": {"hello:amd64": HELLO, "twin-a:amd64": TWIN_A, "twin-b:amd64": TWIN_B, "copy-a:amd64": COPY},
    },
    "gnu-info": {
        "queries": {"q:tiny:Invoking": "Invoking 'tiny'", "q:tiny:Options": "Options",
                    "q:tiny:Odd node": "Odd node", "q:split:Exit status": "Exit status"},
        "corpus": {"tiny:Invoking": INVOKING_TEXT, "tiny:Options": OPTIONS_TEXT, "tiny:Odd node": NO_HEADING_TEXT,
                   "split:Exit status": EXIT_TEXT},
    },
    "devils-dictionary": {
        "queries": {"q:devil:abasement": "abasement", "q:devil:babe": "babe or baby", "q:devil:bore": "bore",
                    "q:devil:lowbred": "low-bred"},
        "corpus": {"devil:abasement": ABASEMENT, "devil:babe": BABE, "devil:bore": BORE, "devil:lowbred": LOWBRED},
    },
}


# --- the builders --------------------------------------------------------------------------


@pytest.mark.parametrize("name", HELDOUT_TASKS)
def test_builder_writes_exactly_the_expected_queries_documents_and_qrels(tmp_path, name):
    """Each builder on its fixture: these queries, these documents, each query judging its own document."""
    source = fixture_sources(tmp_path)[name]
    task = load_task(build_heldout(name, tmp_path / "out", source=source, training=UNRELATED))
    expected = EXPECTED[name]
    assert task.queries == expected["queries"]
    assert task.corpus == {doc_id: ("", text) for doc_id, text in expected["corpus"].items()}
    assert task.qrels == {"test": {qid: {qid.removeprefix("q:"): 1} for qid in expected["queries"]}}


def test_dpkg_reader_leaves_out_corpus_packages_and_their_source_package(tmp_path):
    """A corpus package, and another built from the same Debian source, are not candidates."""
    status = tmp_path / "status"
    status.write_text(STATUS)
    kept = {item.item_id for item in read_dpkg_status(status, excluded=frozenset({"fortunes"})).items}
    assert kept == {"hello:amd64", "twin-a:amd64", "twin-b:amd64", "copy-a:amd64", "copy-b:i386"}
    everything = {item.item_id for item in read_dpkg_status(status, excluded=frozenset()).items}
    assert {"fortunes:all", "fortunes-min:all"} <= everything


@pytest.mark.parametrize("name", HELDOUT_TASKS)
def test_written_task_round_trips_through_beir_with_its_provenance(tmp_path, name):
    """The folder loads with `beir.load_task`; sources.json names packages, files with sha256, code revision."""
    source = fixture_sources(tmp_path)[name]
    path = build_heldout(name, tmp_path / "out", source=source, training=UNRELATED)
    assert path == tmp_path / "out" / name
    task = load_task(path)
    record = read_provenance(path)
    assert record["task_hash"] == task.hash
    assert (record["queries"], record["documents"]) == (len(task.queries), len(task.corpus))
    assert set(record["packages"]) == set(source.packages)
    for file in record["files"]:
        assert len(file["sha256"]) == 64 and file["bytes"] > 0
    assert len(record["builder"]["code_revision"]) == 16
    # A second build gives the same bytes and replaces the first.
    again = load_task(build_heldout(name, tmp_path / "out", source=source, training=UNRELATED))
    assert again.hash == task.hash


def test_split_info_manual_files_are_all_recorded(tmp_path):
    """A manual split by makeinfo is read through its Indirect table, and each file is in sources.json."""
    source = fixture_sources(tmp_path)["gnu-info"]
    path = build_heldout("gnu-info", tmp_path / "out", source=source, training=UNRELATED)
    names = [file["path"].rsplit("/", 1)[1] for file in read_provenance(path)["files"]]
    assert names == ["tiny.info.gz", "split.info.gz", "split.info-1.gz", "split.info-2.gz"]


# --- decontamination -----------------------------------------------------------------------

# For each task, training text holding one of its items, as a training document would.
PLANTED = {
    "debian-packages": ("handbook:dpkg", "Querying the database\n" + HELLO.replace("\n\n", " ") + " And more text."),
    "gnu-info": ("manpages:tiny.1", "tiny(1)\n" + OPTIONS_TEXT),
    "devils-dictionary": ("fortunes:definitions:1", "Abasement, n.: " + ABASEMENT + " -- Ambrose Bierce"),
}
PLANTED_ITEM = {"debian-packages": "hello:amd64", "gnu-info": "tiny:Options", "devils-dictionary": "devil:abasement"}


@pytest.mark.parametrize("name", HELDOUT_TASKS)
def test_an_item_found_in_training_text_is_removed_recorded_and_reaudit_is_clean(tmp_path, name):
    """The audit finds the planted item in the uncleaned task; the build drops and records it; re-audit is clean."""
    source = fixture_sources(tmp_path)[name]
    training = TrainingText({"what": "fixture"}, lambda: [("train:other", "Unrelated words."), PLANTED[name]])
    item = PLANTED_ITEM[name]
    uncleaned = load_task(build_heldout(name, tmp_path / "raw", source=source, training=UNRELATED))
    before = audit([uncleaned], {"training": training.pairs()}, progress=None)
    assert {f.item_id for f in before.findings} == {item}

    cleaned_dir = build_heldout(name, tmp_path / "clean", source=source, training=training)
    cleaned = load_task(cleaned_dir)
    assert item not in cleaned.corpus and f"q:{item}" not in cleaned.queries
    assert set(uncleaned.corpus) - set(cleaned.corpus) == {item}
    record = json.loads((cleaned_dir / heldout.DECONTAMINATION_FILE).read_text())
    assert {r["item"] for r in record["removed"]} == {item}
    assert {r["training_item"] for r in record["removed"]} == {PLANTED[name][0]}
    assert record["items_removed"] == 1 and record["training_text"] == {"what": "fixture"}
    assert audit([cleaned], {"training": training.pairs()}, progress=None).findings == ()


def test_a_shortened_quote_is_a_shared_window_finding_and_removes_the_item(tmp_path):
    """Training text quoting 10+ words of a definition (not all of it: neither contained nor a
    near-duplicate) is found by the audit's window rule, and the build removes the item."""
    source = fixture_sources(tmp_path)["devils-dictionary"]
    quote = ("fortunes:definitions:2", "Babe, n.: A misshapen creature of no particular age, sex, or condition.")
    training = TrainingText({"what": "fixture"}, lambda: [quote])
    uncleaned = load_task(build_heldout("devils-dictionary", tmp_path / "raw", source=source, training=UNRELATED))
    findings = audit([uncleaned], {"training": training.pairs()}, progress=None).findings
    assert [(f.item_id, f.match, f.stage_item_id) for f in findings] == [("devil:babe", SHARED_WINDOW, quote[0])]

    path = build_heldout("devils-dictionary", tmp_path / "clean", source=source, training=training)
    removed = json.loads((path / heldout.DECONTAMINATION_FILE).read_text())["removed"]
    assert [(r["item"], r["match"], r["training_item"]) for r in removed] == [("devil:babe", SHARED_WINDOW, quote[0])]
    assert "devil:babe" not in load_task(path).corpus


def test_a_distractor_found_in_training_text_is_removed_too(tmp_path):
    """Items beyond the query cap stay as distractors, and they were audited as well."""
    source = dataclasses.replace(fixture_sources(tmp_path)["devils-dictionary"], max_queries=1)
    full = load_task(build_heldout("devils-dictionary", tmp_path / "raw", source=source, training=UNRELATED))
    assert len(full.queries) == 1 and len(full.corpus) == 4
    distractor = next(d for d in sorted(full.corpus) if f"q:{d}" not in full.queries)
    training = TrainingText({"what": "fixture"}, lambda: [("train:x", "Quoted:\n" + full.corpus[distractor][1])])
    cleaned = load_task(build_heldout("devils-dictionary", tmp_path / "clean", source=source, training=training))
    assert set(full.corpus) - set(cleaned.corpus) == {distractor}


def test_too_few_queries_after_cleaning_is_a_user_error(tmp_path):
    """A task below its minimum size is refused rather than written."""
    source = dataclasses.replace(fixture_sources(tmp_path)["devils-dictionary"], min_queries=5)
    with pytest.raises(heldout.UserError, match="only 4 queries"):
        build_heldout("devils-dictionary", tmp_path / "out", source=source, training=UNRELATED)
    assert not (tmp_path / "out" / "devils-dictionary").exists()


# --- errors and the CLI --------------------------------------------------------------------


def test_a_missing_source_is_one_line_naming_the_debian_package(tmp_path, monkeypatch, capsys):
    """No dictd files: HeldoutSourceMissing names dict-devil; the CLI prints it as one error line, exit 2."""
    missing = SOURCES["devils-dictionary"].at(tmp_path / "devil.index", tmp_path / "devil.dict.dz")
    with pytest.raises(HeldoutSourceMissing, match="install the Debian package dict-devil") as error:
        build_heldout("devils-dictionary", tmp_path / "out", source=missing, training=UNRELATED)
    assert "\n" not in str(error.value)
    monkeypatch.setitem(heldout.SOURCES, "devils-dictionary", missing)
    assert main(["heldout", "build", "--out", str(tmp_path / "out"), "--tasks", "devils-dictionary"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: held-out task 'devils-dictionary'") and "dict-devil" in err[0]


def _tiny_checkpoint(directory):
    """A random 2-layer width-32 encoder with a tokenizer trained on a few sentences."""
    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.core.config import ModelConfig
    from embedlab.model.encoder import Encoder
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    texts = [*EXPECTED["devils-dictionary"]["corpus"].values(), *EXPECTED["gnu-info"]["corpus"].values()]
    tokenizer = save_tokenizer(train_tokenizer(texts * 5, 300), directory / "tokenizer")
    torch.manual_seed(0)
    encoder = Encoder(ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=512, max_length=64))
    save_checkpoint(directory / "checkpoint", encoder, head=None, tokenizer=tokenizer,
                    fields={"phase": 2, "config": {}, "data_revision": "rev-test"})
    return directory / "checkpoint"


def test_score_prints_a_table_per_task_and_json(tmp_path, monkeypatch, capsys):
    """`heldout score` scores the encoder and BM25 on each built task, with its sizes and source,
    and nDCG@10 over the two word groups (`test_word_matched_by_hand` holds the grouping rule)."""
    for name, source in fixture_sources(tmp_path).items():
        monkeypatch.setitem(heldout.SOURCES, name, source)
    tasks_dir = tmp_path / "tasks"
    build_heldout_tasks(list(heldout.SOURCES.values()), tasks_dir, training=UNRELATED)
    checkpoint = str(_tiny_checkpoint(tmp_path))
    args = ["heldout", "score", checkpoint, "--dir", str(tasks_dir), "--baselines", "bm25"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "devils-dictionary: 4 queries, 4 documents" in out and "nDCG@10" in out and "bm25" in out
    assert main([*args, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert set(results) == set(HELDOUT_TASKS)
    for name, result in results.items():
        assert result["queries"] == len(EXPECTED[name]["queries"])
        assert set(result["scores"]) == {checkpoint, "bm25"}
        assert all(0.0 <= m["ndcg@10"] <= 1.0 and 0.0 <= m["recall@100"] <= 1.0 for m in result["scores"].values())
    # Four documents: every one is within the top 100, so recall@100 is 1 for both.
    assert results["gnu-info"]["scores"]["bm25"]["recall@100"] == 1.0
    # The word groups partition the queries, and their means recombine to the whole split's.
    for name, result in results.items():
        sizes = result["word_groups"]
        assert sizes["words_in_document"] + sizes["other"] == result["queries"]
        assert sizes == {**{g: len(ids) for g, ids in word_groups(load_task(tasks_dir / name), "test").items()},
                         "rule": WORD_MATCH_RULE}
        for scores in result["scores"].values():
            parts = [(sizes[g], scores[f"ndcg@10/{g}"]) for g in ("words_in_document", "other")]
            assert all((value is None) == (size == 0) for size, value in parts)
            assert sum(size * (value or 0.0) for size, value in parts) == pytest.approx(
                result["queries"] * scores["ndcg@10"], rel=1e-12, abs=1e-12)


def test_word_matched_by_hand():
    """Every query word (BM25's tokens: lowercased, stopwords out) must be in a relevant document."""
    corpus = {"d1": ("", "The red fox jumps over walls."), "d2": ("Whales", "A blue sky at sea."),
              "d3": ("", "Nothing relevant here.")}
    queries = {"q1": "Red FOX", "q2": "blue whale", "q3": "the a", "q4": "whales", "q5": "fox sky", "q6": "sea"}
    qrels = {"test": {"q1": {"d1": 1}, "q2": {"d2": 1}, "q3": {"d1": 1}, "q4": {"d2": 2}, "q5": {"d1": 1, "d2": 1},
                      "q6": {"d2": 0}}}
    task = Task("hand", corpus, queries, qrels)
    # q2: "whale" is not "whales" (no stemming); q3: stopwords only; q4: the title counts;
    # q5: its words are spread over its two relevant documents; q6: no relevant document, not scored.
    assert word_matched(task, "test") == {"q1": True, "q2": False, "q3": False, "q4": True, "q5": True}
    assert word_groups(task, "test") == {"words_in_document": ["q1", "q4", "q5"], "other": ["q2", "q3"]}
    assert group_means({"q1": 1.0, "q2": 0.5, "q4": 0.25}, {"a": ["q1", "q4"], "b": ["q2"], "c": []}) == {
        "a": 0.625, "b": 0.5, "c": None}


# --- the real sources ----------------------------------------------------------------------


def _real_sources_problem() -> str | None:
    for source in SOURCES.values():
        try:
            source.check()
        except HeldoutSourceMissing as error:
            return str(error)
    missing = sorted(set(SOURCE_NAMES) - set(available_sources()))
    return f"built-in corpus sources missing: {missing}" if missing else None


@pytest.mark.slow  # reads and audits the whole built-in corpus
@pytest.mark.skipif(_real_sources_problem() is not None, reason=str(_real_sources_problem()))
def test_real_tasks_have_zero_findings_against_the_builtin_corpus(tmp_path):
    """The real build: sizes in bounds, and neither the audit nor the shared-window rule finds anything."""
    # The built-in text read from its sources once (a dozen seconds), for the build and the re-audit.
    text = builtin_training_text()
    documents = list(text.pairs())
    built = build_heldout_tasks(list(SOURCES.values()), tmp_path, training=TrainingText(text.description,
                                                                                         lambda: iter(documents)))
    tasks = [load_task(path) for path in built.values()]
    for task in tasks:
        assert 200 <= len(task.queries) <= 1000 and len(task.corpus) > len(task.queries)
    report = audit(tasks, {"training": iter(documents)}, progress=None)
    assert report.findings == ()
