"""Contamination audit: does any training-stage text overlap the evaluation data?

Evaluation items. For every task and every split in its qrels, the items checked are the
queries judged in that split and the labelled documents (grade > 0 in that split). A
document is checked as its body text and, when it has a title, also as "title. body"
(`Task.doc_text`), since a stage may hold either form; a match on either counts.

Stages. A stage is any iterable of (stage item id, text) pairs, read once, in chunks of
`CHUNK_ITEMS`; the audit gives no meaning to stage names. Every stage item is compared with
every evaluation item, and each (evaluation item, stage item) pair that matches gives one
`Finding`, with the strongest of three kinds:

    exact      equal `content_hash` (NFKC, whitespace-collapsed text); similarity 1.0
    contained  the evaluation text, of at least `CONTAINED_MIN_WORDS` words, occurs inside
               the stage text; similarity 1.0, the share of the evaluation text found
    near       MinHash LSH near-duplicate (`NearDuplicateIndex`): estimated Jaccard of word
               5-gram shingles >= threshold; similarity is that estimate

"contained" exists because queries are short: a 6-word query has two 5-gram shingles, so a
stage sentence that quotes it inside a paragraph shares a tiny fraction of its shingles
and is never a near-duplicate. For containment, words are the `\\w+` runs of the
lower-cased normalised text, so punctuation and quoting around the copied text do not hide
it, and the match is word-aligned. It is found without comparing every pair: the first
8-word window of each evaluation text is its anchor; every 8-word window of every stage
text is hashed (vectorised, `ngram_hashes`) and looked up among the anchors; only the rare
anchor hits are verified by a substring test on the joined words. That is linear in the
stage's words, not in stage items x evaluation items.

Counts. `AuditReport.counts[task][split][stage]` gives, per match kind, how many distinct
evaluation items have that kind as their strongest match in the stage (so the three numbers
add up to the contaminated items); `findings` lists every matching pair. Split "test" is the
final evaluation: `enforce` refuses its findings unless a disclosed-overlap policy is given.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice

import numpy as np

from embedlab.data.dedup import NearDuplicateIndex, ngram_hashes, word_hashes
from embedlab.data.document import content_hash, normalise_text
from embedlab.errors import UserError
from embedlab.evaluate.beir import REQUIRED_SPLIT, Task

FINAL_EVAL_SPLIT = REQUIRED_SPLIT
MATCH_KINDS = ("exact", "contained", "near")  # strongest first
CONTAINED_MIN_WORDS = 8
CHUNK_ITEMS = 20_000
SNIPPET_CHARS = 80
_WORD = re.compile(r"\w+")


class ContaminationError(UserError, RuntimeError):
    """Final-evaluation items overlap training-stage text and no overlap policy was given."""


@dataclass(frozen=True)
class Finding:
    """One evaluation item matched by one stage item.

    `item_snippet` and `stage_snippet` are the start of each text, for reports.
    """

    task: str
    split: str
    item_kind: str  # "query" | "document"
    item_id: str
    stage: str
    stage_item_id: str
    match: str  # "exact" | "contained" | "near"
    similarity: float
    item_snippet: str = ""
    stage_snippet: str = ""


@dataclass(frozen=True)
class AuditReport:
    """Findings, per-cell counts and how much was checked.

    `counts`: task -> split -> stage -> {"exact": n, "contained": n, "near": n}, every cell
    present, zeros included. `checked`: {"stages": stage -> stage items read, "eval": task ->
    split -> {"query": n, "document": n}}. `settings`: the parameters the audit ran with.
    """

    findings: tuple[Finding, ...]
    counts: dict[str, dict[str, dict[str, dict[str, int]]]]
    checked: dict[str, dict]
    settings: dict[str, float | int] = field(default_factory=dict)

    def final_eval_findings(self) -> list[Finding]:
        """Findings on the final-evaluation split ("test")."""
        return [f for f in self.findings if f.split == FINAL_EVAL_SPLIT]

    def to_dict(self) -> dict:
        """A JSON-serialisable copy."""
        return {
            "settings": dict(self.settings),
            "checked": self.checked,
            "counts": self.counts,
            "findings": [asdict(finding) for finding in self.findings],
        }

    def to_markdown(self, examples_per_cell: int = 3) -> str:
        """Stage sizes, a count table per task (split x stage) and a few examples per cell."""
        lines = ["# Contamination audit", "", _settings_line(self.settings), ""]
        lines += ["| stage | items |", "|---|---:|"]
        lines += [f"| {_cell(stage)} | {n} |" for stage, n in self.checked["stages"].items()]
        for task, splits in self.counts.items():
            lines += ["", f"## Task {_cell(task)}", ""]
            lines += ["| split | stage | queries | documents | exact | contained | near |"]
            lines += ["|---|---|---:|---:|---:|---:|---:|"]
            for split, stages in splits.items():
                checked = self.checked["eval"][task][split]
                for stage, counts in stages.items():
                    numbers = " | ".join(str(counts[kind]) for kind in MATCH_KINDS)
                    lines.append(
                        f"| {_cell(split)} | {_cell(stage)} | {checked['query']} "
                        f"| {checked['document']} | {numbers} |"
                    )
        lines += _example_lines(self.findings, examples_per_cell)
        return "\n".join(lines) + "\n"


def _settings_line(settings: dict[str, float | int]) -> str:
    return (
        f"exact: equal content hash; contained: the whole evaluation text "
        f"(>= {settings.get('contained_min_words')} words) inside a stage item; near: "
        f"MinHash estimated Jaccard >= {settings.get('threshold')} "
        f"({settings.get('num_perm')} permutations, seed {settings.get('seed')})."
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _example_lines(findings: Iterable[Finding], per_cell: int) -> list[str]:
    cells: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for finding in findings:
        cells[finding.task, finding.split, finding.stage].append(finding)
    if not cells or per_cell <= 0:
        return []
    lines = ["", "## Examples"]
    for (task, split, stage), cell in cells.items():
        lines += ["", f"### {task} / {split} / {stage} ({len(cell)} findings)", ""]
        strongest_first = sorted(cell, key=lambda f: MATCH_KINDS.index(f.match))
        lines += [
            f"- {f.item_kind} `{f.item_id}` ~ `{f.stage_item_id}`: {f.match} "
            f"({f.similarity:.2f}); \"{f.item_snippet}\" ~ \"{f.stage_snippet}\""
            for f in strongest_first[:per_cell]
        ]
    return lines


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"


# --- evaluation items --------------------------------------------------------------------


@dataclass(frozen=True)
class _EvalItem:
    task: str
    split: str
    kind: str
    item_id: str
    texts: tuple[str, ...]  # the forms it is checked as


def _eval_items(tasks: Iterable[Task]) -> list[_EvalItem]:
    items: list[_EvalItem] = []
    for task in tasks:
        for split, judged in sorted(task.qrels.items()):
            for query_id in sorted(judged):
                query = (task.queries[query_id],)
                items.append(_EvalItem(task.name, split, "query", query_id, query))
            labelled = {d for grades in judged.values() for d, grade in grades.items() if grade > 0}
            for doc_id in sorted(labelled):
                forms = dict.fromkeys((task.corpus[doc_id][1], task.doc_text(doc_id)))
                items.append(_EvalItem(task.name, split, "document", doc_id, tuple(forms)))
    return items


def containment_words(text: str) -> list[str]:
    """The words a containment match compares (normalised, lower-cased). A text with at least
    CONTAINED_MIN_WORDS of them is found inside any text that holds it."""
    return _WORD.findall(normalise_text(text).lower())


class _Matcher:
    """All evaluation items, indexed for the three kinds of match."""

    def __init__(self, items: list[_EvalItem], threshold: float, num_perm: int, seed: int) -> None:
        forms = [(number, text) for number, item in enumerate(items) for text in item.texts]
        self.by_hash: dict[str, set[int]] = defaultdict(set)
        for number, text in forms:
            self.by_hash[content_hash(text)].add(number)
        self.index = NearDuplicateIndex(threshold, num_perm, seed)
        self.index.add([number for number, _ in forms], [text for _, text in forms])
        self.anchors: dict[int, list[tuple[int, str]]] = defaultdict(list)
        words = [containment_words(text) for _, text in forms]
        hashes, counts = _window_hashes(words)
        firsts = np.cumsum(counts) - counts
        for (number, _), form_words, count, first in zip(forms, words, counts, firsts):
            if count:
                self.anchors[int(hashes[first])].append((number, " ".join(form_words)))
        self.anchor_keys = np.array(sorted(self.anchors), dtype=np.uint64)

    def match(self, texts: list[str]) -> dict[tuple[int, int], tuple[str, float]]:
        """(eval item, position in `texts`) -> (kind, similarity) for every matching pair."""
        found: dict[tuple[int, int], tuple[str, float]] = {}

        def record(item: int, position: int, kind: str, similarity: float) -> None:
            old = found.get((item, position))
            if old is None or MATCH_KINDS.index(kind) < MATCH_KINDS.index(old[0]):
                found[item, position] = (kind, similarity)

        for position, text in enumerate(texts):
            for item in self.by_hash.get(content_hash(text), ()):
                record(item, position, "exact", 1.0)
        for item, position in self._contained(texts):
            record(item, position, "contained", 1.0)
        for position, matches in enumerate(self.index.query_many(texts)):
            best: dict[int, float] = {}
            for item, similarity in matches:  # best first: keep each item's first
                best.setdefault(item, similarity)
            for item, similarity in best.items():
                record(item, position, "near", similarity)
        return found

    def _contained(self, texts: list[str]) -> set[tuple[int, int]]:
        """(eval item, position) pairs where the item's words occur inside the text's words."""
        words = [containment_words(text) for text in texts]
        hashes, counts = _window_hashes(words)
        hits = np.flatnonzero(np.isin(hashes, self.anchor_keys))
        owners = np.repeat(np.arange(len(texts)), counts)[hits]
        anchors_in: dict[int, set[int]] = defaultdict(set)
        for key, position in zip(hashes[hits].tolist(), owners.tolist()):
            anchors_in[position].add(key)
        pairs: set[tuple[int, int]] = set()
        for position, keys in anchors_in.items():
            joined = f" {' '.join(words[position])} "
            pairs.update(
                (item, position)
                for key in keys
                for item, phrase in self.anchors[key]
                if f" {phrase} " in joined
            )
        return pairs


def _window_hashes(word_lists: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every CONTAINED_MIN_WORDS-word window of each word list; windows per list."""
    tokens, lengths = word_hashes(word_lists)
    return ngram_hashes(tokens, lengths, CONTAINED_MIN_WORDS, whole_if_shorter=False)


