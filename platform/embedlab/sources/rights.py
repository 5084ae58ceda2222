"""Rights and attribution notes for the built-in sources, read from the machine they come from.

Debian ships every package's copyright statement as /usr/share/doc/<package>/copyright,
either machine-readable (DEP-5: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/)
or free text. Python ships its licence as LICENSE.txt next to the standard library. Every
function here returns a dict of the same shape, ready for a corpus manifest:

    package         the Debian package, or None for Python's own documentation
    copyright_file  the file read, or None if there is none
    format          "dep5", "free-text", or None without a file
    licenses        licence short names (DEP-5: each Files paragraph's License expression, first
                    seen first; free text: licences named by a /usr/share/common-licenses path)
    copyright       copyright lines (DEP-5: every Copyright line; free text: lines that state a
                    copyright and a year)
    files           DEP-5: one {"files", "license", "copyright"} entry per Files paragraph; else []
    upstream        DEP-5 Upstream-Name
    source_url      DEP-5 Source
    notes           DEP-5 header Comment/Disclaimer; free text: its first lines; else why not

These are notes to help a person check the terms, not legal advice: a free-text file is
summarised by heuristics, and a DEP-5 file may cover more than the text a source reads
(mythes-en-us's file covers every LibreOffice dictionary; use `files` to find the right one).
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from embedlab.sources import builtin

FREE_TEXT_NOTE_LINES = 20

_COMMON_LICENSE = re.compile(r"/usr/share/common-licenses/([A-Za-z0-9+.-]*[A-Za-z0-9+])")
_COPYRIGHT_WORD = re.compile(r"copyright|©|\(c\)", re.IGNORECASE)
_YEAR = re.compile(r"\b(?:1[89]|20)\d\d\b")

# From LICENSE.txt, "B. TERMS AND CONDITIONS FOR ACCESSING OR OTHERWISE USING PYTHON".
_PYTHON_NOTES = (
    "Python software and documentation are licensed under the Python Software Foundation License "
    "Version 2; since Python 3.8.6, examples, recipes and other code in the documentation are dual "
    "licensed under the PSF License Version 2 and the Zero-Clause BSD license (0BSD). Some software "
    "incorporated into Python is under other licenses, listed in the license file."
)

Paragraph = dict[str, list[str]]


def debian_copyright(package: str, doc_root: str | Path = "/usr/share/doc") -> dict[str, Any]:
    """The rights notes in a Debian package's copyright file; a missing file is reported, not raised."""
    path = Path(doc_root, package, "copyright")
    if not path.is_file():
        return _rights(package, notes="no copyright file found")
    # errors="replace": some old copyright files are Latin-1, and a notes dict must not fail on that.
    text = path.read_text(encoding="utf-8", errors="replace")
    paragraphs = _deb822_paragraphs(text)
    if paragraphs and _is_dep5_header(paragraphs[0]):
        return _dep5_rights(package, path, paragraphs)
    return _free_text_rights(package, path, text)


def python_docs_rights() -> dict[str, Any]:
    """Rights notes for python-docs and python-docstrings: the PSF License of this Python installation."""
    license_file = builtin.STDLIB_DIR / "LICENSE.txt"
    present = license_file.is_file()
    return _rights(
        None,
        copyright_file=str(license_file) if present else None,
        format="free-text" if present else None,
        licenses=["PSF-2.0"],
        copyright=[line.strip() for line in sys.copyright.splitlines() if line.strip()],
        upstream=f"Python {platform.python_version()}",
        source_url="https://www.python.org/",
        notes=_PYTHON_NOTES,
    )


def rights_for_builtin(name: str) -> dict[str, Any]:
    """Rights notes for a built-in source (ValueError for an unknown name), with the source's name."""
    package = builtin.debian_package(name)
    rights = python_docs_rights() if package is None else debian_copyright(package)
    return {"source": name, **rights}


def _rights(package: str | None, **found: Any) -> dict[str, Any]:
    """The common shape: every key present, whatever the file had."""
    empty: dict[str, Any] = {"copyright_file": None, "format": None, "licenses": [], "copyright": [], "files": [],
                             "upstream": None, "source_url": None, "notes": None}
    return {"package": package, **empty, **found}


# ---------------------------------------------------------------------------------------------
# DEP-5


def _deb822_paragraphs(text: str) -> list[Paragraph]:
    """Paragraphs of a deb822 file: lower-cased field name -> value lines (first line, then continuations).

    A continuation line of just "." stands for an empty line. Comment lines ("#") are dropped,
    and so is any line that is neither a field nor a continuation: free text parses to junk
    paragraphs, which `_is_dep5_header` then rejects.
    """
    paragraphs: list[Paragraph] = []
    current: Paragraph = {}
    value: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if current:
                paragraphs.append(current)
            current, value = {}, None
        elif line[0] in " \t":
            if value is not None:
                stripped = line.strip()
                value.append("" if stripped == "." else stripped)
        else:
            name, colon, first = line.partition(":")
            if colon:
                value = current[name.strip().lower()] = [first.strip()]
    if current:
        paragraphs.append(current)
    return paragraphs


def _is_dep5_header(paragraph: Paragraph) -> bool:
    # Format names the spec: ".../copyright-format/1.0/", or a draft's ".../deps/dep5" URL.
    format_url = " ".join(paragraph.get("format", []))
    return "copyright-format" in format_url or "dep5" in format_url


def _joined(paragraph: Paragraph, name: str, sep: str = " ") -> str | None:
    text = sep.join(line for line in paragraph.get(name, []) if line)
    return text or None


def _dep5_rights(package: str, path: Path, paragraphs: list[Paragraph]) -> dict[str, Any]:
    header = paragraphs[0]
    files: list[dict[str, Any]] = [
        {
            "files": " ".join(" ".join(p["files"]).split()),
            "license": p.get("license", [""])[0],  # the short name; continuation lines are the text
            "copyright": [line for line in p.get("copyright", []) if line],
        }
        for p in paragraphs[1:]
        if "files" in p
    ]
    notes = [text for text in (_joined(header, "comment", "\n"), _joined(header, "disclaimer", "\n")) if text]
    return _rights(
        package,
        copyright_file=str(path),
        format="dep5",
        licenses=_unique(entry["license"] for entry in files if entry["license"]),
        copyright=_unique(line for entry in files for line in entry["copyright"]),
        files=files,
        upstream=_joined(header, "upstream-name"),
        source_url=_joined(header, "source"),
        notes="\n".join(notes) or None,
    )


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# ---------------------------------------------------------------------------------------------
# Free text


def _free_text_rights(package: str, path: Path, text: str) -> dict[str, Any]:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return _rights(
        package,
        copyright_file=str(path),
        format="free-text",
        licenses=_unique(_COMMON_LICENSE.findall(text)),
        copyright=_unique(line for line in lines if _COPYRIGHT_WORD.search(line) and _YEAR.search(line)),
        notes="\n".join(lines[:FREE_TEXT_NOTE_LINES]),
    )
