"""Live metrics: what training and evaluation publish reaches Ray's Prometheus endpoint, and
the Grafana dashboard queries exactly the metrics embedlab publishes."""

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from embedlab.core.telemetry import GROUP_LOSS, MFU, metric_names, training_values

DASHBOARD = Path(__file__).parent.parent / "dashboards" / "grafana" / "embedlab.json"


def test_grafana_dashboard_queries_only_metrics_embedlab_publishes():
    """Every panel's query names a metric embedlab emits (with Ray's `ray_` prefix), and every
    metric embedlab emits has a panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = re.findall(r"\bray_(embedlab_[a-z_]+?)(?:_total)?\b(?=[{\[]|$)", target["expr"])
            assert names, (panel["title"], target["expr"])
            queried.update(names)
    assert queried == metric_names()
    assert dashboard["uid"] and dashboard["templating"]["list"][0]["type"] == "datasource"


def test_training_values_map_reports_to_metrics():
    """Report keys map to metric names; per-head losses get a group; MFU needs the peak."""
    report = {"train/tokens_per_s": 2000.0, "train/loss": 6.5, "train/loss/head/mask5": 7.0,
              "budget/flops": 6e12, "compute/wall_seconds": 10.0, "budget/fraction": 0.5}
    values = training_values(report, world=2, peak_flops=1e12)
    assert values[("embedlab_tokens_per_second", "")] == 2000.0
    assert values[(GROUP_LOSS[0], "head/mask5")] == 7.0
    assert values[(MFU[0], "")] == pytest.approx(6e12 / 10.0 / 2e12)
    assert (MFU[0], "") not in training_values(report, world=2, peak_flops=None)


@pytest.mark.timeout(180)
def test_published_metrics_reach_the_prometheus_endpoint(ray_session):
    """A worker's training report, an evaluation and a trial's wall time by stage, and a study's
    published by the sweep's driver (this process), show up in Ray's metrics export."""
    import ray
    import ray._private.worker as worker

    from embedlab.core.telemetry import publish_stages

    @ray.remote(num_cpus=0)
    def publish():
        from embedlab.core.telemetry import EvaluationTelemetry, TrainingTelemetry, publish_stages

        TrainingTelemetry("final-telemetry-seed0-test", 1).publish(
            {"train/tokens_per_s": 1234.5, "train/loss": 6.25, "train/loss/head/mask50": 7.5,
             "budget/fraction": 0.25, "data/packing_efficiency": 0.97})
        EvaluationTelemetry().publish("python-docstrings", 1.5, cached=False)
        publish_stages("final-telemetry-seed0-test", {"wall": 30.0, "training": 21.5, "other": 8.5})
        time.sleep(12)  # metrics leave a worker on the agent's export interval

    publish_stages("telemetry-20261208-000000", {"wall": 40.0, "cluster_start": 3.25, "other": 36.75})
    ray.get(publish.remote())
    port = worker.global_worker.node.metrics_export_port
    wanted = ['ray_embedlab_tokens_per_second{', 'run="final-telemetry-seed0-test"', 'group="head/mask50"',
              "ray_embedlab_eval_seconds{", "ray_embedlab_packing_efficiency{", 'stage="training"',
              'run="telemetry-20261208-000000"']
    deadline = time.monotonic() + 90
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        if all(w in text for w in wanted) or time.monotonic() > deadline:
            break
        time.sleep(3)
    missing = [w for w in wanted if w not in text]
    assert not missing, missing
    line = next(l for l in text.splitlines() if l.startswith("ray_embedlab_tokens_per_second{")
                and "final-telemetry-seed0-test" in l)
    assert float(line.rsplit(" ", 1)[1]) == 1234.5 and "SessionName=" in line
    stage = next(l for l in text.splitlines() if l.startswith("ray_embedlab_stage_seconds{") and 'stage="training"' in l
                 and "final-telemetry-seed0-test" in l)
    assert float(stage.rsplit(" ", 1)[1]) == 21.5
    study = next(l for l in text.splitlines() if l.startswith("ray_embedlab_stage_seconds{")
                 and 'stage="cluster_start"' in l and "telemetry-20261208-000000" in l)
    assert float(study.rsplit(" ", 1)[1]) == 3.25
