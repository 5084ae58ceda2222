"""Readers for the built-in corpus: real English text that ships with Python or with Debian packages.

Every source is read from local files only, so the corpus needs no network and is the same on
every machine with the same package versions (`source_revision` says which). A source is a
`Source`: the Debian packages and paths it needs, plus a reader that turns those paths into
`Document`s. Paths are module-level constants captured in `SOURCES`; a test points a source
elsewhere with `SOURCES[name].at(path, ...)`.

    python-docs        pydoc_data's topic help, one document per topic
    python-docstrings  standard-library docstrings, parsed with `ast` (nothing is imported)
    bible-kjv          King James Bible via the `bible` program, one document per chapter
    fortunes           fortune cookies, one document per entry
    dict-foldoc        Free On-line Dictionary of Computing (dictd), one document per entry
    dict-jargon        Jargon File (dictd), one document per entry
    debian-handbook    The Debian Administrator's Handbook (HTML), one document per section
    postgresql-doc-15  PostgreSQL 15 manual (HTML), one document per page, split if long
    manpages-dev       Linux man pages, sections 2 and 3 (troff), one document per page
    mythes-en-us       English thesaurus, one document per headword
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import inspect
import json
import os
import platform
import re
import subprocess
import sysconfig
import textwrap
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from itertools import islice
from pathlib import Path
from typing import TypeVar

from embedlab.core.errors import UsageError, UserError
from embedlab.sources.document import Document

STDLIB_DIR = Path(sysconfig.get_paths()["stdlib"])
BIBLE_PROGRAM = Path("/usr/bin/bible")
BIBLE_DATA = Path("/usr/lib/bible.data")
FORTUNES_DIR = Path("/usr/share/games/fortunes")
DICTD_DIR = Path("/usr/share/dictd")
HANDBOOK_DIR = Path("/usr/share/doc/debian-handbook/html/en-US")
POSTGRES_DOC_DIR = Path("/usr/share/doc/postgresql-doc-15/html")
DPKG_INFO_DIR = Path("/var/lib/dpkg/info")
MYTHES_FILE = Path("/usr/share/mythes/th_en_US_v2.dat")

_T = TypeVar("_T")

MIN_DOCSTRING_CHARS = 80
MIN_SECTION_CHARS = 40  # shorter HTML sections are title-page scraps ("Edition 1", an e-mail address)
MAX_PAGE_CHARS = 20_000  # PostgreSQL pages longer than this are split at headings


class SourceUnavailableError(UserError, FileNotFoundError):
    """A built-in source's files are missing; the message names the package and how to install it."""


# ---------------------------------------------------------------------------------------------
# Sources and the public interface


@dataclass(frozen=True)
class Source:
    """A named corpus: the (package, path) pairs it needs and a reader called as read(name, *paths).

    In `needs`, the package is the Debian package that provides the path, or None for files
    that come with Python itself. `content`, called as content(*paths), hashes the bytes the
    reader reads: the revision of a source without a Debian package (Python's own, whose
    files a distribution may patch under one version number).
    """

    name: str
    needs: tuple[tuple[str | None, Path], ...]
    read: Callable[..., Iterator[Document]]
    content: Callable[..., str] | None = None

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(path for _, path in self.needs)

    @property
    def packages(self) -> tuple[str, ...]:
        """Debian packages, in `needs` order, without repeats."""
        return tuple(dict.fromkeys(pkg for pkg, _ in self.needs if pkg is not None))

    def at(self, *paths: Path) -> Source:
        """The same source reading from other paths (same order as `needs`)."""
        if len(paths) != len(self.needs):
            raise ValueError(f"{self.name} reads {len(self.needs)} path(s), got {len(paths)}")
        return replace(self, needs=tuple((pkg, Path(p)) for (pkg, _), p in zip(self.needs, paths, strict=True)))

    def _missing(self) -> tuple[str | None, Path] | None:
        return next(((pkg, path) for pkg, path in self.needs if not path.exists()), None)

    def problem(self) -> str | None:
        """None if every needed path exists, else a one-line reason."""
        missing = self._missing()
        if missing is None:
            return None
        package, path = missing
        if package is None:
            return f"{path} is missing from this Python installation"
        return f"Debian package {package} not installed (missing {path})"

    def check(self) -> None:
        """Raise SourceUnavailableError, with the command that fixes it, if a needed path is missing."""
        missing = self._missing()
        if missing is not None:
            package = missing[0]
            hint = f"; install it with: sudo apt-get install {package}" if package else ""
            raise SourceUnavailableError(f"source {self.name!r}: {self.problem()}{hint}")

    def documents(self, limit: int | None = None) -> Iterator[Document]:
        """Documents in a fixed order; a missing source raises here, not on the first next()."""
        self.check()
        return islice(_unique_ids(self.read(self.name, *self.paths)), limit)

    def revision(self) -> str:
        """Package versions from dpkg, else a hash of the files; for Python's own sources, the
        Python version and a hash of the bytes the reader reads (`content`)."""
        self.check()
        if not self.packages:
            content = self.content(*self.paths) if self.content is not None else _hash_files(self.paths)
            return f"python-{platform.python_version()}+sha256:{content}"
        versions = [_dpkg_version(pkg) for pkg in self.packages]
        if all(versions):
            return "debian:" + ",".join(f"{pkg}={ver}" for pkg, ver in zip(self.packages, versions, strict=True))
        return "sha256:" + _hash_files(self.paths)


