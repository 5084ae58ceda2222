"""`embedlab stats calibrate`: the paired test's false-positive rate and power, by simulation
(`embedlab.stats.calibration`); `embedlab stats ladder`: one study's comparison across runs at
several budgets (`embedlab.stats.ladder`).

`embedlab.cli.build_parser` registers it with `add_parsers`.
"""

from __future__ import annotations

import argparse
import json
import math

from embedlab.core.errors import UserError


def _percent(rate) -> str:
    return f"{rate.rate:.1%} ± {rate.mc_se:.1%}"


def cmd_calibrate(args: argparse.Namespace) -> int:
    from embedlab.stats import calibration, crossed, paired  # here: numpy and scipy, which --help does not need

    defaults = dict(studies=calibration.STUDIES, bootstrap_studies=calibration.BOOTSTRAP_STUDIES,
                    seed=calibration.SIMULATION_SEED, alpha=paired.ALPHA)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha {args.alpha}: a level between 0 and 1")
    if args.studies < 100 or args.bootstrap_studies < 0:
        raise UserError(f"--studies {args.studies} / --bootstrap-studies {args.bootstrap_studies}: simulate at "
                        "least 100 studies per setting (and 0 or more for the bootstrap)")
    settings = calibration.grid()
    print(f"stats: simulating {args.studies:,} null studies in each of {len(settings)} settings "
          f"(numpy seed {args.seed}), alpha {args.alpha:g}", flush=True)
    sizes = calibration.size_table(settings, args.studies, args.seed, args.alpha)
    print(f"stats: the test beside the earlier bootstrap ({args.bootstrap_studies} studies each, 1,000 resamples)",
          flush=True)
    compared = calibration.comparison_rows(args.studies, args.bootstrap_studies, args.seed, args.alpha) if (
        args.bootstrap_studies) else []
    levels = {s: crossed.calibrated_level(s - 1, args.alpha) for s in calibration.GRID_SEEDS}
    print("stats: seeds until decided: false-positive rate, equivalence at the margin, seeds against fixed designs",
          flush=True)
    sequential = (calibration.sequential_size_table(args.studies, args.seed, args.alpha),
                  calibration.equivalence_table(args.studies, args.seed, args.alpha),
                  calibration.seeds_table(args.studies, args.seed, args.alpha))
    if args.json:
        print(json.dumps({"alpha": args.alpha, "seed": args.seed, "model": crossed.MODEL, "test": crossed.METHOD,
                          "calibrated_levels": {str(s): level for s, level in levels.items()},
                          "satterthwaite_worst_case_size": {str(s): crossed.worst_case_size(args.alpha, s - 1)
                                                            for s in levels},
                          "size": [r.as_dict() for r in sizes], "comparison": [r.as_dict() for r in compared],
                          "sequential": {name: [r.as_dict() for r in rows] for name, rows in
                                         zip(("size", "equivalence", "seeds"), sequential)}},
                         indent=2))
        return 0
    print(f"\nmodel: {crossed.MODEL}\ntest: {crossed.METHOD}")
    print("Satterthwaite's p read plainly, worst-case size at alpha: "
          + ", ".join(f"{s} seeds {crossed.worst_case_size(args.alpha, s - 1):.1%}" for s in levels))
    print("Satterthwaite-p level whose worst-case size is alpha: "
          + ", ".join(f"{s} seeds {level:.4g}" for s, level in levels.items()))
    print(f"\nfalse-positive rate at alpha {args.alpha:g} (± one Monte Carlo standard error), "
          f"{args.studies:,} null studies per cell")
    print("| seeds | seed×arm SD | queries | query / noise SD | false-positive rate |\n|---|---|---|---|---|")
    for r in sizes:
        s = r.setting
        print(f"| {s.seeds} | {s.sd_seed:g} | {s.queries} | {s.sd_query:g} / {s.sd_noise:g} | {_percent(r)} |")
    if compared:
        print("\nthe test beside the earlier bootstrap (effect 0: false-positive rate; otherwise power)")
        print("| seeds | seed×arm SD | queries | query / noise SD | true effect | test | rate |\n"
              "|---|---|---|---|---|---|---|")
        for r in compared:
            s = r.setting
            print(f"| {s.seeds} | {s.sd_seed:g} | {s.queries} | {s.sd_query:g} / {s.sd_noise:g} | {s.effect:g} | "
                  f"{r.test} | {_percent(r)} |")
    _print_sequential(*sequential, studies=args.studies, alpha=args.alpha, most=crossed.MAX_SEEDS)
    return 0


def _looks(looks) -> str:
    return ", ".join(map(str, looks))


