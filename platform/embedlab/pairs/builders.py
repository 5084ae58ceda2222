"""Positive pairs for the contrastive phases 2-3, built from the documents of a corpus table.

Every pair comes from exactly one document, so a pair can never mix splits: `build_pairs`
reads the rows of one split only, and each pair carries its document's id and split. A
pair's `confidence` says how sure we are that query and positive mean the same thing; a
trainer may weight or filter by it. Items sharing a `positive_group` must never serve as
each other's in-batch negatives. Each builder names a group (below); `build_pairs` then
widens it to the document's near-duplicate cluster (the corpus's `group_id`) and merges the
groups of pairs whose positives are the same text (`merge_positive_groups`), so an inherited
docstring or a synonym set listed under several headwords is never its own copy's negative.

    same-source-spans  two adjacent, non-overlapping windows of 20-80 words from one
                       long document of any prose source (bible chapters, handbook
                       sections, PostgreSQL pages, docstrings, man pages, long dictionary
                       entries and fortunes). Confidence 0.5: neighbouring passages usually
                       share a topic, but nothing guarantees they answer each other.
                       Group: the document.
    title-body         a heading or name -> the start of the text it heads: Python topic
                       heading -> topic text, docstring qualified name -> docstring,
                       handbook section title -> section, PostgreSQL page title (reference
                       pages: "NAME — purpose") -> page text (Description section), man
                       page "open(2): NAME line" -> DESCRIPTION section. Confidence 0.9: an
                       author wrote the title to describe exactly this text. Group: the document.
    term-definition    FOLDOC / Jargon File headword -> its definition (first sentences, with
                       subject tags, etymology labels, dates and citations removed; entries
                       that only point elsewhere, "See X.", are skipped). Confidence 0.9:
                       curated, though a definition can cover several senses. Group: the entry.
    lead-rest          the opening summary of a text title-body reads -> the rest of it: a
                       docstring's summary -> its explanation, a section's or a reference
                       page's first paragraph (or, when that is long, first sentence) -> what
                       follows, without the lead. Confidence 0.8: authors open with what the
                       text is about, but an opening can be a mere introduction.
                       Group: the document.
    keyword            one distinctive word of a prose document -> the document's opening
                       (its first 32 words, cut at a sentence end where one is near, so that
                       the word nearly always stays within the 64 tokens a pair holds by
                       default), the word inside it: letters only, at least 4 of them, in at
                       least 2 of the split's openings and at most 1% of them (or 2, when 1%
                       is fewer). A hash of the document id picks one per document, among
                       words no earlier document (by id) has taken: each word is one pair's
                       query. What a search box gets, and what BM25 answers by the word
                       alone: the other builders' queries are phrases, so nothing else
                       teaches a lone term to find the text that uses it. Confidence 0.5: the
                       word is in the document, but it is in others too. Group: the document.
    synonyms           thesaurus headword -> the other words of one of its senses
                       ("amsterdam" -> "Dutch capital, capital of The Netherlands"), one pair
                       per sense that lists synonyms (hypernyms, antonyms and adjective
                       pertainym senses left out). Confidence 0.7: synonymy holds for one
                       sense only and single words are ambiguous. Group: the headword's entry,
                       so the senses of one word are never negatives of each other.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from embedlab.contamination.audit import containment_words
from embedlab.sources.corpus import SPLITS

Row = Mapping[str, str]  # one corpus row: doc_id, source, title, text, split (hash is not used)
Span = tuple[int, int]  # [start, end) character offsets into a document's text
_T = TypeVar("_T")

SPANS_CONFIDENCE = 0.5
TITLE_BODY_CONFIDENCE = 0.9
TERM_DEFINITION_CONFIDENCE = 0.9
SYNONYMS_CONFIDENCE = 0.7

# Span windows: long enough to carry a topic, short enough that two of them fit most documents.
SPAN_MIN_WORDS = 20
SPAN_TARGET_WORDS = 40  # a window closes once it reaches this many words
SPAN_MAX_WORDS = 80
SPAN_PAIRS_PER_DOCUMENT = 4  # so a 3,000-word page does not outweigh forty short ones
# Evaluation encodes 128 tokens, about 96 words of English: a longer positive would be cut by
# the tokenizer anyway, so it is cut here, at a sentence end where one is near.
MAX_BODY_WORDS = 96
MIN_BODY_WORDS = 8  # shorter section bodies are scraps (a lone command, a link)
MAX_DEFINITION_WORDS = 64


@dataclass(frozen=True, kw_only=True)
class Pair:
    """A query and a positive from one document, with its provenance."""

    pair_id: str
    builder: str
    query: str
    positive: str
    source: str
    doc_ids: tuple[str, ...]
    split: str
    confidence: float
    positive_group: str

    def __post_init__(self) -> None:
        if not self.query.strip() or not self.positive.strip():
            raise ValueError(f"pair {self.pair_id!r}: empty query or positive")
        if self.query == self.positive:
            raise ValueError(f"pair {self.pair_id!r}: query equals positive")
        if not 0.0 < self.confidence <= 1.0:
            raise ValueError(f"pair {self.pair_id!r}: confidence {self.confidence} not in (0, 1]")
        if not self.doc_ids:
            raise ValueError(f"pair {self.pair_id!r}: no doc_ids")


def _pair(builder: str, row: Row, locator: str, query: str, positive: str, confidence: float, group: str) -> Pair:
    """A pair from one row; its id is builder, document id and a locator inside the document."""
    return Pair(
        pair_id=f"{builder}:{row['doc_id']}{locator}",
        builder=builder,
        query=query,
        positive=positive,
        source=row["source"],
        doc_ids=(row["doc_id"],),
        split=row["split"],
        confidence=confidence,
        positive_group=group,
    )


_ENDS_SENTENCE = re.compile(r".*[^\d\s.][.!?][\"'”’)]*$")  # "Done." or "(so!)", not the "4." of a numbered list


def _truncate(text: str, max_words: int) -> str:
    """Whitespace-collapsed text of at most max_words words, cut after a sentence when one ends in the second half."""
    words = text.split()
    if len(words) <= max_words:
        return " ".join(words)
    head = words[:max_words]
    ends = [i for i, word in enumerate(head) if _ENDS_SENTENCE.match(word) and i + 1 >= max_words // 2]
    return " ".join(head[: ends[-1] + 1] if ends else head)


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


# ---------------------------------------------------------------------------------------------
# same-source-spans

# The thesaurus lists senses, not prose: two halves of an entry are not a meaningful pair.
SPAN_EXCLUDED_SOURCES = frozenset({"mythes-en-us"})

# Where a piece of text may be cut, from the coarsest boundary to the finest.
_BOUNDARIES = (
    re.compile(r"\n\s*\n"),  # paragraphs
    re.compile(r"(?<=[.!?;:])\s+"),  # sentences and clauses (a Bible verse ends in one of these)
    re.compile(r"\n"),  # lines: code and tables have no sentences
    re.compile(r"\s+"),  # words
)


def _words(text: str, span: Span) -> int:
    return len(text[span[0] : span[1]].split())


def _split(text: str, span: Span, boundary: re.Pattern[str]) -> list[Span]:
    """The non-blank pieces of text[span] between matches of boundary, trimmed of whitespace."""
    pieces, position = [], span[0]
    for match in boundary.finditer(text, span[0], span[1]):
        pieces.append((position, match.start()))
        position = match.end()
    pieces.append((position, span[1]))
    trimmed = []
    for start, end in pieces:
        piece = text[start:end]
        stripped = piece.strip()
        if stripped:
            start += len(piece) - len(piece.lstrip())
            trimmed.append((start, start + len(stripped)))
    return trimmed


def _pieces(text: str, span: Span, level: int = 0) -> Iterator[Span]:
    """Consecutive pieces of at most SPAN_MAX_WORDS words, cut at the coarsest boundary that allows it."""
    if _words(text, span) <= SPAN_MAX_WORDS or level == len(_BOUNDARIES):
        yield span
        return
    for piece in _split(text, span, _BOUNDARIES[level]):
        yield from _pieces(text, piece, level + 1)


def _windows(text: str) -> list[Span]:
    """Non-overlapping windows of SPAN_MIN_WORDS..SPAN_MAX_WORDS words, made of whole pieces, in order."""
    windows: list[Span] = []
    start, end, words = None, 0, 0
    for piece in _pieces(text, (0, len(text))):
        count = _words(text, piece)
        if start is not None and words + count > SPAN_MAX_WORDS:  # the piece does not fit: close
            if words >= SPAN_MIN_WORDS:
                windows.append((start, end))
            start, words = None, 0
        if start is None:
            start = piece[0]
        end, words = piece[1], words + count
        if words >= SPAN_TARGET_WORDS:
            windows.append((start, end))
            start, words = None, 0
    if start is not None and words >= SPAN_MIN_WORDS:
        windows.append((start, end))
    return windows


# A plain word, with quotes, brackets and punctuation around it ("(e.g.," counts; "*stream);" does not).
_PLAIN_WORD = re.compile(r"[\"'“‘(]*[A-Za-z]+(?:[-'’][A-Za-z]+)*[.,;:!?\"'”’)]*")
SPAN_MIN_PLAIN_WORDS = 0.7  # measured: below this, windows are mostly code, tables or man-page boilerplate


def _is_prose(text: str) -> bool:
    """Mostly plain words: code and tables make poor evidence of a shared topic."""
    words = text.split()
    return sum(_PLAIN_WORD.fullmatch(word) is not None for word in words) >= SPAN_MIN_PLAIN_WORDS * len(words)


def _evenly(items: list[_T], count: int) -> list[_T]:
    """At most count items, spread evenly over the list (deterministic)."""
    return items if len(items) <= count else [items[i * len(items) // count] for i in range(count)]


def _span_pairs(text: str) -> list[tuple[Span, Span]]:
    """Windows 2k and 2k+1 as (query, positive), where both are prose and not the same words (a refrain)."""
    windows = _windows(text)
    pairs = []
    for first, second in zip(windows[0::2], windows[1::2]):
        query, positive = text[first[0] : first[1]], text[second[0] : second[1]]
        if _is_prose(query) and _is_prose(positive) and query.split() != positive.split():
            pairs.append((first, second))
    return pairs


def same_source_spans(rows: Iterable[Row]) -> Iterator[Pair]:
    """Adjacent windows of one document, at most SPAN_PAIRS_PER_DOCUMENT pairs spread over it."""
    for row in rows:
        if row["source"] in SPAN_EXCLUDED_SOURCES:
            continue
        text = row["text"]
        for (qs, qe), (ps, pe) in _evenly(_span_pairs(text), SPAN_PAIRS_PER_DOCUMENT):
            locator = f"@{qs}:{qe},{ps}:{pe}"  # span_offsets reads it back
            yield _pair("same-source-spans", row, locator, text[qs:qe], text[ps:pe], SPANS_CONFIDENCE, row["doc_id"])


def span_offsets(pair: Pair) -> tuple[Span, Span]:
    """The (query, positive) character spans of a same-source-spans pair, read from its id."""
    query, positive = pair.pair_id.rpartition("@")[2].split(",")
    first, second = (tuple(map(int, span.split(":"))) for span in (query, positive))
    return first, second


# ---------------------------------------------------------------------------------------------
# title-body

_UNDERLINE = re.compile(r"^([*=\-~^\"#+])\1{2,}$")  # reStructuredText heading underline
# "8.10.1. ", "Chapter 12. ", "Appendix L. ": numbering says nothing about the topic.
_SECTION_NUMBER = re.compile(r"(?:^|(?<=: ))(?:(?:Chapter|Appendix|Part) )?[0-9A-Z]{1,3}(?:\.[0-9]+)*\. ")
_MAN_HEADING = re.compile(r"[A-Z][A-Z ]*")
# A PostgreSQL reference page's section headings ("Synopsis", "See Also"): short, capitalised, unpunctuated.
_REFERENCE_HEADING = re.compile(r"[A-Z][a-z]+(?: [A-Z][a-z]+){0,2}")


def _section(paragraphs: list[str], heading: str, headings: re.Pattern[str]) -> str:
    """The paragraphs after the one that is exactly `heading`, up to the next heading ('' if none)."""
    if heading not in paragraphs:
        return ""
    body = []
    for paragraph in paragraphs[paragraphs.index(heading) + 1 :]:
        if headings.fullmatch(paragraph):
            break
        body.append(paragraph)
    return "\n\n".join(body)


def _python_docs(row: Row) -> tuple[str, str]:
    # Topic keys ("typesseq-mutable") are lookup names; the underlined first line is the real
    # heading ("Mutable Sequence Types"), so it is the query.
    lines = row["text"].splitlines()
    if len(lines) > 1 and _UNDERLINE.match(lines[1]):
        heading, lines = lines[0], lines[2:]
    else:
        heading = row["title"]
    return heading, "\n".join(line for line in lines if not _UNDERLINE.match(line))


def _docstring(row: Row) -> tuple[str, str]:
    # Query = the qualified name, positive = the whole docstring, summary line included. The
    # summary is the sentence that best describes the name, and splitting it off as the query
    # would leave many docstrings (the reader keeps those of 80+ characters) with a one-line
    # body. The dotted name is the docstring's title as a heading is a section's, and it teaches
    # identifier -> description retrieval ("set_task_factory" -> "Set a task factory ...").
    return row["title"], row["text"]


def _numbered_section(row: Row) -> tuple[str, str]:
    return _SECTION_NUMBER.sub("", row["title"]).removesuffix(" (continued)"), row["text"]


def _postgres(row: Row) -> tuple[str, str]:
    # Reference pages open with "SET — change a run-time parameter", then a Synopsis of syntax:
    # that line is the query and the Description section the positive (as for man pages).
    paragraphs = _paragraphs(row["text"])
    if paragraphs[0].startswith(f"{row['title']} — "):
        description = _section(paragraphs, "Description", _REFERENCE_HEADING)
        return paragraphs[0], description
    return _numbered_section(row)


def _manpage(row: Row) -> tuple[str, str]:
    # "open(2): open, openat, creat - open and possibly create a file" -> DESCRIPTION: the
    # NAME line holds every name the page documents and its one-line purpose.
    paragraphs = _paragraphs(row["text"])
    name = " ".join(_section(paragraphs, "NAME", _MAN_HEADING).split())
    query = f"{row['title']}: {name}" if name else row["title"]
    return query, _section(paragraphs, "DESCRIPTION", _MAN_HEADING)


# Sources with titles that describe their text; the Bible's "Genesis 1" and the fortune files'
# names do not, and dictionaries have their own builder.
TITLE_BODY_READERS: dict[str, Callable[[Row], tuple[str, str]]] = {
    "python-docs": _python_docs,
    "python-docstrings": _docstring,
    "debian-handbook": _numbered_section,
    "postgresql-doc-15": _postgres,
    "manpages-dev": _manpage,
}


def title_body(rows: Iterable[Row]) -> Iterator[Pair]:
    """Title (or name and purpose) -> the first MAX_BODY_WORDS words of the text it heads."""
    for row in rows:
        reader = TITLE_BODY_READERS.get(row["source"])
        if reader is None:
            continue
        title, body = reader(row)
        query, positive = " ".join(title.split()), _truncate(body, MAX_BODY_WORDS)
        if query and len(positive.split()) >= MIN_BODY_WORDS and query != positive:
            yield _pair("title-body", row, "", query, positive, TITLE_BODY_CONFIDENCE, row["doc_id"])


# ---------------------------------------------------------------------------------------------
# lead-rest

LEAD_REST_CONFIDENCE = 0.8
# A lead is at least 8 words: the audit's containment floor when the rule was set, kept so
# the pairs (and every study on them) stay as they were. A task built from held-out documents
# drops every query contained in a training document (from `audit.SHORT_MIN_WORDS` words), so
# no eval query can equal a lead (each lead is inside its training document).
LEAD_MIN_WORDS = 8
LEAD_MAX_WORDS = 48  # a longer opening paragraph is not a summary: its first sentence is the lead
_LEAD_SENTENCE_END = re.compile(r"(?<=[^\d\s.][.!?])\s+(?=[\"'“‘(]*[A-Z])")  # "... a file. The" but not "e.g. the"


def _lead(body: str) -> tuple[str, str]:
    """(lead, rest) of a text: its first paragraph when that is short, else its first sentence."""
    paragraphs = _paragraphs(body)
    if not paragraphs:
        return "", ""
    first = " ".join(paragraphs[0].split())
    if len(first.split()) <= LEAD_MAX_WORDS:
        return first, "\n\n".join(paragraphs[1:])
    sentence, *remainder = _LEAD_SENTENCE_END.split(first, maxsplit=1)
    return sentence, "\n\n".join([*remainder, *paragraphs[1:]])


def lead_rest(rows: Iterable[Row]) -> Iterator[Pair]:
    """The lead of a titled text (its opening summary) -> the rest of that text."""
    # The texts title-body reads (a docstring, a handbook section, a reference page's
    # Description): their authors open with what the text is about, and the rest explains it.
    # The lead is taken out of the positive, so the pair is never a substring match.
    for row in rows:
        reader = TITLE_BODY_READERS.get(row["source"])
        if reader is None:
            continue
        lead, rest = _lead(reader(row)[1])
        positive = _truncate(rest, MAX_BODY_WORDS)
        if (len(containment_words(lead)) >= LEAD_MIN_WORDS and len(lead.split()) <= LEAD_MAX_WORDS and _is_prose(lead)
                and len(positive.split()) >= MIN_BODY_WORDS):
            yield _pair("lead-rest", row, "", lead, positive, LEAD_REST_CONFIDENCE, row["doc_id"])


# ---------------------------------------------------------------------------------------------
# keyword

KEYWORD_CONFIDENCE = 0.5
KEYWORD_MIN_LETTERS = 4
# A word in at least two openings is a word of the language, not a typo or an identifier; one
# in more than 1% of them (and at least two) says too little about which text is meant.
KEYWORD_MIN_DOCUMENTS = 2
KEYWORD_MAX_DOCUMENT_SHARE = 0.01
# The opening is short enough that the word stays inside what the student reads: 64 tokens
# (the default `pair_length`) less [CLS], [SEP] and the passage prefix hold most 32-word
# openings of the built-in corpus whole, and keep the keyword in nearly all of the rest.
KEYWORD_OPENING_WORDS = 32
_WORD = re.compile(r"\w+")


def _keyword_words(text: str) -> set[str]:
    """The lower-cased words of a text that are letters only, at least KEYWORD_MIN_LETTERS of
    them: "read_file" or "utf8" is an identifier, not a word."""
    return {word for word in _WORD.findall(text.lower()) if len(word) >= KEYWORD_MIN_LETTERS and word.isalpha()}


def keyword(rows: Iterable[Row]) -> Iterator[Pair]:
    """A distinctive word of a prose document's opening -> that opening; each word is the query
    of one pair only."""
    openings = []
    for row in sorted(rows, key=lambda row: row["doc_id"]):
        if row["source"] in SPAN_EXCLUDED_SOURCES:  # thesaurus entries are word lists, not prose
            continue
        opening = _truncate(row["text"], KEYWORD_OPENING_WORDS)
        if len(opening.split()) >= MIN_BODY_WORDS and _is_prose(opening):
            openings.append((row, opening, _keyword_words(opening)))
    documents = Counter(word for _, _, words in openings for word in words)
    most = max(KEYWORD_MIN_DOCUMENTS, int(KEYWORD_MAX_DOCUMENT_SHARE * len(openings)))
    # A word picked twice would put two copies of one query with different positives into a
    # batch, each the other's negative: a word goes to the first document (by id) to pick it.
    used: set[str] = set()
    for row, opening, words in openings:
        candidates = sorted(w for w in words if KEYWORD_MIN_DOCUMENTS <= documents[w] <= most and w not in used)
        if candidates:
            pick = candidates[int.from_bytes(hashlib.sha256(row["doc_id"].encode()).digest()[:8], "big") % len(candidates)]
            used.add(pick)
            yield _pair("keyword", row, "", pick, opening, KEYWORD_CONFIDENCE, row["doc_id"])


# ---------------------------------------------------------------------------------------------
# term-definition

TERM_SOURCES = frozenset({"dict-foldoc", "dict-jargon"})

# Paragraphs that are not definition text: FOLDOC's "(1998-04-19)" dates, "(rfc:822)." links,
# "[Sammet 1969, p. 174]." citations, and the Jargon File's "[Usenet: from ...]" notes.
_METADATA = re.compile(r"\([^()]*\)\.?|\[[^\[\]]*\]\.?")
# Labels opening a sense, before or after its number: FOLDOC's subject "<language>", the Jargon
# File's "[Usenet]" origin. A few close with a wrong character: "<networking<", "[abbreviation, ...)".
_LABELS = r"(?:<[^<>{}]*[>}<]\s*|\[[^\[\]]*\]\s*|\[[^\[\]()]*\)\s*)*"
_LABEL = re.compile(rf"^{_LABELS}(\d+\.\s+)?{_LABELS}")
_CROSS_REFERENCE = re.compile(
    r"(?:\d+\.\s+)?(?:see(?: also)?|compare|cf\.|syn\.?(?: for)?|synonym (?:for|of)|same as|antonym(?: of)?)\b", re.I
)
_SENTENCE_END = re.compile(r"(?<=[^\d\s][.!?])\s+")  # not after "1." of a numbered sense


def _definition(text: str) -> str:
    """The definition paragraphs of a dictd entry (the first paragraph is the headword line), labels removed."""
    paragraphs = (_LABEL.sub(r"\1", p) for p in _paragraphs(text)[1:] if not _METADATA.fullmatch(p))
    return " ".join(" ".join(p.split()) for p in paragraphs if p.strip())


def _only_points_elsewhere(definition: str) -> bool:
    """'See bit rot.', 'Syn. for bitty box.': every sentence is a cross-reference."""
    return all(_CROSS_REFERENCE.match(sentence) for sentence in _SENTENCE_END.split(definition))


def term_definition(rows: Iterable[Row]) -> Iterator[Pair]:
    """Dictionary headword -> its definition's first sentences; cross-reference stubs skipped."""
    for row in rows:
        if row["source"] not in TERM_SOURCES:
            continue
        definition = _definition(row["text"])
        if not definition or _only_points_elsewhere(definition):
            continue
        query, positive = row["title"].strip(), _truncate(definition, MAX_DEFINITION_WORDS)
        if query and query != positive:
            yield _pair("term-definition", row, "", query, positive, TERM_DEFINITION_CONFIDENCE, row["doc_id"])


