"""Orchestration and statistics: a run directory and the records written into it."""
