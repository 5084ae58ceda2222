"""Live metrics for the Ray dashboard: training workers and the evaluation actor publish
gauges through `ray.util.metrics`; Ray's metrics agent exports them to Prometheus under the
`ray_` prefix, and `dashboards/grafana/embedlab.json` charts them in the Grafana that Ray's
dashboard embeds.

Every training report of rank 0 is mirrored (one process per trial: the figures are already
all-reduced over workers), tagged with the Ray Train run name, which carries the stage, arm,
seed and trial id (`final-mask-15-seed0-<trial id>`). Each trial's and each study's wall time
by stage (`embedlab.core.timing`) is published when it is recorded, tagged with the same run
name (a study's: its run directory's name) and the stage ("wall" for the whole).
"""

from __future__ import annotations

import os
from typing import Any

# Metric name -> (description, the report key it mirrors). Names are what panels query
# (with Ray's "ray_" prefix); tests check every panel against this table.
TRAINING: dict[str, tuple[str, str]] = {
    "embedlab_tokens_per_second": ("Non-padding tokens per second, all workers", "train/tokens_per_s"),
    "embedlab_pairs_per_second": ("Positive pairs per second, all workers", "train/pairs_per_s"),
    "embedlab_packing_efficiency": ("Non-padding share of the packed row positions computed", "data/packing_efficiency"),
    "embedlab_train_loss": ("Training loss over the last report window", "train/loss"),
    "embedlab_mlm_loss": ("MLM loss of a joint phase-2 arm", "train/mlm_loss"),
    "embedlab_grad_norm": ("Global gradient norm before clipping", "train/grad_norm"),
    "embedlab_budget_fraction": ("Share of the trial's budget consumed", "budget/fraction"),
    "embedlab_consumed_tokens": ("Consumed non-padding tokens", "budget/tokens"),
    "embedlab_consumed_pairs": ("Consumed positive pairs", "budget/pairs"),
    "embedlab_nonfinite_steps": ("Updates rejected for a non-finite loss or gradient", "train/nonfinite_steps"),
}
# Per-group losses: one series per LM head or per masking ratio (dual heads), tagged `group`.
GROUP_LOSS = ("embedlab_loss_by_group", "Training loss of one LM head or masking ratio", "train/loss/")
# FLOPs utilisation: the executed training FLOPs per second (`budget/flops`: padding,
# attention recomputation and GradCache's re-encode included, so hardware FLOPs, above the
# model FLOPs `embedlab bench mfu` counts) over the peak of the devices the trial holds,
# published only when the peak is known (EMBEDLAB_PEAK_FLOPS, per device).
MFU = ("embedlab_mfu", "Executed training FLOPs utilisation (needs EMBEDLAB_PEAK_FLOPS per device)")
EVALUATION: dict[str, str] = {
    "embedlab_eval_seconds": "Seconds the evaluation actor spent on one request (0 when cached)",
    "embedlab_eval_requests": "Evaluation requests served, cached or not",
}
STAGE_SECONDS = ("embedlab_stage_seconds", "Wall seconds of a trial or a study by stage (\"wall\": the whole)")
PEAK_ENV = "EMBEDLAB_PEAK_FLOPS"


def metric_names() -> set[str]:
    """Every metric embedlab publishes."""
    return {*TRAINING, GROUP_LOSS[0], MFU[0], *EVALUATION, STAGE_SECONDS[0]}


def training_values(report: dict[str, Any], world: int, peak_flops: float | None) -> dict[tuple[str, str], float]:
    """(metric, group) -> value for one training report (group "" when the metric has none)."""
    values = {(name, ""): float(report[key]) for name, (_, key) in TRAINING.items()
              if isinstance(report.get(key), (int, float))}
    for key, value in report.items():
        if key.startswith(GROUP_LOSS[2]) and isinstance(value, (int, float)):
            values[(GROUP_LOSS[0], key.removeprefix(GROUP_LOSS[2]))] = float(value)
    seconds = report.get("compute/wall_seconds")
    if peak_flops and seconds and report.get("budget/flops"):
        values[(MFU[0], "")] = report["budget/flops"] / seconds / (peak_flops * world)
    return values


class TrainingTelemetry:
    """Gauges for one training run; `publish(report)` from rank 0 after each report."""

    def __init__(self, run: str, world: int) -> None:
        from ray.util.metrics import Gauge

        self.run, self.world = run, world
        peak = os.environ.get(PEAK_ENV)
        self.peak = float(peak) if peak else None
        self.gauges = {name: Gauge(name, description=text, tag_keys=("run",)) for name, (text, _) in TRAINING.items()}
        self.gauges[GROUP_LOSS[0]] = Gauge(GROUP_LOSS[0], description=GROUP_LOSS[1], tag_keys=("run", "group"))
        self.gauges[MFU[0]] = Gauge(MFU[0], description=MFU[1], tag_keys=("run",))

    def publish(self, report: dict[str, Any]) -> None:
        for (name, group), value in training_values(report, self.world, self.peak).items():
            tags = {"run": self.run, **({"group": group} if group else {})}
            self.gauges[name].set(value, tags=tags)


class EvaluationTelemetry:
    """The evaluation actor's latency gauge and request counter."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        self.seconds = Gauge("embedlab_eval_seconds", description=EVALUATION["embedlab_eval_seconds"],
                             tag_keys=("task",))
        self.requests = Counter("embedlab_eval_requests", description=EVALUATION["embedlab_eval_requests"],
                                tag_keys=("task", "cached"))

    def publish(self, task: str, seconds: float, cached: bool) -> None:
        self.seconds.set(0.0 if cached else seconds, tags={"task": task})
        self.requests.inc(1.0, tags={"task": task, "cached": str(cached).lower()})


_STAGE_GAUGE: list = []  # the process's gauge, made on first use (Ray registers a metric once)


def publish_stages(run: str, breakdown: dict[str, float]) -> None:
    """A trial's or study's wall time by stage (`embedlab.core.timing.StageClock.breakdown`)
    as the `embedlab_stage_seconds` gauge, one series per stage of the run; nothing in a
    process that is not part of a Ray cluster (a test, a record rewritten offline)."""
    import ray
    from ray.util.metrics import Gauge

    if not ray.is_initialized():
        return
    if not _STAGE_GAUGE:
        _STAGE_GAUGE.append(Gauge(STAGE_SECONDS[0], description=STAGE_SECONDS[1], tag_keys=("run", "stage")))
    for stage, seconds in breakdown.items():
        _STAGE_GAUGE[0].set(float(seconds), tags={"run": run, "stage": stage})
