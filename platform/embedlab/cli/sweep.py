"""`embedlab demo|sweep|plan|tour|table|promote|report`: run studies and read their results.

Each command parses its arguments and calls `embedlab.sweep` (and `embedlab.report`);
`embedlab.cli.build_parser` registers them with `add_parsers`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from embedlab.cli.common import progress, stderr
from embedlab.core import paths, store
from embedlab.core.config import DEFAULT_MAX_RETENTION_DROP
from embedlab.core.errors import UsageError
from embedlab.sweep.capacity import check_options

# The library is imported inside each command, not here: tables, promotion and tours load
# pandas and scipy, sweeps torch and Ray, and `embedlab --help` or a mistyped argument needs
# none of them (`tests/test_cli_errors.py` holds the parser to that).
DEMO_PROFILE = "demo"


def cmd_sweep(args: argparse.Namespace) -> int:
    from embedlab.sweep.run import dry_run, run_sweep  # here: it loads torch

    sequential = dict(until_decided=args.until_decided, max_seeds=args.max_seeds,
                      equivalence_margin=args.equivalence_margin)
    if args.ladder is not None:
        if args.until_decided:
            raise UsageError("--ladder runs each rung at the study's fixed seeds: it does not take --until-decided")
        return _ladder(args)
    if args.dry_run:
        print(dry_run(args.study, profile=args.profile, parent=args.parent, storage=args.storage, resume=args.resume,
                      budget_scale=args.budget_scale, address=args.address, max_concurrent=args.max_concurrent,
                      wait_for_resources=args.wait_for_resources, **sequential))
        return 0
    run_dir = run_sweep(args.study, storage=args.storage, address=args.address, parent=args.parent,
                        profile=args.profile, resume=args.resume, max_concurrent=args.max_concurrent,
                        wait_for_resources=args.wait_for_resources, progress=progress, budget_scale=args.budget_scale,
                        verbose=args.verbose, reuse=not args.no_reuse, **sequential)
    return _show_run(run_dir)


def _ladder(args: argparse.Namespace) -> int:
    """`embedlab sweep STUDY --ladder ...`: each rung's sweep (or what a dry run would do), then the ladder."""
    # here: pandas and scipy, which the other subcommands' --help does not need
    from embedlab.stats.ladder import render_ladder
    from embedlab.sweep.ladder_run import ladder_plan, parse_scales, run_ladder
    from embedlab.sweep.run import dry_run  # here: it loads torch

    if args.resume is not None or args.budget_scale != 1.0:
        raise UsageError("--ladder runs its own rungs: it takes neither --resume nor --budget-scale")
    scales = parse_scales(args.ladder)
    # Every check of a plain dry run, on the top rung (the others differ in budget only, and
    # `ladder_plan` loads each): storage, cluster options, parent, sources, tasks, memory.
    checked = dry_run(args.study, profile=args.profile, parent=args.parent, storage=args.storage,
                      budget_scale=scales[-1], address=args.address, max_concurrent=args.max_concurrent,
                      wait_for_resources=args.wait_for_resources)
    plan = ladder_plan(args.study, scales, profile=args.profile, storage=args.storage)
    if args.dry_run:
        print(checked)
        for factor, action, earlier in plan:
            print(f"rung x{factor:g}: {action}" + (f" ({earlier})" if earlier else ""))
        return 0
    run_dirs = run_ladder(args.study, scales, storage=args.storage, profile=args.profile, progress=progress,
                          address=args.address, parent=args.parent, max_concurrent=args.max_concurrent,
                          wait_for_resources=args.wait_for_resources, verbose=args.verbose,
                          reuse=not args.no_reuse)
    failed = max(_show_run(run_dir) for run_dir in run_dirs)
    print()
    print(render_ladder(run_dirs), end="")
    return failed


def cmd_plan(args: argparse.Namespace) -> int:
    from embedlab.sweep.plan import format_plan, plan_study  # here: it loads torch

    plan = plan_study(args.study, profile=args.profile, parent=args.parent, address=args.address,
                      reports=args.pilot_reports, throughput=args.throughput, seeds_from=args.seeds_from,
                      trend_from=args.trend_from or (), progress=stderr)
    print(json.dumps(plan, sort_keys=True) if args.json else format_plan(plan))
    return 0


