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
    embedlab evaluate --encoder CKPT_DIR --task TASK [--split dev|test] [--dev-fraction F] [--json]
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
    embedlab stats calibrate [--studies N] [--json]   the paired test's size and power, by simulation
    embedlab stats ladder RUN_DIR RUN_DIR... [--project-to FLOPS]   a study across budgets: the trend per doubling

`main(argv)` returns an exit code, so tests call it in-process. An error in what was asked
(`embedlab.core.errors.UserError`, and FileNotFoundError or ConnectionError) prints one line,
`error: ...`, and returns 2; `embedlab --debug ...` prints its traceback above that line (an
error in a study file's own code: the traceback through that code). Anything else is a bug and
is not caught: it propagates with its traceback, and the `embedlab` command exits 1 as Python
does for an uncaught exception. Every line a command prints, on stdout and stderr, passes
through the redaction rule (`embedlab.core.store.redact`): no credential in an address, a
location or a token reaches the console, whichever part of embedlab or a library printed it.

Each group of subcommands lives in a module of its own, which registers its parsers and holds
its `cmd_*` functions: `sweep` (demo, sweep, plan, tour, table, promote, report), `evaluate`
(evaluate, evaluator), `export`, `model`, `data` (data, tokenizer), `bench`, `heldout` and `stats`;
`common` holds what several of them share. `build_parser` registers them in the order
`embedlab --help` lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback

from embedlab.cli import bench, data, evaluate, export, model, stats, sweep
from embedlab.cli.heldout import add_heldout_parser
from embedlab.core.errors import UserError
from embedlab.core.store import RedactedStream

# The errors `main` shows in one line: the user's to fix, not a bug.
USER_ERRORS = (UserError, FileNotFoundError, ConnectionError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedlab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true",
                        help="on an error in what was asked (a study file's own code included), print its "
                             "traceback above the one-line error")
    sub = parser.add_subparsers(dest="command", required=True)
    sweep.add_parsers(sub)
    evaluate.add_evaluate_parser(sub)
    export.add_parsers(sub)
    evaluate.add_evaluator_parser(sub)
    model.add_parsers(sub)
    data.add_parsers(sub)
    bench.add_parsers(sub)
    add_heldout_parser(sub)
    stats.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; 2 and one `error:` line for a user error, a bug's traceback otherwise.
    Everything it prints is redacted (`RedactedStream`)."""
    with contextlib.redirect_stdout(RedactedStream(sys.stdout)), contextlib.redirect_stderr(RedactedStream(sys.stderr)):
        args = build_parser().parse_args(argv)
        try:
            return args.func(args)
        except USER_ERRORS as error:
            if args.debug:
                traceback.print_exception(error)
            print(f"error: {one_line(error)}", file=sys.stderr)
            return 2


def one_line(error: BaseException) -> str:
    """The error's message on one line (a multi-line message is joined with " | ")."""
    return " | ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__

