"""Tests for embedlab.sources.builtin: the readers of the built-in corpus of real English text."""

from __future__ import annotations

import gzip
import inspect
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from embedlab.sources import builtin
from embedlab.sources.builtin import (
    SOURCE_NAMES,
    SOURCES,
    SourceUnavailableError,
    available_sources,
    debian_package,
    iter_documents,
    read_dictd,
    source_revision,
    source_status,
    troff_to_text,
)
from embedlab.sources.document import Document

PYTHON_SOURCES = ("python-docs", "python-docstrings")
DEBIAN_SOURCES = tuple(name for name in SOURCE_NAMES if name not in PYTHON_SOURCES)
SAMPLE = 300  # documents read per source in the generic checks: enough to cross file boundaries


def require(name: str) -> None:
    """Skip the calling test when a source's package is not installed here."""
    reason = source_status()[name]
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def docstrings() -> dict[str, Document]:
    """Every python-docstrings document, by id (read once: about two seconds)."""
    return {doc.doc_id: doc for doc in iter_documents("python-docstrings")}


def test_source_names_and_status_agree() -> None:
    """SOURCE_NAMES lists every registered source, and status/availability cover exactly those names."""
    assert tuple(SOURCES) == SOURCE_NAMES
    assert len(set(SOURCE_NAMES)) == len(SOURCE_NAMES) == 10
    assert tuple(source_status()) == SOURCE_NAMES
    available = available_sources()
    assert available == [name for name in SOURCE_NAMES if name in available]
    assert all(source_status()[name] is None for name in available)


def test_python_sources_always_available() -> None:
    """Both Python sources are usable on any machine running this interpreter."""
    assert set(PYTHON_SOURCES) <= set(available_sources())
    for name in PYTHON_SOURCES:
        assert debian_package(name) is None
        assert re.fullmatch(rf"python-{re.escape(sys.version.split()[0])}\+sha256:[0-9a-f]{{16}}", source_revision(name))


def test_python_docstrings_revision_is_a_hash_of_the_files_it_parses(tmp_path: Path) -> None:
    """A patched standard-library file under the same Python version is a new revision; a file the
    reader skips (a test suite, a cache) is not."""
    library = tmp_path / "lib"
    (library / "pkg").mkdir(parents=True)
    (library / "pkg" / "__init__.py").write_text('"""A package."""\n', encoding="utf-8")
    module = library / "pkg" / "mod.py"
    module.write_text('def f():\n    """Return one."""\n    return 1\n', encoding="utf-8")
    source = SOURCES["python-docstrings"].at(library)
    first = source.revision()
    # A test suite's module, a bytecode cache, a file that is not Python: none is parsed.
    for folder, name in (("test", "test_mod.py"), ("__pycache__", "mod.cpython-311.pyc"), ("pkg", "notes.txt")):
        (library / folder).mkdir(exist_ok=True)
        (library / folder / name).write_text("anything", encoding="utf-8")
    assert source.revision() == first
    module.write_text('def f():\n    """Return two."""\n    return 2\n', encoding="utf-8")
    assert source.revision() != first


@pytest.mark.parametrize("name", SOURCE_NAMES)
def test_documents_are_well_formed_and_deterministic(name: str) -> None:
    """Each source yields unique, source-prefixed ids with text, and the same ids and hashes on a second read."""
    require(name)
    first = list(iter_documents(name, limit=SAMPLE))
    assert 0 < len(first) <= SAMPLE
    ids = [doc.doc_id for doc in first]
    assert len(set(ids)) == len(ids)
    for doc in first:
        assert doc.source == name
        assert doc.doc_id.startswith(f"{name}:")
        assert doc.text.strip() and doc.text == doc.text.strip()
        assert "\n\n\n" not in doc.text
        assert not re.search(r"[\x00-\x08\x0b-\x1f]", doc.text), doc.doc_id
    second = [(doc.doc_id, doc.hash) for doc in iter_documents(name, limit=SAMPLE)]
    assert second == [(doc.doc_id, doc.hash) for doc in first]


def test_limit_stops_early() -> None:
    """`limit` returns exactly that many documents, the first ones of the full order."""
    five = list(iter_documents("python-docs", limit=5))
    assert [doc.doc_id for doc in five] == [doc.doc_id for doc in iter_documents("python-docs")][:5]
    assert len(five) == 5


@pytest.mark.parametrize("name", DEBIAN_SOURCES)
def test_debian_sources_name_package_and_revision(name: str) -> None:
    """Debian sources name their package, and the revision records that package's installed version."""
    package = debian_package(name)
    assert package is not None
    require(name)
    assert source_revision(name).startswith(f"debian:{package}=")


def test_revision_falls_back_to_file_hash(tmp_path: Path) -> None:
    """Without a dpkg record for the package, the revision is a hash of the files that changes with them."""
    data = tmp_path / "data.txt"
    data.write_text("one", encoding="utf-8")
    unknown = replace(SOURCES["fortunes"], needs=(("embedlab-no-such-package", data),))
    first = unknown.revision()
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", first)
    data.write_text("two", encoding="utf-8")
    assert unknown.revision() != first


