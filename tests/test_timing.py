"""Wall time by stage: a clock's stages sum to its wall time, a training loop's own split, a Tune
experiment's span shared among its trials, a study's runs added, and the table that shows them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embedlab.core import timing
from embedlab.core.timing import StageClock, TrialSpan, trial_seconds

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "docs" / "results" / "runs"


class FakeClock:
    """A clock that reads what the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_nested_stages_count_once_and_the_stages_sum_to_the_wall_time():
    """An audit inside data preparation is the audit's; "other" is exactly what no stage took."""
    clock = FakeClock()
    stages = StageClock(clock)
    clock.now = 2.0
    with stages.stage("data_preparation"):
        clock.now = 5.0
        with stages.stage("audit"):
            clock.now = 9.5
        clock.now = 12.0
    clock.now = 13.0
    with stages.stage("evaluation"):
        clock.now = 16.25
    clock.now = 20.0
    breakdown = stages.breakdown()
    assert breakdown["wall"] == 20.0
    assert (breakdown["data_preparation"], breakdown["audit"], breakdown["evaluation"]) == (5.5, 4.5, 3.25)
    assert breakdown["other"] == 20.0 - 13.25
    assert sum(breakdown[s] for s in timing.STAGES) == breakdown["wall"]


def test_a_stage_is_named_from_the_list_and_other_is_never_timed():
    """A misspelt stage and "other" are refused, with or without a current clock."""
    with pytest.raises(ValueError, match="stage 'trainig'; valid:"):
        with timing.stage("trainig"):
            pass
    with pytest.raises(ValueError, match="never timed"):
        with StageClock().stage("other"):
            pass


def test_moved_seconds_leave_their_stage_and_never_exceed_it():
    """A fit's 30 s go to trial start-up; the loop's 12 + 3 + 1 s move out of it. Parts larger
    than what the stage holds are scaled to it, so the sum stays the wall time."""
    clock = FakeClock()
    stages = StageClock(clock)
    with stages.stage("trial_startup"):
        clock.now = 30.0
    stages.move("trial_startup", {"training": 12.0, "data_wait": 3.0, "checkpointing": 1.0})
    breakdown = stages.breakdown()
    assert (breakdown["trial_startup"], breakdown["training"], breakdown["data_wait"], breakdown["checkpointing"]) == (
        14.0, 12.0, 3.0, 1.0)
    stages.move("trial_startup", {"evaluation": 21.0, "mining": 7.0})  # 28 s asked, 14 held
    breakdown = stages.breakdown()
    assert (breakdown["trial_startup"], breakdown["evaluation"], breakdown["mining"]) == (0.0, 10.5, 3.5)
    assert sum(breakdown[s] for s in timing.STAGES) == breakdown["wall"] == 30.0


def test_one_trial_at_a_time_each_trial_keeps_its_own_stages():
    """Sequential trials: the span's seconds are each trial's own stages; the gaps (Tune starting
    a trial) are left to the caller; a trial outside the span (reused, or an earlier run's) adds nothing."""
    first = TrialSpan(102.0, 112.0, {"trial_startup": 4.0, "training": 5.0, "evaluation": 1.0})
    second = TrialSpan(115.0, 123.0, {"trial_startup": 2.0, "training": 4.0, "evaluation": 2.0})
    earlier = TrialSpan(10.0, 50.0, {"training": 40.0})
    assert trial_seconds(100.0, 125.0, [first, second, earlier]) == {
        "trial_startup": 6.0, "training": 9.0, "evaluation": 3.0}


def test_trials_side_by_side_share_the_span_and_still_sum_to_it():
    """Two trials overlapping for 4 s: each instant is split between the trials running then,
    each part by its trial's own shares; the result sums to the seconds some trial ran."""
    a = TrialSpan(0.0, 8.0, {"training": 6.0, "evaluation": 2.0})  # 3/4 training
    b = TrialSpan(4.0, 12.0, {"training": 2.0, "trial_startup": 6.0})  # 1/4 training
    seconds = trial_seconds(0.0, 12.0, [a, b])
    # [0, 4): a alone; [4, 8): half each; [8, 12): b alone
    assert seconds == {"training": 3.0 + (3.0 + 1.0) / 2 + 1.0, "evaluation": 1.0 + 1.0 / 2,
                       "trial_startup": 3.0 / 2 + 3.0}
    assert sum(seconds.values()) == 12.0


