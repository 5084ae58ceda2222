"""Held-out retrieval tasks: real English text that is not in the built-in training corpus.

They measure how a trained encoder transfers to text it never saw. Each is built from files a
Debian package installs, read locally:

    debian-packages    query: a package's one-line synopsis; document: its long description,
                       from the dpkg status file (the packages installed on this machine; the
                       built-in corpus's own packages, and any built from the same Debian
                       source, are left out)
    gnu-info           query: an Info node's section heading (its number dropped, the node
                       name when it has none); document: the node's text without heading
                       and menu; the manuals of coreutils, diffutils, findutils, grep, gzip
                       and sed (all Essential packages); Top, index and licence nodes skipped
    devils-dictionary  query: a term of Ambrose Bierce's Devil's Dictionary (dict-devil,
                       dictd format); document: its definition, headword and part of speech
                       removed

Construction, the same for every task and deterministic for the same input files:

1. The reader turns the source into candidate items (id, query, document). An exact
   duplicate document (normalised text) keeps only its first copy; a query shared by two
   items (case-insensitively) would have an arbitrary answer, so neither becomes a query.
2. Every candidate, query and document, is audited against the training text (the built-in
   corpus's documents, every split: all of it is training-adjacent) with the repository's
   contamination audit (exact, contained, near, shared-window: `embedlab.contamination.audit`). Its
   shared-window rule (any run of 10 words in common) matters here: `fortunes` quotes
   Bierce's definitions shortened or lightly edited, which whole-item containment and
   near-duplicate Jaccard miss. An item with any finding is removed whole, query and
   document, and the removal (its strongest finding) is recorded in `decontamination.json`.
3. Of the clean items with a usable query, the `max_queries` with the smallest
   sha256(task:item id) become queries, each with its own document as the one relevant
   document of split "test"; every other clean item's document stays as a distractor.

Because step 2 covers every document the task can hold (distractors included), an audit
of the written task finds nothing. Each task directory holds the BEIR files
(`embedlab.core.beir`), `sources.json` (packages and versions, files with their sha256,
the builder's code revision, sizes) and `decontamination.json`. debian-packages depends on
what is installed: its `sources.json` records the status file's sha256.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path


from embedlab.contamination.audit import Finding, MATCH_KINDS, SHARED_WINDOW, WINDOW_WORDS, audit
from embedlab.core.beir import REQUIRED_SPLIT, Task, write_task
from embedlab.core.code_identity import VERSION
from embedlab.core.config import DataConfig
from embedlab.core.errors import UsageError, UserError
from embedlab.core.store import file_sha256
from embedlab.core.code_identity import code_revision
from embedlab.sources import builtin
from embedlab.sources.builtin import read_dictd
from embedlab.sources.document import document_text, normalise_text

DPKG_STATUS = Path("/var/lib/dpkg/status")
INFO_DIR = Path("/usr/share/info")
DEVIL_INDEX = Path("/usr/share/dictd/devil.index")
DEVIL_DICTIONARY = Path("/usr/share/dictd/devil.dict.dz")
# (Debian package, manual): GNU manuals every Debian system has, their packages being Essential.
INFO_MANUALS = (
    ("coreutils", "coreutils"), ("diffutils", "diffutils"), ("findutils", "find"),
    ("grep", "grep"), ("gzip", "gzip"), ("sed", "sed"),
)

MAX_QUERIES = 500
MIN_QUERIES = 200
SOURCES_FILE = "sources.json"
DECONTAMINATION_FILE = "decontamination.json"
# The package's files whose code decides a task's bytes (see `embedlab.core.code_identity.code_revision`).
BUILD_SOURCES = (
    "tasks/heldout.py", "core/beir.py", "contamination/audit.py", "sources/dedup.py", "sources/document.py",
    "sources/builtin.py",
)


class HeldoutSourceMissing(UserError, FileNotFoundError):
    """A held-out task's source file is missing; the message names the Debian package."""


@dataclass(frozen=True)
class Item:
    """One candidate: a query and the document that answers it."""

    item_id: str
    query: str
    document: str


