"""Contamination audit: does any training-stage text overlap the evaluation data?

Evaluation items. For every task and every split in its qrels, the items checked are the
queries judged in that split and the labelled documents (grade > 0 in that split). A
document is checked as its body text and, when it has a title, also as "title. body"
(`Task.doc_text`), since a stage may hold either form; a match on either counts.

Stages. A stage is any iterable of (stage item id, text) pairs, read once, in chunks of
`CHUNK_ITEMS`; the audit gives no meaning to stage names. Every stage item is compared with
every evaluation item, and each (evaluation item, stage item) pair that matches gives one
`Finding`, with the strongest of four kinds. Words are `dedup.matching_words`: the `\\w+`
runs of the normalised, accent-folded, lower-cased text, so case, punctuation, spacing,
compatibility forms and accents never hide a copy.

    exact          the same words (as a whole: the two texts are one text); similarity 1.0
    contained      the evaluation item's whole word sequence, of at least `SHORT_MIN_WORDS`
                   words, occurs inside the stage text's; similarity 1.0
    near           near-duplicate (`dedup.NearDuplicateIndex`): exact Jaccard of word 5-gram
                   shingles >= threshold, candidates from LSH banded for 0.95 recall at the
                   threshold; similarity is that Jaccard
    shared-window  an item of at least `WINDOW_WORDS` words shares a run of `WINDOW_WORDS`
                   consecutive words with the stage text; similarity is the share of the
                   item's windows found in that stage text

Why four. A short query has few shingles, so a stage paragraph that quotes it is never a
near-duplicate of it: containment finds it, for items shorter than a window as well (an
item of 4 to 9 words must occur whole). An edited copy (a word substituted, inserted or
swapped) is no longer contained: a 75-word document with one word changed keeps a Jaccard
of about 0.87, which the near rule finds; with several words changed, runs of ten words
survive and the window rule finds them (GPT-3's contamination check used 13-word runs;
ten suits the shorter items of retrieval tasks). What no rule here finds: an item under 10
words with any word changed, and a longer item edited at least every ten words. The
planted-copy recall of each rule is measured by `embedlab.contamination.recall` and asserted in
the suite.

All of it is linear in the stage's words, not in stage items x evaluation items: each
window size the items need is hashed over every stage text (vectorised, one extension per
size, `dedup.ngram_hashes_by_size`) and looked up among the items' windows; containment hits
are verified by a substring test on the joined words, window hits counted per item.

Counts. `AuditReport.counts[task][split][stage]` gives, per match kind, how many distinct
evaluation items have that kind as their strongest match in the stage (so the numbers add
up to the contaminated items); `findings` lists every matching pair. Split "test" is the
final evaluation: `enforce` refuses its findings unless a disclosed-overlap policy is given.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice

import numpy as np

from embedlab.sources.dedup import (NearDuplicateIndex, TARGET_RECALL, run_positions, lsh_params, matching_words,
                                  ngram_hashes_by_size, word_hashes)
from embedlab.core.beir import REQUIRED_SPLIT, Task
from embedlab.core.errors import UserError

FINAL_EVAL_SPLIT = REQUIRED_SPLIT
SHARED_WINDOW = "shared-window"
MATCH_KINDS = ("exact", "contained", "near", SHARED_WINDOW)  # strongest first
WINDOW_WORDS = 10  # the shared-window rule's run of words
SHORT_MIN_WORDS = 4  # shorter items are only found whole (exact)
CHUNK_ITEMS = 20_000
SNIPPET_CHARS = 80


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
    match: str  # one of MATCH_KINDS
    similarity: float
    item_snippet: str = ""
    stage_snippet: str = ""


@dataclass(frozen=True)
class AuditReport:
    """Findings, per-cell counts and how much was checked.

    `counts`: task -> split -> stage -> {kind: n for kind in MATCH_KINDS}, every cell present,
    zeros included. `checked`: {"stages": stage -> stage items read, "eval": task ->
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
            lines += ["| split | stage | queries | documents | " + " | ".join(MATCH_KINDS) + " |"]
            lines += ["|---|---|---:|---:|" + "---:|" * len(MATCH_KINDS)]
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
        f"Words: accent-folded, lower-cased \\w+ runs. exact: the same words; contained: the whole "
        f"evaluation item (>= {settings.get('short_min_words')} words) inside a stage item; near: exact "
        f"Jaccard of word 5-grams >= {settings.get('threshold')} (LSH {settings.get('bands')} bands x "
        f"{settings.get('rows')} rows of {settings.get('num_perm')} permutations, seed {settings.get('seed')}: "
        f"recall {settings.get('target_recall')} at the threshold); shared-window: a run of "
        f"{settings.get('window_words')} words in common."
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
    """The words the window rules compare (`dedup.matching_words`)."""
    return matching_words(text)


class _Matcher:
    """All evaluation items' forms, indexed for the four kinds of match."""

    def __init__(self, items: list[_EvalItem], threshold: float, num_perm: int, seed: int) -> None:
        forms = [(number, text) for number, item in enumerate(items) for text in item.texts]
        self.form_item = np.array([number for number, _ in forms], dtype=np.int64)
        words = [matching_words(text) for _, text in forms]
        self.by_words: dict[str, set[int]] = defaultdict(set)
        for (number, _), form_words in zip(forms, words):
            if form_words:
                self.by_words[" ".join(form_words)].add(number)
        self.index = NearDuplicateIndex(threshold, num_perm, seed)
        self.index.add([number for number, _ in forms], [text for _, text in forms])
        # Containment anchors: an item's first window, or the whole item when shorter than one.
        self.anchors: dict[int, dict[int, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
        tokens, lengths = word_hashes(words)
        sizes = {min(len(w), WINDOW_WORDS) for w in words if len(w) >= SHORT_MIN_WORDS}
        window_parts: list[tuple[np.ndarray, np.ndarray]] = []
        for n, hashes, counts in ngram_hashes_by_size(tokens, lengths, sizes):
            firsts = np.cumsum(counts) - counts
            for form, (form_words, count, first) in enumerate(zip(words, counts, firsts)):
                if count and min(len(form_words), WINDOW_WORDS) == n:
                    self.anchors[n][int(hashes[first])].append((forms[form][0], " ".join(form_words)))
            if n == WINDOW_WORDS:
                window_parts.append((hashes, np.repeat(np.arange(len(forms)), counts)))
        self.anchor_keys = {n: np.array(sorted(keys), dtype=np.uint64) for n, keys in self.anchors.items()}
        # The shared-window table: every distinct window of every form, sorted by hash.
        hashes, owners = window_parts[0] if window_parts else (np.zeros(0, np.uint64), np.zeros(0, np.int64))
        distinct = np.unique(np.stack((hashes, owners.astype(np.uint64))), axis=1)
        self.window_keys, self.window_forms = distinct[0], distinct[1].astype(np.int64)
        self.form_windows = np.bincount(self.window_forms, minlength=len(forms))

    def match(self, texts: list[str]) -> dict[tuple[int, int], tuple[str, float]]:
        """(eval item, position in `texts`) -> (kind, similarity) for every matching pair."""
        found: dict[tuple[int, int], tuple[str, float]] = {}

        def record(item: int, position: int, kind: str, similarity: float) -> None:
            old = found.get((item, position))
            if old is None or MATCH_KINDS.index(kind) < MATCH_KINDS.index(old[0]) or (
                    kind == old[0] and similarity > old[1]):
                found[item, position] = (kind, similarity)

        words = [matching_words(text) for text in texts]
        for position, text_words in enumerate(words):
            for item in self.by_words.get(" ".join(text_words), ()) if text_words else ():
                record(item, position, "exact", 1.0)
        tokens, lengths = word_hashes(words)
        sizes = set(self.anchor_keys) | ({WINDOW_WORDS} if len(self.window_keys) else set())
        for n, hashes, counts in ngram_hashes_by_size(tokens, lengths, sizes):
            owners = np.repeat(np.arange(len(texts)), counts)
            if n in self.anchor_keys:
                for item, position in self._contained(n, hashes, owners, words):
                    record(item, position, "contained", 1.0)
            if n == WINDOW_WORDS:
                for item, position, share in self._shared(hashes, owners):
                    record(item, position, SHARED_WINDOW, share)
        for position, matches in enumerate(self.index.query_many(texts)):
            best: dict[int, float] = {}
            for item, similarity in matches:  # best first: keep each item's first
                best.setdefault(item, similarity)
            for item, similarity in best.items():
                record(item, position, "near", similarity)
        return found

    def _contained(self, n: int, hashes: np.ndarray, owners: np.ndarray, words: list[list[str]]
                   ) -> set[tuple[int, int]]:
        """(eval item, position) pairs where the item's words occur inside the text's words."""
        hits = np.flatnonzero(np.isin(hashes, self.anchor_keys[n]))
        anchors_in: dict[int, set[int]] = defaultdict(set)
        for key, position in zip(hashes[hits].tolist(), owners[hits].tolist()):
            anchors_in[position].add(key)
        pairs: set[tuple[int, int]] = set()
        for position, keys in anchors_in.items():
            joined = f" {' '.join(words[position])} "
            pairs.update(
                (item, position)
                for key in keys
                for item, phrase in self.anchors[n][key]
                if f" {phrase} " in joined
            )
        return pairs

    def _shared(self, hashes: np.ndarray, owners: np.ndarray) -> list[tuple[int, int, float]]:
        """(eval item, position, share of the item's windows in that text) for every text that
        shares a window with an item (the best of the item's forms)."""
        hits = np.flatnonzero(np.isin(hashes, self.window_keys))
        if len(hits) == 0:
            return []
        lo = np.searchsorted(self.window_keys, hashes[hits], side="left")
        many = np.searchsorted(self.window_keys, hashes[hits], side="right") - lo
        forms = self.window_forms[np.repeat(lo, many) + run_positions(many)]
        triples = np.unique(np.stack((forms, np.repeat(owners[hits], many), np.repeat(hashes[hits], many).view(np.int64))),
                            axis=1)
        (forms, positions), shared = np.unique(triples[:2], axis=1, return_counts=True)
        shares = shared / self.form_windows[forms]
        return [(int(self.form_item[f]), int(p), float(x)) for f, p, x in zip(forms, positions, shares)]


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
    bands, rows = lsh_params(threshold, num_perm)
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
            "bands": bands,
            "rows": rows,
            "target_recall": TARGET_RECALL,
            "short_min_words": SHORT_MIN_WORDS,
            "window_words": WINDOW_WORDS,
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
