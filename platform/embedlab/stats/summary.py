"""What a finished run directory says at the end of `embedlab sweep` or a tour's stage: its
table, its parent's scores under the same evaluator, and whether every trial finished."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedlab.stats import looks
from embedlab.stats.paired import final_trials
from embedlab.stats.table import load_table, read_study_record, render

# The parent's scores shown beside a run's table: retrieval on recipe-dev and the retention panel.
PARENT_KEYS = ("dev/ndcg@10", "dev/recall@100", "retention/")


@dataclass(frozen=True)
class RunSummary:
    table: str  # `render(run_dir, "text")`
    parent_line: str | None  # the parent's scores (same evaluator), None without a parent
    finished: int  # finished final trials, one per (arm, seed)
    expected: int  # arms x seeds (a study run until decided: what its rounds asked for)

    @property
    def missing(self) -> int:
        return self.expected - self.finished


def expected_trials(record: dict, run_dir: str | Path | None = None) -> int:
    """Final trials a study's run should hold: arms x seeds, from its study record; for a study
    run until decided, the trials its rounds so far asked for (`sequential.json` in `run_dir`)."""
    sequential = looks.read_sequential(run_dir) if run_dir is not None else None
    if sequential is not None:
        return len(looks.planned_trials(sequential))
    return len(record["study"]["arms"]) * len(record["study"]["seeds"])


def summarize_run(run_dir: str | Path) -> RunSummary:
    record = read_study_record(run_dir)
    parent = record.get("parent_scores")
    parent_line = None
    if parent:
        keys = sorted(k for k in parent if k.startswith(PARENT_KEYS) and isinstance(parent[k], (int, float)))
        parent_line = "parent (same evaluator): " + ", ".join(f"{k} {parent[k]:.4f}" for k in keys)
    return RunSummary(table=render(run_dir, "text"), parent_line=parent_line,
                      finished=len(final_trials(load_table(run_dir))), expected=expected_trials(record, run_dir))