def test_a_trial_row_with_no_span_is_not_a_trial_span():
    """Rows written before trials were timed, or a failed row the Tune callback wrote, carry no span."""
    assert TrialSpan.of_row({"arm": "a", "seed": 0}) is None
    row = timing.row_columns({"wall": 3.0, **{s: 0.0 for s in timing.STAGES}, "training": 3.0}, 5.0, 8.0)
    assert TrialSpan.of_row(row) == TrialSpan(5.0, 8.0, {**{s: 0.0 for s in timing.STAGES}, "training": 3.0})


def test_a_tour_is_its_studies_and_the_rest_is_other():
    """A tour's wall time: its studies' stages summed, its own checks and loading in "other"."""
    one = {"wall": 10.0, "training": 4.0, "cluster_start": 2.0, "other": 4.0}
    two = {"wall": 5.0, "training": 3.0, "promotion": 1.0, "other": 1.0}
    tour = timing.within(18.0, [one, two])
    assert (tour["training"], tour["cluster_start"], tour["promotion"], tour["other"]) == (7.0, 2.0, 1.0, 8.0)
    assert sum(tour[s] for s in timing.STAGES) == 18.0
    assert timing.text(tour).startswith("18.0 s of wall time, training 7.0 s (39%): other 8.0 s, training 7.0 s")


def test_the_training_loop_splits_its_time_into_data_wait_checkpointing_and_training(frozen, tmp_path, monkeypatch):
    """On a clock that moves only where the test says (a batch 0.25 s, a step 1 s, a checkpointed
    report 5 s), the loop's split is exactly those sums: what a trial's driver moves out of its
    trial start-up."""
    import itertools
    import types

    import synthetic
    from embedlab.train import loop as loop_module
    from embedlab.train.loop import loop_seconds
    from embedlab.train.phase1 import Phase1Loop
    from embedlab.train.session import LocalSession

    clock = FakeClock()
    monkeypatch.setattr(loop_module, "time", types.SimpleNamespace(perf_counter=clock))
    batches, reports = LocalSession.worker_batches, LocalSession.report

    def slow_batches(self, rows):
        for batch in batches(self, rows):
            clock.now += 0.25
            yield batch

    def slow_report(self, metrics, checkpoint):
        clock.now += 5.0 if checkpoint is not None else 0.0
        reports(self, metrics, checkpoint)

    steps, step = itertools.count(), Phase1Loop.step

    def slow_step(self, rows):
        next(steps)
        clock.now += 1.0
        step(self, rows)

    monkeypatch.setattr(LocalSession, "worker_batches", slow_batches)
    monkeypatch.setattr(LocalSession, "report", slow_report)
    monkeypatch.setattr(Phase1Loop, "step", slow_step)
    trial = synthetic.phase1_trial()  # 8 steps of 2 microbatches, a checkpoint every 3 steps and at the end
    reports_seen, loop = synthetic.train(trial, frozen, tmp_path)
    stepped = next(steps)
    assert stepped == synthetic.STEPS and len(reports_seen) == synthetic.STEPS
    checkpoints = len(list(tmp_path.glob("checkpoint_*")))
    assert checkpoints == 3  # steps 3, 6 and 8
    assert loop_seconds(loop) == {"wall": 0.25 * 2 * stepped + 1.0 * stepped + 5.0 * checkpoints,
                                  "data_wait": 0.25 * 2 * stepped, "checkpointing": 5.0 * checkpoints,
                                  "training": 1.0 * stepped}


def test_a_stopped_trial_carries_its_loop_time_to_the_driver():
    """A non-finite stop returned by rank 0 becomes the driver's error with the loop's split."""
    from embedlab.train.nonfinite import NonFiniteError

    error = NonFiniteError.from_return_value({"stopped": "non-finite", "rejected_in_a_row": 3, "step": 9,
                                              timing.LOOP_TIME: {"wall": 4.0, "training": 4.0}})
    assert (error.step, error.loop_seconds) == (9, {"wall": 4.0, "training": 4.0})
    assert NonFiniteError.from_return_value({timing.LOOP_TIME: {"wall": 1.0}}) is None  # a normal end


def test_a_trial_clock_moves_the_loop_out_of_start_up_and_its_columns_sum_to_its_wall(monkeypatch):
    """The driver's columns: the fit in trial start-up less the loop's split; every stage sums to the wall."""
    from embedlab.sweep.driver import TrialClock

    clock = FakeClock()
    trial = TrialClock()
    trial.stages = StageClock(clock)
    with timing.timed(trial.stages):
        with timing.stage("trial_startup"):
            clock.now = 40.0
        trial.add_loop({"wall": 25.0, "training": 20.0, "data_wait": 4.0, "checkpointing": 1.0})
        with timing.stage("evaluation"):
            clock.now = 46.0
    clock.now = 46.5
    columns = trial.columns()
    assert columns[timing.WALL] == 46.5
    assert {s: columns[timing.column(s)] for s in ("trial_startup", "training", "data_wait", "checkpointing",
                                                    "evaluation", "other")} == {
        "trial_startup": 15.0, "training": 20.0, "data_wait": 4.0, "checkpointing": 1.0, "evaluation": 6.0,
        "other": 0.5}
    assert sum(columns[timing.column(s)] for s in timing.STAGES) == columns[timing.WALL]


