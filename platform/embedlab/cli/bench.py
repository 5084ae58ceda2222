"""`embedlab bench [SUBCOMMAND]`: each measurement against a reference in the same run
(`embedlab.bench`); no subcommand runs them all in one table.

`embedlab.cli.build_parser` registers them with `add_parsers`. The benchmark modules load torch
(or tokenizers), as does `embedlab.sweep.run`, so each command imports its own inside it: the
parser and every other command do without them.
"""

from __future__ import annotations

import argparse
import json

from embedlab.bench.measure import comparisons_json, format_comparisons
from embedlab.cli.common import add_spec, require_cuda, stderr
from embedlab.studies.spec import load_data_configs


def _print_comparisons(comparisons, notes: list[str], as_json: bool) -> None:
    print(json.dumps(comparisons_json(comparisons), sort_keys=True) if as_json else format_comparisons(comparisons, notes))


def _bench_prepared(args: argparse.Namespace):
    # here: data.prepare loads tokenizers, sweep.run torch
    from embedlab.prepared.build import prepare_data
    from embedlab.sweep.cluster import connect

    connect(args.address, stderr)
    return prepare_data(load_data_configs(args.spec)[0], progress=stderr)


def cmd_bench_data(args: argparse.Namespace) -> int:
    # here: bench.data loads tokenizers, sweep.run torch
    from embedlab.bench.data import bench_data, format_bench
    from embedlab.sweep.cluster import connect

    connect(args.address, stderr)
    config = load_data_configs(args.spec)[0]
    repeats = {} if args.repeats is None else {"repeats": args.repeats}
    result = bench_data(documents=args.documents, config=config, progress=stderr, **repeats)
    print(json.dumps(result, sort_keys=True) if args.json else format_bench(result))
    return 0


def cmd_bench_eval(args: argparse.Namespace) -> int:
    # here: bench.evaluation loads tokenizers, sweep.run torch
    from embedlab.bench.evaluation import bench_eval, format_bench_eval
    from embedlab.sweep.cluster import connect

    connect(args.address, stderr)
    result = bench_eval(split=args.split, progress=stderr)
    print(json.dumps(result, sort_keys=True) if args.json else format_bench_eval(result))
    return 0


def cmd_bench_all(args: argparse.Namespace) -> int:
    if args.scaling:
        return cmd_bench_scaling(args)
    # here: both load torch
    from embedlab.bench.suite import bench_all
    from embedlab.sweep.cluster import connect

    connect(args.address, stderr)
    result = bench_all(load_data_configs(args.spec)[0], compile_model=not args.no_compile, progress=stderr)
    _print_comparisons(result["comparisons"], result["notes"], args.json)
    return 0


def cmd_bench_train(args: argparse.Namespace) -> int:
    from embedlab.bench.train import TrainBench, bench_train, train_notes  # here: it loads torch

    bench = TrainBench(preset=args.preset, sequence_length=args.sequence_length, documents=args.documents,
                       batch_documents=args.batch_documents, repeats=args.repeats, threads=args.threads)
    result = bench_train(_bench_prepared(args), bench, ablations=args.ablations, memory=not args.no_memory,
                         compile_model=not args.no_compile, progress=stderr)
    _print_comparisons(result["comparisons"], train_notes(result), args.json)
    return 0


def cmd_bench_contrastive(args: argparse.Namespace) -> int:
    from embedlab.bench.contrastive import ContrastiveBench, bench_contrastive  # here: it loads torch

    bench = ContrastiveBench(preset=args.preset, batch_pairs=args.batch_pairs, gradcache_chunk=args.chunk,
                             repeats=args.repeats, threads=args.threads, memory=not args.no_memory)
    result = bench_contrastive(_bench_prepared(args), bench, progress=stderr)
    _print_comparisons(result["comparisons"], [], args.json)
    return 0


def cmd_bench_layout(args: argparse.Namespace) -> int:
    from embedlab.bench.layout import LayoutBench, bench_layout, format_layout  # here: it loads ray and torch

    bench = LayoutBench(**({} if args.pairs is None else {"pairs": args.pairs}))
    result = bench_layout(_bench_prepared(args), bench, progress=stderr)
    print(json.dumps(result, sort_keys=True) if args.json else format_layout(result))
    return 0


def cmd_bench_mining(args: argparse.Namespace) -> int:
    from embedlab.bench.mining import MiningBench, bench_mining, mining_notes  # here: it loads torch and Ray Data

    bench = MiningBench(workers=args.workers, documents=args.documents, pairs=args.pairs, preset=args.preset,
                        top_k=args.top_k, repeats=args.repeats)
    result = bench_mining(_bench_prepared(args), bench, progress=stderr)
    if args.json:
        print(json.dumps({**result, "comparisons": comparisons_json(result["comparisons"])}, sort_keys=True))
    else:
        _print_comparisons(result["comparisons"], mining_notes(result), as_json=False)
    return 0