def test_docstrings_hold_json_dumps(docstrings: dict[str, Document]) -> None:
    """python-docstrings has json.dumps with its cleaned docstring, titled by qualified name."""
    doc = docstrings["python-docstrings:json.dumps"]
    assert doc.title == "json.dumps"
    assert doc.text == inspect.cleandoc(json.dumps.__doc__ or "")
    assert "python-docstrings:json.decoder.JSONDecoder.decode" in docstrings


def test_docstrings_skip_tests_and_short_ones(docstrings: dict[str, Document]) -> None:
    """No docstring comes from test suites or IDLE, and every one meets the minimum length."""
    modules = {doc.title.split(".")[0] for doc in docstrings.values()}
    assert "idlelib" not in modules and "test" not in modules
    assert not any(".test." in doc.title or ".tests." in doc.title for doc in docstrings.values())
    assert all(len(doc.text) >= builtin.MIN_DOCSTRING_CHARS for doc in docstrings.values())


def test_docstrings_are_read_without_importing(docstrings: dict[str, Document]) -> None:
    """Reading docstrings never imports the modules: `this` and `antigravity` (import side effects) stay unloaded."""
    assert "python-docstrings:antigravity.geohash" in docstrings
    assert "antigravity" not in sys.modules
    assert "this" not in sys.modules


def test_unknown_source_name_lists_valid_names() -> None:
    """Every public function rejects an unknown name with ValueError naming the valid ones."""
    for call in (
        lambda: iter_documents("no-such-source"),
        lambda: source_revision("no-such-source"),
        lambda: debian_package("no-such-source"),
    ):
        with pytest.raises(ValueError, match="no-such-source") as info:
            call()
        assert all(name in str(info.value) for name in SOURCE_NAMES)


def test_missing_package_raises_with_install_hint(tmp_path: Path) -> None:
    """A Debian source whose files are absent raises FileNotFoundError naming the package, path and apt command."""
    missing = tmp_path / "no-fortunes-here"
    source = SOURCES["fortunes"].at(missing)
    assert source.problem() == f"Debian package fortunes not installed (missing {missing})"
    with pytest.raises(FileNotFoundError) as info:
        source.documents()  # raises at once, before any iteration
    assert isinstance(info.value, SourceUnavailableError)
    assert str(missing) in str(info.value)
    assert "apt-get install fortunes" in str(info.value)


def test_missing_second_package_is_the_one_named(tmp_path: Path) -> None:
    """When the bible text is present but the `bible` program is not, the error names package bible-kjv."""
    data = tmp_path / "bible.data"
    data.write_bytes(b"")
    source = SOURCES["bible-kjv"].at(data, tmp_path / "bible")
    with pytest.raises(SourceUnavailableError, match=r"apt-get install bible-kjv$"):
        source.documents()


def test_troff_to_text() -> None:
    """troff stripping keeps headings, paragraphs, tags, code lines and table cells, and drops markup."""
    page = "\n".join([
        r'.\" Copyright notice, a comment',
        r"'\" t",
        r".TH OPEN 2 2023-02-05 Linux",
        r".SH NAME",
        r"open \- open a file",
        r".SH SYNOPSIS",
        r".nf",
        r".B #include <fcntl.h>",
        r".PP",
        '.BI "int open(const char *" path ", int " flags \\',  # continued on the next line
        r'", ...);"',
        r".fi",
        r".SH DESCRIPTION",
        r"The",
        r".BR open ()",
        r"call opens \fIpath\fP; see",
        r".BR close (2).",
        r"Quotes \(lqlike\(rq this \[em] and \e backslashes\&.",
        r".TP",
        r".B O_APPEND",
        r"Append to the file.\c",
        r"",
        r".TS",
        r"allbox;",
        r"lb lb.",
        r"Interface	Value",
        r"T{",
        r".BR open ()",
        r"T}	MT-Safe",
        r".TE",
    ])
    assert troff_to_text(page) == "\n\n".join([
        "NAME",
        "open - open a file",
        "SYNOPSIS",
        "#include <fcntl.h>",
        "int open(const char *path, int flags, ...);",
        "DESCRIPTION",
        "The open() call opens path; see close(2). Quotes \u201clike\u201d this \u2014 and \\ backslashes.",
        "O_APPEND\nAppend to the file.",
        "Interface | Value\nopen() | MT-Safe",
    ])