def _lookup(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise UsageError(f"unknown built-in source {name!r}; valid names: {', '.join(SOURCE_NAMES)}") from None


def source_status() -> dict[str, str | None]:
    """Source name -> None if usable now, else a one-line reason."""
    return {name: SOURCES[name].problem() for name in SOURCE_NAMES}


def available_sources() -> list[str]:
    """Names usable now, in SOURCE_NAMES order."""
    return [name for name, reason in source_status().items() if reason is None]


def source_revision(name: str) -> str:
    """What version of the data a source reads, e.g. 'python-3.11.7+sha256:<16 hex>' (the bytes read)
    or 'debian:fortunes=1:1.99.1-7.3'."""
    return _lookup(name).revision()


def debian_package(name: str) -> str | None:
    """The Debian package that provides a source's text (None for the Python sources)."""
    packages = _lookup(name).packages
    return packages[0] if packages else None


def iter_documents(name: str, *, limit: int | None = None) -> Iterator[Document]:
    """The documents of one source, at most `limit` of them."""
    return _lookup(name).documents(limit)


# ---------------------------------------------------------------------------------------------
# Shared helpers


def _unique_ids(docs: Iterable[Document]) -> Iterator[Document]:
    # Some locators repeat inside a source (FOLDOC has two entries headed "actor"; a function may
    # be defined in both branches of an `if`): later ones get "~2", "~3", ... in file order.
    seen: dict[str, int] = {}
    for doc in docs:
        count = seen[doc.doc_id] = seen.get(doc.doc_id, 0) + 1
        yield doc if count == 1 else replace(doc, doc_id=f"{doc.doc_id}~{count}")


def _tidy(text: str) -> str:
    """Expand tabs, drop trailing spaces and common indentation, keep at most one blank line in a row."""
    lines = [line.expandtabs().rstrip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", textwrap.dedent("\n".join(lines))).strip()


def _reflow(text: str) -> str:
    """Join hard-wrapped lines: paragraphs (blank-line separated) become single lines."""
    paragraphs = (" ".join(block.split()) for block in re.split(r"\n\s*\n", text))
    return "\n\n".join(p for p in paragraphs if p)


def _dpkg_version(package: str) -> str | None:
    try:
        result = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Abbrev}${Version}", package],
            capture_output=True, text=True, check=False,
        )
    except FileNotFoundError:  # not a dpkg-based system
        return None
    status, _, version = result.stdout.partition(" ")
    return version.strip() if result.returncode == 0 and status == "ii" else None


def _hash_files(paths: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for file in files:
            digest.update(str(file.relative_to(root.parent)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# python-docs and python-docstrings


def _python_docs_content() -> str:
    """sha256 (16 hex digits) of pydoc_data's topics, the text python-docs reads."""
    from pydoc_data.topics import topics

    return hashlib.sha256(json.dumps(topics, sort_keys=True).encode()).hexdigest()[:16]


def _read_python_docs(name: str) -> Iterator[Document]:
    from pydoc_data.topics import topics  # a plain dict of strings; importing it has no side effects

    for key in sorted(topics):
        text = _tidy(topics[key])
        if text:
            yield Document(doc_id=f"{name}:{key}", source=name, title=key, text=text)


# Test suites, IDLE and third-party packages are not the standard library's documentation.
_STDLIB_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "site-packages", "__pycache__"})


def _stdlib_modules(stdlib: Path) -> list[tuple[str, Path]]:
    """(dotted module name, file) for every importable .py file, sorted by path."""
    modules = []
    for dirpath, dirnames, filenames in os.walk(stdlib):
        # Non-identifier directories (lib-dynload, config-3.11-...) are not packages.
        dirnames[:] = [d for d in dirnames if d not in _STDLIB_SKIP_DIRS and d.isidentifier()]
        for filename in filenames:
            path = Path(dirpath, filename)
            if path.suffix == ".py" and path.stem.isidentifier():
                parts = path.relative_to(stdlib).with_suffix("").parts
                modules.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return sorted(modules, key=lambda item: item[1].relative_to(stdlib).as_posix())


def _stdlib_content(stdlib: Path) -> str:
    """sha256 (16 hex digits) of the relative paths and bytes of every file python-docstrings parses."""
    digest = hashlib.sha256()
    for _, path in _stdlib_modules(stdlib):
        name, data = path.relative_to(stdlib).as_posix().encode(), path.read_bytes()
        digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:16]


