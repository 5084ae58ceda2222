"""Trial drivers run as one Ray Tune experiment: named beside an earlier pass's, at the
sweep's concurrency, printing the sweep's console lines, retrying a trial whose trainer died,
and leaving a row for every trial, its process's death included.

The console holds embedlab's lines only (`tune_output_to_log`): what Ray Tune prints or logs
itself (its configuration box, the TensorBoard hint pointing into Ray's session folder, its
Ctrl-C `Tuner.restore(...)` advice, which an embedlab user never acts on: `--resume` is theirs)
goes to the run directory's `ray.log`, and to the console too with `--verbose`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from embedlab.core import store, timing
from embedlab.records.rundir import TRIALS_DIR, error_text, finished_rows, write_row
from embedlab.studies.study import Study
from embedlab.sweep.driver import trial_identity
from embedlab.sweep.progress import trial_progress

RAY_LOG = "ray.log"  # in the run directory: Ray Tune's own console output and warnings
# The loggers Ray Tune and Train write their advice and warnings to (Ray's own handler prints them).
TUNE_LOGGERS = ("ray.tune", "ray.train")
# Runs of a trial beyond its first before it counts as failed. Fixed, not a setting: one
# retry outlasts a lost node or a removed placement group; a trial that fails again fails
# for a reason of its own, which its row records, and a resumed run runs it again.
TRIAL_RETRIES = 1


def fit(driver, param_space, run_dir: str, name: str, concurrency: int, progress: Callable[[str], None], *,
        study: Study, searcher=None, num_samples: int = 1) -> None:
    """Run `driver`'s trials as the Tune experiment `<run_dir>/tune/<name>`: the grid of
    `param_space`, or `num_samples` trials that `searcher` suggests; `concurrency` at a time.
    On the current stage clock, the experiment's span goes to its trials' stages as their rows
    record them (`timing.trial_seconds`); what no trial ran in, to trial start-up."""
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
    span_start = time.time()
    with timing.stage("trial_startup"):
        results = tuner.fit()
    clock = timing.current()
    if clock is not None:
        spans = [span for row in finished_rows(run_dir) if (span := timing.TrialSpan.of_row(row)) is not None]
        clock.move("trial_startup", timing.trial_seconds(span_start, time.time(), spans))
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


@contextlib.contextmanager
def tune_output_to_log(run_dir: str, progress: Callable[[str], None], *, verbose: bool = False
                       ) -> Iterator[Callable[[str], None]]:
    """While the block runs (the sweep's Tune experiments), what is printed to stdout and what
    `TUNE_LOGGERS` log goes to `<run_dir>/ray.log` (appended; on object storage, uploaded when
    the block ends), and with `verbose` to the console as well. Yields the `progress` to use
    inside: embedlab's lines, which reach the console as before."""
    console = sys.stdout
    local = store.local_path(run_dir)
    path = local / RAY_LOG if local is not None else Path(tempfile.mkdtemp(prefix="embedlab-ray-log-")) / RAY_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    loggers = [logging.getLogger(name) for name in TUNE_LOGGERS]
    propagating = [logger.propagate for logger in loggers]
    with open(path, "a", encoding="utf-8", buffering=1) as file:  # by line: a killed driver keeps its lines
        log = store.RedactedStream(file)  # a record too: no credential in it
        # Ray's own handler (on the "ray" logger) is bypassed: with --verbose the console gets
        # the same record from a handler of our own, once.
        handlers = [logging.StreamHandler(log), *([logging.StreamHandler(sys.stderr)] if verbose else [])]
        for handler in handlers:
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for logger in loggers:
            for handler in handlers:
                logger.addHandler(handler)
            logger.propagate = False

        _CONSOLES.append(console)
        try:
            with contextlib.redirect_stdout(_Tee(log, console) if verbose else log):
                yield ConsoleLines(progress)
        finally:
            _CONSOLES.pop()
            for logger, propagate in zip(loggers, propagating):
                for handler in handlers:
                    logger.removeHandler(handler)
                logger.propagate = propagate
    if local is None:
        store.upload(path, store.join(run_dir, RAY_LOG))


# The consoles of the open `tune_output_to_log` blocks, the innermost last.
_CONSOLES: list = []


@dataclasses.dataclass(frozen=True)
class ConsoleLines:
    """`progress`, its lines printed to the console of the innermost `tune_output_to_log` block
    rather than to the run's log. A value that holds no stream: Tune pickles its callbacks,
    which call it, with the experiment's state."""

    progress: Callable[[str], None]

    def __call__(self, line: str) -> None:
        with contextlib.redirect_stdout(_CONSOLES[-1]) if _CONSOLES else contextlib.nullcontext():
            self.progress(line)


class _Tee:
    """A text stream writing to two: the run's log and the console (`--verbose`)."""

    def __init__(self, *streams) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()

    def isatty(self) -> bool:
        return False
