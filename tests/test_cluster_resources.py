"""What a sweep asks the cluster for: GPU shares for the evaluator and for mining trial drivers
on a cluster that advertises GPUs (none on a CPU-only one), checked as pure functions of
`ray.cluster_resources()` and once on a real local cluster advertising a GPU, started in a
subprocess so the shared test session is left alone; and a study that cannot run on this
machine fails before a local cluster starts, naming the profile that fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from embedlab.evaluate.actor import EVALUATOR_GPU_SHARE, evaluator_gpus
from embedlab.sweep.cluster import (
    MINING_GPU_SHARE, TRIAL_DRIVER_RESOURCES, GpuShares, check_fits, gpu_shares, local_resources, study_concurrency,
    trial_driver_resources,
)
from embedlab.studies.study import load_study
from embedlab.sweep.run import _driver_resources, run_sweep

ROOT = Path(__file__).parent.parent
HARD_NEGATIVES = ROOT / "ablations" / "hard_negatives.py"  # arms "in-batch" (no mining) and "mined-2"
MASKING = ROOT / "ablations" / "masking_ratio.py"  # phase 1; its default profile wants 4 GPUs
CPU_ONLY = {"CPU": 2.0, "memory": 8e9}  # what Ray reports for a machine without GPUs: no "GPU" key


def test_cpu_only_cluster_requests_no_gpu():
    """Without GPUs on the cluster neither the evaluator nor a mining driver asks for one."""
    study = load_study(HARD_NEGATIVES, "demo")
    shares = gpu_shares(study.arms, CPU_ONLY)
    assert evaluator_gpus(CPU_ONLY) == 0 and shares == GpuShares()
    assert trial_driver_resources(study.arms["mined-2"], shares) == TRIAL_DRIVER_RESOURCES
    assert _driver_resources(study, shares) == TRIAL_DRIVER_RESOURCES


def test_gpu_cluster_gives_the_evaluator_and_mining_drivers_a_share():
    """On a GPU cluster the evaluator and the driver of an arm that mines each ask for a share;
    the in-batch arm's driver and a phase-1 driver do not; Tune's per-trial request follows
    the arm in the trial's config (a grid entry or an Optuna config)."""
    study = load_study(HARD_NEGATIVES, "demo")  # CPU trainers
    resources = {"CPU": 16.0, "GPU": 1.0}
    shares = gpu_shares(study.arms, resources)
    assert shares == GpuShares(evaluator=EVALUATOR_GPU_SHARE, mining_driver=MINING_GPU_SHARE)
    assert 0 < EVALUATOR_GPU_SHARE < 1 and 0 < MINING_GPU_SHARE < 1
    assert trial_driver_resources(study.arms["mined-2"], shares) == {**TRIAL_DRIVER_RESOURCES, "GPU": MINING_GPU_SHARE}
    assert trial_driver_resources(study.arms["in-batch"], shares) == TRIAL_DRIVER_RESOURCES
    phase1 = load_study(MASKING, "demo")
    assert gpu_shares(phase1.arms, resources) == GpuShares(evaluator=EVALUATOR_GPU_SHARE)
    request = _driver_resources(study, shares)
    mined = request({"trial": {"arm": "mined-2", "seed": 0, "stage": "final", "params": {}}})
    in_batch = request({"arm": "in-batch", "seed": 10000, "stage": "tune"})
    assert len(mined.bundles) == 1 and mined.bundles[0].get("CPU", 0) == 0
    assert mined.bundles[0]["GPU"] == MINING_GPU_SHARE
    assert mined.bundles[0]["memory"] == TRIAL_DRIVER_RESOURCES["memory"]
    assert in_batch.bundles[0].get("GPU", 0) == 0


def test_shares_never_leave_a_trainer_without_whole_gpus():
    """Trainers take whole GPUs: where one trial's workers need every GPU there are no shares;
    with a GPU to spare the shares take it and fewer trials run side by side."""
    study = load_study(HARD_NEGATIVES, "full")  # 4 workers x 1 GPU per trial
    assert gpu_shares(study.arms, {"CPU": 64.0, "GPU": 4.0}) == GpuShares()
    eight = {"CPU": 64.0, "GPU": 8.0}
    shares = gpu_shares(study.arms, eight)
    assert shares == GpuShares(evaluator=EVALUATOR_GPU_SHARE, mining_driver=MINING_GPU_SHARE)
    assert study_concurrency(study.arms, eight) == 2
    assert study_concurrency(study.arms, eight, shares=shares) == 1  # 2 x 4 GPUs + the shares' device > 8


SCHEDULED = """
import json, os
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only, as embedlab.sweep.cluster.connect
import ray
import ray._private.ray_constants as ray_constants
ray_constants.ENABLE_RAY_CLUSTER = False
ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False,
         logging_level="WARNING")
from embedlab.evaluate.actor import get_evaluator
stats = ray.get(get_evaluator().stats.remote(), timeout=180)
print("RESULT " + json.dumps({"stats": stats, "gpus_left": ray.available_resources().get("GPU", 0.0)}))
"""


@pytest.mark.ray  # a local Ray cluster of its own, in a subprocess
def test_evaluator_is_scheduled_on_a_gpu_of_a_cluster_that_advertises_one():
    """On a real local cluster advertising one GPU, the evaluator `get_evaluator` creates asks for
    its share, is scheduled, and sees the GPU Ray assigned it (CUDA_VISIBLE_DEVICES=0)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", SCHEDULED], env=env, capture_output=True, text=True, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["stats"]["gpu_ids"] == ["0"] and result["stats"]["cuda_visible_devices"] == "0"
    assert result["gpus_left"] == pytest.approx(1 - EVALUATOR_GPU_SHARE)


def test_a_study_that_does_not_fit_names_the_profile_that_does():
    """The full profile's GPU workers do not fit a 2-CPU machine without GPUs: the refusal names
    --profile demo; on a machine that has the GPUs and CPUs it fits."""
    study = load_study(MASKING)
    with pytest.raises(ValueError, match=r"does not fit this machine \(2 CPUs, 0 GPUs\).*run it with --profile demo"):
        check_fits(MASKING, study, CPU_ONLY, "this machine")
    assert check_fits(MASKING, study, {"CPU": 16.0, "GPU": 4.0}, "this machine") == 1


def test_sweep_refuses_before_starting_a_local_cluster(tmp_path):
    """`embedlab sweep` of a study whose default profile this machine cannot run fails at once,
    naming the profile that fits, and starts no Ray cluster."""
    import ray

    try:
        check_fits(MASKING, load_study(MASKING), local_resources(), "this machine")
    except ValueError:
        pass
    else:
        pytest.skip("this machine has the GPUs and CPUs the full profile needs")
    running = ray.is_initialized()
    lines: list[str] = []
    with pytest.raises(ValueError, match="run it with --profile demo"):
        run_sweep(MASKING, storage=tmp_path / "runs", progress=lines.append)
    assert ray.is_initialized() == running
    assert not any(line.startswith("ray:") for line in lines) and not (tmp_path / "runs").exists()
