"""A sweep whose driver is killed continues with `embedlab sweep --resume`: finished trials are
kept (not rerun), the missing ones run, and none is lost or duplicated in the table."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from embedlab import load_table
from embedlab.cli import main
from embedlab.core import timing
from embedlab.stats.table import render
from embedlab.sweep.run import resume_line

from conftest import only_run, tiny_trial, write_study



@pytest.mark.timeout(420)
def test_killed_driver_resumes_without_loss_or_duplicates(ray_session, prepared, tmp_path, cache_dir, capsys):
    import ray

    study_file = write_study(tmp_path / "resumable.py", tiny_trial(num_workers=1), name="resumable",
                             extra="budget=replace(DEFAULT_BUDGET, tokens=3_000)")
    storage = tmp_path / "runs"
    env = {**os.environ, "EMBEDLAB_CACHE": str(cache_dir)}
    # The driver's output goes to a file, so a driver that ends early says why in the failure.
    log = tmp_path / "driver.log"
    # One trial at a time: when the first trial's record appears the second has just started.
    # Side by side, on an idle machine, the second could finish in the moment before Ray's
    # processes follow their killed driver, and write a second record.
    # The driver joins the session's cluster (--address), as a driver on a cluster's head
    # would: its death ends its Ray job, whose trial actors Ray then kills, and the resume
    # below runs on that same cluster. (A local cluster of its own would cost a Ray start.)
    address = ray.get_runtime_context().gcs_address
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            # A filesystem URI (any pyarrow filesystem) as the storage: the run's records and Ray's
            # state are written through it, and --resume reads them back.
            [sys.executable, "-m", "embedlab.cli", "sweep", str(study_file), "--storage", f"file://{storage}",
             "--max-concurrent", "1", "--address", address],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        # A sweep that never finishes a trial is a hang: the test's timeout ends it, and this
        # `finally` still kills the driver (pytest-timeout's signal method raises in this thread).
        while not list(storage.glob("*/trials/*.json")):
            assert driver.poll() is None, (
                f"the sweep ended (exit {driver.returncode}) before its first trial finished; its output ends:\n"
                + log.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
    finally:
        # SIGKILL the driver: nothing gets to clean up, as when its node is preempted.
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    run_dir = only_run(storage)
    # The killed run's wall time by stage, saved as its stages ended, is kept by the resume.
    killed = json.loads((run_dir / "study.json").read_text())[timing.RECORD_KEY]
    assert len(killed) == 1 and killed[0]["wall"] > 0
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "trials").glob("*.json")}
    assert len(before) == 1
    # The other arm's trial as a crash leaves it (the driver's "failed" row): resume runs it again.
    survivor = json.loads(next((run_dir / "trials").glob("*.json")).read_text())
    other = next(arm for arm in ("mask-15", "mask-30") if arm != survivor["arm"])
    crashed = {**{k: survivor[k] for k in ("study", "stage", "seed", "factor")}, "trial_id": "crashed_00000",
               "arm": other, "factor_value": 0.3 if other == "mask-30" else 0.15, "status": "failed",
               "error": "RayActorError: The actor died unexpectedly before finishing this task."}
    (run_dir / "trials" / "crashed_00000.json").write_text(json.dumps(crashed))

    started = time.monotonic()
    assert main(["sweep", str(study_file), "--resume", str(run_dir)]) == 0, capsys.readouterr().err
    elapsed = time.monotonic() - started  # the resumed run's wall time, as the command's caller sees it
    out = capsys.readouterr().out
    assert "resume: 1 finished trial(s) kept, 1 to run (1 failed grid trial(s) among them run again)" in out
    # Tune's own box and hint are in the run's ray.log (both drivers'), never on the console.
    assert "Configuration for experiment" not in out and "tensorboard --logdir" not in out
    assert (run_dir / "ray.log").read_text().count("Configuration for experiment") == 2
    table = load_table(run_dir)
    finished = table[table["status"] == "finished"]
    assert sorted(zip(finished["arm"], finished["seed"])) == [("mask-15", 0), ("mask-30", 0)]
    assert table["trial_id"].is_unique
    assert table.loc[table["trial_id"] == "crashed_00000", "status"].item() == "failed"  # kept, never averaged
    for name, mtime in before.items():  # finished trials were not rerun
        assert (run_dir / "trials" / name).stat().st_mtime_ns == mtime
    assert json.loads((run_dir / "study.json").read_text())["study"]["name"] == "resumable"
    # Every trial's stages sum to its wall time; the resumed run's attempt is added to the killed
    # one's, and its trials' stages are the trial it ran (one at a time: each instant is one trial's).
    attempts = json.loads((run_dir / "study.json").read_text())[timing.RECORD_KEY]
    assert attempts[0] == killed[0] and len(attempts) == 2
    assert 0 < attempts[1]["wall"] <= elapsed  # its own wall time, measured inside the command's
    for attempt in attempts:
        assert sum(attempt[s] for s in timing.STAGES) == pytest.approx(attempt["wall"], abs=1e-9)
    rows = [r for r in table.to_dict("records") if r["status"] == "finished"]
    for row in rows:
        assert sum(row[timing.column(s)] for s in timing.STAGES) == pytest.approx(row[timing.WALL], abs=1e-9)
        assert row[timing.column("training")] > 0 and row[timing.column("evaluation")] > 0
    rerun = next(r for r in rows if f"{r['trial_id']}.json" not in before)
    assert attempts[1]["training"] == pytest.approx(rerun[timing.column("training")], abs=0.05)
    assert attempts[1]["cluster_start"] > 0 and attempts[1]["trial_startup"] >= rerun[timing.column("trial_startup")]
    assert "over 2 runs of the sweep" in render(run_dir)


def test_resume_refuses_a_run_directory_of_another_study(tmp_path, capsys):
    """--resume on a run directory holding a different study is refused and the directory is untouched."""
    run_dir = tmp_path / "other"
    (run_dir / "trials").mkdir(parents=True)
    record = {"study": {"name": "other", "metric": "dev/ndcg@10", "arms": {"a": {}}}, "study_hash": "0" * 64, "parent": None}
    (run_dir / "study.json").write_text(json.dumps(record))
    (run_dir / "trials" / "t1.json").write_text("{}")
    study_file = write_study(tmp_path / "resumable.py", tiny_trial(num_workers=1), name="resumable")
    assert main(["sweep", str(study_file), "--resume", str(run_dir)]) == 2
    assert "holds study 'other'" in capsys.readouterr().err
    assert json.loads((run_dir / "study.json").read_text()) == record
    assert (run_dir / "trials" / "t1.json").read_text() == "{}"


def test_the_resume_line_counts_a_failed_trial_as_rerun_only_when_it_is_not_done():
    """A failed grid row is run again unless its (arm, seed) also has a finished row (a crash
    that later finished): then it is neither counted as run again nor run."""
    finished = {"arm": "a", "seed": 0, "stage": "final", "status": "finished"}
    failed_a = {**finished, "status": "failed"}
    failed_b = {**failed_a, "arm": "b"}
    tuning = {**failed_a, "arm": "b", "stage": "tune"}  # kept: it spent its arm's tuning budget
    assert resume_line([finished, failed_b], 2) == (
        "resume: 1 finished trial(s) kept, 1 to run (1 failed grid trial(s) among them run again)")
    assert resume_line([finished, failed_a], 2) == "resume: 1 finished trial(s) kept, 1 to run"
    assert resume_line([finished, tuning, failed_b], 3) == (
        "resume: 2 finished trial(s) kept, 1 to run (1 failed grid trial(s) among them run again)")
    assert resume_line([], 4) == "resume: 0 finished trial(s) kept, 4 to run"