def _docstrings(node: ast.AST, qualname: str) -> Iterator[tuple[str, str]]:
    """(qualified name, raw docstring) for `node` and every class/function under it, in source order."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        docstring = ast.get_docstring(node, clean=False)
        if docstring:
            yield qualname, docstring
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _docstrings(child, f"{qualname}.{child.name}")
        elif isinstance(child, ast.stmt):  # defs nested in if/try/with blocks count too
            yield from _docstrings(child, qualname)


def _read_python_docstrings(name: str, stdlib: Path) -> Iterator[Document]:
    for module, path in _stdlib_modules(stdlib):
        try:
            with warnings.catch_warnings():  # invalid escape sequences in old code warn on parse
                warnings.simplefilter("ignore")
                tree = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError:  # a file written for another Python version: nothing to read
            continue
        for qualname, docstring in _docstrings(tree, module):
            text = _tidy(inspect.cleandoc(docstring))
            if len(text) >= MIN_DOCSTRING_CHARS:
                yield Document(doc_id=f"{name}:{qualname}", source=name, title=qualname, text=text,
                               group=f"{name}:{module}")


# ---------------------------------------------------------------------------------------------
# bible-kjv

# Book names as the `bible` program prints them -> OSIS abbreviations used in doc ids.
_BIBLE_BOOKS = dict(
    pair.split("=")
    for pair in (
        "Genesis=Gen, Exodus=Exod, Leviticus=Lev, Numbers=Num, Deuteronomy=Deut, Joshua=Josh, "
        "Judges=Judg, Ruth=Ruth, 1 Samuel=1Sam, 2 Samuel=2Sam, 1 Kings=1Kgs, 2 Kings=2Kgs, "
        "1 Chronicles=1Chr, 2 Chronicles=2Chr, Ezra=Ezra, Nehemiah=Neh, Esther=Esth, Job=Job, "
        "Psalms=Ps, Proverbs=Prov, Ecclesiastes=Eccl, Song of Solomon=Song, Isaiah=Isa, "
        "Jeremiah=Jer, Lamentations=Lam, Ezekiel=Ezek, Daniel=Dan, Hosea=Hos, Joel=Joel, Amos=Amos, "
        "Obadiah=Obad, Jonah=Jonah, Micah=Mic, Nahum=Nah, Habakkuk=Hab, Zephaniah=Zeph, Haggai=Hag, "
        "Zechariah=Zech, Malachi=Mal, Matthew=Matt, Mark=Mark, Luke=Luke, John=John, Acts=Acts, "
        "Romans=Rom, 1 Corinthians=1Cor, 2 Corinthians=2Cor, Galatians=Gal, Ephesians=Eph, "
        "Philippians=Phil, Colossians=Col, 1 Thessalonians=1Thess, 2 Thessalonians=2Thess, "
        "1 Timothy=1Tim, 2 Timothy=2Tim, Titus=Titus, Philemon=Phlm, Hebrews=Heb, James=Jas, "
        "1 Peter=1Pet, 2 Peter=2Pet, 1 John=1John, 2 John=2John, 3 John=3John, Jude=Jude, Revelation=Rev"
    ).split(", ")
)


def _read_bible(name: str, data: Path, program: Path) -> Iterator[Document]:
    # One call dumps the whole text in ~40 ms: a "Genesis 1" heading line per chapter, then one
    # "  <n> <verse>" line per verse; -l sets a line width wide enough that verses are not wrapped.
    dump = subprocess.run(
        [str(program), "-p", str(data.parent), "-d", data.name, "-l100000", "Gen1:1-Rev22:21"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=True,
    ).stdout
    for chapter in re.split(r"\n\n(?=\S)", dump.strip("\n")):
        heading, *verses = chapter.splitlines()
        book, number = heading.rsplit(" ", 1)
        text = "\n".join(verse.split(None, 1)[1] for verse in verses if verse.strip())
        yield Document(doc_id=f"{name}:{_BIBLE_BOOKS[book]}.{number}", source=name, title=heading, text=text)


# ---------------------------------------------------------------------------------------------
# fortunes

_OVERSTRIKE = re.compile(r".\x08")  # "_\bX" underlines X on a teletype
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_FORTUNE_PICTURES = frozenset({"ascii-art"})  # drawings, not text


def _mostly_words(text: str) -> bool:
    """At least half of the non-space characters are letters: prose, not ASCII art or line noise."""
    chars = "".join(text.split())
    return sum(c.isalpha() for c in chars) >= len(chars) / 2


def _read_fortunes(name: str, root: Path) -> Iterator[Document]:
    # Each cookie file is a list of entries separated by lines holding only "%"; next to it lie the
    # strfile index (.dat) and a .u8 symlink to the same file, both skipped.
    files = sorted(
        p for p in root.iterdir()
        if p.is_file() and not p.is_symlink() and p.suffix == "" and p.name not in _FORTUNE_PICTURES
    )
    for path in files:
        raw = _CONTROL.sub("", _OVERSTRIKE.sub("", path.read_text(encoding="utf-8", errors="replace")))
        for index, entry in enumerate(re.split(r"^%$", raw, flags=re.MULTILINE)):
            text = _tidy("\n".join(" ".join(line.split()) for line in entry.splitlines()))
            if text and _mostly_words(text):
                yield Document(doc_id=f"{name}:{path.name}:{index}", source=name, title=path.name, text=text)


# ---------------------------------------------------------------------------------------------
# dict-foldoc and dict-jargon (dictd format)

_DICTD_DIGITS = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(text: str) -> int:
    """dictd index numbers are base 64, most significant digit first, in the base64 alphabet."""
    value = 0
    for char in text:
        value = value * 64 + _DICTD_DIGITS[char]
    return value


def read_dictd(index: Path, dictionary: Path) -> Iterator[tuple[str, str]]:
    """(index headword, entry text) in index order; the 00-database-* metadata entries are skipped.

    Several headwords may point at the same entry (FOLDOC lists "kilo-" and "mega-" under one
    "prefix" entry): each entry is yielded once, under its first headword.
    """
    # .dict.dz is dictzip, which is gzip with a seek table in a header field: gzip reads it whole.
    data = gzip.decompress(dictionary.read_bytes())
    seen: set[tuple[int, int]] = set()
    for line in index.read_text(encoding="utf-8").splitlines():
        headword, offset, length = line.split("\t")
        span = (_dictd_number(offset), _dictd_number(length))
        if headword.startswith(("00-database-", "00database")) or span in seen:
            continue
        seen.add(span)
        yield headword, data[span[0] : span[0] + span[1]].decode("utf-8")


def _read_dict(name: str, index: Path, dictionary: Path) -> Iterator[Document]:
    for headword, entry in read_dictd(index, dictionary):
        # The entry's first line is its headword in display case (the index folds case); the
        # definition follows, hard-wrapped and indented, with {braces} around cross-references.
        title, _, definition = entry.strip("\n").partition("\n")
        if definition.strip():
            text = _reflow(re.sub(r"\{([^{}]*)\}", r"\1", entry))
            yield Document(doc_id=f"{name}:{headword}", source=name, title=title.strip() or headword, text=text)


# ---------------------------------------------------------------------------------------------
# debian-handbook and postgresql-doc-15 (HTML)

_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})
_BLOCKS = frozenset({
    "address", "blockquote", "dd", "div", "dl", "dt", "figure", "li", "ol", "p", "pre", "table", "tr", "ul",
    *_HEADINGS,
})
_SKIP_TAGS = frozenset({"head", "script", "style"})
_SKIP_CLASSES = frozenset({"toc", "docnav", "navheader", "navfooter"})  # tables of contents, navigation
_SKIP_IDS = frozenset({"banner"})  # the handbook's "Download the ebook" banner
# A heading inside an admonition ("Note", "Tip") titles the box, not a section of the page.
_ASIDE_CLASSES = frozenset({"note", "tip", "warning", "caution", "important", "sidebar", "example", "table", "figure"})


@dataclass
class _Section:
    number: int  # position in the page
    anchor: str | None  # the id an URL fragment would name
    heading: str
    body: str = ""

    @property
    def locator(self) -> str:
        return self.anchor or str(self.number)


class _HtmlSections(HTMLParser):
    """Splits one page into sections at h1-h6: visible text, paragraphs at block elements."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.title = ""
        self.sections: list[_Section] = []
        self._stack: list[tuple[str, str | None, frozenset[str]]] = []  # open elements: (tag, id, classes)
        self._skip_from: int | None = None  # stack depth of the element being skipped
        self._heading: list[str] | None = None  # text of the heading being read
        self._blocks: list[tuple[bool, list[str]]] = []  # (is <pre>, text pieces) of the section
        self._closed = True  # the next text starts a new block

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag in _VOID:
            if tag == "br" and self._skip_from is None:
                self._add("\n")
            return
        classes = frozenset((attr.get("class") or "").split())
        self._stack.append((tag, attr.get("id"), classes))
        if self._skip_from is None and (tag in _SKIP_TAGS or classes & _SKIP_CLASSES or attr.get("id") in _SKIP_IDS):
            self._skip_from = len(self._stack)
        if self._skip_from is not None:
            return
        if tag in _HEADINGS and not any(c & _ASIDE_CLASSES for _, _, c in self._stack):
            self._end_section()
            # The section's id is on an <a> inside the heading (handbook) or an enclosing <div> (PostgreSQL).
            anchor = next((i for _, i, _ in reversed(self._stack) if i), None)
            self.sections.append(_Section(len(self.sections), anchor, ""))
            self._heading = []
        elif tag == "a" and self._heading is not None and attr.get("id"):
            self.sections[-1].anchor = attr["id"]
        if tag in _BLOCKS:
            self._closed = True

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        # XHTML's <a id="x"/> and <br/>: an empty element, so a start tag that is closed at once.
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag not in (t for t, _, _ in self._stack):
            return  # stray end tag
        while self._stack.pop()[0] != tag:
            pass
        if self._skip_from is not None:
            if len(self._stack) < self._skip_from:
                self._skip_from = None
            return
        if tag in _HEADINGS and self._heading is not None:
            self.sections[-1].heading = " ".join("".join(self._heading).split())
            self._heading = None
        if tag in _BLOCKS:
            self._closed = True

    def handle_data(self, data: str) -> None:
        if self._stack and self._stack[-1][0] == "title":  # inside <head>, which is skipped
            self.title += data
        if self._skip_from is not None:
            return
        if self._heading is not None:
            self._heading.append(data)
        else:
            self._add(data)

    def close(self) -> None:
        super().close()
        self._end_section()
        self.title = " ".join(self.title.split())

    def _add(self, text: str) -> None:
        pre = any(tag == "pre" for tag, _, _ in self._stack)
        if not pre and text != "\n":  # source line breaks are spaces; only <br> (a lone "\n") breaks
            text = re.sub(r"\s+", " ", text)
        if self._closed or not self._blocks or self._blocks[-1][0] != pre:
            self._blocks.append((pre, []))
            self._closed = False
        self._blocks[-1][1].append(text)

    def _end_section(self) -> None:
        """Render the collected blocks into the current section (one before the first heading)."""
        paragraphs = []
        for pre, pieces in self._blocks:
            text = "".join(pieces)
            if pre:
                paragraphs.append(_tidy(text))
            else:  # a <br> survives as a line break; other whitespace collapses as in a browser
                paragraphs.append("\n".join(" ".join(line.split()) for line in text.split("\n")).strip())
        body = "\n\n".join(p for p in paragraphs if p)
        self._blocks = []
        if body and not self.sections:
            self.sections.append(_Section(0, None, ""))
        if body:
            self.sections[-1].body = body


