"""Orchestration and statistics: trial tables, the calibrated paired test, ladders and reruns."""
