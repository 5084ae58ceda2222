"""`embedlab data build|audit|audit-recall` and `embedlab tokenizer compare`: prepare the training
data, audit it for contamination, measure the audit's recall on planted copies, compare tokenizer
candidates on it.

Each command prepares (or reuses) the data of every config its spec names (`embedlab.studies.spec`)
and calls the library on it. `embedlab.cli.build_parser` registers them with `add_parsers`.
"""

from __future__ import annotations

import argparse
import json

from embedlab.cli.common import add_spec, stderr
from embedlab.core import store
from embedlab.core.errors import UsageError
from embedlab.studies.spec import load_data_configs


def _configs(args: argparse.Namespace) -> list:
    """The spec's data configs and the data cache, checked before a cluster starts."""
    configs = load_data_configs(args.spec)
    store.cache_dir()  # EMBEDLAB_CACHE: a folder, or none yet
    return configs


def cmd_data_build(args: argparse.Namespace) -> int:
    # here: torch (sweep.run) and tokenizers (data.prepare)
    from embedlab.prepared.build import prepare_data
    from embedlab.sweep.cluster import connect

    configs = _configs(args)
    connect(args.address, stderr)
    for config in configs:
        prepared = prepare_data(config, progress=stderr)
        print(f"prepared data: {prepared.directory}")
        print(f"data card:     {prepared.directory / 'data_card.md'}")
    return 0


def cmd_data_audit(args: argparse.Namespace) -> int:
    # here: torch (sweep.run) and tokenizers (the data modules)
    from embedlab.sweep.gate import run_audit
    from embedlab.contamination.stages import ALL_STAGES
    from embedlab.prepared.build import prepare_data
    from embedlab.sweep.cluster import connect

    configs = _configs(args)
    connect(args.address, stderr)
    for config in configs:
        prepared = prepare_data(config, progress=stderr)
        report = run_audit(prepared, stages=ALL_STAGES, extra_tasks=args.task, progress=stderr, data=config)
        print(json.dumps(report.to_dict(), sort_keys=True) if args.json else report.to_markdown())
    return 0


def cmd_data_audit_recall(args: argparse.Namespace) -> int:
    # here: the audit, numpy and the built-in readers, which parsing the command line does not need
    from embedlab.contamination.recall import measure

    if args.items < 1:
        raise UsageError(f"--items: must be at least 1, got {args.items}")
    table = measure(per_kind=args.items)
    if args.json:
        print(json.dumps({"settings": table.settings, "controls": table.controls,
                          "false_positives": table.false_positives,
                          "rows": [{**vars(row), "recall": row.recall} for row in table.rows]}, sort_keys=True))
    else:
        print(table.to_markdown(), end="")
    return 0


def cmd_tokenizer_compare(args: argparse.Namespace) -> int:
    # here: torch (sweep.run) and tokenizers (data.prepare, tokenizer.compare)
    from embedlab.bench.tokenizers import compare_corpus_tokenizers, format_comparison
    from embedlab.prepared.build import prepare_data
    from embedlab.sweep.cluster import connect

    configs = _configs(args)
    connect(args.address, stderr)
    for config in configs:
        prepared = prepare_data(config, progress=stderr)
        rows = compare_corpus_tokenizers(prepared, progress=stderr)
        print(json.dumps(rows, sort_keys=True) if args.json else format_comparison(rows))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab data build|audit|audit-recall` and `embedlab tokenizer compare` on the main parser's subcommands."""
    data = sub.add_parser("data", help="build and audit training data")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    build = data_sub.add_parser("build", help="corpus, dedup, group-aware splits, tokenizer, pieces and a data card")
    add_spec(build)
    build.set_defaults(func=cmd_data_build)
    audit = data_sub.add_parser("audit", help="check evaluation items against every training stage")
    add_spec(audit)
    audit.add_argument("--task", action="append", default=[], help="an extra BEIR task directory (repeatable)")
    audit.add_argument("--json", action="store_true")
    audit.set_defaults(func=cmd_data_audit)
    recall = data_sub.add_parser(
        "audit-recall", help="how often the audit finds edited copies of evaluation items (planted in real text)")
    recall.add_argument("--items", type=int, default=100, help="planted items per kind (default 100)")
    recall.add_argument("--json", action="store_true")
    recall.set_defaults(func=cmd_data_audit_recall)

    tokenizer = sub.add_parser("tokenizer", help="tokenizer candidates")
    tokenizer_sub = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    compare = tokenizer_sub.add_parser("compare", help="BPE, unigram and byte-level trained on the training split")
    add_spec(compare)
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(func=cmd_tokenizer_compare)