# ---------------------------------------------------------------------------------------------
# synonyms

SYNONYM_SOURCES = frozenset({"mythes-en-us"})
# Labelled groups in a sense line ("a kind of: city") are hypernyms, similar or related words and
# antonyms: not synonyms. Only the unlabelled group right after the part of speech is.
_RELATION_LABELS = ("a kind of: ", "similar to: ", "related to: ", "opposite of: ")


def _sense_synonyms(line: str, headword: str) -> list[str]:
    """'noun: Amsterdam, Dutch capital; a kind of: ...' -> ['Dutch capital'] (the headword removed)."""
    pos, _, groups = line.partition(": ")
    first = groups.split("; ")[0]
    if first.startswith(_RELATION_LABELS):
        return []
    if pos == "adjective" and "; related to: " in groups:
        # A pertainym ("waxen" -> "waxy, lipid, lipide; related to: lipoid"): the unlabelled group
        # mixes in the nouns the adjective pertains to, which are not synonyms.
        return []
    return [word for word in first.split(", ") if word.casefold() != headword.casefold()]


def synonyms(rows: Iterable[Row]) -> Iterator[Pair]:
    """Headword -> the other words of one sense, one pair per sense with synonyms (repeats dropped)."""
    # A word list rather than a single synonym: the list pins down which sense is meant
    # ("bank" -> "depository financial institution, banking concern, banking company").
    for row in rows:
        if row["source"] not in SYNONYM_SOURCES:
            continue
        headword, *senses = row["text"].splitlines()
        seen: set[str] = set()
        for number, sense in enumerate(senses, start=1):
            positive = ", ".join(_sense_synonyms(sense, headword))
            if positive and positive not in seen:
                seen.add(positive)
                yield _pair("synonyms", row, f"#{number}", headword, positive, SYNONYMS_CONFIDENCE, row["doc_id"])


