"""Reading a run directory: a seed without its study metric is a failed trial everywhere (the
seeds column, the intervals, the paired test, promotion), and a corrupt, truncated, foreign or
duplicate record is refused in one line naming its file, by every reader, with nothing written."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from embedlab.cli import main
from embedlab.core.errors import RunRecordError
from embedlab.stats.paired import compare_to_control
from embedlab.stats.table import load_table, summarize

from test_paired_stats import per_query_values, write_run


def _files(root):
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def run_dir(tmp_path):
    return write_run(tmp_path, per_query_values())


def _set(run_dir, trial_id: str, **fields) -> None:
    path = run_dir / "trials" / f"{trial_id}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.parametrize("value", [math.nan, None])
def test_a_seed_without_its_study_metric_counts_nowhere(run_dir, capsys, value):
    """Trial better-1 finished with dev/ndcg@10 NaN (or without it): the arm has 2 seeds, not 3,
    in the summary, the paired test and the printed table, which says why; promotion refuses
    (the study declared 3 seeds) and, told to rank on the seeds present, records 2."""
    _set(run_dir, "better-1", **{"dev/ndcg@10": value})
    table = load_table(run_dir)
    row = table.set_index("trial_id").loc["better-1"]
    why = "study metric dev/ndcg@10 is " + ("nan" if value is not None else "missing")
    assert row["status"] == "failed" and row["error"] == why
    summary = summarize(table).set_index("arm")
    assert summary.loc["better", "seeds"] == 2 and summary.loc["same", "seeds"] == 3
    finished = table[(table["arm"] == "better") & (table["status"] == "finished")]["dev/ndcg@10"]
    assert summary.loc["better", "dev/ndcg@10:mean"] == pytest.approx(float(np.mean(finished)))
    tests = compare_to_control(run_dir, table).tests.set_index("arm")
    assert tests.loc["better", "seeds"] == 2 and tests.loc["same", "seeds"] == 3

    assert main(["table", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "excluded from statistics: 1 failed\n  better seed 1: failed: " + why in out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("better ")][:1] == ["2"]

    before = _files(run_dir)
    assert main(["promote", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trials missing for (arm, seed) [('better', 1)]" in err
    assert f"better seed 1: failed ({why})" in err and "--allow-missing-seeds" in err
    assert _files(run_dir) == before


@pytest.mark.parametrize("case, write, message", [
    ("truncated", lambda p: p.write_text(p.read_text()[:20]), "not a trial row: truncated or invalid JSON"),
    ("empty", lambda p: p.write_text(""), "empty file, not a trial row"),
    ("list", lambda p: p.write_text("[1, 2]"), "not a trial row: a JSON list, not an object"),
    ("no arm", lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "arm"})),
     "not a trial row: no 'arm'"),
    ("foreign arm", lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "arm": "other"})),
     "arm 'other' is not an arm of study 'toy'"),
    ("foreign study", lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "study": "else"})),
     "a trial of study 'else', not of this run's 'toy'"),
])
def test_a_corrupt_trial_row_is_named_by_every_reader(run_dir, capsys, case, write, message):
    target = run_dir / "trials" / "same-2.json"
    write(target)
    with pytest.raises(RunRecordError, match="same-2.json") as caught:
        load_table(run_dir)
    assert message in str(caught.value)
    before = _files(run_dir.parent)
    for argv in (["table", str(run_dir)], ["promote", str(run_dir)], ["report", str(run_dir)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and str(target) in err and message in err, err
    assert _files(run_dir.parent) == before


def test_a_duplicate_finished_trial_and_a_truncated_study_record_are_named(run_dir, capsys):
    duplicate = run_dir / "trials" / "same-2-again.json"
    duplicate.write_text((run_dir / "trials" / "same-2.json").read_text().replace('"same-2"', '"same-2-again"'))
    assert main(["table", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a second finished final trial of arm 'same' seed 2" in err
    assert "same-2-again.json" in err and "same-2.json" in err
    duplicate.unlink()
    study = run_dir / "study.json"
    study.write_text(study.read_text()[:30])
    for argv in (["table", str(run_dir)], ["promote", str(run_dir)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{study}: not a study record: truncated or invalid JSON" in err
    study.write_text(json.dumps({"study": {"name": "toy"}}))
    assert main(["table", str(run_dir)]) == 2
    assert "its study has no 'metric', 'arms'" in capsys.readouterr().err
