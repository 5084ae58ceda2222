"""Where a run's wall time went: each trial's and each study's wall seconds by stage.

A `StageClock` measures one wall-clock span (a trial's driver, a study's sweep). Inside it,
`with stage("audit"):` charges the block to that stage; stages nest, and a nested stage's
time is its own, not its enclosing one's (the audit that a mining build runs counts as
audit, not mining). What no stage measured is "other", so the stages sum to the wall time
exactly: `breakdown()` returns the wall seconds and every stage's share of them.

Code deep in the stack times itself with the module-level `stage`, which charges the clock
made current by `timed` (a context variable of this thread) and does nothing without one: the
same functions run timed under a sweep and untimed in a test or a bench.

Two kinds of time are measured in another process and moved into a clock after the fact
(`StageClock.move`): a training loop's own split of its time (data wait, training,
checkpointing: `embedlab.train.loop`), moved out of the trial's "trial_startup", which the
whole `TorchTrainer.fit` is first charged to; and the trials of a Tune experiment, moved out of
the study's "trial_startup" by `trial_seconds`, which divides the experiment's span among the
trials that ran in it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

# Every stage, in the order tables show them, and what each counts.
STAGES: dict[str, str] = {
    "data_preparation": "preparing data: corpus, tokenizer, pieces, evaluation tasks, pair tables",
    "audit": "the contamination audit of what trains (or reading its saved verdict)",
    "cluster_start": "starting or joining the Ray cluster",
    "trial_startup": "starting and stopping a trial: Tune's start of its process, Ray Train's workers, "
                     "process group and datasets around the training loop (a restart included)",
    "data_wait": "the training loop waiting for its batches (the stream's first batches included)",
    "training": "the training loop's steps and its metric reports",
    "evaluation": "scoring a checkpoint (a trial's, or the parent's and teacher's as references)",
    "mining": "mining hard negatives and a teacher's labels and vectors",
    "checkpointing": "writing checkpoints and handing them to Ray Train",
    "promotion": "promoting the winner and exporting the release (in a tour)",
    "other": "the rest of the wall time, measured as what no stage above took",
}
OTHER = "other"
PREFIX = "time/"  # a trial row's columns: time/<stage> and time/wall, in wall seconds
WALL = "time/wall"
STARTED, ENDED = "time/started", "time/ended"  # a trial's span in epoch seconds (`trial_seconds`)
# The key of a training worker's return value that holds its loop's time by stage
# (`embedlab.train.loop.loop_seconds`), which its trial's driver reads from Ray Train's result.
LOOP_TIME = "loop_seconds"


def column(stage: str) -> str:
    """A trial row's column for `stage`'s seconds."""
    return f"{PREFIX}{stage}"


def _known(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}; valid: {list(STAGES)}")
    return stage


class StageClock:
    """Wall seconds by stage over one span that starts when the clock is made (module docstring).
    `now` is the clock read (seconds, monotonic); tests pass a fake one. `on_change`, when set, is
    called each time an outermost stage ends and after a `move` outside every stage (a sweep
    saves its record then)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self.started = now()
        self.seconds: dict[str, float] = {}
        self._open: list[list] = []  # [stage, since]: the innermost last
        self.on_change: Callable[[], None] | None = None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Charge the block's wall time to `name`, less what stages nested in it take."""
        if _known(name) == OTHER:
            raise ValueError("'other' is what no stage measured: it is never timed itself")
        self._switch()
        self._open.append([name, self._now()])
        try:
            yield
        finally:
            now = self._switch()
            self._open.pop()
            if self._open:
                self._open[-1][1] = now  # the enclosing stage goes on from here
            elif self.on_change is not None:
                self.on_change()

    def _switch(self) -> float:
        """Charge the innermost open stage up to now, which it goes on from; returns now."""
        now = self._now()
        if self._open:
            name, since = self._open[-1]
            self._add(name, now - since)
            self._open[-1][1] = now
        return now

    def _add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def move(self, source: str, parts: Mapping[str, float]) -> None:
        """Move `parts` (stage -> seconds, measured elsewhere) out of `source`'s seconds into
        their stages. Never more than `source` holds: parts summing to more (clocks of other
        processes) are scaled down to it, so the stages still sum to the wall time."""
        self._switch()
        wanted = {_known(stage): max(float(s), 0.0) for stage, s in parts.items()}
        total, held = sum(wanted.values()), self.seconds.get(_known(source), 0.0)
        scale = 1.0 if total <= held or total == 0 else held / total
        for stage, seconds in wanted.items():
            self._add(source, -seconds * scale)
            self._add(stage, seconds * scale)
        if not self._open and self.on_change is not None:
            self.on_change()

    def wall(self) -> float:
        return self._now() - self.started

    def breakdown(self) -> dict[str, float]:
        """{"wall": seconds so far, <stage>: seconds for every stage}, "other" the rest of the
        wall time: the stages sum to it (up to float rounding)."""
        self._switch()
        wall = self.wall()
        stages = {stage: self.seconds.get(stage, 0.0) for stage in STAGES if stage != OTHER}
        return {"wall": wall, **stages, OTHER: wall - sum(stages.values())}


