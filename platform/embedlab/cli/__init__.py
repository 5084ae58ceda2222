"""The `embedlab` command.

    embedlab demo [--ablations DIR]     the three-phase tour (demo profile) on a local Ray cluster
    embedlab sweep STUDY_FILE           run a study (arms x seeds, Optuna per arm) with Ray Tune
                   [--profile P] [--parent CKPT] [--dry-run] [--resume RUN_DIR] [--address A]
    embedlab tour TOUR_FILE [--profile P] [--dry-run]   studies of consecutive phases, winners promoted between
    embedlab plan STUDY_FILE [--profile P] [--parent CKPT] [--pilot-reports N] [--throughput FILE] [--json]
                                        measured pilots: time, memory and storage of the study
    embedlab table RUN_DIR [--format text|csv|markdown|json]   per-arm mean ± 95% CI, paired differences
    embedlab promote RUN_DIR [--metric dev/ndcg@10] [--max-retention-drop X] [--run]
    embedlab report RUN_DIR [RUN_DIR...] [--out FILE]   the study report: one self-contained HTML page
    embedlab evaluate --encoder CKPT_DIR --task TASK [--split test] [--dev-fraction F] [--json]
                      TASK: a BEIR directory, a built-in name, hub:DATASET@REVISION or a HubTask .toml/.json
    embedlab model params PRESET [--json]
    embedlab model check-cuda [--device cuda|cpu] [--json]   GPU paths vs their CPU-tested oracles
    embedlab export CKPT_DIR OUT_DIR    the inference package: encoder + tokenizer, no MLM heads
    embedlab evaluator stop|status [--address A]   stop the cluster's evaluation actor / show its code and stats
    embedlab heldout build [--out DIR] / score [CKPT_OR_RELEASE] [--tasks ...] [--json]   held-out tasks, model vs BM25 and MiniLM
    embedlab data build [SPEC]          prepare data: corpus, dedup, splits, tokenizer, pieces, data card
    embedlab data audit [SPEC] [--task DIR] [--json]   contamination audit of every training stage
    embedlab tokenizer compare [SPEC] [--json]         BPE vs unigram vs byte-level on held-out text
    embedlab bench [--json] [--no-compile] [--spec SPEC]   every comparison below in one table
    embedlab bench --scaling [--json]   tokens/s vs length 128-2048; eval time vs corpus size 1k-1M
    embedlab bench train [SPEC] [--preset P] [--documents N] [--ablations] [--json]
                                        phase-1 tokens/s vs BertForMaskedLM and ModernBertForMaskedLM, peak
                                        memory vs BERT; optimisations on/off
    embedlab bench contrastive [SPEC] [--json]   pairs/s with and without GradCache
    embedlab bench layout [--pairs N] [--json]   phase-2 pairs/s and Ray's fixed cost per worker layout vs one process
    embedlab bench data [SPEC] [--json] packed tokens/s through Ray Data vs raw encode_batch
    embedlab bench prefetch [SPEC] [--json]   the phase-1 loop's tokens/s and data wait, prefetch on vs off
    embedlab bench eval [--json]        evaluator time vs sentence-transformers' IR evaluator
    embedlab bench mfu [--preset 300m] [--sequence-length 512] [--json]   MFU on a CUDA GPU (bf16)
    embedlab bench mfu-cpu [--presets small 5m] [--threads 1] [--json]   training FLOP/s vs this CPU's matmul peak

`main(argv)` returns an exit code, so tests call it in-process. An error in what was asked
(`embedlab.errors.UserError`, and FileNotFoundError or ConnectionError) prints one line,
`error: ...`, and returns 2. Anything else is a bug and is not caught: it propagates with its
traceback, and the `embedlab` command exits 1 as Python does for an uncaught exception.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from embedlab.errors import UsageError, UserError
from embedlab.cli.heldout import add_heldout_parser

DEMO_TOUR = "recipe.py"  # in the repository's ablations/
DEMO_PROFILE = "demo"
# The errors `main` shows in one line: the user's to fix, not a bug.
USER_ERRORS = (UserError, FileNotFoundError, ConnectionError)


def _progress(message: str) -> None:
    print(message, flush=True)


def cmd_model_params(args: argparse.Namespace) -> int:
    from embedlab.config import model_preset
    from embedlab.model.encoder import parameter_counts

    counts = parameter_counts(model_preset(args.preset))
    if args.json:
        print(json.dumps(counts))
    else:
        for name, value in counts.items():
            print(f"{name:<14} {value:>15,}")
    return 0


def cmd_model_check_cuda(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from embedlab.bench.cuda_checks import run_checks

    if args.device == "cuda":
        _require_cuda("model check-cuda", "--device cpu runs the same checks on the CPU")
    checks = run_checks(torch.device(args.device), progress=_stderr)
    if args.json:
        print(json.dumps({"device": args.device, "torch": torch.__version__,
                          "checks": [dataclasses.asdict(c) for c in checks]}, sort_keys=True))
    else:
        for check in checks:
            detail = check.error or ", ".join(f"{k} {v:.2e}" for k, v in check.measured.items())
            print(f"{'ok' if check.ok else 'FAILED':<7} {check.name:<14} {detail}  [{check.compares}]")
    return 0 if all(c.ok for c in checks) else 1


def _require_cuda(command: str, instead: str) -> None:
    import torch

    if not torch.cuda.is_available():
        raise UsageError(f"{command} needs CUDA (torch.cuda.is_available() is False here); {instead}")


def cmd_sweep(args: argparse.Namespace) -> int:
    from embedlab.sweep.run import dry_run, run_sweep

    if args.dry_run:
        print(dry_run(args.study, profile=args.profile, parent=args.parent))
        return 0
    run_dir = run_sweep(args.study, storage=args.storage, address=args.address, parent=args.parent,
                        profile=args.profile, resume=args.resume, max_concurrent=args.max_concurrent,
                        wait_for_resources=args.wait_for_resources, progress=_progress)
    return _show_run(run_dir)


def cmd_plan(args: argparse.Namespace) -> int:
    from embedlab.sweep.plan import format_plan, plan_study

    plan = plan_study(args.study, profile=args.profile, parent=args.parent, address=args.address,
                      reports=args.pilot_reports, throughput=args.throughput, progress=_stderr)
    print(json.dumps(plan, sort_keys=True) if args.json else format_plan(plan))
    return 0


def _show_run(run_dir: Path) -> int:
    """Print a finished run's table; 1 when trials are missing."""
    from embedlab.sweep.table import load_table, read_study_record, render
    from embedlab.sweep.trial_rows import final_trials

    print()
    print(render(run_dir, "text"))
    parent = read_study_record(run_dir).get("parent_scores")
    if parent:
        keys = [k for k in parent if k.startswith(("dev/ndcg@10", "dev/recall@100", "retention/"))
                and isinstance(parent[k], (int, float))]
        print("parent (same evaluator): " + ", ".join(f"{k} {parent[k]:.4f}" for k in sorted(keys)))
    print(f"\nrun directory: {run_dir}")
    print(f"trial table:   embedlab table {run_dir}   (or embedlab.load_table(...) in Python)")
    finished = final_trials(load_table(run_dir))
    expected = _expected_trials(run_dir)
    if len(finished) < expected:
        print(f"error: {expected - len(finished)} of {expected} trials did not finish; "
              f"continue with: embedlab sweep STUDY --resume {run_dir}", file=sys.stderr)
        return 1
    return 0