def _html_sections(path: Path) -> tuple[str, list[_Section]]:
    """(page title, sections) of one HTML file; sections without a heading take the page title."""
    parser = _HtmlSections()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    for section in parser.sections:
        section.heading = section.heading or parser.title
    return parser.title, parser.sections


def _read_handbook(name: str, root: Path) -> Iterator[Document]:
    for path in sorted(root.glob("*.html")):
        _, sections = _html_sections(path)
        for section in sections:
            if len(section.body) >= MIN_SECTION_CHARS:
                doc_id = f"{name}:{path.name}#{section.locator}"
                yield Document(doc_id=doc_id, source=name, title=section.heading, text=section.body,
                               group=f"{name}:{path.name}")


def _group(items: list[_T], size: Callable[[_T], int], max_size: int) -> Iterator[list[_T]]:
    """Consecutive runs of items whose sizes add up to at most max_size (an oversized item stands alone)."""
    run: list[_T] = []
    total = 0
    for item in items:
        if run and total + size(item) > max_size:
            yield run
            run, total = [], 0
        run.append(item)
        total += size(item)
    if run:
        yield run


def _split_long(section: _Section, max_chars: int) -> Iterator[_Section]:
    """The section, or if its body is longer than max_chars, pieces of it cut between paragraphs."""
    # A cut may fall between blank-line separated parts of a <pre> block: _tidy re-dedents the piece.
    paragraphs = section.body.split("\n\n")
    for k, run in enumerate(_group(paragraphs, lambda p: len(p) + 2, max_chars)):
        body = _tidy("\n\n".join(run))
        if k == 0:
            yield replace(section, body=body)
        else:
            yield _Section(section.number, f"{section.locator}.{k}", f"{section.heading} (continued)", body)