@dataclass(frozen=True)
class Reading:
    """What a reader made of its files: the candidates, and every file it read (for provenance)."""

    items: list[Item]
    files: list[Path]


@dataclass(frozen=True, kw_only=True)
class HeldoutSource:
    """A held-out task's recipe: the (Debian package, path) pairs it needs and a reader.

    `read(*paths)` gets the paths in `needs` order. `at(...)` points the same recipe at other
    files (tests); `replace(source, min_queries=...)` changes the size bounds.
    """

    name: str
    query: str  # what a query is, in a few words (recorded and printed)
    document: str  # what a document is
    needs: tuple[tuple[str, Path], ...]
    read: Callable[..., Reading]
    max_queries: int = MAX_QUERIES
    min_queries: int = MIN_QUERIES

    @property
    def paths(self) -> tuple[Path, ...]:
        return tuple(path for _, path in self.needs)

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(package for package, _ in self.needs))

    def at(self, *paths: Path) -> HeldoutSource:
        if len(paths) != len(self.needs):
            raise ValueError(f"{self.name} reads {len(self.needs)} path(s), got {len(paths)}")
        return replace(self, needs=tuple((pkg, Path(p)) for (pkg, _), p in zip(self.needs, paths, strict=True)))

    def check(self) -> None:
        """HeldoutSourceMissing, naming the package to install, if a needed file is missing."""
        for package, path in self.needs:
            if not path.exists():
                raise HeldoutSourceMissing(
                    f"held-out task {self.name!r}: {path} is missing; install the Debian package {package} "
                    f"(apt-get install {package}; if it is installed, a dpkg path-exclude in "
                    f"/etc/dpkg/dpkg.cfg.d/ may keep the file out)"
                )


@dataclass(frozen=True)
class TrainingText:
    """What the tasks are audited against: `pairs()` gives (id, text) pairs, read once per call;
    `description` is recorded with each task."""

    description: dict
    pairs: Callable[[], Iterable[tuple[str, str]]]


# --- debian-packages -----------------------------------------------------------------------

MIN_DESCRIPTION_CHARS = 80


def deb822_stanzas(text: str) -> Iterator[dict[str, list[str]]]:
    """Field name -> [first line, continuation lines...] for each blank-line separated stanza."""
    stanza: dict[str, list[str]] = {}
    field = None
    for line in text.splitlines():
        if not line.strip():
            if stanza:
                yield stanza
            stanza, field = {}, None
        elif line[0] in " \t" and field is not None:
            stanza[field].append(line)
        elif ":" in line:
            field, _, value = line.partition(":")
            stanza[field] = [value.strip()]
    if stanza:
        yield stanza


def long_description(lines: list[str]) -> str:
    """Debian policy 5.6.13: " ." is a blank line, lines after two spaces are verbatim, the rest
    are filled; filled lines are joined into one line per paragraph."""
    paragraphs: list[list[str]] = [[]]
    filled = False  # whether the last line of the current paragraph can take more words
    for line in lines:
        body = line[1:] if line[:1] in " \t" else line
        if body.strip() == ".":
            paragraphs.append([])
            filled = False
        elif body.startswith((" ", "\t")):
            paragraphs[-1].append(body.strip())
            filled = False
        else:
            if filled:
                paragraphs[-1][-1] += " " + body.strip()
            else:
                paragraphs[-1].append(body.strip())
            filled = True
    return "\n\n".join("\n".join(p) for p in paragraphs if p)


def corpus_packages() -> frozenset[str]:
    """The Debian packages behind the built-in corpus, and the one that holds Python's stdlib."""
    packages = {pkg for source in builtin.SOURCES.values() for pkg in source.packages}
    owner = _owning_package(builtin.STDLIB_DIR / "os.py")
    return frozenset(packages | ({owner} if owner else set()))