def _expected_trials(run_dir: Path) -> int:
    from embedlab.sweep.table import read_study_record

    study = read_study_record(run_dir)["study"]
    return len(study["arms"]) * len(study["seeds"])


def find_demo_tour(ablations: str | Path | None = None) -> Path:
    """The demo's tour file: `ablations/recipe.py` in the directory given (--ablations), else in
    the installed checkout's `ablations/` (beside `platform/`, wherever the command runs from),
    else in the working directory's. UsageError naming where it looked when none has it."""
    from embedlab.sweep.promote import packaged_ablations

    places = [Path(ablations)] if ablations is not None else [packaged_ablations(), Path.cwd() / "ablations"]
    found = next((place / DEMO_TOUR for place in places if (place / DEMO_TOUR).is_file()), None)
    if found is None:
        raise UsageError(f"the demo's study files ({DEMO_TOUR} and the studies it names) are not in "
                         f"{' or '.join(str(p) for p in dict.fromkeys(places))}; point at the repository's "
                         "ablations/ directory with `embedlab demo --ablations DIR`")
    return found


def cmd_demo(args: argparse.Namespace) -> int:
    args.tour, args.profile = str(find_demo_tour(args.ablations)), DEMO_PROFILE
    return cmd_tour(args)


def cmd_tour(args: argparse.Namespace) -> int:
    from embedlab.sweep.tour import dry_run_tour, run_tour

    if args.dry_run:
        print(dry_run_tour(args.tour, args.profile))
        return 0
    failed = []
    run_dirs = run_tour(args.tour, profile=args.profile, storage=args.storage, address=args.address,
                        max_concurrent=args.max_concurrent, wait_for_resources=args.wait_for_resources,
                        show=lambda run_dir: failed.append(_show_run(run_dir)), progress=_progress)
    print("\ntour finished; run directories:")
    for run_dir in run_dirs:
        print(f"  {run_dir}")
    return max(failed, default=0)


