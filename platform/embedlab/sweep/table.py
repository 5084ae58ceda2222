"""Trial tables: one row per finished trial, read from a run directory.

Each trial driver writes `trials/<trial_id>.json` when it finishes; the table is those
rows, in the study's arm order and then by seed. Nothing is parsed out of logs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

TRIALS_DIR = "trials"
STUDY_FILE = "study.json"
SUMMARY_COLUMNS = (
    "arm", "seed", "factor_value", "budget/tokens", "train/loss",
    "dev/ndcg@10", "dev/recall@100", "dev/mrr@10", "compute/wall_seconds",
)


def read_study_record(run_dir: Path) -> dict:
    path = Path(run_dir) / STUDY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not an embedlab run directory (no {STUDY_FILE})")
    return json.loads(path.read_text())


def load_table(run_dir: str | Path) -> pd.DataFrame:
    """The trial table of a run directory as a DataFrame, one row per finished trial."""
    run_dir = Path(run_dir)
    record = read_study_record(run_dir)
    rows = [json.loads(p.read_text()) for p in sorted((run_dir / TRIALS_DIR).glob("*.json"))]
    if not rows:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    table = pd.DataFrame(rows)
    arm_order = {arm: i for i, arm in enumerate(record.get("arm_order", record["study"]["arms"]))}
    table["_arm_order"] = table["arm"].map(arm_order)
    table = table.sort_values(["_arm_order", "seed"]).drop(columns="_arm_order")
    return table.reset_index(drop=True)


def format_table(table: pd.DataFrame, run_dir: str | Path | None = None) -> str:
    """The summary columns as aligned text, with the study's disclosed-overlap policy if any."""
    text = "(no finished trials)"
    if not table.empty:
        columns = [c for c in SUMMARY_COLUMNS if c in table.columns]
        text = table[columns].to_string(index=False, float_format=lambda v: f"{v:.4f}")
    if run_dir is not None:
        record = read_study_record(Path(run_dir))
        policy = record["study"].get("disclosed_overlap")
        if policy:
            overlap = len(record.get("final_eval_overlap", []))
            text += f"\n\ndisclosed overlap ({overlap} final-eval items in training data): {policy}"
    return text