# --- the audit ---------------------------------------------------------------------------


def audit(
    tasks: list[Task],
    stages: dict[str, Iterable[tuple[str, str]]],
    *,
    threshold: float = 0.8,
    num_perm: int = 128,
    seed: int = 1,
    progress: Callable[[str], None] | None = print,
) -> AuditReport:
    """Check every stage item against every evaluation item of `tasks` (see the module doc)."""
    items = _eval_items(tasks)
    matcher = _Matcher(items, threshold, num_perm, seed)
    findings: list[Finding] = []
    stage_sizes: dict[str, int] = {}
    for stage, pairs in stages.items():
        start, before = time.perf_counter(), len(findings)
        stage_sizes[stage] = 0
        for chunk in _chunks(pairs, CHUNK_ITEMS):
            stage_sizes[stage] += len(chunk)
            texts = [text for _, text in chunk]
            for (number, position), (kind, similarity) in matcher.match(texts).items():
                item = items[number]
                findings.append(
                    Finding(
                        task=item.task, split=item.split, item_kind=item.kind,
                        item_id=item.item_id, stage=stage, stage_item_id=chunk[position][0],
                        match=kind, similarity=similarity,
                        item_snippet=_snippet(item.texts[0]),
                        stage_snippet=_snippet(texts[position]),
                    )
                )
        if progress is not None:
            progress(
                f"audit: stage {stage}: {stage_sizes[stage]} items, "
                f"{len(findings) - before} findings ({time.perf_counter() - start:.1f}s)"
            )
    findings.sort(key=lambda f: (f.task, f.split, f.stage, f.item_kind, f.item_id, f.stage_item_id))
    return AuditReport(
        findings=tuple(findings),
        counts=_counts(items, list(stages), findings),
        checked={"stages": stage_sizes, "eval": _checked(items)},
        settings={
            "threshold": threshold,
            "num_perm": num_perm,
            "seed": seed,
            "contained_min_words": CONTAINED_MIN_WORDS,
        },
    )