def cmd_table(args: argparse.Namespace) -> int:
    from embedlab.sweep.table import load_table, render

    if args.json:  # every column of every trial, as records
        print(load_table(args.run_dir).to_json(orient="records"))
    else:
        print(render(args.run_dir, args.format))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from embedlab.sweep.capacity import check_options
    from embedlab.sweep.promote import DEFAULT_MAX_RETENTION_DROP, promote

    check_options(args.max_concurrent, args.wait_for_resources)  # before promoting, not after
    margin = DEFAULT_MAX_RETENTION_DROP if args.max_retention_drop is None else args.max_retention_drop
    promotion = promote(args.run_dir, metric=args.metric, max_retention_drop=margin,
                        arm=args.arm, next_study=args.next, progress=_progress)
    if args.run and "next_study" in promotion:
        from embedlab.sweep.run import run_sweep

        from embedlab import store

        child = run_sweep(promotion["next_study"], storage=store.parent(store.resolve(args.run_dir)),
                          address=args.address, max_concurrent=args.max_concurrent,
                          wait_for_resources=args.wait_for_resources, progress=_progress)
        return _show_run(child)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from embedlab.report import write_report  # here: it loads matplotlib

    from embedlab import store

    if args.out is None and store.local_path(args.run_dirs[-1]) is None:
        raise UsageError(f"{args.run_dirs[-1]} is on object storage: name a local file with --out")
    out = args.out or Path(args.run_dirs[-1]) / "report.html"
    print(write_report(args.run_dirs, out, progress=_stderr))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from embedlab.data.prepare import prepare_data
    from embedlab.evaluate.beir import load_task
    from embedlab.evaluate.builtin_tasks import BUILTIN_TASKS
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint, resolve_task
    from embedlab.train.checkpoint import verify_checkpoint

    from embedlab.evaluate.hub_tasks import derive_dev_split, hub_task_argument, load_hub_task

    baseline = args.encoder.removeprefix("baseline:") if args.encoder.startswith("baseline:") else None
    spec = hub_task_argument(args.task, dev_fraction=args.dev_fraction, dev_seed=args.dev_seed)
    if spec is not None:  # materialised (with its derived dev split, if any) in the cache, once
        task = load_hub_task(spec)
    else:
        prepared_dir = None
        if args.task in BUILTIN_TASKS and not Path(args.task).is_dir():
            from embedlab.config import DataConfig, TrialConfig

            # The built-in task comes from the same corpus split the checkpoint trained on
            # (baselines: the default data config, the one `make demo` trains on).
            data = DataConfig() if baseline else TrialConfig.from_dict(
                verify_checkpoint(args.encoder)["config"]).data
            prepared_dir = prepare_data(data, progress=lambda m: print(m, file=sys.stderr)).directory
        task = load_task(resolve_task(args.task, prepared_dir))
        if args.dev_fraction is not None:  # the same rule as a Hub task's, in memory
            task, _ = derive_dev_split(task, args.dev_fraction, args.dev_seed)
    if args.without_documents:
        from embedlab.evaluate.beir import without_documents

        task, dropped = without_documents(task, args.without_documents.split(","))
        print(f"without documents {args.without_documents}: {len(dropped)} queries left out "
              f"({', '.join(dropped)})", file=sys.stderr)
    if baseline is not None:
        from embedlab.evaluate.baselines import evaluate_baseline

        metrics = evaluate_baseline(baseline, task, args.split)
    else:
        metrics = evaluate_checkpoint(args.encoder, task, args.split, index=args.index)
    if args.json:
        print(json.dumps(metrics, sort_keys=True))
    else:
        for key in ("ndcg@10", "recall@100", "mrr@10", "map", "queries", "docs"):
            print(f"{key:<11} {metrics[key]:.4f}" if isinstance(metrics[key], float) else f"{key:<11} {metrics[key]}")
    return 0


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _data_configs(spec: str | None):
    from embedlab.data.spec import load_data_configs

    return load_data_configs(spec)


def cmd_evaluator_stop(args: argparse.Namespace) -> int:
    from embedlab.evaluate.actor import describe_identity, stop_evaluator
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    served = stop_evaluator()
    if served is None:
        print("no evaluator on this cluster")
    else:
        print(f"stopped the evaluator ({describe_identity(served) if served else 'not answering'}"
              f"{', an evaluation in flight failed' if served.get('in_flight') else ''})")
    return 0


def cmd_evaluator_status(args: argparse.Namespace) -> int:
    import ray

    from embedlab.code_identity import current
    from embedlab.evaluate.actor import describe_identity, evaluator_identity, find_evaluator
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
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