def _dictd_number(value: int) -> str:
    """Encode a number the way dictd indexes do (base 64, most significant digit first)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = alphabet[value % 64]
    while value >= 64:
        value //= 64
        digits = alphabet[value % 64] + digits
    return digits


def test_dictd_index_parsing(tmp_path: Path) -> None:
    """A tiny dictd dictionary reads back entry by entry: metadata skipped, aliases once, duplicates kept apart."""
    entries = {
        "meta": "00-database-short\n     A test dictionary\n",
        "filler": "x" * 5000 + "\n",  # pushes later offsets past one base-64 digit
        "widget": "Widget\n\n   A small {gadget}, often\n   hypothetical.\n\n   (2001-01-01)\n\n",
        "gadget": "gadget\n\n   A device.\n",
        "gadget2": "gadget\n\n   A second sense.\n",
    }
    body, spans = "", {}
    for key, text in entries.items():
        spans[key] = f"{_dictd_number(len(body.encode()))}\t{_dictd_number(len(text.encode()))}"
        body += text
    dictionary = tmp_path / "test.dict.dz"
    dictionary.write_bytes(gzip.compress(body.encode()))
    index = tmp_path / "test.index"
    index.write_text(
        f"00-database-short\t{spans['meta']}\ngadget\t{spans['gadget']}\ngadget\t{spans['gadget2']}\n"
        f"widget\t{spans['widget']}\nwidgets\t{spans['widget']}\n",
        encoding="utf-8",
    )
    assert list(read_dictd(index, dictionary)) == [
        ("gadget", entries["gadget"]),
        ("gadget", entries["gadget2"]),
        ("widget", entries["widget"]),
    ]
    docs = list(SOURCES["dict-jargon"].at(index, dictionary).documents())
    assert [(d.doc_id, d.title) for d in docs] == [
        ("dict-jargon:gadget", "gadget"),
        ("dict-jargon:gadget~2", "gadget"),
        ("dict-jargon:widget", "Widget"),
    ]
    assert docs[2].text == "Widget\n\nA small gadget, often hypothetical.\n\n(2001-01-01)"


def test_fortunes_reader(tmp_path: Path) -> None:
    """Fortune files split at "%" lines; overstrikes and index/symlink files are dropped; ids count entries."""
    (tmp_path / "wisdom").write_text("First  entry,\n\tsecond line.\n%\n%\n_\bB_\bold words.\n%\n", encoding="utf-8")
    (tmp_path / "wisdom.dat").write_bytes(b"\x00\x02binary index")
    (tmp_path / "wisdom.u8").symlink_to(tmp_path / "wisdom")
    docs = list(SOURCES["fortunes"].at(tmp_path).documents())
    assert [(d.doc_id, d.title, d.text) for d in docs] == [
        ("fortunes:wisdom:0", "wisdom", "First entry,\nsecond line."),
        ("fortunes:wisdom:2", "wisdom", "Bold words."),
    ]


def test_handbook_reader_splits_html_sections(tmp_path: Path) -> None:
    """An HTML page becomes one document per heading, without navigation, keeping <pre> lines."""
    (tmp_path / "page.html").write_text(
        "<html><head><title>Page</title></head><body><ul class='docnav'><li>Prev</li></ul>"
        "<div class='section'><h2 class='title'><a id='sect.one'></a>1. First</h2>"
        "<div class='para'>Some   text\n spread over\nlines, with enough words to count.</div>"
        "<pre>line one\n  line two</pre></div>"
        "<div class='section'><h3>2. Second</h3><p>Another paragraph that is long enough to keep.</p></div>"
        "</body></html>",
        encoding="utf-8",
    )
    docs = list(SOURCES["debian-handbook"].at(tmp_path).documents())
    assert [(d.doc_id, d.title, d.text) for d in docs] == [
        ("debian-handbook:page.html#sect.one", "1. First",
         "Some text spread over lines, with enough words to count.\n\nline one\n  line two"),
        ("debian-handbook:page.html#1", "2. Second", "Another paragraph that is long enough to keep."),
    ]


def test_bible_has_every_chapter() -> None:
    """bible-kjv yields the 1189 KJV chapters, Genesis 1 first, ids by OSIS book abbreviation."""
    require("bible-kjv")
    docs = list(iter_documents("bible-kjv"))
    assert len(docs) == 1189
    assert (docs[0].doc_id, docs[0].title) == ("bible-kjv:Gen.1", "Genesis 1")
    assert docs[0].text.startswith("In the beginning God created the heaven and the earth.\n")
    assert docs[-1].doc_id == "bible-kjv:Rev.22"


def test_manpages_have_open() -> None:
    """manpages-dev converts open(2) with its headings and macro text intact."""
    require("manpages-dev")
    doc = next(d for d in iter_documents("manpages-dev") if d.doc_id == "manpages-dev:man2/open.2")
    assert doc.title == "open(2)"
    assert doc.text.startswith("NAME\n\nopen, openat, creat - open and possibly create a file\n\n")
    assert "The open() system call opens the file specified by pathname." in doc.text


def test_thesaurus_entries_read_as_english() -> None:
    """mythes-en-us documents start with the word, then one readable line per sense."""
    require("mythes-en-us")
    doc = next(iter_documents("mythes-en-us", limit=1))
    lines = doc.text.splitlines()
    assert lines[0] == doc.title
    assert all(re.match(r"(noun|verb|adjective|adverb): \S", line) for line in lines[1:])
    assert "(generic term)" not in doc.text