# ---------------------------------------------------------------------------------------------
# Registry and entry points

PAIR_BUILDERS: dict[str, Callable[[Iterable[Row]], Iterator[Pair]]] = {
    "same-source-spans": same_source_spans,
    "title-body": title_body,
    "term-definition": term_definition,
    "synonyms": synonyms,
    "lead-rest": lead_rest,
    "keyword": keyword,
}

_ROW_COLUMNS = ["doc_id", "source", "title", "text", "split"]
CLUSTER_COLUMN = "group_id"  # the corpus's near-duplicate cluster of each document


def pair_builder(name: str) -> Callable[[Iterable[Row]], Iterator[Pair]]:
    """The builder registered under name; an unknown name is a ValueError listing the valid ones."""
    try:
        return PAIR_BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown pair builder {name!r}; valid names: {', '.join(PAIR_BUILDERS)}") from None


def _subsample(pairs: list[Pair], limit: int, seed: int) -> list[Pair]:
    """`limit` pairs chosen by a seeded hash of their ids, in their original order.

    Ranking by hash makes a pair's chance depend only on the seed and its id, not on row
    order or on which other builders ran.
    """
    if len(pairs) <= limit:
        return pairs
    rank = sorted(range(len(pairs)), key=lambda i: hashlib.sha256(f"{seed}:{pairs[i].pair_id}".encode()).digest())
    keep = set(rank[:limit])
    return [pair for i, pair in enumerate(pairs) if i in keep]