def _show_run(run_dir: Path) -> int:
    """Print a finished run's table; 1 when trials are missing."""
    from embedlab.stats.summary import summarize_run  # here: pandas and scipy

    summary = summarize_run(run_dir)
    print()
    print(summary.table)
    if summary.parent_line:
        print(summary.parent_line)
    print(f"\nrun directory: {run_dir}")
    print(f"trial table:   embedlab table {run_dir}   (or embedlab.load_table(...) in Python)")
    if summary.missing:
        print(f"error: {summary.missing} of {summary.expected} trials did not finish; "
              f"continue with: embedlab sweep STUDY --resume {run_dir}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from embedlab.sweep.tour import find_demo_tour  # here: pandas and scipy

    args.tour, args.profile = str(find_demo_tour(args.ablations)), DEMO_PROFILE
    return cmd_tour(args)


def cmd_tour(args: argparse.Namespace) -> int:
    from embedlab.sweep.tour import dry_run_tour, run_tour  # here: pandas and scipy

    if args.dry_run:
        print(dry_run_tour(args.tour, args.profile, storage=args.storage, address=args.address,
                           max_concurrent=args.max_concurrent, wait_for_resources=args.wait_for_resources))
        return 0
    failed = []
    run_dirs = run_tour(args.tour, profile=args.profile, storage=args.storage, address=args.address,
                        max_concurrent=args.max_concurrent, wait_for_resources=args.wait_for_resources,
                        show=lambda run_dir: failed.append(_show_run(run_dir)), progress=progress,
                        verbose=args.verbose, reuse=not args.no_reuse)
    print("\ntour finished; run directories:")
    for run_dir in run_dirs:
        print(f"  {run_dir}")
    return max(failed, default=0)


def cmd_table(args: argparse.Namespace) -> int:
    from embedlab.stats.table import load_table, render  # here: pandas and scipy

    if args.json:  # every column of every trial, as records
        print(load_table(args.run_dir).to_json(orient="records"))
    else:
        print(render(args.run_dir, args.format))
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    from embedlab.sweep.promote import promote  # here: pandas and scipy

    check_options(args.max_concurrent, args.wait_for_resources)  # before promoting, not after
    if args.run and args.address is not None:
        from embedlab.sweep.cluster import check_address  # here: its module loads torch

        check_address(args.address)
    margin = DEFAULT_MAX_RETENTION_DROP if args.max_retention_drop is None else args.max_retention_drop
    promotion = promote(args.run_dir, metric=args.metric, max_retention_drop=margin,
                        arm=args.arm, next_study=args.next, allow_missing_seeds=args.allow_missing_seeds,
                        replace=args.replace, progress=progress)
    if args.run and "next_study" in promotion:
        from embedlab.sweep.run import run_sweep  # here: it loads torch

        child = run_sweep(promotion["next_study"], storage=store.parent(store.resolve(args.run_dir)),
                          address=args.address, max_concurrent=args.max_concurrent,
                          wait_for_resources=args.wait_for_resources, progress=progress, verbose=args.verbose)
        return _show_run(child)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from embedlab.report import write_report  # here: it loads matplotlib and torch

    if args.out is None and store.local_path(args.run_dirs[-1]) is None:
        raise UsageError(f"{store.redact(args.run_dirs[-1])} is on object storage: name a local file with --out")
    out = args.out or Path(args.run_dirs[-1]) / "report.html"
    paths.require_output_file(out, "--out")  # before the minutes of scoring, not after
    if args.figures is not None:
        paths.require_output_dir(args.figures, "--figures")
    print(write_report(args.run_dirs, out, figures_dir=args.figures, progress=stderr))
    if args.figures is not None:
        print(f"figures: {args.figures}/<figure id>.png")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register demo, sweep, plan, tour, table, promote and report on the main parser's subcommands."""

    def add_run_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--storage", default="runs", help="where run directories go (default ./runs)")
        p.add_argument("--address", default=None, help="an existing Ray cluster (default: the one RAY_ADDRESS names, else start a new local one)")
        p.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                       help="trials Tune runs at once (default: as many as the cluster's resources hold when "
                            "the sweep starts)")
        p.add_argument("--wait-for-resources", type=float, default=0.0, metavar="SECONDS",
                       help="on an autoscaling cluster (--address), wait up to SECONDS for nodes that hold one "
                            "trial of every arm, asking the autoscaler for them (default 0: refuse at once)")
        p.add_argument("--verbose", action="store_true",
                       help="also show Ray Tune's own console output (its configuration box, hints and warnings), "
                            "which otherwise goes to the run directory's ray.log")
        p.add_argument("--no-reuse", action="store_true",
                       help="train every trial, even one already finished under the storage root with the same "
                            "config, parent, data and training code (default: copy its row)")

    demo = sub.add_parser("demo", help="the three-phase tour on the demo profile, on a local Ray cluster")
    demo.add_argument("--ablations", default=None, metavar="DIR",
                      help="the repository's ablations/ directory (default: the installed checkout's)")
    add_run_options(demo)
    demo.set_defaults(func=cmd_demo, dry_run=False)

    def add_profile(p: argparse.ArgumentParser) -> None:
        from embedlab.studies.recipes import profiles_help  # here: the data layer's config modules

        p.add_argument("--profile", default=None, help=f"sizes to run at: {profiles_help()}")

    sweep = sub.add_parser("sweep", help="run a study file with Ray Tune")
    sweep.add_argument("study", help="a study file, e.g. ablations/masking_ratio.py")
    sweep.add_argument("--parent", default=None,
                       help="phases 2-3: the checkpoint every arm starts from, or a pretrained model "
                            "(hf:ORG/NAME@COMMIT from the local Hub cache, a Hugging Face or sentence-transformers "
                            "directory)")
    add_profile(sweep)
    sweep.add_argument("--dry-run", action="store_true",
                       help="check everything the study reads that needs no Ray and no training (storage, "
                            "--resume, arms, pair and document sources, evaluation tasks), print its arms, "
                            "seeds, budget and trials; start nothing")
    sweep.add_argument("--resume", default=None, metavar="RUN_DIR",
                       help="continue an interrupted run of the same study: finished trials are kept")
    sweep.add_argument("--budget-scale", type=float, default=1.0, metavar="F",
                       help="run the study at F times its budget, named <study>-x<F> (default 1)")
    sweep.add_argument("--ladder", default=None, metavar="F,F,...",
                       help="run the study at each budget factor (e.g. 0.25,0.5,1), one run per rung; running "
                            "it again keeps finished rungs and resumes a cut one; ends with `embedlab stats ladder`")
    sweep.add_argument("--until-decided", action="store_true",
                       help="run seeds in rounds, each arm until it is better, worse, equivalent or futile, or "
                            "--max-seeds is reached (a sequential test that holds its size)")
    sweep.add_argument("--max-seeds", type=int, default=None, metavar="N",
                       help="with --until-decided: the most seeds an arm runs (default: the study's, else 8)")
    sweep.add_argument("--equivalence-margin", type=float, default=None, metavar="DELTA",
                       help="the smallest difference that matters, in metric units: an arm shown within "
                            "±DELTA is 'equivalent within ±DELTA' (default: the study's, else none)")
    add_run_options(sweep)
    sweep.set_defaults(func=cmd_sweep)

    plan = sub.add_parser("plan", help="pilot every arm on the cluster; estimate time, memory and storage")
    plan.add_argument("study", help="a study file, e.g. ablations/masking_ratio.py")
    add_profile(plan)
    plan.add_argument("--parent", default=None,
                      help="the parent checkpoint of a phase-2 or phase-3 study, or a pretrained model")
    plan.add_argument("--pilot-reports", type=int, default=6,
                      help="report intervals (train.report_every_steps) each arm's pilot trains (default 6)")
    plan.add_argument("--address", default=None, help="a Ray cluster to plan on (default: a local one)")
    plan.add_argument("--throughput", default=None, metavar="FILE",
                      help="no pilots: estimate a GPU study from one GPU's `embedlab bench mfu --json` output "
                           "(training FLOP/s x workers a trial); starts nothing")
    plan.add_argument("--seeds-from", default=None, metavar="RUN_DIR",
                      help="a finished run of the study: plan it at the seeds that run's paired test says would "
                           "detect its observed differences at 80%% power")
    plan.add_argument("--trend-from", nargs="+", default=None, metavar="RUN_DIR",
                      help="no pilots: the rungs of a budget ladder of the same comparison (embedlab sweep --ladder); "
                           "project each arm's trend to this study's training FLOPs at --profile, labelled an "
                           "extrapolation beyond the rungs, never a result")
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

    # `promote` here is the parser; cmd_promote calls the function of that name
    promote = sub.add_parser("promote", help="pick a study's winner on recipe-dev and write the next phase's study")
    promote.add_argument("run_dir")
    promote.add_argument("--metric", default=None, help="a dev/ metric (default: the study's)")
    promote.add_argument("--max-retention-drop", type=float, default=None,
                         help="refuse a winner whose retention panel, as its mean over seeds, falls more than "
                              "this below its parent's: absolute, in metric points (0.10 is 0.10 below, not 10%%; "
                              "default 0.05)")
    promote.add_argument("--arm", default=None, help="promote this arm instead of the dev winner (margin still applies)")
    promote.add_argument("--next", default=None, help="the next phase's study file (default: the recipe's next)")
    promote.add_argument("--replace", action="store_true",
                         help="replace this run's earlier promotion (its final-eval split is read again, and the "
                              "new promotion.json records that)")
    promote.add_argument("--allow-missing-seeds", action="store_true",
                         help="rank arms on the seeds they have when a declared (arm, seed) has no finished trial "
                              "with the metric (default: refuse)")
    promote.add_argument("--run", action="store_true", help="launch the next phase's study after promoting")
    promote.add_argument("--address", default=None, help="with --run: an existing Ray cluster")
    promote.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                         help="with --run: trials Tune runs at once (as for embedlab sweep)")
    promote.add_argument("--wait-for-resources", type=float, default=0.0, metavar="SECONDS",
                         help="with --run: wait up to SECONDS for the autoscaler's nodes (as for embedlab sweep)")
    promote.add_argument("--verbose", action="store_true", help="with --run: as for embedlab sweep")
    promote.set_defaults(func=cmd_promote)

    report = sub.add_parser("report", help="the study report: one self-contained HTML page for one or more runs")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a study's run directory, or a tour's, in order")
    report.add_argument("--out", type=Path, default=None, help="HTML file (default: LAST_RUN_DIR/report.html)")
    report.add_argument("--figures", type=Path, default=None, metavar="DIR",
                        help="also write each figure as DIR/<figure id>.png (the image the page embeds)")
    report.set_defaults(func=cmd_report)
