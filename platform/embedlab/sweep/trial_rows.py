"""Which rows of a trial table (`embedlab.sweep.table`) statistics are computed over.

Kept apart from the table so the paired per-query statistics (`embedlab.sweep.paired`), which
the table renders, select the same rows without importing it.
"""

from __future__ import annotations

import pandas as pd


def final_trials(table: pd.DataFrame) -> pd.DataFrame:
    """The rows statistics are computed over: finished grid trials."""
    keep = pd.Series(True, index=table.index)
    if "status" in table:  # rows without one were written before unfinished trials were recorded
        keep &= table["status"].fillna("finished") == "finished"
    if "stage" in table:  # rows without one were written before tuning trials existed
        keep &= table["stage"].fillna("final") == "final"
    return table[keep]