def _read_postgres(name: str, root: Path) -> Iterator[Document]:
    for path in sorted(root.glob("*.html")):
        if path.name == "bookindex.html":  # the back-of-book index: a list of terms and links
            continue
        page_title, sections = _html_sections(path)
        pieces = [piece for section in sections for piece in _split_long(section, MAX_PAGE_CHARS)]
        for run in _group(pieces, lambda s: len(s.heading) + len(s.body) + 4, MAX_PAGE_CHARS):
            # The run's first heading is its title; later headings stay in the text for context.
            first, rest = run[0], run[1:]
            text = "\n\n".join(p for p in [first.body, *(f"{s.heading}\n\n{s.body}".strip() for s in rest)] if p)
            own_title = first is pieces[0] or first.heading.startswith(page_title)
            title = first.heading if own_title else f"{page_title}: {first.heading}"
            if len(text) >= MIN_SECTION_CHARS:
                yield Document(doc_id=f"{name}:{path.name}#{first.locator}", source=name, title=title, text=text,
                               group=f"{name}:{path.name}")


# ---------------------------------------------------------------------------------------------
# manpages-dev (troff)

_GLYPHS = {
    "aq": "'", "dq": '"', "oq": "\u2018", "cq": "\u2019", "lq": "\u201c", "rq": "\u201d", "em": "\u2014",
    "en": "\u2013", "hy": "-", "bu": "\u2022", "ha": "^", "ti": "~", "rs": "\\", "ga": "`", "ul": "_",
    "bv": "|", "lB": "[", "rB": "]", "lC": "{", "rC": "}", "la": "\u27e8", "ra": "\u27e9", "+-": "\u00b1",
    "mu": "\u00d7", "di": "\u00f7", "co": "\u00a9", "rg": "\u00ae", "tm": "\u2122", "sc": "\u00a7",
    "de": "\u00b0", ":A": "\u00c4", ":O": "\u00d6", ":U": "\u00dc", ":a": "\u00e4", ":o": "\u00f6",
    ":u": "\u00fc", "ss": "\u00df", "R": "\u00ae", "Tm": "\u2122",
}
_SIMPLE_ESCAPES = {"e": "\\", "\\": "\\", "-": "-", " ": " ", "~": " ", "0": " ", "t": " "}
_DROPPED_ESCAPES = frozenset("&:%|^){},/c")  # zero-width: break points, italic corrections, ...
_ESCAPE = re.compile(
    r"""\\(?:
        (?P<comment>".*)
      | \*?\((?P<glyph2>..)                   # \(em glyph, \*(lq string
      | \*?\[(?P<named>[^\]]*)\]              # \[em] glyph, \*[lq] string
      | \*(?P<string1>.)                       # \*R string
      | [fF](?:\(..|\[[^\]]*\]|.)              # font change
      | s[-+]?(?:\d+|\(\d\d|\[[^\]]*\])        # size change
      | (?P<char>.)
    )""",
    re.VERBOSE,
)
_REQUEST_ARG = re.compile(r'"((?:[^"]|"")*)"?|((?:\\.|[^\s\\])+)')
_FONT_MACROS_ALTERNATING = frozenset({"BR", "RB", "IR", "RI", "BI", "IB"})  # args joined without spaces
_FONT_MACROS = frozenset({"B", "I", "SM", "SB"})
_PARAGRAPH_MACROS = frozenset({"PP", "LP", "P", "sp", "TP", "IP", "HP", "RS", "RE", "EX", "EE", "TS", "TE"})
_LINE_BREAK_MACROS = frozenset({"br", "nf", "fi", "TQ"})


