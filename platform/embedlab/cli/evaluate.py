"""`embedlab evaluate` and `embedlab evaluator stop|status`: score an encoder on a task; the
cluster's evaluation actor.

`evaluate` scores with `embedlab.evaluate` and `evaluator` asks `embedlab.evaluate.actor`.
`embedlab.cli.build_parser` registers them with `add_evaluate_parser` and `add_evaluator_parser`
(two, as `embedlab export` is listed between them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from embedlab.cli.common import stderr
from embedlab.code_identity import current
from embedlab.config import DataConfig, TrialConfig
from embedlab.evaluate.baselines import evaluate_baseline
from embedlab.evaluate.beir import load_task, without_documents
from embedlab.evaluate.builtin_tasks import BUILTIN_TASKS
from embedlab.evaluate.hub_tasks import derive_dev_split, hub_task_argument, load_hub_task


def cmd_evaluate(args: argparse.Namespace) -> int:
    # here: checkpoint_eval and train.checkpoint load torch, data.prepare tokenizers
    from embedlab.data.prepare import prepare_data
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint, resolve_task
    from embedlab.train.checkpoint import verify_checkpoint

    baseline = args.encoder.removeprefix("baseline:") if args.encoder.startswith("baseline:") else None
    spec = hub_task_argument(args.task, dev_fraction=args.dev_fraction, dev_seed=args.dev_seed)
    if spec is not None:  # materialised (with its derived dev split, if any) in the cache, once
        task = load_hub_task(spec)
    else:
        prepared_dir = None
        if args.task in BUILTIN_TASKS and not Path(args.task).is_dir():
            # The built-in task comes from the same corpus split the checkpoint trained on
            # (baselines: the default data config, the one `make demo` trains on).
            data = DataConfig() if baseline else TrialConfig.from_dict(
                verify_checkpoint(args.encoder)["config"]).data
            prepared_dir = prepare_data(data, progress=lambda m: print(m, file=sys.stderr)).directory
        task = load_task(resolve_task(args.task, prepared_dir))
        if args.dev_fraction is not None:  # the same rule as a Hub task's, in memory
            task, _ = derive_dev_split(task, args.dev_fraction, args.dev_seed)
    if args.without_documents:
        task, dropped = without_documents(task, args.without_documents.split(","))
        print(f"without documents {args.without_documents}: {len(dropped)} queries left out "
              f"({', '.join(dropped)})", file=sys.stderr)
    if baseline is not None:
        metrics = evaluate_baseline(baseline, task, args.split)
    else:
        metrics = evaluate_checkpoint(args.encoder, task, args.split, index=args.index)
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
    else:
        for key in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "docs"):
            print(f"{key:<11} {metrics[key]:.4f}" if isinstance(metrics[key], float) else f"{key:<11} {metrics[key]}")
    return 0


def cmd_evaluator_stop(args: argparse.Namespace) -> int:
    # here: evaluate.actor loads ray and torch, sweep.run torch
    from embedlab.evaluate.actor import describe_identity, stop_evaluator
    from embedlab.sweep.run import connect

    connect(args.address, stderr)
    served = stop_evaluator()
    if served is None:
        print("no evaluator on this cluster")
    else:
        print(f"stopped the evaluator ({describe_identity(served) if served else 'not answering'}"
              f"{', an evaluation in flight failed' if served.get('in_flight') else ''})")
    return 0


def cmd_evaluator_status(args: argparse.Namespace) -> int:
    import ray  # here, as evaluate.actor (ray, torch) and sweep.run (torch) below

    from embedlab.evaluate.actor import describe_identity, evaluator_identity, find_evaluator
    from embedlab.sweep.run import connect

    connect(args.address, stderr)
    handle = find_evaluator()
    if handle is None:
        print("no evaluator on this cluster")
        return 0
    served = evaluator_identity(handle, timeout_s=30.0)
    same = (served["version"], served["code_hash"]) == (current().version, current().code_hash)
    print(f"evaluator: {describe_identity(served)}, {'evaluating' if served['in_flight'] else 'idle'}; "
          f"{'the same as' if same else 'not'} this checkout's {current()}")
    for key, value in ray.get(handle.stats.remote(), timeout=30.0).items():
        print(f"{key}: {value}")
    return 0


def add_evaluate_parser(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab evaluate` on the main parser's subcommands."""
    evaluate = sub.add_parser("evaluate", help="score a checkpoint on a retrieval task")
    evaluate.add_argument("--encoder", required=True,
                          help="a checkpoint directory, baseline:bm25 or baseline:all-MiniLM-L6-v2")
    evaluate.add_argument("--task", required=True,
                          help="a BEIR directory, a built-in task name, a Hub task as hub:DATASET@REVISION "
                               "(BEIR/MTEB layout: corpus, queries and default qrels configs; REVISION a commit "
                               "sha, tag or branch, resolved to its commit; for a local directory in that layout, "
                               "its content digest sha256:...), or a .toml/.json file of HubTask fields (name, "
                               "dataset, revision, qrels_dataset, splits, ...; see embedlab.evaluate.hub_tasks)")
    evaluate.add_argument("--dev-fraction", type=float, default=None,
                          help="for a task without dev qrels: move this share of its train queries to a derived "
                               "dev split (seeded by query id, frozen with a Hub task's cached folder); a task "
                               "with its own dev split keeps it")
    evaluate.add_argument("--dev-seed", type=int, default=0, help="seed of the derived dev split (default 0)")
    evaluate.add_argument("--split", default="test", help="qrels split to score (default test)")
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
