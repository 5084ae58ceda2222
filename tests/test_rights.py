"""Rights notes: Debian copyright files (DEP-5 and free text) and Python's own licence."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedlab.sources import builtin
from embedlab.sources.rights import debian_copyright, python_docs_rights, rights_for_builtin

DEP5 = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: wordlist
Source: https://example.org/wordlist/
Comment: Repacked without the
 non-free appendix.

# Comments are not fields.
Files: *
Copyright: 2001-2010 Ada Lovelace <ada@example.org>
           2011 Charles Babbage
License: GPL-2+
 This program is free software;
 .
 see /usr/share/common-licenses/GPL-2.

Files: debian/*
       extra/*.txt
Copyright: 2020 Debian Maintainer <dm@example.org>
License: MIT or Expat

License: MIT
 Permission is hereby granted...
"""

FREE_TEXT = """\
This package was debianized by Someone <someone@example.org>.

It was downloaded from ftp://example.org/pub/words.

Copyright (C) 1993 Word Smith
The copyright holder is unknown for the appendix.

License: you may copy this file at will.

On Debian systems the GPL is in /usr/share/common-licenses/GPL-2.
""" + "".join(f"filler line {n}\n" for n in range(30))


def write_copyright(doc_root: Path, package: str, text: str) -> Path:
    path = doc_root / package / "copyright"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_dep5_fields_licenses_and_copyright_lines(tmp_path):
    """A DEP-5 file gives header fields, each Files paragraph's licence and copyright lines, and flat unique lists."""
    path = write_copyright(tmp_path, "wordlist", DEP5)
    rights = debian_copyright("wordlist", doc_root=tmp_path)
    assert rights == {
        "package": "wordlist",
        "copyright_file": str(path),
        "format": "dep5",
        "licenses": ["GPL-2+", "MIT or Expat"],
        "copyright": ["2001-2010 Ada Lovelace <ada@example.org>", "2011 Charles Babbage",
                      "2020 Debian Maintainer <dm@example.org>"],
        "files": [
            {"files": "*", "license": "GPL-2+",
             "copyright": ["2001-2010 Ada Lovelace <ada@example.org>", "2011 Charles Babbage"]},
            {"files": "debian/* extra/*.txt", "license": "MIT or Expat",
             "copyright": ["2020 Debian Maintainer <dm@example.org>"]},
        ],
        "upstream": "wordlist",
        "source_url": "https://example.org/wordlist/",
        "notes": "Repacked without the\nnon-free appendix.",
    }


def test_free_text_falls_back_to_notes_and_heuristics(tmp_path):
    """A file without a DEP-5 header gives its first 20 lines, dated copyright lines and common-licenses names."""
    write_copyright(tmp_path, "words", FREE_TEXT)
    rights = debian_copyright("words", doc_root=tmp_path)
    assert rights["format"] == "free-text"
    assert rights["copyright"] == ["Copyright (C) 1993 Word Smith"]
    assert rights["licenses"] == ["GPL-2"]
    notes = rights["notes"].splitlines()
    assert len(notes) == 20 and notes[0].startswith("This package was debianized") and notes[-1] == "filler line 13"
    assert (rights["upstream"], rights["source_url"], rights["files"]) == (None, None, [])


def test_missing_copyright_file_is_reported_not_raised(tmp_path):
    """A package without a copyright file gives copyright_file None and a note."""
    rights = debian_copyright("not-installed", doc_root=tmp_path)
    assert rights["package"] == "not-installed"
    assert rights["copyright_file"] is None
    assert rights["notes"] == "no copyright file found"
    assert rights["licenses"] == []


@pytest.mark.parametrize(
    ("package", "fmt", "key", "expected"),
    [
        ("fortunes", "free-text", "copyright", "Copyright (c) 1991 The Regents of the University of California."),
        ("bible-kjv-text", "free-text", "licenses", "GPL-2"),
        ("dict-jargon", "dep5", "licenses", "public-domain"),
        ("manpages-dev", "dep5", "licenses", "GPL-2+"),
    ],
)
def test_installed_debian_packages(package, fmt, key, expected):
    """The real copyright files of installed packages parse to the expected format and content."""
    if not Path("/usr/share/doc", package, "copyright").is_file():
        pytest.skip(f"Debian package {package} is not installed")
    rights = debian_copyright(package)
    assert rights["format"] == fmt
    assert expected in rights[key]


def test_python_docs_rights_name_the_psf_license():
    """Python's documentation is under the PSF License; the licence file is recorded when the install has one."""
    rights = python_docs_rights()
    assert rights["package"] is None
    assert rights["licenses"] == ["PSF-2.0"]
    assert any("Python Software Foundation" in line for line in rights["copyright"])
    license_file = builtin.STDLIB_DIR / "LICENSE.txt"
    if license_file.is_file():
        assert rights["copyright_file"] == str(license_file)
        assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in license_file.read_text(encoding="utf-8")


def test_python_docs_rights_without_license_file(monkeypatch, tmp_path):
    """Without LICENSE.txt the licence is still PSF-2.0 and copyright_file is None."""
    monkeypatch.setattr(builtin, "STDLIB_DIR", tmp_path)
    rights = python_docs_rights()
    assert (rights["copyright_file"], rights["format"], rights["licenses"]) == (None, None, ["PSF-2.0"])


@pytest.mark.parametrize("name", builtin.SOURCE_NAMES)
def test_rights_for_every_builtin_source(name):
    """Every built-in source gets notes for its Debian package, or Python's licence for the Python sources."""
    rights = rights_for_builtin(name)
    assert rights["source"] == name
    assert rights["package"] == builtin.debian_package(name)
    if rights["package"] is None:
        assert rights["licenses"] == ["PSF-2.0"]
    else:
        assert rights["copyright_file"] is None or rights["format"] in ("dep5", "free-text")


def test_rights_for_unknown_source():
    """An unknown source name is a ValueError listing the valid ones."""
    with pytest.raises(ValueError, match="valid names"):
        rights_for_builtin("no-such-source")