def _glyph(name: str) -> str:
    if re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):
        return chr(int(name[1:], 16))
    return _GLYPHS.get(name, "")


def _troff_inline(text: str) -> str:
    """Replace troff escapes in one line of text with the characters they print."""

    def escape(match: re.Match[str]) -> str:
        groups = match.groupdict()
        if groups["comment"] is not None:
            return ""
        for key in ("glyph2", "named", "string1"):
            if groups[key] is not None:
                return _glyph(groups[key])
        char = groups["char"]
        if char is None or char in _DROPPED_ESCAPES:  # font and size changes print nothing either
            return ""
        return _SIMPLE_ESCAPES.get(char, char)

    return _ESCAPE.sub(escape, text)


def _request_args(text: str) -> list[str]:
    """Arguments of a macro line: space separated, double quotes group, "" inside quotes is a quote."""
    return [
        match[1].replace('""', '"') if match[1] is not None else match[2]
        for match in _REQUEST_ARG.finditer(text)
    ]


class _ManText:
    """Output of the troff converter: paragraphs of lines."""

    def __init__(self) -> None:
        self.paragraphs: list[str] = []
        self.lines: list[str] = []
        self.line = ""
        self.glue = False  # the previous input line ended in \c: join without a space

    def add(self, text: str) -> None:
        if text:
            self.line = self.line + text if self.glue or not self.line else f"{self.line} {text}"
        self.glue = False

    def line_break(self) -> None:
        if self.line.strip():
            self.lines.append(self.line.rstrip())
        self.line = ""

    def paragraph_break(self) -> None:
        self.line_break()
        if self.lines:
            self.paragraphs.append("\n".join(self.lines))
        self.lines = []

    def text(self) -> str:
        self.paragraph_break()
        return "\n\n".join(self.paragraphs)


