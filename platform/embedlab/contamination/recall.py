"""How often the contamination audit finds an edited copy of an evaluation item: planted copies.

Evaluation items are real text, Python's own docstrings (present wherever Python is): long
queries (a docstring's first sentence, 10 to 24 words), short queries (4 to 9 words) and
documents (a docstring's first 75 one-word tokens, code such as `f(x)` left out). Every
whitespace-separated token of an item is one word, so an edit of a token is an edit of one
word. Each item gets one copy per edit level, planted in a
training stage alone or inside a paragraph of other docstring text; the audit (`audit.audit`)
runs once over all copies, and an item's copy counts as found when the audit pairs that item
with that copy. Items without a copy are the controls: a finding on one that an edited copy
makes and its original does not is a false positive (docstrings do share real text, which the
audit rightly finds).
For documents the table also gives how often a lone copy joins its original's near-duplicate
cluster (`dedup.near_duplicate_clusters`), the rule the splits group by.

Edits are deterministic (`EDITS`): formatting (case, punctuation, whitespace, full-width
compatibility forms, accents, all of these at once) leaves the words the audit compares
unchanged; word edits (one substituted, one inserted, two adjacent swapped, three
substituted) change them, in the middle of the text where they break the most runs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from embedlab.contamination.audit import audit
from embedlab.core.beir import REQUIRED_SPLIT, Task
from embedlab.sources.builtin import iter_documents
from embedlab.sources.dedup import matching_words, near_duplicate_clusters

SOURCE = "python-docstrings"
DOCUMENT_WORDS = 75
KINDS = {"long query": (10, 24), "short query": (4, 9), "document": (DOCUMENT_WORDS, DOCUMENT_WORDS)}
PLACEMENTS = ("alone", "in a paragraph")
_SENTENCE = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
_FULL_WIDTH = {c: chr(ord(c) + 0xFEE0) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"}
_ACCENTED = str.maketrans({"a": "á", "e": "é", "i": "î", "o": "ö", "u": "ü", "c": "ç", "n": "ñ"})


def _case(text: str, rng: random.Random) -> str:
    return text.upper()


def _punctuation(text: str, rng: random.Random) -> str:
    return "\u201c" + re.sub(r"\s+", lambda m: rng.choice([", ", "; ", " - ", " "]), text.rstrip(".")) + "!\u201d"


def _whitespace(text: str, rng: random.Random) -> str:
    return "\n  " + re.sub(r"\s+", lambda m: rng.choice(["  ", "\t", "\n", " \n "]), text) + " \n"


def _full_width(text: str, rng: random.Random) -> str:
    return "".join(_FULL_WIDTH.get(c, c) for c in text)


def _accents(text: str, rng: random.Random) -> str:
    return text.translate(_ACCENTED)


def _combined(text: str, rng: random.Random) -> str:
    return _accents(_full_width(_whitespace(_punctuation(_case(text, rng), rng), rng), rng), rng)


def _words(text: str) -> list[str]:
    return text.split()


def _substitute(count: int) -> Callable[[str, random.Random], str]:
    def edit(text: str, rng: random.Random) -> str:
        words = _words(text)
        for k in range(count):
            words[len(words) * (k + 1) // (count + 1)] = f"zq{rng.randrange(10**6)}"
        return " ".join(words)

    return edit


def _insert(text: str, rng: random.Random) -> str:
    words = _words(text)
    words.insert(len(words) // 2, f"zq{rng.randrange(10**6)}")
    return " ".join(words)


def _swap(text: str, rng: random.Random) -> str:
    words = _words(text)
    middle = len(words) // 2
    words[middle - 1], words[middle] = words[middle], words[middle - 1]
    return " ".join(words)


EDITS: dict[str, Callable[[str, random.Random], str]] = {
    "verbatim": lambda text, rng: text,
    "case": _case,
    "punctuation": _punctuation,
    "whitespace": _whitespace,
    "full-width (NFKC)": _full_width,
    "accents added": _accents,
    "all formatting at once": _combined,
    "one word substituted": _substitute(1),
    "one word inserted": _insert,
    "two words swapped": _swap,
    "three words substituted": _substitute(3),
}


@dataclass(frozen=True)
class RecallRow:
    """Recall of one (item kind, edit, placement) cell over `items` planted copies."""

    kind: str
    edit: str
    placement: str
    items: int
    found: int
    same_cluster: int | None  # documents alone: copies in their original's near-duplicate cluster

    @property
    def recall(self) -> float:
        return self.found / self.items if self.items else 0.0


@dataclass(frozen=True)
class RecallTable:
    rows: tuple[RecallRow, ...]
    controls: int
    false_positives: int  # (control, item) pairs found through the item's copies but not its original
    settings: dict
    overlapping: int = 0  # controls that share text with some planted item's original

    def recall(self, kind: str, edit: str, placement: str) -> float:
        return next(r.recall for r in self.rows if (r.kind, r.edit, r.placement) == (kind, edit, placement))

    def to_markdown(self) -> str:
        lines = ["| item | edit | alone | in a paragraph | same dedup cluster |", "|---|---|---:|---:|---:|"]
        for kind in KINDS:
            for edit in EDITS:
                cells = {r.placement: r for r in self.rows if (r.kind, r.edit) == (kind, edit)}
                alone = cells["alone"]
                cluster = f"{alone.same_cluster / alone.items:.0%}" if alone.same_cluster is not None else "-"
                lines.append(f"| {kind} | {edit} | {alone.recall:.0%} | {cells['in a paragraph'].recall:.0%} "
                             f"| {cluster} |")
        lines += ["", f"{self.items_per_cell()} items per cell, real docstrings. Of {self.controls} control items "
                      f"without a copy, {self.overlapping} share text with some planted item's original (real "
                      f"overlap between docstrings); findings on controls that an edited copy made and the "
                      f"original did not: {self.false_positives}."]
        return "\n".join(lines) + "\n"

    def items_per_cell(self) -> str:
        counts = sorted({r.items for r in self.rows})
        return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _plain(text: str) -> bool:
    """Whether each whitespace-separated token holds exactly one word (`matching_words`), so an
    edit of a token is an edit of one word and the window arithmetic of the tests is exact."""
    return all(len(matching_words(token)) == 1 for token in text.split())


def _first_sentence(text: str) -> str:
    return _SENTENCE.split(" ".join(text.split()), maxsplit=1)[0]


def evaluation_items(per_kind: int, scan: int = 8000) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Up to `per_kind` (id, text) items of each kind from the first `scan` docstrings (a
    docstring gives at most one item; texts distinct); and the other docstrings' texts."""
    items: dict[str, list[tuple[str, str]]] = {kind: [] for kind in KINDS}
    seen: set[str] = set()
    rest: list[str] = []
    for document in iter_documents(SOURCE, limit=scan):
        words = _words(document.text)
        sentence = _first_sentence(document.text)
        # A document: the docstring's first 75 one-word tokens (code such as `f(x)` left out).
        forms = {"long query": sentence, "short query": sentence,
                 "document": " ".join([w for w in words if _plain(w)][:DOCUMENT_WORDS])}
        for kind, (low, high) in KINDS.items():
            text = forms[kind]
            if len(items[kind]) < per_kind and low <= len(_words(text)) <= high and text.lower() not in seen \
                    and _plain(text):
                items[kind].append((f"{kind.replace(' ', '-')}:{document.doc_id}", text))
                seen.add(text.lower())
                break
        else:
            rest.append(" ".join(words))
    return items, rest


