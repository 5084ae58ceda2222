"""Trial drivers run as one Ray Tune experiment: named beside an earlier pass's, at the
sweep's concurrency, printing the sweep's console lines, retrying a trial whose trainer died,
and leaving a row for every trial, its process's death included."""

from __future__ import annotations

from collections.abc import Callable

from embedlab.core import store
from embedlab.records.rundir import TRIALS_DIR, error_text, write_row
from embedlab.studies.study import Study
from embedlab.sweep.driver import trial_identity
from embedlab.sweep.progress import trial_progress

# Runs of a trial beyond its first before it counts as failed. Fixed, not a setting: one
# retry outlasts a lost node or a removed placement group; a trial that fails again fails
# for a reason of its own, which its row records, and a resumed run runs it again.
TRIAL_RETRIES = 1


def fit(driver, param_space, run_dir: str, name: str, concurrency: int, progress: Callable[[str], None], *,
        study: Study, searcher=None, num_samples: int = 1) -> None:
    """Run `driver`'s trials as the Tune experiment `<run_dir>/tune/<name>`: the grid of
    `param_space`, or `num_samples` trials that `searcher` suggests; `concurrency` at a time."""
    from ray import tune  # here: Ray, which a dry run does not need

    total = num_samples if param_space is None else len(param_space["trial"]["grid_search"])
    # Each pass of a resumed run gets its own Tune experiment next to the earlier ones.
    base, n = name, 1
    while store.exists(store.join(run_dir, "tune", name)):
        name, n = f"{base}-{n}", n + 1
    tuner = tune.Tuner(
        driver,
        param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency, search_alg=searcher, num_samples=num_samples),
        run_config=tune.RunConfig(name=name, storage_path=store.join(run_dir, "tune"), verbose=0,
                                  callbacks=[trial_progress(total, study.metric, progress),
                                             _failed_rows(study, run_dir)],
                                  # A trial whose trainer died (a lost node, a removed placement
                                  # group) runs once more before it counts as failed.
                                  failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES)),
    )
    results = tuner.fit()
    failed = [r for r in results if r.error is not None]
    if failed:
        progress(f"tune: {len(failed)} trial(s) failed; see {store.join(run_dir, 'tune', name)}")


def _failed_rows(study: Study, run_dir: str):
    """A Tune callback that writes a "failed" row for a trial that errored without writing one
    itself (its process died: out of memory, a lost node), so every trial leaves a row."""
    from ray import tune  # here: Ray, which a dry run does not need

    class FailedRows(tune.Callback):
        def on_trial_error(self, iteration, trials, trial, **info):
            if store.exists(store.join(run_dir, TRIALS_DIR, f"{trial.trial_id}.json")):
                return  # the driver's own row says more
            error = trial.get_error() or f"see {trial.local_path}"
            write_row(run_dir, {**trial_identity(study, trial.config, trial.trial_id), "status": "failed",
                                "error": error_text(str(error))})

    return FailedRows()