def _owning_package(path: Path) -> str | None:
    try:
        result = subprocess.run(["dpkg-query", "-S", str(path.resolve())], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    if result.returncode != 0:
        return None
    return result.stdout.split(":", 1)[0].strip() or None


def read_dpkg_status(status: Path, excluded: frozenset[str] | None = None) -> Reading:
    """Installed packages with a long description, minus `excluded` packages (default: the
    corpus's) and every package built from the same Debian source as one of them."""
    excluded = corpus_packages() if excluded is None else excluded
    stanzas = [s for s in deb822_stanzas(status.read_text(encoding="utf-8")) if _installed(s)]
    excluded_sources = {_source_package(s) for s in stanzas if s["Package"][0] in excluded} | set(excluded)
    items = []
    for stanza in stanzas:
        if stanza["Package"][0] in excluded or _source_package(stanza) in excluded_sources:
            continue
        if "Description" not in stanza:
            continue
        synopsis, *rest = stanza["Description"]
        text = long_description(rest)
        if len(text) >= MIN_DESCRIPTION_CHARS and len(synopsis.split()) >= 2:
            architecture = stanza.get("Architecture", ["all"])[0]
            items.append(Item(f"{stanza['Package'][0]}:{architecture}", synopsis, text))
    return Reading(sorted(items, key=lambda i: i.item_id), [status])


def _installed(stanza: dict[str, list[str]]) -> bool:
    return "Package" in stanza and stanza.get("Status", [""])[0].split()[-1:] == ["installed"]


def _source_package(stanza: dict[str, list[str]]) -> str:
    """The Source field without its version ("glibc (2.36-9)" -> "glibc"), else the package."""
    return stanza.get("Source", stanza["Package"])[0].split()[0]


# --- gnu-info ------------------------------------------------------------------------------

MIN_NODE_CHARS = 200
_NODE_SEPARATOR = "\x1f"
_INDEX_MARKER = "\x00\x08[index\x00\x08]"
_UNDERLINE = re.compile(r"[*=\-.]{3,}")
# "2.1 ", "A.1 ", "Appendix A ": not "A " alone, which starts headings such as "A Sample Session".
_SECTION_NUMBER = re.compile(r"^(?:\d+(?:\.\d+)*|[A-Z](?:\.\d+)+|Appendix\s+[A-Z](?:\.\d+)*)\.?\s+")
_MENU_ENTRY = re.compile(r"^\* ")
_SKIPPED_NODES = frozenset({"Top"})
_LICENCE = re.compile(r"\b(License|Licence|Copying)\b")


def info_files(main: Path) -> list[Path]:
    """The manual's files: `main`, then the subfiles its Indirect table lists (find.info-1.gz ...)."""
    text = _read_info(main)
    table = re.search(r"\x1f\nIndirect:\n(.*?)\x1f", text, re.S)
    if table is None:
        return [main]
    names = [line.split(":", 1)[0] for line in table[1].splitlines() if ":" in line]
    suffix = ".gz" if main.suffix == ".gz" else ""
    return [main, *(main.parent / f"{name}{suffix}" for name in names)]


def _read_info(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8", errors="replace")


def info_nodes(files: list[Path]) -> Iterator[tuple[str, str]]:
    """(node name, node text after its header line) for every node of the files, in order."""
    for path in files:
        for chunk in _read_info(path).split(_NODE_SEPARATOR)[1:]:
            header, _, body = chunk.lstrip("\n").partition("\n")
            match = re.search(r"Node:\s*([^,\t]+)", header)
            if header.startswith("File:") and match:
                yield match[1].strip(), body


def split_node(body: str) -> tuple[str | None, str]:
    """(heading without its section number, text without heading and menus) of one node."""
    lines = body.strip("\n").splitlines()
    heading = None
    if len(lines) >= 2 and lines[0].strip() and _UNDERLINE.fullmatch(lines[1].strip()):
        heading = _SECTION_NUMBER.sub("", lines[0].strip()).strip() or None
        lines = lines[2:]
    kept: list[str] = []
    in_menu = False
    for line in lines:
        if line.startswith("* Menu:"):
            in_menu = True
        elif in_menu and (not line.strip() or _MENU_ENTRY.match(line) or line.startswith("     ")):
            continue  # an entry, its continuation (indented to the description column) or a gap
        else:
            in_menu = False
        if not in_menu:
            kept.append(line.rstrip())
    return heading, re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()


def read_info_manuals(*mains: Path) -> Reading:
    """One item per content node of each manual; query = heading (or node name), document = text."""
    items, files = [], []
    for main in mains:
        manual_files = info_files(main)
        files += manual_files
        manual = main.name.split(".info")[0]
        for node, body in info_nodes(manual_files):
            if node in _SKIPPED_NODES or _INDEX_MARKER in body:
                continue
            heading, text = split_node(body)
            query = heading or node
            if _LICENCE.search(query) or len(text) < MIN_NODE_CHARS:
                continue
            items.append(Item(f"{manual}:{node}", query, text))
    return Reading(items, files)


# --- devils-dictionary ---------------------------------------------------------------------

# "ABASEMENT, n.  A decent ..." / "BABE or BABY, n.  ..." / "LIGHT-FINGERED, adj.  ...": the
# entries of another shape (letters of the alphabet, Latin phrases) are skipped.
_DEVIL_ENTRY = re.compile(r"^(?P<term>[^,\n]+?),\s+(?P<pos>(?:[a-z]+\.\s*)+)(?P<definition>.+)\Z", re.S)
_EMPHASIS = re.compile(r"_([^_\n]+)_")
MIN_DEFINITION_CHARS = 20


def read_devil(index: Path, dictionary: Path) -> Reading:
    """One item per entry: query = the term, lower-cased; document = the definition."""
    items = []
    for headword, entry in read_dictd(index, dictionary):
        match = _DEVIL_ENTRY.match(entry.strip())
        if match is None:
            continue
        definition = _dictionary_text(match["definition"])
        if len(definition) >= MIN_DEFINITION_CHARS:
            items.append(Item(f"devil:{headword}", " ".join(match["term"].lower().split()), definition))
    return Reading(items, [index, dictionary])


def _dictionary_text(text: str) -> str:
    """Prose paragraphs filled into one line each; indented blocks (verse, quotations) keep
    their lines; _emphasis_ marks dropped."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", _EMPHASIS.sub(r"\1", text).strip("\n")):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        if all(line.startswith((" ", "\t")) for line in lines):
            paragraphs.append("\n".join(line.strip() for line in lines))
        else:
            paragraphs.append(" ".join(" ".join(line.split()) for line in lines))
    return "\n\n".join(paragraphs)


# --- the registry --------------------------------------------------------------------------

SOURCES: dict[str, HeldoutSource] = {
    source.name: source
    for source in (
        HeldoutSource(
            name="debian-packages", query="package synopsis", document="package long description",
            needs=(("dpkg", DPKG_STATUS),), read=read_dpkg_status,
        ),
        HeldoutSource(
            name="gnu-info", query="Info node heading", document="Info node text",
            needs=tuple((package, INFO_DIR / f"{manual}.info.gz") for package, manual in INFO_MANUALS),
            read=read_info_manuals,
        ),
        HeldoutSource(
            name="devils-dictionary", query="term", document="definition",
            needs=(("dict-devil", DEVIL_INDEX), ("dict-devil", DEVIL_DICTIONARY)), read=read_devil,
        ),
    )
}
HELDOUT_TASKS: tuple[str, ...] = tuple(SOURCES)
# What the Makefile installs for these tasks beyond a default Debian system.
DEBIAN_PACKAGES = ("dict-devil",)


def heldout_source(name: str) -> HeldoutSource:
    try:
        return SOURCES[name]
    except KeyError:
        raise UsageError(f"unknown held-out task {name!r}; valid: {', '.join(HELDOUT_TASKS)}") from None


# --- building ------------------------------------------------------------------------------


def builtin_training_text() -> TrainingText:
    """Every document of every built-in source available here, as it is trained and audited
    ("title\\ntext"), read straight from the sources: the corpus before dedup and splitting."""
    names = builtin.available_sources()

    def pairs() -> Iterator[tuple[str, str]]:
        for name in names:
            for doc in builtin.iter_documents(name):
                yield doc.doc_id, document_text(doc.title, doc.text)

    description = {
        "what": "the built-in corpus: every document of every available source, all splits",
        "sources": {name: builtin.source_revision(name) for name in names},
        "unavailable_sources": {n: why for n, why in builtin.source_status().items() if why is not None},
    }
    return TrainingText(description, pairs)


def candidate_task(name: str, items: Sequence[Item]) -> tuple[Task, dict[str, str]]:
    """Every item as its own labelled pair (the form the audit checks), after in-task dedup;
    and the queries that are usable (not shared with another item)."""
    seen: set[str] = set()
    unique: list[Item] = []
    for item in items:
        key = normalise_text(item.document)
        if key not in seen:
            seen.add(key)
            unique.append(item)
    counts = Counter(normalise_text(i.query).lower() for i in unique)
    usable = {f"q:{i.item_id}": i.query for i in unique if counts[normalise_text(i.query).lower()] == 1}
    task = Task(
        name=name,
        corpus={i.item_id: ("", i.document) for i in unique},
        queries={f"q:{i.item_id}": i.query for i in unique},
        qrels={REQUIRED_SPLIT: {f"q:{i.item_id}": {i.item_id: 1} for i in unique}},
    )
    return task, usable


def decontaminated_task(
    source: HeldoutSource, candidates: Task, usable: dict[str, str], findings: Iterable[Finding]
) -> tuple[Task, dict]:
    """The task after step 2 and 3 of the module doc, and the record of what was removed."""
    strongest: dict[tuple[str, str], Finding] = {}
    for f in sorted(findings, key=lambda f: (MATCH_KINDS.index(f.match), -f.similarity, f.stage_item_id)):
        strongest.setdefault((f.item_kind, f.item_id), f)
    findings = sorted(strongest.values(), key=lambda f: (f.item_kind, f.item_id))
    found = {_item_of(f) for f in findings}
    clean = sorted(d for d in candidates.corpus if d not in found)
    order = {d: hashlib.sha256(f"{source.name}:{d}".encode()).hexdigest() for d in clean}
    queried = sorted((d for d in clean if f"q:{d}" in usable), key=order.__getitem__)[: source.max_queries]
    task = Task(
        name=source.name,
        corpus={d: candidates.corpus[d] for d in clean},
        queries={f"q:{d}": usable[f"q:{d}"] for d in queried},
        qrels={REQUIRED_SPLIT: {f"q:{d}": {d: 1} for d in queried}},
    )
    record = {
        "rule": "remove every candidate item (query and document) the contamination audit finds "
                f"in the training text ({', '.join(MATCH_KINDS)}: {SHARED_WINDOW} is a run of "
                f"{WINDOW_WORDS} words in common); each removal lists the item's strongest finding",
        "candidates": len(candidates.corpus),
        "items_removed": len(found & set(candidates.corpus)),
        "removed": [
            {"item": _item_of(f), "kind": f.item_kind, "match": f.match, "similarity": round(f.similarity, 4),
             "training_item": f.stage_item_id, "item_snippet": f.item_snippet, "training_snippet": f.stage_snippet}
            for f in findings
        ],
        "queries": len(task.queries),
        "documents": len(task.corpus),
    }
    return task, record


def _item_of(finding: Finding) -> str:
    """The candidate a finding is about: a query's id is "q:" + its document's id."""
    return finding.item_id.removeprefix("q:") if finding.item_kind == "query" else finding.item_id


def build_heldout(
    name: str, out_dir: str | Path, *, source: HeldoutSource | None = None, training: TrainingText | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Build task `name` into `out_dir/name` (replacing an older build) and return that path.

    `source` overrides the registered recipe (same name); `training` defaults to
    `builtin_training_text()`."""
    source = source or heldout_source(name)
    if source.name != name:
        raise UsageError(f"source {source.name!r} given for held-out task {name!r}")
    return build_heldout_tasks([source], out_dir, training=training, progress=progress)[name]


def build_heldout_tasks(
    sources: Sequence[HeldoutSource], out_dir: str | Path, *, training: TrainingText | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Build every task of `sources` into `out_dir/<name>`, with one audit pass over the training text."""
    say = progress or (lambda message: None)
    for source in sources:
        source.check()
    readings = {s.name: s.read(*s.paths) for s in sources}
    candidates = {name: candidate_task(name, reading.items) for name, reading in readings.items()}
    training = training or builtin_training_text()
    if training.description.get("unavailable_sources"):
        say(f"heldout: warning: built-in sources not installed, so not audited against: "
            f"{', '.join(training.description['unavailable_sources'])}")
    say(f"heldout: auditing {sum(len(t.corpus) for t, _ in candidates.values()):,} candidate items "
        f"of {', '.join(readings)} against the training text")
    tasks = [task for task, _ in candidates.values()]
    report = audit(tasks, {"training": training.pairs()}, threshold=DataConfig().near_duplicate_threshold,
                   progress=progress)
    findings = report.findings
    out_dir = Path(out_dir)
    built = {}
    for source in sources:
        candidate, usable = candidates[source.name]
        task, record = decontaminated_task(source, candidate, usable,
                                           (f for f in findings if f.task == source.name))
        if len(task.queries) < source.min_queries:
            raise UserError(f"held-out task {source.name!r}: only {len(task.queries)} queries after cleaning "
                            f"(at least {source.min_queries} needed) from {', '.join(map(str, source.paths))}")
        record = {**record, "items_read": len(readings[source.name].items), "training_text": training.description,
                  "audit_settings": report.settings}
        built[source.name] = _write(source, task, readings[source.name], record, out_dir)
        say(f"heldout: {source.name}: {len(task.queries)} queries, {len(task.corpus)} documents "
            f"({record['items_removed']} of {record['candidates']} candidates removed: found in training text)")
    return built


def _write(source: HeldoutSource, task: Task, reading: Reading, record: dict, out_dir: Path) -> Path:
    """Write the task under a staging name, then put it in place of any older build."""
    target = out_dir / source.name
    staging = out_dir / f".staging-{source.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        write_task(task, staging)
        (staging / SOURCES_FILE).write_text(json.dumps(provenance(source, task, reading), indent=2, sort_keys=True))
        (staging / DECONTAMINATION_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def provenance(source: HeldoutSource, task: Task, reading: Reading) -> dict:
    """What `sources.json` records: where the text came from and what built the task."""
    versions = {package: package_version(package) for package in source.packages}
    files = reading.files
    where = ", ".join(map(str, files)) if len(files) <= 2 else f"{len(files)} files in {os.path.commonpath(files)}"
    return {
        "task": source.name,
        "query": source.query,
        "document": source.document,
        "summary": f"{source.query} -> {source.document}; "
                   + ", ".join(f"{p} {v or '(version unknown)'}" for p, v in versions.items()) + f"; {where}",
        "packages": versions,
        "files": [{"path": str(path), "sha256": file_sha256(path), "bytes": path.stat().st_size} for path in reading.files],
        "builder": {"module": __name__, "code_revision": code_revision(sources=BUILD_SOURCES),
                    "embedlab_version": VERSION},
        "construction": {"max_queries": source.max_queries, "min_queries": source.min_queries,
                         "query_order": f"sha256('{source.name}:' + item id), smallest first"},
        "queries": len(task.queries),
        "documents": len(task.corpus),
        "task_hash": task.hash,
    }


def package_version(package: str) -> str | None:
    """The installed version of a Debian package, None when it is not installed (or no dpkg)."""
    try:
        result = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}${Version}", package],
                                capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None
    status, _, version = result.stdout.partition(" ")
    return version.strip() if result.returncode == 0 and status == "ii" else None


def read_provenance(task_dir: str | Path) -> dict:
    """A built task's `sources.json`."""
    path = Path(task_dir) / SOURCES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a held-out task built by `embedlab heldout build`")
    return json.loads(path.read_text())

