"""Real sweeps on Ray, one tiny study's trials throughout: a finished trial asked for again under
the same storage root is copied, not trained, and its row is the row the same trial gets when
trained again (bitwise, but for the timings and names two runs of one trial always differ in);
a study run until decided reuses the finished seeds as its first round, trains the next, and,
its driver killed mid-round, resumes at that round without losing or repeating a trial."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embedlab import load_table
from embedlab.cli import main
from embedlab.sweep.reuse import INDEX_DIR, REUSED_FROM, TRIAL_KEY
from embedlab.sweep.run import run_sweep

from conftest import run_dirs, tiny_trial, write_study

pytestmark = pytest.mark.timeout(1800)

spec = importlib.util.spec_from_file_location(
    "compare_outputs", Path(__file__).resolve().parent.parent / "workers" / "compare_outputs.py")
compare_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_outputs)

BUDGET = "budget=replace(DEFAULT_BUDGET, tokens=3_000)"
# What names a row's run and study rather than its trial's result.
IDENTITY = ("study", "arm", "trial_id", "factor", "factor_value", REUSED_FROM)


def study_file(tmp_path: Path, name: str, arms=("mask-15", "mask-30"), seeds=(0, 1)) -> str:
    return write_study(tmp_path / f"{name}.py", tiny_trial(num_workers=1), name=name, arms=arms, seeds=seeds,
                       extra=BUDGET)


def rows(run_dir) -> dict[tuple[int, int], dict]:
    """Finished final rows by (arm position, seed), as written."""
    table = load_table(run_dir)
    order = {arm: i for i, arm in enumerate(table.attrs["arm_order"])}
    found = {}
    for path in Path(run_dir, "trials").glob("*.json"):
        row = json.loads(path.read_text())
        if row.get("status") == "finished":
            found[(order[row["arm"]], row["seed"])] = row
    return found


def per_query(run_dir, row) -> dict:
    return json.loads(Path(run_dir, "per_query", f"{row['trial_id']}.json").read_text())["values"]


def same(a: dict, b: dict) -> list[str]:
    """The columns two rows of one trial differ in, beyond timings, paths, ids and names."""
    keys = {k for k in a.keys() | b.keys() if k not in IDENTITY and not compare_outputs.run_varying(k)}
    return sorted(k for k in keys if not compare_outputs.same_value(a.get(k), b.get(k)))


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return tmp_path_factory.mktemp("reuse-storage")


@pytest.fixture(scope="module")
def finished(ray_session, prepared, storage, tmp_path_factory):
    """The tiny study at seeds 0 and 1, trained (4 trials): the runs below reuse it."""
    folder = tmp_path_factory.mktemp("studies")
    run_dir = run_sweep(study_file(folder, "tiny-first"), storage=storage, progress=lambda line: None)
    return folder, run_dir


def test_a_finished_trial_is_copied_and_equals_the_same_trial_trained_again(finished, storage, capsys):
    """Another study with the same arm configs (its own names) copies all four trials, training
    none: each row is the original's but for its study, arm and id, with `reused_from` naming it,
    the same per-query values and checkpoint (lineage whole); the table marks them and states the
    compute saved. Trained again (--no-reuse, seed 0), the trial's row is the copy's, bitwise,
    but for timings and names."""
    folder, first = finished
    lines: list[str] = []
    second = run_sweep(study_file(folder, "tiny-again", arms=("low", "high")), storage=storage,
                       progress=lines.append)
    assert any("reuse: 4 of 4 trial(s) copied from earlier runs, 0 to train" in line for line in lines)
    assert not any(line.startswith("tune:") for line in lines)  # no trial ran
    original, copied = rows(first), rows(second)
    assert sorted(copied) == sorted(original) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for key, row in copied.items():
        source = original[key]
        assert row[REUSED_FROM] == f"{Path(first).name}/{source['trial_id']}"
        assert row["study"] == "tiny-again" and row["arm"] == ("low", "high")[key[0]]
        assert {k: v for k, v in row.items() if k not in IDENTITY} == {
            k: v for k, v in source.items() if k not in IDENTITY}
        assert row["checkpoint"] == source["checkpoint"] and row[TRIAL_KEY] == source[TRIAL_KEY]
        assert per_query(second, row) == per_query(first, source)
    assert main(["table", str(second)]) == 0
    table = capsys.readouterr().out
    assert "reuse saved 4 trial(s)" in table and "compute spent: 0 trial(s) trained by this run" in table
    assert f"{Path(first).name}/" in table  # the reused_from column

    retrained = run_sweep(study_file(folder, "tiny-retrained", arms=("low", "high"), seeds=(0,)), storage=storage,
                          reuse=False, progress=lambda line: None)
    again = rows(retrained)
    assert sorted(again) == [(0, 0), (1, 0)] and not any(REUSED_FROM in row for row in again.values())
    for key, row in again.items():
        assert same(row, copied[key]) == [], key
        assert row["checkpoint"] != copied[key]["checkpoint"]  # trained again, its own checkpoint
        assert per_query(retrained, row) == per_query(second, copied[key])
    assert main(["table", str(retrained)]) == 0
    assert "reuse off (--no-reuse)" in capsys.readouterr().out


def test_a_killed_sequential_sweep_resumes_at_its_round(finished, storage, tmp_path, cache_dir, capsys):
    """Until decided from 2 seeds to 4: round 1 is the finished seeds, copied; the driver, killed
    once round 2 has trained a trial, resumes at round 2: the trial is kept (its file untouched),
    the other three run, and the run ends with every (arm, seed) once, its two looks recorded,
    each with its boundaries, and a table of sequential verdicts."""
    import ray

    folder, _ = finished
    path = study_file(folder, "tiny-rounds")
    address = ray.get_runtime_context().gcs_address
    log = tmp_path / "driver.log"
    env = {**os.environ, "EMBEDLAB_CACHE": str(cache_dir)}
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [sys.executable, "-m", "embedlab.cli", "sweep", path, "--storage", str(storage), "--until-decided",
             "--max-seeds", "4", "--max-concurrent", "1", "--address", address],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            found = run_dirs(str(storage), "tiny-rounds")
            trained = [p for d in found for p in Path(d, "trials").glob("*.json") if "reused" not in p.name]
            if trained:
                break
            assert driver.poll() is None, ("the sweep ended before round 2 trained a trial:\n"
                                           + log.read_text(errors="replace")[-3000:])
            time.sleep(0.5)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    run_dir = Path(found[0])
    record = json.loads((run_dir / "sequential.json").read_text())
    assert [r["round"] for r in record["rounds"]] == [1, 2] and len(record["looks"]) == 1  # killed in round 2
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "trials").glob("*.json")}
    assert len(before) == 5  # four copied, one trained

    assert main(["sweep", path, "--resume", str(run_dir)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    table = load_table(run_dir)
    finished_rows = table[table["status"] == "finished"]
    pairs = list(zip(finished_rows["arm"], finished_rows["seed"]))
    assert sorted(pairs) == sorted((arm, seed) for arm in ("mask-15", "mask-30") for seed in range(4))
    assert table["trial_id"].is_unique and len(table) == 8
    for name, mtime in before.items():  # nothing trained or copied before the kill ran again
        assert (run_dir / "trials" / name).stat().st_mtime_ns == mtime
    assert finished_rows[REUSED_FROM].notna().sum() == 4
    record = json.loads((run_dir / "sequential.json").read_text())
    assert record["finished"] and [look["seeds"] for look in record["looks"]] == [2, 4]
    assert record["looks"][0]["weight"] == 0 and record["looks"][1]["weight"] == 1
    assert set(record["looks"][1]["boundaries"]["difference"]) == {"0.05"}
    verdict = record["arms"]["mask-30"]["verdict"]
    assert verdict in ("better", "worse", "not significant")
    assert "sequential paired test of dev/ndcg@10" in out and verdict in out and "seeds used (decided)" in out
    assert math.isfinite(record["arms"]["mask-30"]["diff"])
    index = list((storage / INDEX_DIR).rglob("*.json"))
    # One entry per trial key trained: the first study's four (its seed-0 pair trained again under
    # the same keys), round 2's four; a copy is never indexed.
    assert len(index) == 8
