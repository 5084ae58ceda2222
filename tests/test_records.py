"""Run records of every schema read through one `upgrade`, and the tables they render.

`tests/records/tables/<run>.txt` is `embedlab table docs/results/runs/<run>` as it printed when
the record's schema was last current; `python tests/test_records.py` rewrites them, for a change
that means to alter how a table reads (the diff then shows what changed).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
from pathlib import Path

import pytest

from embedlab.cli import main
from embedlab.core.errors import ConfigError, RunRecordError
from embedlab.core.schema import SCHEMA, upgrade

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "docs" / "results" / "runs"
TABLES = Path(__file__).resolve().parent / "records" / "tables"


def run_dirs() -> list[Path]:
    return sorted(p for p in RUNS.iterdir() if (p / "study.json").is_file())


def rendered(run_dir: Path) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["table", str(run_dir)]) == 0
    return out.getvalue()


@pytest.mark.parametrize("run_dir", run_dirs(), ids=lambda p: p.name)
def test_every_kept_run_record_reads_through_upgrade_and_renders_its_table_as_recorded(run_dir):
    """Each run kept under docs/results/runs/ upgrades to the current schema (its study, arms and
    rows) and `embedlab table` prints exactly the table recorded for it."""
    record = upgrade(json.loads((run_dir / "study.json").read_text()), "record")
    assert record["schema"] == SCHEMA and set(record["study"]["arms"])
    for path in sorted((run_dir / "trials").glob("*.json")):
        row = upgrade(json.loads(path.read_text()), "row")
        assert row["status"] and row["stage"]
    assert rendered(run_dir) == (TABLES / f"{run_dir.name}.txt").read_text()


def test_every_kept_run_has_its_recorded_table():
    """No recorded table without its run, no run without its recorded table."""
    assert {p.stem for p in TABLES.glob("*.txt")} == {p.name for p in run_dirs()}


def test_a_schema_1_record_upgrades_step_by_step_and_leaves_its_argument_alone():
    """Flat budget keys nest into one budget (the phase-1 study's 0 pairs become its arms'),
    trial configs' too; rows without status or stage are finished final trials; the record
    given is not changed."""
    arm = {"phase": 1, "train": {"budget_tokens": 5000, "budget_pairs": 64, "budget_flops": 0.0,
                                 "budget_device_seconds": 0.0, "budget_scope": "phase", "seed": 0}}
    old = {"study": {"name": "s", "metric": "dev/ndcg@10", "arms": {"a": arm}, "budget_tokens": 5000,
                     "budget_pairs": 0, "budget_flops": 0.0, "budget_device_seconds": 0.0, "budget_scope": "phase"}}
    kept = copy.deepcopy(old)
    new = upgrade(old, "record")
    assert old == kept
    assert new["schema"] == SCHEMA
    assert new["study"]["budget"] == {"tokens": 5000, "pairs": 64, "flops": 0.0, "device_seconds": 0.0,
                                      "scope": "phase"}
    assert new["study"]["arms"]["a"]["train"] == {
        "seed": 0, "budget": {"tokens": 5000, "pairs": 64, "flops": 0.0, "device_seconds": 0.0, "scope": "phase"}}
    assert not any(key.startswith("budget_") for key in new["study"])
    assert upgrade(new, "record") == new  # the current schema is a fixed point
    assert upgrade({"trial_id": "t", "arm": "a", "seed": 0}, "row") == {
        "trial_id": "t", "arm": "a", "seed": 0, "status": "finished", "stage": "final"}
    assert upgrade({"trial_id": "t", "status": "failed", "stage": "tune"}, "row")["status"] == "failed"


def test_an_unreadable_record_is_refused_naming_why():
    """A later schema, both budget layouts at once, a non-object and an unknown kind are refused."""
    with pytest.raises(RunRecordError, match=f"schema {SCHEMA + 1}: this embedlab reads schemas 1 to {SCHEMA}"):
        upgrade({"schema": SCHEMA + 1, "study": {}}, "record")
    with pytest.raises(ConfigError, match="study: has both a budget mapping and the older flat keys"):
        upgrade({"budget": {"tokens": 1}, "budget_tokens": 1}, "study")
    with pytest.raises(RunRecordError, match="a row must be a JSON object, got list"):
        upgrade([], "row")
    with pytest.raises(ValueError, match="kind 'table'"):
        upgrade({}, "table")


if __name__ == "__main__":
    TABLES.mkdir(parents=True, exist_ok=True)
    for stale in TABLES.glob("*.txt"):
        stale.unlink()
    for run in run_dirs():
        (TABLES / f"{run.name}.txt").write_text(rendered(run))
    print(f"wrote {len(run_dirs())} tables to {TABLES.relative_to(REPO)}", file=sys.stderr)
