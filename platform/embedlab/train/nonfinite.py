"""Rejected updates: what a step does with a non-finite loss or gradient.

The check runs on all-reduced values (the global loss, the norm of the summed gradients),
so every worker sees the same numbers and takes the same decision: no worker steps while
another skips. A rejected step changes neither the weights nor the optimizer state (no
`optimizer.step()`, gradients dropped), but its batch counts as consumed: the data position,
the schedule clock and the budget advance as for any other step, so a trial with a few
rejections is still compared with its arms at equal consumed compute, and a resumed run
never retries a batch. Rejections are counted in `train/skipped_steps` (with the phase-1
steps that had no masked token) and on their own in `train/nonfinite_steps`.
`train.max_rejected_steps` rejections in a row stop the trial with `NonFiniteError`.
"""

from __future__ import annotations

import math

from embedlab.core.timing import LOOP_TIME

REJECTED_UPDATE_POLICY = (
    "a step whose global loss or global gradient norm is not finite is rejected: no optimizer step, "
    "weights and optimizer state unchanged; its batch counts as consumed (data position, schedule "
    "clock and budget advance); counted in train/skipped_steps and train/nonfinite_steps; "
    "train.max_rejected_steps consecutive rejections stop the trial with NonFiniteError"
)
STOPPED_KEY = "train/stopped_nonfinite"  # 1.0 in the last report of a trial stopped by rejections


class NonFiniteError(RuntimeError):
    """A trial stopped because too many consecutive steps had a non-finite loss or gradient."""

    def __init__(self, rejected_in_a_row: int, step: int, loop_seconds: dict[str, float] | None = None) -> None:
        self.rejected_in_a_row, self.step = rejected_in_a_row, step
        self.loop_seconds = loop_seconds or {}  # the stopped loop's time by stage (`train.loop.loop_seconds`)
        super().__init__(
            f"{rejected_in_a_row} consecutive steps rejected for a non-finite loss or gradient "
            f"(train.max_rejected_steps = {rejected_in_a_row}), the last at step {step}; the trial stopped"
        )

    @classmethod
    def from_return_value(cls, value: dict | None) -> NonFiniteError | None:
        """The error a worker returned to stop its trial (`train.loop.run_on_ray`), if any."""
        if not value or value.get("stopped") != "non-finite":
            return None
        return cls(int(value["rejected_in_a_row"]), int(value["step"]), value.get(LOOP_TIME))


def finite_update(*values: float) -> bool:
    """True when every all-reduced figure of the step (losses, gradient norm) is finite."""
    return all(math.isfinite(v) for v in values)