def _timed_run(tmp_path: Path) -> Path:
    """A kept run record with every trial timed alike (2 s of start-up, 6 s of training)."""
    source = next(p for p in sorted(RUNS.iterdir()) if (p / "study.json").is_file())
    run_dir = tmp_path / source.name
    shutil.copytree(source, run_dir)
    for path in (run_dir / "trials").glob("*.json"):
        row = json.loads(path.read_text())
        breakdown = {"wall": 8.0, **{s: 0.0 for s in timing.STAGES}, "trial_startup": 2.0, "training": 6.0}
        path.write_text(json.dumps({**row, **timing.row_columns(breakdown, 0.0, 8.0)}))
    return run_dir


def test_a_resumed_study_keeps_its_earlier_run_and_adds_this_one(tmp_path):
    """Each run of the sweep is an attempt in the study record, saved as its stages end; a resume
    appends its own, the first unchanged, and the table (text, csv, json) and the report show their sum."""
    from embedlab.report import collect, html
    from embedlab.stats.table import read_study_record, render
    from embedlab.sweep.run import StudyTimes

    run_dir = _timed_run(tmp_path)
    for attempt, (cluster, training) in enumerate([(3.0, 10.0), (2.0, 30.0)]):
        record = read_study_record(run_dir)
        clock = FakeClock()
        stages = StageClock(clock)
        StudyTimes(str(run_dir), record, stages)
        with stages.stage("cluster_start"):
            clock.now = cluster
        with stages.stage("trial_startup"):
            clock.now = cluster + training
        stages.move("trial_startup", {"training": training})
        if attempt == 0:
            first = json.loads((run_dir / "study.json").read_text())[timing.RECORD_KEY]
            assert len(first) == 1 and first[0]["training"] == 10.0 and first[0]["wall"] == 13.0
    attempts = json.loads((run_dir / "study.json").read_text())[timing.RECORD_KEY]
    assert [a["wall"] for a in attempts] == [13.0, 32.0] and attempts[0] == first[0]
    study = timing.study_breakdown(read_study_record(run_dir))
    assert (study["wall"], study["training"], study["cluster_start"], study["other"]) == (45.0, 40.0, 5.0, 0.0)
    text = render(run_dir)
    trials = len(list((run_dir / "trials").glob("*.json")))
    assert (f"wall time by stage: 45.0 s, training 40.0 s (89%) over 2 runs of the sweep (a resumed run's earlier "
            f"ones added); per trial, the mean of {trials} trained here: 8.0 s, training 6.0 s (75%)") in text
    rows = {line.split("  ")[0]: line.split() for line in text.splitlines()[-12:]}
    assert rows["training"] == ["training", "40.0", "88.9%", "6.0", "75.0%"]
    assert rows["wall (the whole)"][-4:] == ["45.0", "100.0%", "8.0", "100.0%"]
    assert json.loads(render(run_dir, "json"))["time"]["study"]["wall"] == 45.0
    assert "# wall time by stage: 45.0 s, training 40.0 s (89%)" in render(run_dir, "csv")
    # The report's page shows the same block under the run's trial tables.
    page = html.page(collect.read_runs([str(run_dir)]), [])
    assert "wall time by stage: 45.0 s, training 40.0 s (89%) over 2 runs of the sweep" in page
    assert "<tr><td>training</td><td>40.0</td><td>88.9%</td><td>6.0</td><td>75.0%</td></tr>" in page


def test_a_record_from_before_timing_shows_no_breakdown():
    """A study record without `time_by_stage` renders as it did, without the block."""
    from embedlab.report import collect, html
    from embedlab.stats.table import render

    run_dir = next(p for p in sorted(RUNS.iterdir()) if (p / "study.json").is_file())
    assert "wall time by stage" not in render(run_dir)
    assert json.loads(render(run_dir, "json"))["time"] is None
    assert "wall time by stage" not in html.page(collect.read_runs([str(run_dir)]), [])


def test_the_monitoring_guide_names_every_stage():
    """The guide's table of stages is the code's: each stage a row, no other."""
    guide = (REPO / "docs" / "guides" / "monitoring.md").read_text()
    section = guide.split("## Where the time went", 1)[1].split("\n## ", 1)[0]
    named = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    assert named == list(timing.STAGES)