class _TroffConverter:
    """Feeds troff source line by line into a _ManText, tracking fill mode and tbl tables."""

    def __init__(self) -> None:
        self.out = _ManText()
        self.fill = True  # False inside .nf/.EX: input lines stay output lines
        self.table: str | None = None  # inside .TS: "format" for layout lines, then "data"
        self.in_cell = False  # inside a multi-line table cell, T{ ... T}
        self.after_text: Callable[[], None] | None = None  # break to make after the next text
        self.url = ""

    def feed(self, raw: str) -> None:
        glue = raw.endswith("\\c")
        line = raw[:-2] if glue else raw
        if self.table == "format":
            # Layout lines (an optional "options;" line, then column formats ending in "."): not text.
            if line.rstrip().endswith("."):
                self.table = "data"
            return
        if line.startswith((".", "'")):
            name, _, rest = line[1:].strip().partition(" ")
            text = self._request(name, _request_args(rest))
        elif self.table == "data":
            text = self._table_row(line)
        elif not line.strip():
            self.out.paragraph_break()
            return
        else:
            if self.fill and line.startswith(" "):  # a leading space breaks the line, as in troff
                self.out.line_break()
            text = _troff_inline(line)
            text = " ".join(text.split()) if self.fill else text.rstrip()
        if text is None:
            return
        self.out.add(text)
        self.out.glue = glue
        if glue:
            return
        if self.after_text is not None:
            self.after_text()
            self.after_text = None
        elif (self.table == "data" and not self.in_cell) or (not self.fill and self.table is None):
            self.out.line_break()

    def _request(self, name: str, args: list[str]) -> str | None:
        """Handle one macro or request; return the text it prints, if any."""
        if name in _FONT_MACROS_ALTERNATING:
            return _troff_inline("".join(args))
        if name in _FONT_MACROS and args:
            return _troff_inline(" ".join(args))
        if name == "UE":  # end of a hyperlink: print the URL, then any punctuation glued to it
            self.out.add(f"<{_troff_inline(self.url)}>")
            self.out.glue = True
            return _troff_inline("".join(args))
        if name in _PARAGRAPH_MACROS or name in ("SH", "SS"):
            self.out.paragraph_break()
        elif name in _LINE_BREAK_MACROS:
            self.out.line_break()
        self.fill = {"nf": False, "EX": False, "fi": True, "EE": True}.get(name, self.fill)
        if name in ("TS", "T&"):  # a table, or a table changing its layout: format lines follow
            self.table, self.in_cell = "format", False
        elif name == "TE":
            self.table = None
        elif name == "UR":
            self.url = args[0] if args else ""
        elif name in ("SH", "SS"):
            if args:
                self.out.add(_troff_inline(" ".join(args)))
                self.out.paragraph_break()
            else:  # the heading is on the next line
                self.after_text = self.out.paragraph_break
        elif name in ("TP", "TQ"):  # the next line is the tag, on a line of its own
            self.after_text = self.out.line_break
        elif name == "IP" and args:  # ".IP \[bu] 2": the tag starts the paragraph
            self.out.add(_troff_inline(args[0]))
        return None

    def _table_row(self, line: str) -> str | None:
        """Text of one tbl data line: cells are tab separated, T{ ... T} spans several lines."""
        if not self.in_cell and re.fullmatch(r"[_=\s]*", line):  # horizontal rules
            return None
        if line.startswith("T}"):
            self.in_cell, line = False, line[2:]
        if line.rstrip().endswith("T{"):
            self.in_cell, line = True, line.rstrip()[:-2]
        return " | ".join(_troff_inline(cell).strip() for cell in line.split("\t")).strip()


