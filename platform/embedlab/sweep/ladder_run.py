"""`embedlab sweep STUDY --ladder 0.25,0.5,1`: one study at several budgets, each rung a full,
independent run of the study at that multiple of its budget (`Study.scaled`: every arm's
schedule on the rung's own budget, arms compute-matched within the rung as in any sweep).

A rung's run directory is `<storage>/<study>-x<factor>-<timestamp>`. Running the same ladder
again (same study file, profile, scales and storage) skips every rung whose run holds all
its trials, resumes a rung whose run was cut short, and starts the rest: a killed driver
loses at most the trials in flight. The rungs are then read together (`embedlab.stats.ladder`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from embedlab.core import store
from embedlab.core.errors import UsageError, UserError
from embedlab.stats.paired import final_trials
from embedlab.stats.summary import expected_trials
from embedlab.stats.table import STUDY_FILE, load_table, read_study_record
from embedlab.studies.study import load_study
from embedlab.sweep.preflight import check_storage


def parse_scales(text: str) -> tuple[float, ...]:
    """"0.25,0.5,1" -> (0.25, 0.5, 1.0): distinct positive factors, in increasing order."""
    try:
        scales = tuple(sorted(float(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise UsageError(f"--ladder {text!r}: a comma-separated list of budget factors, e.g. 0.25,0.5,1") from None
    if len(scales) < 2 or len(set(scales)) != len(scales) or scales[0] <= 0 or not all(map(math.isfinite, scales)):
        raise UsageError(f"--ladder {text!r}: two or more distinct finite positive budget factors, e.g. 0.25,0.5,1")
    return scales


def rung_runs(storage: str, study) -> list[str]:
    """Earlier run directories of `study` (this rung: same name and hash) in `storage`, oldest first."""
    found = []
    for run_dir in store.list_dirs(storage):
        if not store.name(run_dir).startswith(f"{study.name}-") or not store.exists(store.join(run_dir, STUDY_FILE)):
            continue
        if read_study_record(run_dir).get("study_hash") == study.hash:
            found.append(run_dir)
    return found


def ladder_plan(study_path: str | Path, scales: Sequence[float], *, profile: str | None, storage: str | Path
                ) -> list[tuple[float, str, str | None]]:
    """Per rung: (factor, "done" | "resume" | "run", its latest earlier run directory or None)."""
    check_storage(storage)  # a folder (or a URI) to look for earlier rungs in, before listing it
    plan = []
    for factor in scales:
        earlier = rung_runs(store.resolve(storage), load_study(study_path, profile, factor))
        if not earlier:
            plan.append((factor, "run", None))
            continue
        latest = earlier[-1]
        done, expected = trial_counts(latest)
        plan.append((factor, "done" if done >= expected else "resume", latest))
    return plan


def trial_counts(run_dir: str) -> tuple[int, int]:
    """(finished final trials, trials the study declares) of a rung's run directory."""
    return len(final_trials(load_table(run_dir))), expected_trials(read_study_record(run_dir), run_dir)


def run_ladder(study_path: str | Path, scales: Sequence[float], *, storage: str | Path = "runs",
               profile: str | None = None, progress: Callable[[str], None] = print, **sweep) -> list[str]:
    """Run (or finish) every rung of the ladder (module docstring); returns the rungs' run
    directories in increasing budget. `sweep`: `run_sweep`'s other options (address, parent, ...)."""
    from embedlab.sweep.run import run_sweep  # here: Ray and torch

    run_dirs = []
    for factor, action, earlier in ladder_plan(study_path, scales, profile=profile, storage=storage):
        if action == "done":
            progress(f"ladder: rung x{factor:g} already finished in {earlier}: kept")
            run_dirs.append(earlier)
            continue
        progress(f"ladder: rung x{factor:g}: " + (f"resuming {earlier}" if action == "resume" else "starting"))
        run_dir = str(run_sweep(study_path, storage=storage, profile=profile, budget_scale=factor,
                                resume=earlier if action == "resume" else None, progress=progress, **sweep))
        run_dirs.append(run_dir)
        # A rung that ended short (Ctrl-C, which Tune turns into an orderly stop, or failed
        # trials) stops the ladder: the next rung would start behind the user's back.
        done, expected = trial_counts(run_dir)
        if done < expected:
            raise LadderStopped(f"ladder: rung x{factor:g} ended with {done} of {expected} trials ({run_dir}), "
                                "interrupted or failed; later rungs not started: run the same command again to "
                                "resume it")
    return run_dirs


class LadderStopped(UserError):
    """A rung ended with trials missing; the ladder stopped there."""