def _chunks(pairs: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    iterator = iter(pairs)
    while chunk := list(islice(iterator, size)):
        yield chunk


def _counts(
    items: list[_EvalItem], stages: list[str], findings: list[Finding]
) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """Per cell and kind, the evaluation items whose strongest match in the stage is that kind."""
    strongest: dict[tuple[str, str, str, str, str], int] = {}
    for f in findings:
        key = (f.task, f.split, f.stage, f.item_kind, f.item_id)
        strongest[key] = min(strongest.get(key, len(MATCH_KINDS)), MATCH_KINDS.index(f.match))
    counts: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for item in items:
        for stage in stages:
            counts.setdefault(item.task, {}).setdefault(item.split, {}).setdefault(
                stage, dict.fromkeys(MATCH_KINDS, 0)
            )
    for (task, split, stage, _, _), kind in strongest.items():
        counts[task][split][stage][MATCH_KINDS[kind]] += 1
    return counts


def _checked(items: list[_EvalItem]) -> dict[str, dict[str, dict[str, int]]]:
    checked: dict[str, dict[str, dict[str, int]]] = {}
    for item in items:
        cell = checked.setdefault(item.task, {}).setdefault(item.split, {"query": 0, "document": 0})
        cell[item.kind] += 1
    return checked


# --- the policy gate ---------------------------------------------------------------------


def enforce(report: AuditReport, policy: str | None) -> None:
    """Raise ContaminationError if final-eval items are contaminated and no policy is given.

    `policy` is a disclosed-overlap policy, printed by the caller next to the results; with
    one (non-blank), findings are allowed. Findings on other splits (dev) never raise.
    """
    findings = report.final_eval_findings()
    if not findings or (policy is not None and policy.strip()):
        return
    cells = [
        f"  {task} / {stage}: "
        + ", ".join(f"{counts[kind]} {kind}" for kind in MATCH_KINDS if counts[kind])
        for task, splits in report.counts.items()
        for stage, counts in splits.get(FINAL_EVAL_SPLIT, {}).items()
        if any(counts.values())
    ]
    examples = [
        f"  {f.item_kind} {f.item_id!r} ~ {f.stage} item {f.stage_item_id!r}: "
        f"{f.match} ({f.similarity:.2f})"
        for f in findings[:5]
    ]
    raise ContaminationError(
        f"{len(findings)} final-eval ({FINAL_EVAL_SPLIT!r} split) contamination findings; "
        "contaminated items per task / stage:\n" + "\n".join(cells)
        + "\nexamples:\n" + "\n".join(examples)
        + "\nremove the overlap from the stages, or pass a disclosed-overlap policy"
    )