def troff_to_text(source: str) -> str:
    """Plain text of a man page in troff source (man macros, simple tbl tables).

    Comments and formatting requests vanish; headings, paragraphs, tagged lists and font-macro
    text remain; no-fill blocks (.nf, .EX) keep their lines; table cells are joined with " | ".
    """
    converter = _TroffConverter()
    # A backslash at the end of a line (an odd number of them) continues the line on the next.
    source = re.sub(r"(?<!\\)((?:\\\\)*)\\\n", r"\1", source)
    for line in source.splitlines():
        converter.feed(line)
    return converter.out.text()


def _read_manpages(name: str, file_list: Path) -> Iterator[Document]:
    # dpkg's list of the package's files keeps out section-3 pages of other -dev packages (X11,
    # libtiff, perl, ...) that share /usr/share/man/man3. Symlinks are aliases of other pages;
    # so are ".so" pages, which convert to empty text.
    pages = sorted(
        path
        for path in map(Path, file_list.read_text(encoding="utf-8").splitlines())
        if path.parent.name in ("man2", "man3") and path.suffix == ".gz" and path.is_file() and not path.is_symlink()
    )
    for path in pages:
        page, section = path.with_suffix("").name.rsplit(".", 1)
        text = troff_to_text(gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace"))
        if text:
            yield Document(
                doc_id=f"{name}:{path.parent.name}/{page}.{section}", source=name, title=f"{page}({section})", text=text
            )


# ---------------------------------------------------------------------------------------------
# mythes-en-us

# MyThes marks related words with a parenthesised relation; WordNet's terms become plain English.
_RELATIONS = {
    "generic term": "a kind of", "similar term": "similar to", "related term": "related to", "antonym": "opposite of"
}
_PARTS_OF_SPEECH = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}
_RELATION_SUFFIX = re.compile(r"^(.*) \((" + "|".join(_RELATIONS) + r")\)$")


def _thesaurus_sense(fields: list[str]) -> str:
    """'(noun)|a|b|c (generic term)' -> 'noun: a, b; a kind of: c'; '' if the sense lists no words."""
    tag = fields[0].strip("()")
    pos = _PARTS_OF_SPEECH.get(tag, tag)
    groups: dict[str, list[str]] = {"": []}
    for word in fields[1:]:
        match = _RELATION_SUFFIX.match(word)
        relation, word = (_RELATIONS[match[2]], match[1]) if match else ("", word)
        groups.setdefault(relation, []).append(word)
    parts = [", ".join(groups.pop(""))] + [f"{relation}: {', '.join(words)}" for relation, words in groups.items()]
    words = "; ".join(p for p in parts if p)
    return f"{pos}: {words}" if words else ""


def _read_mythes(name: str, data: Path) -> Iterator[Document]:
    # The file: an encoding line ("UTF-8" for this thesaurus), then per headword "word|n"
    # followed by n "(pos)|syn|syn..." lines.
    with data.open(encoding="utf-8") as lines:
        next(lines)
        for header in lines:
            word, count = header.rstrip("\n").rsplit("|", 1)
            senses = [_thesaurus_sense(next(lines).rstrip("\n").split("|")) for _ in range(int(count))]
            senses = [sense for sense in senses if sense]
            if senses:
                yield Document(doc_id=f"{name}:{word}", source=name, title=word, text="\n".join([word, *senses]))


# ---------------------------------------------------------------------------------------------
# The registry


def _dictd_source(database: str) -> Source:
    """dict-<database>: the index and dictionary files that Debian package dict-<database> installs."""
    name = f"dict-{database}"
    files = (DICTD_DIR / f"{database}.index", DICTD_DIR / f"{database}.dict.dz")
    return Source(name, tuple((name, path) for path in files), _read_dict)


SOURCES: dict[str, Source] = {
    source.name: source
    for source in (
        Source("python-docs", (), _read_python_docs, _python_docs_content),
        Source("python-docstrings", ((None, STDLIB_DIR),), _read_python_docstrings, _stdlib_content),
        Source("bible-kjv", (("bible-kjv-text", BIBLE_DATA), ("bible-kjv", BIBLE_PROGRAM)), _read_bible),
        Source("fortunes", (("fortunes", FORTUNES_DIR),), _read_fortunes),
        _dictd_source("foldoc"),
        _dictd_source("jargon"),
        Source("debian-handbook", (("debian-handbook", HANDBOOK_DIR),), _read_handbook),
        Source("postgresql-doc-15", (("postgresql-doc-15", POSTGRES_DOC_DIR),), _read_postgres),
        Source("manpages-dev", (("manpages-dev", DPKG_INFO_DIR / "manpages-dev.list"),), _read_manpages),
        Source("mythes-en-us", (("mythes-en-us", MYTHES_FILE),), _read_mythes),
    )
}
SOURCE_NAMES: tuple[str, ...] = tuple(SOURCES)