def cmd_bench_prefetch(args: argparse.Namespace) -> int:
    from embedlab.bench.prefetch import PrefetchBench, bench_prefetch, prefetch_note  # here: it loads torch

    bench = PrefetchBench(budget_tokens=args.budget_tokens, preset=args.preset, repeats=args.repeats,
                          packing_tokens=args.packing_tokens)
    result = bench_prefetch(_bench_prepared(args), load_data_configs(args.spec)[0], bench, progress=stderr)
    _print_comparisons(result["comparisons"], [f"prefetch: {prefetch_note(result)}"], args.json)
    return 0


def cmd_bench_scaling(args: argparse.Namespace) -> int:
    from embedlab.bench.scaling import bench_scaling, format_scaling  # here: it loads torch

    limit = {} if args.encode_limit is None else {"encode_limit": args.encode_limit}
    result = bench_scaling(_bench_prepared(args), sizes=tuple(args.sizes), length_tokens=args.length_tokens,
                           progress=stderr, **limit)
    print(json.dumps(result, sort_keys=True) if args.json else format_scaling(result))
    return 0


def cmd_bench_mfu_cpu(args: argparse.Namespace) -> int:
    # here: it loads torch
    from embedlab.bench.cpu_mfu import CpuMfuBench, bench_cpu_mfu, cpu_mfu_comparisons, cpu_mfu_notes

    given = {"presets": None if args.presets is None else tuple(args.presets), "sequence_length": args.sequence_length,
             "batch_rows": args.batch_rows, "steps": args.steps, "peak_size": args.peak_size,
             "peak_repeats": args.peak_repeats, "threads": args.threads}
    bench = CpuMfuBench(**{name: value for name, value in given.items() if value is not None})
    result = bench_cpu_mfu(bench, progress=stderr)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        _print_comparisons(cpu_mfu_comparisons(result), cpu_mfu_notes(result), as_json=False)
    return 0


def cmd_bench_mfu(args: argparse.Namespace) -> int:
    from embedlab.bench.mfu import MfuBench, bench_mfu  # here: it loads torch

    require_cuda("bench mfu", "run workers/bench-gpu.sh on a GPU machine")
    bench = MfuBench(preset=args.preset, sequence_length=args.sequence_length, batch_rows=args.batch_rows,
                     steps=args.steps, compile=not args.no_compile, attention=args.attention,
                     **({} if args.compare_steps is None else {"compare_steps": args.compare_steps}))
    result = bench_mfu(bench, peak_tflops=args.peak_tflops, progress=stderr)
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab bench` and its subcommands on the main parser's subcommands."""

    def add_scaling_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000],
                       help="corpus sizes for evaluation time (default 1k 10k 100k 1M)")
        p.add_argument("--encode-limit", type=int, default=None,
                       help="largest size whose encoding is measured, default 100,000; larger ones are "
                            "extrapolated (labelled)")
        p.add_argument("--length-tokens", type=int, default=16384, help="tokens per pass at each sequence length")

    bench = sub.add_parser("bench", help="measurements, each against a reference in the same run "
                           "(no subcommand: all of them in one table)")
    bench.add_argument("--scaling", action="store_true",
                       help="instead: tokens/s vs sequence length and evaluation time vs corpus size")
    bench.add_argument("--spec", default=None, help="a data spec or study file (default: the built-in corpus)")
    bench.add_argument("--no-compile", action="store_true", help="skip the torch.compile row (it compiles ~1 min)")
    bench.add_argument("--address", default=None, help="an existing Ray cluster (default: the one RAY_ADDRESS names, else start a new local one)")
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
    bench_prefetch_parser.add_argument("--packing-tokens", type=int, default=4_000_000,
                                       help="tokens of the stream the packing-per-worker rows pack")
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
    bench_mining_parser = bench_sub.add_parser(
        "mining", help="hard-negative mining (encoding and exact search) on N Ray workers vs one process")
    add_spec(bench_mining_parser)
    bench_mining_parser.add_argument("--workers", type=int, default=2, help="Ray workers on the sharded side (default 2)")
    bench_mining_parser.add_argument("--documents", type=int, default=None,
                                     help="the first N training documents (default: the whole training split)")
    bench_mining_parser.add_argument("--pairs", type=int, default=2000, help="title-body pairs mined (default 2000)")
    bench_mining_parser.add_argument("--preset", default="small", help="the random parent's model preset (default small)")
    bench_mining_parser.add_argument("--top-k", type=int, default=100, help="candidates searched per query (default 100)")
    bench_mining_parser.add_argument("--repeats", type=int, default=1,
                                     help="timed runs of each side, alternating; the median is reported (default 1)")
    bench_mining_parser.add_argument("--json", action="store_true")
    bench_mining_parser.set_defaults(func=cmd_bench_mining)
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