_CURRENT: contextvars.ContextVar[StageClock | None] = contextvars.ContextVar("embedlab_stage_clock", default=None)


@contextlib.contextmanager
def timed(clock: StageClock) -> Iterator[StageClock]:
    """Make `clock` the one `stage` charges in this thread while the block runs."""
    token = _CURRENT.set(clock)
    try:
        yield clock
    finally:
        _CURRENT.reset(token)


def current() -> StageClock | None:
    """The clock `timed` made current, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """`StageClock.stage` on the current clock; nothing (but checking the name) without one."""
    clock = _CURRENT.get()
    if clock is None:
        _known(name)
        yield
        return
    with clock.stage(name):
        yield


def charged(name: str) -> Callable:
    """A decorator: every call of the function is charged to stage `name` (`stage`)."""
    _known(name)

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def charged_call(*args, **kwargs):
            with stage(name):
                return function(*args, **kwargs)
        return charged_call
    return decorate


def row_columns(breakdown: Mapping[str, float], started: float, ended: float) -> dict[str, float]:
    """A trial row's time columns: `time/<stage>` and `time/wall` of `breakdown`, and its span
    in epoch seconds (`time/started`, `time/ended`)."""
    return {WALL: breakdown["wall"], **{column(s): breakdown[s] for s in STAGES}, STARTED: started, ENDED: ended}


@dataclass(frozen=True)
class TrialSpan:
    """One trial as `trial_seconds` reads it: its span in epoch seconds and its stages' seconds."""

    started: float
    ended: float
    stages: Mapping[str, float]

    @classmethod
    def of_row(cls, row: Mapping) -> TrialSpan | None:
        """A trial row's span, or None for a row without one (written before rows were timed)."""
        values = [row.get(key) for key in (STARTED, ENDED, WALL)]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            return None
        return cls(row[STARTED], row[ENDED], {s: float(row.get(column(s), 0.0)) for s in STAGES})


def trial_seconds(span_start: float, span_end: float, trials: Sequence[TrialSpan]) -> dict[str, float]:
    """The seconds of the span [span_start, span_end] (epoch seconds) that trials ran in, by
    stage: every instant goes to the trials running then, in equal parts, and each trial's part
    to its stages in proportion to its own seconds in them. Instants no trial runs in are left
    out (the caller's: Tune starting a trial's process). One trial at a time, each trial's
    stages are its own; side by side, the span is shared, so the stages still sum to it.
    Trials outside the span (a resumed run's earlier ones, trials copied from other runs) add
    nothing."""
    inside = [t for t in trials if t.ended > span_start and t.started < span_end and t.ended > t.started]
    cuts = sorted({span_start, span_end, *(min(max(x, span_start), span_end)
                                           for t in inside for x in (t.started, t.ended))})
    shares = [{s: v / total for s, v in t.stages.items()} if (total := sum(t.stages.values())) > 0 else {OTHER: 1.0}
              for t in inside]
    out: dict[str, float] = {}
    for low, high in zip(cuts, cuts[1:]):
        running = [share for t, share in zip(inside, shares) if t.started <= low and t.ended >= high]
        for share in running:
            for stage, fraction in share.items():
                out[stage] = out.get(stage, 0.0) + (high - low) * fraction / len(running)
    return out


def add_breakdowns(breakdowns: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Several breakdowns (a study's attempts, a tour's studies) as one: their sums."""
    return {key: sum(b.get(key, 0.0) for b in breakdowns) for key in ("wall", *STAGES)}


def within(wall: float, parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """`wall` seconds by stage, of which `parts` (breakdowns of spans inside it) took their
    stages' sums; "other" is the rest of `wall`, their own "other" included."""
    stages = {stage: sum(part.get(stage, 0.0) for part in parts) for stage in STAGES if stage != OTHER}
    return {"wall": wall, **stages, OTHER: wall - sum(stages.values())}


def training_share(breakdown: Mapping[str, float]) -> float:
    """Training's share of the wall time (nan for no wall time)."""
    return breakdown.get("training", 0.0) / breakdown["wall"] if breakdown.get("wall") else math.nan


def text(breakdown: Mapping[str, float]) -> str:
    """One line: the wall time, training's share, then every stage that took time, largest first."""
    wall = breakdown["wall"]
    parts = sorted(((breakdown.get(s, 0.0), s) for s in STAGES), reverse=True)
    stages = ", ".join(f"{s.replace('_', ' ')} {v:,.1f} s" for v, s in parts if v >= 0.05)
    share = training_share(breakdown)
    return (f"{wall:,.1f} s of wall time, training {breakdown.get('training', 0.0):,.1f} s"
            + (f" ({share:.0%})" if math.isfinite(share) else "") + (f": {stages}" if stages else ""))


# A study record's (`study.json`) attempts: one breakdown per run of the sweep on the directory
# (the first, then each --resume), with when it started; kept and added, never replaced.
RECORD_KEY = "time_by_stage"


def study_breakdown(record: Mapping) -> dict[str, float] | None:
    """A study record's wall time by stage, over all its attempts; None for a record written
    before studies were timed."""
    attempts = record.get(RECORD_KEY)
    return add_breakdowns(attempts) if attempts else None
