"""Comments and docstrings name only documents that exist in the repository.

A reference to a notes file or a specification kept outside the repository sends a reader
nowhere: every `*.md` named in the sources, tests, study files and worker files must be a
file of this repository, unless it is one that embedlab itself writes into a run or data
directory (`RUNTIME_DOCUMENTS`).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("platform", "tests", "ablations", "workers", "dashboards", "docs")
# Markdown files embedlab writes at run time, named in the code that writes or reads them.
RUNTIME_DOCUMENTS = frozenset({"data_card.md", "report.md"})
REFERENCE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")
# A source file named by its path (`sweep/run.py`, `ablations/recipe.py`), from the repository
# root or the package; a path under a placeholder such as RUN_DIR/ is a run's file, not ours.
SOURCE_PATH = re.compile(r"(?<![\w/.$-])((?:[a-z_][\w.-]*/)+[\w-]+\.(?:py|sh))\b")
PACKAGE_ROOTS = (REPO, REPO / "platform", REPO / "platform" / "embedlab", REPO / "tests")


def _sources() -> list[Path]:
    files = [REPO / "Makefile", REPO / "pyproject.toml", REPO / "README.md"]
    for folder in SCANNED:
        files += [p for p in (REPO / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix in (".py", ".sh", ".toml", ".md", ".json", "")]
    return files


def test_every_markdown_file_a_source_names_exists_in_the_repository():
    present = {p.relative_to(REPO).as_posix() for p in REPO.rglob("*.md") if ".git" not in p.parts}
    names = {Path(p).name for p in present}
    missing = []
    for path in _sources():
        for match in REFERENCE.finditer(path.read_text(errors="replace")):
            reference = match.group(1)
            # A path is from the repository root or, as a docs page links, from the naming file's folder.
            beside = (path.parent / reference).resolve()
            found = (reference in present or (beside.is_relative_to(REPO) and beside.relative_to(REPO).as_posix()
                                              in present)) if "/" in reference else reference in names
            if not found and reference not in RUNTIME_DOCUMENTS:
                missing.append(f"{path.relative_to(REPO)}: {reference}")
    assert not missing, "documents named but not in the repository:\n" + "\n".join(sorted(set(missing)))


def test_every_source_path_a_comment_names_exists():
    """A path to a .py or .sh file named in the sources, docs or README exists, from the
    repository root or the package (`sweep/run.py` is `platform/embedlab/sweep/run.py`)."""
    missing = []
    for path in _sources():
        for match in SOURCE_PATH.finditer(path.read_text(errors="replace")):
            reference = match.group(1)
            if not any((root / reference).exists() for root in PACKAGE_ROOTS):
                missing.append(f"{path.relative_to(REPO)}: {reference}")
    assert not missing, "source paths named but not in the repository:\n" + "\n".join(sorted(set(missing)))