def cmd_data_build(args: argparse.Namespace) -> int:
    from embedlab.data.prepare import prepare_data
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    for config in _data_configs(args.spec):
        prepared = prepare_data(config, progress=_stderr)
        print(f"prepared data: {prepared.directory}")
        print(f"data card:     {prepared.directory / 'data_card.md'}")
    return 0


def cmd_data_audit(args: argparse.Namespace) -> int:
    from embedlab.data.contamination import run_audit
    from embedlab.data.prepare import prepare_data
    from embedlab.data.stages import ALL_STAGES
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    for config in _data_configs(args.spec):
        prepared = prepare_data(config, progress=_stderr)
        report = run_audit(prepared, stages=ALL_STAGES, extra_tasks=args.task, progress=_stderr, data=config)
        print(json.dumps(report.to_dict(), sort_keys=True) if args.json else report.to_markdown())
    return 0


def cmd_tokenizer_compare(args: argparse.Namespace) -> int:
    from embedlab.data.prepare import prepare_data
    from embedlab.sweep.run import connect
    from embedlab.tokenizer.compare import compare_corpus_tokenizers, format_comparison

    connect(args.address, _stderr)
    for config in _data_configs(args.spec):
        prepared = prepare_data(config, progress=_stderr)
        rows = compare_corpus_tokenizers(prepared, progress=_stderr)
        print(json.dumps(rows, sort_keys=True) if args.json else format_comparison(rows))
    return 0


def cmd_bench_data(args: argparse.Namespace) -> int:
    from embedlab.bench.data import bench_data, format_bench
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    config = _data_configs(args.spec)[0]
    repeats = {} if args.repeats is None else {"repeats": args.repeats}
    result = bench_data(documents=args.documents, config=config, progress=_stderr, **repeats)
    print(json.dumps(result, sort_keys=True) if args.json else format_bench(result))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from embedlab.release import export_release_to

    manifest = export_release_to(args.checkpoint, args.out)
    print(f"exported {args.out}: encoder {manifest['content_hash'][:16]} (from {manifest['exported_from'][:16]}), "
          f"pooling {manifest['pooling']['method']}, prefixes {manifest['pooling'].get('prefixes')}")
    return 0


def cmd_bench_eval(args: argparse.Namespace) -> int:
    from embedlab.bench.evaluation import bench_eval, format_bench_eval
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    result = bench_eval(split=args.split, progress=_stderr)
    print(json.dumps(result, sort_keys=True) if args.json else format_bench_eval(result))
    return 0


def _print_comparisons(comparisons, notes: list[str], as_json: bool) -> None:
    from embedlab.bench.measure import comparisons_json, format_comparisons

    print(json.dumps(comparisons_json(comparisons), sort_keys=True) if as_json else format_comparisons(comparisons, notes))


def _bench_prepared(args: argparse.Namespace):
    from embedlab.data.prepare import prepare_data
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    return prepare_data(_data_configs(args.spec)[0], progress=_stderr)


def cmd_bench_all(args: argparse.Namespace) -> int:
    if args.scaling:
        return cmd_bench_scaling(args)
    from embedlab.bench.suite import bench_all
    from embedlab.sweep.run import connect

    connect(args.address, _stderr)
    result = bench_all(_data_configs(args.spec)[0], compile_model=not args.no_compile, progress=_stderr)
    _print_comparisons(result["comparisons"], result["notes"], args.json)
    return 0


def cmd_bench_train(args: argparse.Namespace) -> int:
    from embedlab.bench.train import TrainBench, bench_train, train_notes

    bench = TrainBench(preset=args.preset, sequence_length=args.sequence_length, documents=args.documents,
                       batch_documents=args.batch_documents, repeats=args.repeats, threads=args.threads)
    result = bench_train(_bench_prepared(args), bench, ablations=args.ablations, memory=not args.no_memory,
                         compile_model=not args.no_compile, progress=_stderr)
    _print_comparisons(result["comparisons"], train_notes(result), args.json)
    return 0


def cmd_bench_contrastive(args: argparse.Namespace) -> int:
    from embedlab.bench.contrastive import ContrastiveBench, bench_contrastive

    bench = ContrastiveBench(preset=args.preset, batch_pairs=args.batch_pairs, gradcache_chunk=args.chunk,
                             repeats=args.repeats, threads=args.threads, memory=not args.no_memory)
    result = bench_contrastive(_bench_prepared(args), bench, progress=_stderr)
    _print_comparisons(result["comparisons"], [], args.json)
    return 0


