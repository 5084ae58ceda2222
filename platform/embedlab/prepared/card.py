"""The data card: what a prepared data directory holds, where it came from, what was dropped.

Written as `data_card.json` (everything) and `data_card.md` (for people) next to the
frozen manifests. A dataset card is evidence to inspect, not permission to redistribute:
the rights column repeats each source's own licence notes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def card_dict(record: dict[str, Any], corpus_manifest: dict[str, Any], audits: dict[str, dict],
              user_pairs: dict[str, dict] | None = None) -> dict:
    """`user_pairs`: key -> record of each user pair set frozen in the directory (`data.user_pairs`)."""
    return {
        "corpus_hash": record["corpus_hash"],
        "data_revision": record["data_revision"],
        "tokenizer": {"hash": record["tokenizer_hash"], **record["tokenizer"],
                      "training_documents": record["tokenizer_sample_documents"]},
        "sources": corpus_manifest["sources"],
        "unavailable_sources": corpus_manifest["unavailable_sources"],
        "dedup": corpus_manifest["dedup"],
        "split_rule": corpus_manifest["split_rule"],
        "exclusions": corpus_manifest["exclusions"],
        "mixture": record["mixture"],
        "pieces": record["pieces"],
        "tasks": record.get("tasks", {}),
        "audits": audits,
        "user_pairs": user_pairs or {},
    }


def _licences(rights: dict[str, Any]) -> str:
    return ", ".join(rights.get("licenses") or []) or (rights.get("notes") or "")[:60].replace("\n", " ")


def card_markdown(card: dict[str, Any]) -> str:
    lines = [
        "# Data card",
        "",
        f"- corpus hash: `{card['corpus_hash']}`",
        f"- data revision: `{card['data_revision']}`",
        f"- tokenizer: {card['tokenizer'].get('kind', '?')}, vocabulary {card['tokenizer'].get('vocab_size', '?')}, "
        f"hash `{card['tokenizer']['hash'][:16]}`, " + (
            f"the pretrained parent's own ({card['tokenizer']['sample']})" if "sample" in card["tokenizer"] else
            f"trained on {card['tokenizer']['training_documents']:,} training-split documents"),
        f"- split rule: {card['split_rule']}",
        f"- dedup: {card['dedup']['exact']}; {card['dedup']['near']}",
        "",
        "## Sources",
        "",
        "| source | domain | revision | read | train | dev | test | rights |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for name, source in card["sources"].items():
        retained = source.get("retained", {})
        lines.append(
            f"| {name} | {source['domain']} | {source['revision']} | {source['documents_read']:,} | "
            f"{retained.get('train', 0):,} | {retained.get('dev', 0):,} | {retained.get('test', 0):,} | "
            f"{_licences(source['rights'])} |"
        )
    for name, why in card["unavailable_sources"].items():
        lines.append(f"| {name} | — | not available: {why} | | | | | |")
    lines += ["", "## Exclusion report", "", "| source | reason | count |", "|---|---|---:|"]
    exclusions = [*card["exclusions"], *(e for pairs in card.get("user_pairs", {}).values() for e in pairs["exclusions"])]
    lines += [f"| {e['source']} | {e['reason']} | {e['count']:,} |" for e in exclusions] or ["| — | none | 0 |"]
    dedup = card["dedup"]
    lines += [
        "",
        f"Near-duplicate clusters with more than one document: {dedup['multi_document_clusters']:,} "
        f"({dedup['documents_in_multi_document_clusters']:,} documents, {dedup['cross_source_clusters']:,} "
        "spanning sources). Clusters are kept whole inside one split.",
        "",
        "## Mixture (share of consumed non-padding tokens)",
        "",
        f"Origin: {card['mixture']['origin']}; schedule {card['mixture']['schedule']}, seed "
        f"{card['mixture']['seed']}, repetition cap {card['mixture']['max_epochs']:g} epochs.",
        "",
        "| source | intended share | training tokens | pieces | documents longer than L |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, share in card["mixture"]["shares"].items():
        pieces = card["pieces"].get(name, {})
        lines.append(
            f"| {name} | {share:.3f} | {pieces.get('tokens', 0):,} | {pieces.get('pieces', 0):,} | "
            f"{pieces.get('truncation_frequency', 0.0):.3f} |"
        )
    lines += [f"- {note}" for note in card["mixture"]["notes"]]
    for name, task in card["tasks"].items():
        lines += [
            "", f"## Task {name}", "",
            f"{task['documents']:,} documents; queries per split {task['queries']}; "
            f"{task['queries_removed']} queries and {task['documents_removed']} documents removed because "
            f"they were found in training-split text (see tasks/{name}/decontamination.json).",
        ]
    for key, pairs in card.get("user_pairs", {}).items():
        lines += _user_pair_lines(key, pairs)
    for name, audit in card["audits"].items():
        lines += ["", f"## Contamination audit: {name}", "", audit.get("markdown", "")]
    return "\n".join(lines) + "\n"


def _user_pair_lines(key: str, pairs: dict[str, Any]) -> list[str]:
    lines = ["", f"## User pair sources ({key})", "",
             f"Split: {pairs['split_rule']}. {pairs['groups']:,} positive groups (near-duplicate threshold "
             f"{pairs['near_duplicate_threshold']}); {len(pairs['duplicates']):,} exact duplicate pairs removed.", "",
             "| source | kind | revision | read | pairs | train rows | train | dev | test | rights |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    files = []
    for source in pairs["sources"]:
        counts, read = pairs["splits"][source["name"]], source["read"]
        rows = pairs.get("rows", {}).get(source["name"], {}).get("train", counts["train"])
        revision = source.get("content_revision") or source.get("resolved_revision") or source["revision"]
        lines.append(f"| {source['name']} | {source['kind']} | {revision} | {read['records']:,} | {read['pairs']:,} | "
                     f"{rows:,} | {counts['train']:,} | {counts['dev']:,} | {counts['test']:,} | {source['rights']} |")
        files += [f"- `{source['name']}` file `{entry['path']}`: sha256 `{entry['sha256']}`"
                  for entry in (*source.get("files", ()), *source.get("data_files", ())) if "sha256" in entry]
    note = ("Pairs are counted per split (train, dev, test); train rows are what is streamed, one per "
            "(query, positive), the unit of shares and budgets. Their drops are in the exclusion report.")
    return [*lines, "", note, *([""] + files if files else [])]


def write_card(directory: Path, card: dict[str, Any]) -> tuple[Path, Path]:
    directory = Path(directory)
    json_path, md_path = directory / "data_card.json", directory / "data_card.md"
    json_path.write_text(json.dumps(card, indent=2, sort_keys=True, default=str))
    md_path.write_text(card_markdown(card))
    return json_path, md_path