def _print_sequential(sizes, equivalence, seeds, *, studies: int, alpha: float, most: int) -> None:
    """The three sequential tables (`embedlab.stats.calibration`), in markdown."""
    print(f"\nseeds until decided: false-positive rate at alpha {alpha:g} (better or worse called with no true "
          f"difference; ± one Monte Carlo standard error) and the seeds an arm ran, {studies:,} null studies per cell")
    print("| looks at seeds | seed×arm SD | queries | query / noise SD | false-positive rate | expected seeds |\n"
          "|---|---|---|---|---|---|")
    for r in sizes:
        s = r.setting
        print(f"| {_looks(r.looks)} | {s.sd_seed:g} | {s.queries} | {s.sd_query:g} / {s.sd_noise:g} | {_percent(r)} | "
              f"{r.seeds:.2f} |")
    print(f"\nseeds until decided: equivalence called where the true difference is at the margin (3 sd of the mean "
          f"difference at max seeds), at +margin and -margin, {studies:,} studies each")
    print("| looks at seeds | seed×arm SD | queries | query / noise SD | margin | true difference | called equivalent "
          "| expected seeds |\n|---|---|---|---|---|---|---|---|")
    for r in equivalence:
        s = r.setting
        print(f"| {_looks(r.looks)} | {s.sd_seed:g} | {s.queries} | {s.sd_query:g} / {s.sd_noise:g} | {r.margin:.4f} | "
              f"{s.effect:+.4f} | {_percent(r)} | {r.seeds:.2f} |")
    fixed = sorted(seeds[0].fixed_power)
    print(f"\nseeds until decided against fixed designs: one arm, true difference in sd of the mean difference at "
          f"{seeds[0].looks[-1]} seeds; fixed designs' power from their formula, the sequential design's power and "
          f"expected seeds simulated ({studies:,} studies); the last column is the fewest seeds a fixed design needs "
          "for the sequential design's power")
    print("| setting | seed×arm SD | queries | query / noise SD | true difference | fixed power at "
          + "/".join(map(str, fixed)) + " seeds | sequential power | expected seeds | fixed seeds of equal power |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for r in seeds:
        s = r.setting
        power = "/".join(f"{r.fixed_power[k]:.2f}" for k in fixed)
        equal = "n/a (no difference)" if not s.effect else f"over {most}" if r.fixed_seeds is None else \
            str(r.fixed_seeds)
        print(f"| {r.name} | {s.sd_seed:g} | {s.queries} | {s.sd_query:g} / {s.sd_noise:g} | {s.effect:.4f} | {power} | "
              f"{r.power:.3f} | {r.seeds:.2f} | {equal} |")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `embedlab stats` on the main parser's subcommands."""
    stats = sub.add_parser("stats", help="the statistics behind 'significant'")
    commands = stats.add_subparsers(dest="stats_command", required=True)
    calibrate = commands.add_parser("calibrate", help="the paired test's size and power, by simulation")
    # Defaults (None here) are embedlab.stats.calibration's, read when the command runs.
    calibrate.add_argument("--studies", type=int, help="simulated studies per setting [4000]")
    calibrate.add_argument("--bootstrap-studies", type=int,
                           help="studies per setting for the earlier bootstrap (slow: 1,000 resamples each); 0: skip [400]")
    calibrate.add_argument("--seed", type=int, help="numpy seed [20261203]")
    calibrate.add_argument("--alpha", type=float, help="family-wise level [0.05]")
    calibrate.add_argument("--json", action="store_true")
    calibrate.set_defaults(func=cmd_calibrate)
    ladder = commands.add_parser("ladder", help="one study's comparison across runs at several budgets: per-rung "
                                                "tests, Holm across arms x rungs, the trend per doubling")
    ladder.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories of one study, one per budget")
    ladder.add_argument("--project-to", type=float, metavar="FLOPS",
                        help="evaluate each trend at this many training FLOPs (labelled an extrapolation outside "
                             "the measured range)")
    ladder.set_defaults(func=cmd_ladder)


def cmd_ladder(args: argparse.Namespace) -> int:
    """Print the ladder of `args.run_dirs` (`embedlab.stats.ladder`)."""
    # here: pandas and scipy, which the rest of `embedlab stats` loads only when it runs
    from embedlab.stats.ladder import render_ladder

    if args.project_to is not None and not 0 < args.project_to < math.inf:
        raise UserError(f"--project-to {args.project_to:g}: a number of training FLOPs, positive and finite "
                        "(e.g. 1e18), to project each trend to")
    print(render_ladder(args.run_dirs, project_to=args.project_to), end="")
    return 0
