"""`embedlab evaluate` and `embedlab evaluator stop|status`: score an encoder on a task; the
cluster's evaluation actor.

`evaluate` resolves its arguments with `embedlab.evaluate.arguments` and `evaluator` asks
`embedlab.evaluate.actor`. `embedlab.cli.build_parser` registers them with `add_evaluate_parser`
and `add_evaluator_parser` (two, as `embedlab export` is listed between them).
"""

from __future__ import annotations

import argparse
import json
import sys

from embedlab.cli.common import stderr
from embedlab.core.beir import without_documents
from embedlab.core.code_identity import current
from embedlab.core.errors import UsageError

SELECTION_SPLIT = "dev"  # what `evaluate` scores unless told: the split selection reads
FINAL_EVAL_SPLIT = "test"


def cmd_evaluate(args: argparse.Namespace) -> int:
    from embedlab.evaluate.arguments import load_task_argument, score_encoder  # here: it loads torch

    task = load_task_argument(args.task, args.encoder, dev_fraction=args.dev_fraction, dev_seed=args.dev_seed,
                              progress=lambda m: print(m, file=sys.stderr))
    if args.without_documents:
        task, dropped = without_documents(task, args.without_documents.split(","))
        print(f"without documents {args.without_documents}: {len(dropped)} queries left out "
              f"({', '.join(dropped)})", file=sys.stderr)
    if args.split not in task.qrels and args.split == SELECTION_SPLIT:
        raise UsageError(f"task {task.name!r} has no {SELECTION_SPLIT} split (only {sorted(task.qrels)}): evaluate "
                         f"scores {SELECTION_SPLIT}, the split selection reads, unless told; derive one with "
                         f"--dev-fraction F, or score the final-eval split, once and for reporting, with --split "
                         f"{FINAL_EVAL_SPLIT}")
    metrics = score_encoder(args.encoder, task, args.split, index=args.index)
    if args.split == FINAL_EVAL_SPLIT:  # after scoring: a refusal stays one line
        print(f"split {FINAL_EVAL_SPLIT}: the final-eval split, for reporting once after selection; choose on "
              f"--split {SELECTION_SPLIT}", file=sys.stderr)
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
    else:
        for key in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "docs"):
            print(f"{key:<11} {metrics[key]:.4f}" if isinstance(metrics[key], float) else f"{key:<11} {metrics[key]}")
    return 0


def cmd_evaluator_stop(args: argparse.Namespace) -> int:
    # here: evaluate.actor loads ray and torch, sweep.run torch
    from embedlab.evaluate.actor import describe_identity, stop_evaluator
    from embedlab.sweep.cluster import connect

    connect(args.address, stderr)
    served = stop_evaluator()
    if served is None:
        print("no evaluator on this cluster")
    else:
        print(f"stopped the evaluator ({describe_identity(served) if served else 'not answering'}"
              f"{', an evaluation in flight failed' if served.get('in_flight') else ''})")
    return 0


def cmd_evaluator_status(args: argparse.Namespace) -> int:
    # here: evaluate.actor loads ray and torch, sweep.run torch
    from embedlab.evaluate.actor import (describe_identity, evaluator_identity, evaluator_stats, find_evaluator,
                                         runs_this_code)
    from embedlab.sweep.cluster import connect

    connect(args.address, stderr)
    handle = find_evaluator()
    if handle is None:
        print("no evaluator on this cluster")
        return 0
    served = evaluator_identity(handle, timeout_s=30.0)
    print(f"evaluator: {describe_identity(served)}, {'evaluating' if served['in_flight'] else 'idle'}; "
          f"{'the same as' if runs_this_code(served) else 'not'} this checkout's {current()}")
    for key, value in evaluator_stats(handle, timeout_s=30.0).items():
        print(f"{key}: {value}")
    return 0


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab evaluate` on the main parser's subcommands."""
    evaluate = sub.add_parser("evaluate", help="score a checkpoint on a retrieval task")
    evaluate.add_argument("--encoder", required=True,
                          help="a checkpoint directory, a pretrained model (hf:ORG/NAME@COMMIT, a Hugging Face or "
                               "sentence-transformers directory), baseline:bm25 or baseline:all-MiniLM-L6-v2")
    evaluate.add_argument("--task", required=True,
                          help="a BEIR directory, a built-in task name, a Hub task as hub:DATASET@REVISION "
                               "(BEIR/MTEB layout: corpus, queries and default qrels configs; REVISION a commit "
                               "sha, tag or branch, resolved to its commit; for a local directory in that layout, "
                               "its content digest sha256:...), or a .toml/.json file of HubTask fields (name, "
                               "dataset, revision, qrels_dataset, splits, ...; see embedlab.tasks.hub_tasks)")
    evaluate.add_argument("--dev-fraction", type=float, default=None,
                          help="for a task without dev qrels: move this share of its train queries to a derived "
                               "dev split (seeded by query id, frozen with a Hub task's cached folder); a task "
                               "with its own dev split keeps it")
    evaluate.add_argument("--dev-seed", type=int, default=0, help="seed of the derived dev split (default 0)")
    evaluate.add_argument("--split", default=SELECTION_SPLIT,
                          help=f"qrels split to score (default {SELECTION_SPLIT}, what selection reads; "
                               f"{FINAL_EVAL_SPLIT}: the final-eval split, to report once after selection)")
    evaluate.add_argument("--index", default="flat", choices=["flat", "ivf", "hnsw"],
                          help="Faiss index: exact flat (default) or approximate ivf/hnsw")
    evaluate.add_argument("--without-documents", metavar="DOC_ID[,DOC_ID...]", default=None,
                          help="leave out the queries that judge any of these documents relevant (a "
                               "contaminated item a study declared), in every split; the documents stay "
                               "in the corpus as distractors")
    evaluate.add_argument("--json", action="store_true")
    evaluate.set_defaults(func=cmd_evaluate)


def add_evaluator_parser(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab evaluator stop|status` on the main parser's subcommands."""
    evaluator = sub.add_parser("evaluator", help="the cluster's evaluation actor")
    evaluator_sub = evaluator.add_subparsers(dest="evaluator_command", required=True)
    for name, func, help_text in (
            ("stop", cmd_evaluator_stop, "kill it (an evaluation in flight fails); the next sweep starts a fresh one"),
            ("status", cmd_evaluator_status, "its embedlab version and code hash, whether it is busy, its stats")):
        command = evaluator_sub.add_parser(name, help=help_text)
        command.add_argument("--address", default="auto",
                             help="the Ray cluster (default auto: RAY_ADDRESS, or the one `ray start` started here)")
        command.set_defaults(func=func)
