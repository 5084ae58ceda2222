"""A run's wall time by stage as its table and its report show it: the study's, over every
run of its sweep (`embedlab.core.timing.study_breakdown`), beside the mean of the trials this
run trained (rows copied from another run spent their time there).

    stage             study s  share   per trial s  share
    data preparation  88.8     14.5%   0.0          0.0%
    ...
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from embedlab.core import timing

REUSED_FROM = "reused_from"  # a copied row's origin (`embedlab.sweep.reuse`)


def trained_here(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of trials this run ran itself with their time recorded, failed ones included
    (they spent their time too); rows copied from another run and rows written before trials
    were timed are left out."""
    if timing.WALL not in table:
        return table.iloc[0:0]
    timed = pd.to_numeric(table[timing.WALL], errors="coerce").notna()
    copied = table[REUSED_FROM].notna() if REUSED_FROM in table else pd.Series(False, index=table.index)
    return table[timed & ~copied]


def trial_mean(table: pd.DataFrame) -> dict[str, float] | None:
    """The mean over `trained_here` rows of each stage's and the wall seconds; None without any."""
    rows = trained_here(table)
    if rows.empty:
        return None
    mean = {"wall": float(pd.to_numeric(rows[timing.WALL]).mean())}
    for stage in timing.STAGES:
        name = timing.column(stage)
        mean[stage] = float(pd.to_numeric(rows[name], errors="coerce").fillna(0.0).mean()) if name in rows else 0.0
    return mean


def frame(study: dict[str, float], trials: dict[str, float] | None) -> pd.DataFrame:
    """One row per stage and one for the whole: the study's seconds and share of its wall time,
    and the trials' mean seconds and share where there are trials."""
    def share(part: float, whole: float) -> str:
        return f"{part / whole:.1%}" if whole else ""

    rows = []
    for stage in (*timing.STAGES, "wall"):
        name = "wall (the whole)" if stage == "wall" else stage.replace("_", " ")
        row: dict[str, Any] = {"stage": name, "study s": f"{study[stage]:,.1f}", "share": share(study[stage], study["wall"])}
        if trials is not None:
            row.update({"per trial s": f"{trials[stage]:,.1f}", "trial share": share(trials[stage], trials["wall"])})
        rows.append(row)
    return pd.DataFrame(rows)


def header(record: dict, table: pd.DataFrame) -> str | None:
    """The block's first line: the study's wall time, its runs and training's share, and the
    trials' mean; None for a record written before studies were timed."""
    study = timing.study_breakdown(record)
    if study is None:
        return None
    runs = len(record[timing.RECORD_KEY])
    line = (f"wall time by stage: {_seconds_and_share(study)} over {runs} run{'s' if runs > 1 else ''} of the sweep"
            + (" (a resumed run's earlier ones added)" if runs > 1 else ""))
    trials = trial_mean(table)
    if trials is not None:
        line += f"; per trial, the mean of {len(trained_here(table))} trained here: {_seconds_and_share(trials)}"
    return line


def _seconds_and_share(breakdown: dict[str, float]) -> str:
    share = timing.training_share(breakdown)
    return (f"{breakdown['wall']:,.1f} s, training {breakdown['training']:,.1f} s"
            + (f" ({share:.0%})" if math.isfinite(share) else ""))


def as_json(record: dict, table: pd.DataFrame) -> dict[str, Any] | None:
    """The block as JSON: the study's breakdown and training share, its runs, and the trials' mean."""
    study = timing.study_breakdown(record)
    if study is None:
        return None
    trials = trial_mean(table)
    return {"study": study, "training_share": timing.training_share(study), "runs": record[timing.RECORD_KEY],
            "trial_mean": trials, "trials": len(trained_here(table)),
            "trial_training_share": None if trials is None else timing.training_share(trials)}


def block(record: dict, table: pd.DataFrame, table_of) -> str | None:
    """The header and the stage table (`table_of`: text or markdown); None without a breakdown."""
    first = header(record, table)
    if first is None:
        return None
    study = timing.study_breakdown(record)
    return f"{first}\n{table_of(frame(study, trial_mean(table)))}"