def _task(queries: dict[str, str], documents: dict[str, str]) -> Task:
    """Every query and every document an audited item: each document is some query's positive."""
    names = sorted(documents)
    judged = {q: {names[k % len(names)]: 1} for k, q in enumerate(sorted(queries))}
    if len(queries) < len(names):
        raise ValueError(f"{len(queries)} queries cannot label {len(names)} documents")
    return Task(name="planted", corpus={d: ("", t) for d, t in documents.items()}, queries=dict(queries),
                qrels={REQUIRED_SPLIT: judged})


def measure(per_kind: int = 100, controls: int = 30, seed: int = 0) -> RecallTable:
    """Plant every item's copies, audit once, and count per cell (see the module doc).

    `controls` items of each kind get no copy. Paragraphs that already match an item (the
    standard library repeats some docstrings) are not used to wrap copies."""
    items, rest = evaluation_items(per_kind + controls)
    if any(len(pool) < per_kind + controls for pool in items.values()):
        raise ValueError(f"too few docstrings for {per_kind + controls} items of each kind")
    planted = {kind: pool[:per_kind] for kind, pool in items.items()}
    control_items = {kind: pool[per_kind:] for kind, pool in items.items()}
    everything = _task({i: t for kind in ("long query", "short query") for i, t in items[kind]}, dict(items["document"]))
    candidates = [(f"p{k}", text) for k, text in enumerate(rest) if len(_words(text)) >= 20][:3000]
    matched = {f.stage_item_id for f in audit([everything], {"paragraphs": candidates}, progress=None).findings}
    paragraphs = [text for key, text in candidates if key not in matched]
    rng = random.Random(seed)
    stage: list[tuple[str, str]] = []
    for kind, pool in planted.items():
        for item_id, text in pool:
            for edit, apply in EDITS.items():
                copy = apply(text, rng)
                stage.append((f"{edit}|alone|{item_id}", copy))
                before, after = rng.choice(paragraphs), rng.choice(paragraphs)
                stage.append((f"{edit}|in a paragraph|{item_id}", f"{before} {copy} {after}"))
    report = audit([everything], {"training": stage}, progress=None)
    found = {(f.item_id, f.stage_item_id) for f in report.findings}
    control_ids = {i for pool in control_items.values() for i, _ in pool}
    # Docstrings share real text (boilerplate, a class's repeated phrases): a control found by
    # an item's copy is a false positive only if it is not found by that item's original.
    originals = [(item_id, text) for pool in planted.values() for item_id, text in pool]
    overlap = {(f.item_id, f.stage_item_id) for f in audit([everything], {"originals": originals}, progress=None).findings
               if f.item_id in control_ids}
    on_controls = {(f.item_id, f.stage_item_id.rsplit("|", 1)[1]) for f in report.findings if f.item_id in control_ids}
    false_positives = len(on_controls - overlap)
    clusters = _document_clusters(planted["document"], rng)
    rows = []
    for kind, pool in planted.items():
        for edit in EDITS:
            for placement in PLACEMENTS:
                hits = sum((item_id, f"{edit}|{placement}|{item_id}") in found for item_id, _ in pool)
                same = (sum(clusters[item_id, edit] for item_id, _ in pool)
                        if kind == "document" and placement == "alone" else None)
                rows.append(RecallRow(kind, edit, placement, len(pool), hits, same))
    return RecallTable(tuple(rows), len(control_ids), false_positives, dict(report.settings),
                       overlapping=len({control for control, _ in overlap}))


def _document_clusters(documents: list[tuple[str, str]], rng: random.Random) -> dict[tuple[str, str], bool]:
    """(document id, edit) -> whether its lone copy joins its cluster, all copies clustered at once."""
    ids, texts = [], []
    for item_id, text in documents:
        ids.append(item_id)
        texts.append(text)
        for edit, apply in EDITS.items():
            ids.append(f"~{edit}|{item_id}")
            texts.append(apply(text, rng))
    groups = near_duplicate_clusters(ids, texts)
    return {(item_id, edit): groups[f"~{edit}|{item_id}"] == groups[item_id]
            for item_id, _ in documents for edit in EDITS}