def build_pairs(
    corpus_table: pa.Table,
    builders: list[str],
    *,
    split: str,
    seed: int,
    max_pairs_per_builder: int | None = None,
) -> list[Pair]:
    """Pairs from the rows of one split, builder by builder, each capped at max_pairs_per_builder."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if max_pairs_per_builder is not None and max_pairs_per_builder < 0:
        raise ValueError(f"max_pairs_per_builder must be >= 0, got {max_pairs_per_builder}")
    if len(set(builders)) != len(builders):
        raise ValueError(f"pair builders listed more than once: {builders}")
    functions = {name: pair_builder(name) for name in builders}  # every name checked before any work
    table = corpus_table.filter(pc.equal(corpus_table["split"], split))
    # A table without clusters (no dedup run) counts every document as its own cluster.
    cluster_of = dict(zip(table["doc_id"].to_pylist(), table[CLUSTER_COLUMN].to_pylist())) \
        if CLUSTER_COLUMN in table.column_names else {}
    # Sorted by id, so the pairs do not depend on the order of the table's rows.
    rows = sorted(table.select(_ROW_COLUMNS).to_pylist(), key=lambda row: row["doc_id"])
    pairs: list[Pair] = []
    for name, build in functions.items():
        built = list(build(rows))
        pairs += built if max_pairs_per_builder is None else _subsample(built, max_pairs_per_builder, seed)
    return merge_positive_groups(pairs, cluster_of)


class SmallestRootSets:
    """Union-find over names (path halving) whose root is always the set's smallest name, so
    which name stands for a set does not depend on the order of the unions."""

    def __init__(self) -> None:
        self._parent: dict[str, str] = {}

    def find(self, node: str) -> str:
        parent = self._parent
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(self, a: str, b: str) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self._parent[max(a, b)] = min(a, b)


def merge_positive_groups(pairs: list[Pair], cluster_of: Mapping[str, str]) -> list[Pair]:
    """The pairs with groups joined (union-find) wherever two pairs' builder groups share a
    document cluster (`cluster_of`: doc id -> cluster; a document not in it is its own) or
    their positives are the same text (whitespace and case folded). A joined group is named
    by its smallest member's name, so the result does not depend on the pairs' order."""
    sets = SmallestRootSets()
    find, union = sets.find, sets.union
    for pair in pairs:
        group = f"group:{pair.positive_group}"
        for doc_id in pair.doc_ids:
            union(group, f"cluster:{cluster_of.get(doc_id, doc_id)}")
        union(group, f"positive:{' '.join(pair.positive.lower().split())}")
    # Name each joined group by its smallest builder group (the root may be a cluster or a text).
    names: dict[str, str] = {}
    for pair in pairs:
        root = find(f"group:{pair.positive_group}")
        names[root] = min(names.get(root, pair.positive_group), pair.positive_group)
    return [dataclasses.replace(pair, positive_group=names[find(f"group:{pair.positive_group}")]) for pair in pairs]


PAIR_SCHEMA = pa.schema([
    ("pair_id", pa.string()),
    ("builder", pa.string()),
    ("query", pa.string()),
    ("positive", pa.string()),
    ("source", pa.string()),
    ("doc_ids", pa.list_(pa.string())),
    ("split", pa.string()),
    ("confidence", pa.float64()),
    ("positive_group", pa.string()),
])


def pairs_to_table(pairs: Iterable[Pair]) -> pa.Table:
    """One row per pair, columns as the Pair fields (doc_ids a list of strings)."""
    return pa.Table.from_pylist([asdict(pair) for pair in pairs], schema=PAIR_SCHEMA)


def pair_stats(pairs: list[Pair]) -> dict:
    """Pair counts per builder and per source, and mean query / positive length in characters."""
    count = max(len(pairs), 1)
    return {
        "pairs": len(pairs),
        "by_builder": dict(sorted(Counter(p.builder for p in pairs).items())),
        "by_source": dict(sorted(Counter(p.source for p in pairs).items())),
        "mean_query_chars": sum(len(p.query) for p in pairs) / count,
        "mean_positive_chars": sum(len(p.positive) for p in pairs) / count,
    }
