"""A study run until decided, round by round (`embedlab sweep STUDY --until-decided`): each
round trains the control and every arm not yet decided at the next look's seeds, then the look
is taken (`embedlab.stats.looks`, `embedlab.stats.sequential`) and recorded in
`sequential.json` with its boundaries and verdicts, until every arm is decided or the study's
max seeds are reached.

Every look is recomputed from the trials' data before the next round: a killed driver, resumed
(`--resume RUN_DIR`), finds the looks it had taken, refuses a run whose data or design no
longer give them, and continues at the round it was in: the round's finished trials are kept
(as every resumed grid keeps them) and only the missing ones run. A look is never taken on an
incomplete round: a round that ends with trials missing (failed twice, or Ctrl-C) ends the
sweep there, and its summary counts them missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from embedlab.core import store
from embedlab.core.errors import UsageError
from embedlab.records.rundir import SEQUENTIAL_FILE, write_json
from embedlab.stats import looks
from embedlab.stats.paired import load_per_query
from embedlab.stats.sequential import Design
from embedlab.stats.table import load_table
from embedlab.studies.study import Study


def current(study: Study, run_dir: str, design: Design, recorded: dict[str, Any] | None
            ) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The run's looks recomputed from its trials' data, checked against the recorded ones, and
    the trials of the next round ([] once decided)."""
    arms = list(study.arms)
    table = load_table(run_dir)
    taken, states = looks.replay(design, load_per_query(run_dir, table), study.metric, arms)
    summary = looks.summarize(design, taken, states, arms)
    if recorded is not None:
        if len(recorded["looks"]) > len(taken):
            raise UsageError(f"{run_dir}: {SEQUENTIAL_FILE} records {len(recorded['looks'])} look(s), the trials' data "
                             f"give {len(taken)}: trials were removed; resume refused")
        differs = looks.same_looks(recorded["looks"], summary["looks"])
        if differs:
            raise UsageError(f"{run_dir}: {differs}; the trials' data changed since the look was taken: resume refused")
    return summary, looks.round_trials(design, states[-1], arms)


def run_rounds(study: Study, run_dir: str, run_grid: Callable[[list[tuple[str, int]]], None],
               progress: Callable[[str], None]) -> None:
    """Run the study's rounds in `run_dir` (module docstring); `run_grid(pairs)` trains or
    copies the (arm, seed) trials of a round that are not yet done."""
    design = looks.design_for(study)
    location = store.join(run_dir, SEQUENTIAL_FILE)
    recorded = looks.read_sequential(run_dir)
    if recorded is not None and Design.from_dict(recorded["design"]) != design:
        raise UsageError(f"{run_dir}: its sequential design {recorded['design']} is not the study's now "
                         f"{design.to_dict()}: the looks were planned before any data; resume refused")
    rounds = list(recorded["rounds"]) if recorded else []
    while True:
        summary, needed = current(study, run_dir, design, recorded)
        number = len(summary["looks"]) + 1
        if needed:
            rounds = [*rounds[:number - 1], {"round": number, "seeds": design.looks[number - 1],
                                             "trials": [list(pair) for pair in needed]}]
        recorded = {**summary, "rounds": rounds, "study_hash": study.hash}
        write_json(location, recorded)
        _report(summary, progress)
        if not needed:
            return
        arms = sorted({arm for arm, _ in needed} - {next(iter(study.arms))})
        progress(f"sequential: round {number}: {design.looks[number - 1]} seeds for {', '.join(arms)} and the control")
        run_grid(needed)
        have = looks.available(load_per_query(run_dir, load_table(run_dir)), study.metric)
        missing = [pair for pair in needed if pair not in have]
        if missing:  # the run's summary counts them missing and says how to continue
            progress(f"sequential: round {number} ended with {len(missing)} of {len(needed)} trial(s) missing "
                     f"({', '.join(f'{arm} seed {seed}' for arm, seed in missing[:5])}); no look taken")
            return


def _report(summary: dict[str, Any], progress: Callable[[str], None]) -> None:
    """The last look's verdicts, one line."""
    if summary["looks"]:
        last = summary["looks"][-1]
        progress(f"sequential: look {last['round']} at {last['seeds']} seeds: "
                 + "; ".join(f"{arm} {result['verdict']}" for arm, result in summary["arms"].items()))
