"""workers/compare_outputs.py, the refactor check: a changed metric, trial, column or bench key
is a difference; what varies between two runs of one commit (timings, paths, trial ids) is not."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "workers" / "compare_outputs.py"
spec = importlib.util.spec_from_file_location("compare_outputs", PATH)
compare_outputs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_outputs)


def row(**changes):
    base = {"arm": "a", "seed": 0, "stage": "final", "dev/ndcg@10": 0.4321, "retention/probe_accuracy": math.nan,
            "checkpoint_hash": "ab" * 32, "compute/flops": 1.5e12, "compute/wall_seconds": 26.1,
            "compute/peak_memory_bytes": 719134720, "checkpoint": "/tmp/x/run-1/ckpt", "trial_id": "b48dc_00000",
            "eval/seconds": 2.5}
    return {**base, **changes}


def write(directory: Path, rows: list[dict], bench: dict) -> Path:
    directory.mkdir()
    (directory / "table.study.json").write_text(json.dumps(rows))
    (directory / "bench.json").write_text(json.dumps(bench))
    return directory


BENCH = {"train: tokens/s": {"ratio": 6.9, "rows": [{"name": "embedlab", "value": 1.0}, {"name": "hf", "value": 2.0}]}}


def test_two_runs_that_differ_only_in_timings_and_paths_are_the_same(tmp_path, capsys):
    before = write(tmp_path / "b", [row(), row(seed=1)], BENCH)
    timed = {"train: tokens/s": {"ratio": 7.4, "rows": [{"name": "embedlab", "value": 1.3}, {"name": "hf", "value": 2.2}]}}
    # A timing column only one side has (the trial's wall time by stage) is a timing too.
    after = write(tmp_path / "a", [row(**{"compute/wall_seconds": 43.2, "compute/peak_memory_bytes": 672264192,
                                          "checkpoint": "/tmp/y/run-2/ckpt", "trial_id": "ce6cf_00000",
                                          "eval/seconds": 2.1, "time/training": 12.5, "time/wall": 40.0}),
                                   row(seed=1)], timed)
    assert compare_outputs.main([str(before), str(after)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "same outputs"


@pytest.mark.parametrize("changes, expected", [
    ({"dev/ndcg@10": 0.43210000000000004}, "dev/ndcg@10 0.4321 -> 0.43210000000000004"),
    ({"retention/probe_accuracy": 0.5}, "retention/probe_accuracy nan -> 0.5"),
    ({"checkpoint_hash": "cd" * 32}, "checkpoint_hash"),
    ({"compute/flops": 1.5e12 + 1}, "compute/flops"),
    ({"compute/flops": 1500000000000}, "compute/flops 1500000000000.0 -> 1500000000000"),
])
def test_a_changed_measurement_is_a_difference(tmp_path, capsys, changes, expected):
    before = write(tmp_path / "b", [row()], BENCH)
    after = write(tmp_path / "a", [row(**changes)], BENCH)
    assert compare_outputs.main([str(before), str(after)]) == 1
    out = capsys.readouterr().out
    assert f"table.study.json: trial ('a', 0, 'final'): {expected}" in out and "1 differences" in out


def test_missing_trials_columns_and_bench_keys_are_differences(tmp_path):
    before = write(tmp_path / "b", [row(), row(seed=1)], BENCH)
    renamed = {"train: tokens/s": {"ratio": 6.9, "rows": [{"name": "embedlab", "value": 1.0}, {"name": "modernbert", "value": 2.0}]}}
    extra = row(**{"train/new": 1.0})
    after = write(tmp_path / "a", [extra], renamed)
    problems = compare_outputs.compare(before, after)
    assert "table.study.json: trial ('a', 1, 'final') only before" in problems
    assert "table.study.json: trial ('a', 0, 'final'): column train/new only after" in problems
    assert "bench.json: /train: tokens/s/rows[hf] only before" in problems
    assert "bench.json: /train: tokens/s/rows[modernbert] only after" in problems
    assert "bench.json: /train: tokens/s/rows[modernbert]/value only after" in problems
    assert len(problems) == 8  # the two above and three paths of each renamed row (itself, name, value)


def test_an_empty_before_directory_is_not_a_pass(tmp_path):
    before = write(tmp_path / "b", [], BENCH)
    (before / "table.study.json").unlink()
    after = write(tmp_path / "a", [row()], BENCH)
    problems = compare_outputs.compare(before, after)
    assert f"{before}: no table.*.json" in problems and "table.study.json: only after" in problems


def test_the_before_runs_as_the_after_commit_reads_them_are_what_is_compared(tmp_path, capsys):
    """With `table-read-by-after.STUDY.json` (the before commit's records tabled by the after
    commit, through the schema's upgrade), that is compared in place of the before commit's own
    table: a config path the after commit renamed reads alike, a changed measurement still differs."""
    before = write(tmp_path / "b", [row(factor="contrastive.hard_negatives")], BENCH)
    (before / "table-read-by-after.study.json").write_text(json.dumps([row(factor="contrastive.negatives.count")]))
    after = write(tmp_path / "a", [row(factor="contrastive.negatives.count")], BENCH)
    assert compare_outputs.main([str(before), str(after)]) == 0
    assert "table.study.json (before: as after reads its records): 1 trials" in capsys.readouterr().out
    (before / "table-read-by-after.study.json").write_text(
        json.dumps([row(factor="contrastive.negatives.count", **{"dev/ndcg@10": 0.5})]))
    assert compare_outputs.main([str(before), str(after)]) == 1
