"""`sweep --dry-run` (and a real sweep, before Ray starts) checks everything a study reads that
needs no Ray and no training: each bad input below exits 2 with one `error:` line naming the file
or location, and nothing is written (the storage folder is not even made)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from embedlab.cli import main
from embedlab.pairs.readers import PairFiles
from embedlab import recipes
from embedlab.sweep import run as run_module

from conftest import write_study

RIGHTS = "written for this test"
PAIRS = [{"query": f"how do I open file number {i}", "positive": f"Use open() to read file {i} from disk."}
         for i in range(12)]


def _study(tmp_path: Path, pairs_path: Path, *, shares=(("title-body", 0.5), ("mine", 0.5)),
           task: str = "python-docstrings") -> str:
    base = recipes.phase3_baseline("demo")
    data = dataclasses.replace(base.data, pair_files=(PairFiles(name="mine", path=str(pairs_path), rights=RIGHTS),))
    config = dataclasses.replace(base, data=data, contrastive=dataclasses.replace(base.contrastive, pairs=shares),
                                 eval=dataclasses.replace(base.eval, task=task))
    return write_study(tmp_path / "own_pairs.py", config, name="own-pairs", arms=("t-05", "t-10"),
                       change="contrastive.temperature=0.1", extra="budget=replace(DEFAULT_BUDGET, pairs=4_096)")


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    return path


def _refused(capsys, argv, *fragments):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_a_good_study_dry_runs_and_lists_what_it_checked(tmp_path, pairs_file, capsys):
    storage = tmp_path / "runs"
    assert main(["sweep", _study(tmp_path, pairs_file), "--dry-run", "--parent", "x", "--storage", str(storage)]) \
        == 2  # a --parent that is not a checkpoint is refused by the dry run too
    assert "checkpoint" in capsys.readouterr().err
    assert main(["sweep", _study(tmp_path, pairs_file), "--dry-run", "--storage", str(storage)]) == 0
    out = capsys.readouterr().out
    assert f"storage {storage}: will be made, in a writable folder" in out
    assert f"pair source mine ({pairs_file}): 12 pairs" in out and "task python-docstrings: built-in" in out
    assert not storage.exists()


@pytest.mark.parametrize("case", ["missing", "malformed", "empty", "misspelt", "task"])
def test_a_study_that_reads_a_bad_source_or_task_is_refused_by_the_dry_run(tmp_path, pairs_file, capsys, case):
    storage = tmp_path / "runs"
    if case == "missing":
        path, expected = _study(tmp_path, tmp_path / "nothing.jsonl"), (str(tmp_path / "nothing.jsonl"), "does not exist")
    elif case == "malformed":
        pairs_file.write_text(pairs_file.read_text() + '{"query": "half a li\n')
        path, expected = _study(tmp_path, pairs_file), ("pairs.jsonl line 13", "JSON")
    elif case == "empty":
        pairs_file.write_text("")
        path, expected = _study(tmp_path, pairs_file), (str(pairs_file), "no pairs: an empty source is refused")
    elif case == "misspelt":
        path = _study(tmp_path, pairs_file, shares=(("title-body", 0.5), ("mien", 0.5)))
        expected = ("contrastive.pairs: unknown pair builder or pair source ['mien']", "'mine'")
    else:
        path = _study(tmp_path, pairs_file, task=str(tmp_path / "no-task"))
        expected = ("no-task", "neither a BEIR directory")
    _refused(capsys, ["sweep", path, "--dry-run", "--storage", str(storage)], *expected)
    assert not storage.exists()


def test_bad_storage_and_resume_locations_are_refused_by_the_dry_run(tmp_path, pairs_file, capsys):
    path = _study(tmp_path, pairs_file)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    not_a_run = tmp_path / "just-a-folder"
    not_a_run.mkdir()
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "study.json").write_text(json.dumps({"study": {"name": "else", "metric": "m", "arms": {}},
                                                  "study_hash": "0" * 64}))
    for args, expected in (
            (["--storage", "s3://KEY:S3CR3T@bucket/runs"], ("carries no credentials",)),
            (["--storage", "ftp://example.invalid/runs"], ("ftp://example.invalid/runs",)),
            (["--storage", str(blocker / "runs")], (f"{blocker} is a file, not a directory",)),
            (["--resume", str(not_a_run)], (f"--resume {not_a_run}: not a run directory",)),
            (["--resume", str(other)], (f"--resume {other}: a run of study 'else'", "not of study 'own-pairs'"))):
        err = _refused(capsys, ["sweep", path, "--dry-run", *args], *expected)
        assert "S3CR3T" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a-file", "just-a-folder", "other-run", "own_pairs.py", "pairs.jsonl"])


def test_a_real_sweep_runs_the_same_checks_before_ray_starts(tmp_path, capsys, monkeypatch):
    """No --dry-run: a phase-1 study scored on a task folder that is not there is refused
    before `connect` (Ray) is ever called, and no run directory is made."""
    monkeypatch.setattr(run_module, "connect", lambda *a, **k: pytest.fail("the sweep started Ray before its checks"))
    base = recipes.phase1_baseline("demo")
    config = dataclasses.replace(base, eval=dataclasses.replace(base.eval, task=str(tmp_path / "no-task")))
    path = write_study(tmp_path / "study.py", config, extra="budget=replace(DEFAULT_BUDGET, tokens=1_000_000)")
    storage = tmp_path / "runs"
    _refused(capsys, ["sweep", path, "--storage", str(storage)], "no-task", "neither a BEIR directory")
    assert not storage.exists()


def test_resume_of_a_run_with_a_truncated_trial_row_names_the_file_before_ray(tmp_path, pairs_file, capsys,
                                                                                 monkeypatch):
    """`sweep --resume RUN` reads every trial row before Ray starts: a truncated one is named."""
    from embedlab.studies.study import load_study

    monkeypatch.setattr(run_module, "connect", lambda *a, **k: pytest.fail("the sweep started Ray before its checks"))
    path = _study(tmp_path, pairs_file)
    study = load_study(path)
    run_dir = tmp_path / "runs" / "own-pairs-1"
    (run_dir / "trials").mkdir(parents=True)
    (run_dir / "study.json").write_text(json.dumps({"study": study.to_dict(), "study_hash": study.hash,
                                                    "parent": None}))
    (run_dir / "trials" / "t-05-0.json").write_text('{"trial_id": "t-05-0", "arm": "t-0')
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for argv in (["--dry-run"], []):
        _refused(capsys, ["sweep", path, "--resume", str(run_dir), *argv],
                 f"--resume {run_dir}: {run_dir / 'trials' / 't-05-0.json'}: not a trial row: truncated or invalid JSON")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
