"""The seeds a rerun of a finished study needs, read from its paired test (`embedlab plan
--seeds-from RUN_DIR`).

The run's paired per-query test (`sweep.paired`, the crossed model of `sweep.crossed`) gives,
for every comparison that is not significant, the seeds that would detect its observed
difference with 80% power at Holm's strictest level, with the run's queries. A rerun sized
to detect all of them needs the largest; comparisons no number of seeds up to
`crossed.MAX_SEEDS` reaches are named and left out of the size (they need more queries or a
larger effect). The rerun keeps the run's seeds and adds the smallest unused ones, so its
first trials repeat the run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from embedlab.core.errors import UsageError
from embedlab.stats import crossed
from embedlab.stats.looks import read_sequential
from embedlab.stats.sequential import extended_seeds
from embedlab.stats.paired import ONE_SEED, compare_to_control
from embedlab.stats.table import load_table, read_study_record
from embedlab.studies.study import Study


@dataclass(frozen=True)
class RerunSize:
    """How many seeds a rerun needs (`seeds`) and why: per comparison that is not significant,
    its seeds needed (None: beyond `crossed.MAX_SEEDS`)."""

    run_dir: str
    run_seeds: int
    seeds: int
    needed: dict[str, int | None]
    significant: tuple[str, ...]

    @property
    def line(self) -> str:
        """One line for the plan: the size and the comparisons behind it."""
        reach = ", ".join(f"{arm} {n}" for arm, n in self.needed.items() if n is not None)
        beyond = [arm for arm, n in self.needed.items() if n is None]
        return (f"seeds from {self.run_dir}: {self.seeds} (the run had {self.run_seeds}); seeds needed at 80% power "
                f"for the observed differences: {reach}"
                + (f"; beyond {crossed.MAX_SEEDS} seeds, not sized: {', '.join(beyond)}" if beyond else "")
                + (f"; already significant: {', '.join(self.significant)}" if self.significant else ""))


def rerun_size(run_dir: str | Path, study: Study) -> RerunSize:
    """The seeds a rerun of `study` needs to detect the differences its finished run
    `run_dir` observed; refused (UsageError) for a run of another study, a run without a
    paired test or with other arms, and a run where no comparison is left to size or none is
    within reach."""
    if read_sequential(run_dir) is not None:
        raise UsageError(f"--seeds-from {run_dir}: a study run until decided chose its seeds round by round; its "
                         "table says what each arm used and what it could not detect")
    record = read_study_record(run_dir).get("study") or {}
    if record.get("name") != study.name:
        raise UsageError(f"--seeds-from {run_dir}: a run of study {record.get('name')!r}, not of {study.name!r}")
    if sorted(record.get("arms") or ()) != sorted(study.arms):
        raise UsageError(f"--seeds-from {run_dir}: the run's arms ({', '.join(record.get('arms') or ())}) are not the "
                         f"study's ({', '.join(study.arms)})")
    comparison = compare_to_control(run_dir, load_table(run_dir))
    if comparison.tests is None:
        raise UsageError(f"--seeds-from {run_dir}: no paired test to size a rerun from: {comparison.unavailable}")
    tests = comparison.tests
    if (tests["note"] == ONE_SEED).all():
        raise UsageError(f"--seeds-from {run_dir}: every arm ran one seed, so there is no seed variance to size a "
                         "rerun from; run at least 2 seeds first")
    significant = tuple(tests.loc[tests["significant"], "arm"])
    open_rows = tests[~tests["significant"] & tests["note"].eq("")]
    needed = {row.arm: None if math.isnan(row.seeds_needed) else int(row.seeds_needed)
              for row in open_rows.itertuples()}
    if not needed:
        raise UsageError(f"--seeds-from {run_dir}: every comparison is already significant "
                         f"({', '.join(significant)}); a rerun needs no more seeds")
    reachable = [n for n in needed.values() if n is not None]
    if not reachable:
        raise UsageError(f"--seeds-from {run_dir}: no comparison's observed difference is detectable within "
                         f"{crossed.MAX_SEEDS} seeds ({', '.join(needed)}); it needs more queries (`embedlab table` "
                         "prints queries needed where the query part dominates) or a larger effect")
    run_seeds = int(tests["seeds"].max())
    return RerunSize(run_dir=str(run_dir), run_seeds=run_seeds, seeds=max(max(reachable), run_seeds), needed=needed,
                     significant=significant)


def with_seeds(study: Study, count: int) -> Study:
    """`study` at `count` seeds: its own seeds first, then the smallest unused non-negative
    integers outside its tuning seeds."""
    return replace(study, seeds=extended_seeds(study.seeds, count, study.tuning_seeds))