def cmd_bench_layout(args: argparse.Namespace) -> int:
    from embedlab.bench.layout import LayoutBench, bench_layout, format_layout

    bench = LayoutBench(**({} if args.pairs is None else {"pairs": args.pairs}))
    result = bench_layout(_bench_prepared(args), bench, progress=_stderr)
    print(json.dumps(result, sort_keys=True) if args.json else format_layout(result))
    return 0


def cmd_bench_prefetch(args: argparse.Namespace) -> int:
    from embedlab.bench.prefetch import PrefetchBench, bench_prefetch, prefetch_note

    bench = PrefetchBench(budget_tokens=args.budget_tokens, preset=args.preset, repeats=args.repeats)
    result = bench_prefetch(_bench_prepared(args), _data_configs(args.spec)[0], bench, progress=_stderr)
    _print_comparisons(result["comparisons"], [f"prefetch: {prefetch_note(result)}"], args.json)
    return 0


def cmd_bench_scaling(args: argparse.Namespace) -> int:
    from embedlab.bench.scaling import bench_scaling, format_scaling

    limit = {} if args.encode_limit is None else {"encode_limit": args.encode_limit}
    result = bench_scaling(_bench_prepared(args), sizes=tuple(args.sizes), length_tokens=args.length_tokens,
                           progress=_stderr, **limit)
    print(json.dumps(result, sort_keys=True) if args.json else format_scaling(result))
    return 0


def cmd_bench_mfu_cpu(args: argparse.Namespace) -> int:
    from embedlab.bench.cpu_mfu import CpuMfuBench, bench_cpu_mfu, cpu_mfu_comparisons, cpu_mfu_notes

    given = {"presets": None if args.presets is None else tuple(args.presets), "sequence_length": args.sequence_length,
             "batch_rows": args.batch_rows, "steps": args.steps, "peak_size": args.peak_size,
             "peak_repeats": args.peak_repeats, "threads": args.threads}
    bench = CpuMfuBench(**{name: value for name, value in given.items() if value is not None})
    result = bench_cpu_mfu(bench, progress=_stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        _print_comparisons(cpu_mfu_comparisons(result), cpu_mfu_notes(result), as_json=False)
    return 0


def cmd_bench_mfu(args: argparse.Namespace) -> int:
    from embedlab.bench.mfu import MfuBench, bench_mfu

    _require_cuda("bench mfu", "run workers/bench-gpu.sh on a GPU machine")
    bench = MfuBench(preset=args.preset, sequence_length=args.sequence_length, batch_rows=args.batch_rows,
                     steps=args.steps, compile=not args.no_compile, attention=args.attention,
                     **({} if args.compare_steps is None else {"compare_steps": args.compare_steps}))
    result = bench_mfu(bench, peak_tflops=args.peak_tflops, progress=_stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key in ("device", "tokens_per_s", "model_tflops_per_s", "peak_tflops_per_s", "mfu", "peak_memory_gib",
                    "warmup_seconds", "timed_seconds", "attention_path"):
            value = result[key]
            print(f"{key:<20} {value:,.4f}" if isinstance(value, float) else f"{key:<20} {value}")
        for row in result["before_after"]:
            print(f"{row['name']:<26} {row['embedlab']:>12,.0f} vs {row['reference']:>12,.0f} tokens/s  "
                  f"{row['ratio']:.3f}x  ({row['embedlab_measures']} | vs {row['reference_measures']})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedlab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add_run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage", default="runs", help="where run directories go (default ./runs)")
        p.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
        p.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                       help="trials Tune runs at once (default: as many as the cluster's resources hold when "
                            "the sweep starts)")
        p.add_argument("--wait-for-resources", type=float, default=0.0, metavar="SECONDS",
                       help="on an autoscaling cluster (--address), wait up to SECONDS for nodes that hold one "
                            "trial of every arm, asking the autoscaler for them (default 0: refuse at once)")

    demo = sub.add_parser("demo", help="the three-phase tour on the demo profile, on a local Ray cluster")
    demo.add_argument("--ablations", default=None, metavar="DIR",
                      help="the repository's ablations/ directory (default: the installed checkout's)")
    add_run_options(demo)
    demo.set_defaults(func=cmd_demo, dry_run=False)

    def add_profile(p: argparse.ArgumentParser) -> None:
        p.add_argument("--profile", default=None,
                       help="sizes to run at: demo (2-core CPU, minutes), cpu (2-core CPU, an hour, a usable model) "
                            "or full (GPU cluster; the study files' default)")

    sweep = sub.add_parser("sweep", help="run a study file with Ray Tune")
    sweep.add_argument("study", help="a study file, e.g. ablations/masking_ratio.py")
    sweep.add_argument("--parent", default=None, help="phases 2-3: the checkpoint every arm starts from")
    add_profile(sweep)
    sweep.add_argument("--dry-run", action="store_true",
                       help="validate the study and print its arms, seeds, budget and trials; start nothing")
    sweep.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="continue an interrupted run of the same study: finished trials are kept")
    add_run_options(sweep)
    sweep.set_defaults(func=cmd_sweep)

    plan = sub.add_parser("plan", help="pilot every arm on the cluster; estimate time, memory and storage")
    plan.add_argument("study", help="a study file, e.g. ablations/masking_ratio.py")
    add_profile(plan)
    plan.add_argument("--parent", default=None, help="the parent checkpoint of a phase-2 or phase-3 study")
    plan.add_argument("--pilot-reports", type=int, default=6,
                      help="report intervals (train.report_every_steps) each arm's pilot trains (default 6)")
    plan.add_argument("--address", default=None, help="a Ray cluster to plan on (default: a local one)")
    plan.add_argument("--throughput", default=None, metavar="FILE",
                      help="no pilots: estimate a GPU study from one GPU's `embedlab bench mfu --json` output "
                           "(training FLOP/s x workers a trial); starts nothing")
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=cmd_plan)

    tour = sub.add_parser("tour", help="run a tour file: consecutive phases with promotion between them")
    tour.add_argument("tour", help="a tour file, e.g. ablations/recipe.py")
    add_profile(tour)
    tour.add_argument("--dry-run", action="store_true",
                      help="print each stage's study plan and how winners are promoted; start nothing")
    add_run_options(tour)
    tour.set_defaults(func=cmd_tour)

    table = sub.add_parser("table", help="per-arm mean ± 95%% CI, paired differences from the control, trials")
    table.add_argument("run_dir")
    table.add_argument("--format", default="text", choices=["text", "csv", "markdown", "json"])
    table.add_argument("--json", action="store_true", help="every column of every trial as JSON records")
    table.set_defaults(func=cmd_table)

    promote = sub.add_parser("promote", help="pick a study's winner on recipe-dev and write the next phase's study")
    promote.add_argument("run_dir")
    promote.add_argument("--metric", default=None, help="a dev/ metric (default: the study's)")
    promote.add_argument("--max-retention-drop", type=float, default=None,
                         help="refuse a winner whose retention panel, as its mean over seeds, falls more than "
                              "this below its parent's: absolute, in metric points (0.10 is 0.10 below, not 10%%; "
                              "default 0.05)")
    promote.add_argument("--arm", default=None, help="promote this arm instead of the dev winner (margin still applies)")
    promote.add_argument("--next", default=None, help="the next phase's study file (default: the recipe's next)")
    promote.add_argument("--run", action="store_true", help="launch the next phase's study after promoting")
    promote.add_argument("--address", default=None, help="with --run: an existing Ray cluster")
    promote.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                         help="with --run: trials Tune runs at once (as for embedlab sweep)")
    promote.add_argument("--wait-for-resources", type=float, default=0.0, metavar="SECONDS",
                         help="with --run: wait up to SECONDS for the autoscaler's nodes (as for embedlab sweep)")
    promote.set_defaults(func=cmd_promote)

    report = sub.add_parser("report", help="the study report: one self-contained HTML page for one or more runs")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a study's run directory, or a tour's, in order")
    report.add_argument("--out", type=Path, default=None, help="HTML file (default: LAST_RUN_DIR/report.html)")
    report.set_defaults(func=cmd_report)

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

    export = sub.add_parser("export", help="the inference package of a checkpoint (encoder, tokenizer, manifest)")
    export.add_argument("checkpoint", help="a checkpoint directory or storage URI (s3://, gs://, ...)")
    export.add_argument("out", help="a new or empty directory, or a storage URI")
    export.set_defaults(func=cmd_export)

    evaluator = sub.add_parser("evaluator", help="the cluster's evaluation actor")
    evaluator_sub = evaluator.add_subparsers(dest="evaluator_command", required=True)
    for name, func, help_text in (
            ("stop", cmd_evaluator_stop, "kill it (an evaluation in flight fails); the next sweep starts a fresh one"),
            ("status", cmd_evaluator_status, "its embedlab version and code hash, whether it is busy, its stats")):
        command = evaluator_sub.add_parser(name, help=help_text)
        command.add_argument("--address", default="auto",
                             help="the Ray cluster (default auto: RAY_ADDRESS, or the one `ray start` started here)")
        command.set_defaults(func=func)

    model = sub.add_parser("model", help="model utilities")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    params = model_sub.add_parser("params", help="parameter counts of a preset, from the meta-device tree")
    params.add_argument("preset")
    params.add_argument("--json", action="store_true")
    params.set_defaults(func=cmd_model_params)
    check_cuda = model_sub.add_parser(
        "check-cuda", help="the GPU paths (flash varlen, bf16, compile, NCCL) against their CPU-tested oracles")
    check_cuda.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                            help="cpu runs the same checks with the CPU kernel, compiler and gloo")
    check_cuda.add_argument("--json", action="store_true")
    check_cuda.set_defaults(func=cmd_model_check_cuda)

    def add_scaling_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000],
                       help="corpus sizes for evaluation time (default 1k 10k 100k 1M)")
        p.add_argument("--encode-limit", type=int, default=None,
                       help="largest size whose encoding is measured, default 100,000; larger ones are "
                            "extrapolated (labelled)")
        p.add_argument("--length-tokens", type=int, default=16384, help="tokens per pass at each sequence length")

    def add_spec(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", nargs="?", default=None,
                       help="a study file (.py: every arm's data), a data spec (.toml/.json), or none for the defaults")
        p.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")

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

    tokenizer = sub.add_parser("tokenizer", help="tokenizer candidates")
    tokenizer_sub = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    compare = tokenizer_sub.add_parser("compare", help="BPE, unigram and byte-level trained on the training split")
    add_spec(compare)
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(func=cmd_tokenizer_compare)

    bench = sub.add_parser("bench", help="measurements, each against a reference in the same run "
                           "(no subcommand: all of them in one table)")
    bench.add_argument("--scaling", action="store_true",
                       help="instead: tokens/s vs sequence length and evaluation time vs corpus size")
    bench.add_argument("--spec", default=None, help="a data spec or study file (default: the built-in corpus)")
    bench.add_argument("--no-compile", action="store_true", help="skip the torch.compile row (it compiles ~1 min)")
    bench.add_argument("--address", default=None, help="an existing Ray cluster (default: start a local one)")
    bench.add_argument("--json", action="store_true", help="one JSON object: {comparison: {embedlab, reference, ratio, unit, ...}}")
    add_scaling_options(bench)
    bench.set_defaults(func=cmd_bench_all)
    bench_sub = bench.add_subparsers(dest="bench_command")
    bench_data_parser = bench_sub.add_parser("data", help="packed tokens/s through Ray Data vs raw encode_batch")
    add_spec(bench_data_parser)
    bench_data_parser.add_argument("--documents", type=int, default=None,
                                   help="the first N training documents (default: the whole training split)")
    bench_data_parser.add_argument("--repeats", type=int, default=None,
                                   help="timed passes of each side, the median reported (default 3)")
    bench_data_parser.add_argument("--json", action="store_true")
    bench_data_parser.set_defaults(func=cmd_bench_data)
    bench_prefetch_parser = bench_sub.add_parser(
        "prefetch", help="the phase-1 loop on its Ray Data stream with and without the iterator's prefetch")
    add_spec(bench_prefetch_parser)
    bench_prefetch_parser.add_argument("--budget-tokens", type=int, default=100_000, help="tokens a pass")
    bench_prefetch_parser.add_argument("--preset", default="small")
    bench_prefetch_parser.add_argument("--repeats", type=int, default=3, help="timed passes of each side")
    bench_prefetch_parser.add_argument("--json", action="store_true")
    bench_prefetch_parser.set_defaults(func=cmd_bench_prefetch)
    bench_eval_parser = bench_sub.add_parser(
        "eval", help="evaluator time vs sentence-transformers' InformationRetrievalEvaluator (all-MiniLM-L6-v2)")
    bench_eval_parser.add_argument("--split", default="dev", choices=["dev", "test"])
    bench_eval_parser.add_argument("--address", default=None)
    bench_eval_parser.add_argument("--json", action="store_true")
    bench_eval_parser.set_defaults(func=cmd_bench_eval)

    def add_bench_sizes(p: argparse.ArgumentParser, preset: str) -> None:
        p.add_argument("--preset", default=preset, help=f"model preset (default {preset})")
        p.add_argument("--repeats", type=int, default=3, help="timed passes per side; the median is reported")
        p.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides (default 1)")
        p.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak-memory measurement")
        p.add_argument("--json", action="store_true")

    bench_train_parser = bench_sub.add_parser(
        "train", help="phase-1 non-padding tokens/s vs BertForMaskedLM and ModernBertForMaskedLM, peak memory vs "
                      "BERT; optimisations on/off")
    add_spec(bench_train_parser)
    add_bench_sizes(bench_train_parser, "small")
    bench_train_parser.add_argument("--documents", type=int, default=400)
    bench_train_parser.add_argument("--sequence-length", type=int, default=128)
    bench_train_parser.add_argument("--batch-documents", type=int, default=32, help="the reference's batch size")
    bench_train_parser.add_argument("--ablations", action="store_true", help="each optimisation measured on and off")
    bench_train_parser.add_argument("--no-compile", action="store_true", help="with --ablations: skip torch.compile")
    bench_train_parser.set_defaults(func=cmd_bench_train)
    bench_contrastive_parser = bench_sub.add_parser("contrastive", help="pairs/s with and without GradCache")
    add_spec(bench_contrastive_parser)
    add_bench_sizes(bench_contrastive_parser, "small")
    bench_contrastive_parser.add_argument("--batch-pairs", type=int, default=64)
    bench_contrastive_parser.add_argument("--chunk", type=int, default=16, help="GradCache chunk (pairs)")
    bench_contrastive_parser.set_defaults(func=cmd_bench_contrastive)
    bench_layout_parser = bench_sub.add_parser(
        "layout", help="phase-2 pairs/s and Ray's fixed cost in trials of three worker layouts vs one process")
    add_spec(bench_layout_parser)
    bench_layout_parser.add_argument("--pairs", type=int, default=None,
                                     help="pairs each trial trains (default: the demo profile's phase-2 budget)")
    bench_layout_parser.add_argument("--json", action="store_true")
    bench_layout_parser.set_defaults(func=cmd_bench_layout)
    bench_scaling_parser = bench_sub.add_parser(
        "scaling", help="tokens/s vs sequence length; evaluation time vs corpus size (as --scaling)")
    add_spec(bench_scaling_parser)
    add_scaling_options(bench_scaling_parser)
    bench_scaling_parser.add_argument("--json", action="store_true")
    bench_scaling_parser.set_defaults(func=cmd_bench_scaling)
    bench_mfu_parser = bench_sub.add_parser("mfu", help="model FLOPs utilisation of phase-1 training (needs CUDA)")
    bench_mfu_parser.add_argument("--preset", default="300m")
    bench_mfu_parser.add_argument("--sequence-length", type=int, default=512)
    bench_mfu_parser.add_argument("--batch-rows", type=int, default=64)
    bench_mfu_parser.add_argument("--steps", type=int, default=20, help="timed steps after 5 warm-up steps")
    bench_mfu_parser.add_argument("--no-compile", action="store_true")
    bench_mfu_parser.add_argument("--attention", default="auto", choices=["auto", "dense", "varlen"],
                                  help="dense: time the dense mask, never touching the flash kernel")
    bench_mfu_parser.add_argument("--compare-steps", type=int, default=None,
                                  help="timed steps of the eager runs measured before/after (0: skip; default 8)")
    bench_mfu_parser.add_argument("--peak-tflops", type=float, default=None,
                                  help="the device's dense bf16 peak in TFLOP/s (default: looked up by the exact device "
                                       "name in embedlab.bench.mfu.PEAKS; an unknown device needs this)")
    bench_mfu_parser.add_argument("--json", action="store_true")
    bench_mfu_parser.set_defaults(func=cmd_bench_mfu)
    # Unset options keep CpuMfuBench's defaults (one place; importing it here would import torch).
    bench_mfu_cpu_parser = bench_sub.add_parser(
        "mfu-cpu", help="phase-1 training FLOP/s as a share of this CPU's measured fp32 matmul peak")
    bench_mfu_cpu_parser.add_argument("--presets", nargs="+", default=None, help="model presets (default: small 5m)")
    bench_mfu_cpu_parser.add_argument("--sequence-length", type=int, default=None, help="row length (default 128)")
    bench_mfu_cpu_parser.add_argument("--batch-rows", type=int, default=None, help="rows a step (default 16)")
    bench_mfu_cpu_parser.add_argument("--steps", type=int, default=None,
                                      help="timed steps after 2 warm-up steps (default 6)")
    bench_mfu_cpu_parser.add_argument("--peak-size", type=int, default=None,
                                      help="n of the n x n fp32 matmul whose best FLOP/s is the peak (default 2048)")
    bench_mfu_cpu_parser.add_argument("--peak-repeats", type=int, default=None, help="timed matmuls (default 5)")
    bench_mfu_cpu_parser.add_argument("--threads", type=int, default=None,
                                      help="torch threads for the peak and the steps (default 1)")
    bench_mfu_cpu_parser.add_argument("--json", action="store_true")
    bench_mfu_cpu_parser.set_defaults(func=cmd_bench_mfu_cpu)
    add_heldout_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; 2 and one `error:` line for a user error, a bug's traceback otherwise."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as error:
        print(f"error: {one_line(error)}", file=sys.stderr)
        return 2


def one_line(error: BaseException) -> str:
    """The error's message on one line (a multi-line message is joined with " | ")."""
    return " | ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__

