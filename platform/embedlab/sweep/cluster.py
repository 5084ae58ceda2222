"""The Ray cluster a sweep runs on: joining one, or starting a local one, and sizing the
study to it: the GPU shares of the processes that encode beside the trainers, what a trial's
driver reserves, and how many trials fit side by side.

The private Ray hooks `connect` needs live in `embedlab.sweep.ray_compat`; the CPUs kept free
beside the trainers and the autoscaler wait in `embedlab.sweep.capacity`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
from collections.abc import Callable
from pathlib import Path

from embedlab.core.config import TrialConfig
from embedlab.core.errors import UsageError
from embedlab.core.store import redact
from embedlab.prepared.build import keep_ray_data_off_the_console
from embedlab.studies.recipes import PROFILES
from embedlab.studies.study import Study, load_study
from embedlab.sweep import ray_compat
from embedlab.sweep.capacity import RESERVED_CPUS, at_searched_maximum

# Fixed rules, not settings: each follows from how Ray runs a trial, the same in every study.
# Each Ray Train report waits for the controller's next poll, 2 s apart by default; at 0.2 s
# it waits a tenth as long.
RAY_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    # Training progress reaches Tune before the trial's dev metric exists (it comes from the
    # evaluator at the end); Optuna only reads the final result, which has it.
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1",
}
# A local cluster's settings besides RAY_ENV (a value already in the environment wins): it is
# one machine, which no autoscaler preempts, so Ray Train's preemption watcher (one more actor
# process per fit, a few seconds of start-up on a small machine) has nothing to watch.
LOCAL_RAY_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
# A local cluster listens on loopback only (`connect`): nothing on the network reaches it.
LOCAL_HOST = "127.0.0.1"
# A trial driver only waits on its trainer; it reserves memory, not a CPU, so the trainer's
# workers can start (a CPU-holding driver deadlocks a 2-CPU box).
TRIAL_DRIVER_RESOURCES = {"CPU": 0, "memory": 200 * 1024**2}
# The share of one GPU the driver of a trial that mines hard negatives asks for on a GPU
# cluster: it encodes the corpus with the parent encoder in its own process, and Ray hides
# every GPU from a process that asks for none, so without a share mining runs on CPU there.
# A quarter, as the evaluator's (`embedlab.evaluate.actor.EVALUATOR_GPU_SHARE`): both encode
# in bursts beside the trainers, and Ray packs fractional requests onto as few devices as
# they fill, leaving whole devices to the trainers' workers.
MINING_GPU_SHARE = 0.25


def connect(address: str | None, progress: Callable[[str], None] = print, job_env: dict[str, str] | None = None) -> None:
    """Join the cluster at `address` (None: the one RAY_ADDRESS names, if set), or start a
    local one (the embedded default); `job_env` is set for every process of this job (not for
    this driver process). The local cluster is always a new one: never a cluster `ray start`
    left running on this machine, which `ray.init()` without an address would join.

    Refuses a Ray outside `ray_compat.SUPPORTED_RAY` with `ray_compat.RayIncompatible`;
    with EMBEDLAB_ALLOW_UNTESTED_RAY=1 it prints a warning line and goes on.
    """
    import ray  # here: Ray, which a dry run does not need

    if address:  # a bad address is the user's mistake whether or not this process holds a cluster
        check_address(address)
    untested = ray_compat.check_ray_version()
    if untested:
        progress(untested)
    ray_compat.keep_credentials_out_of_trial_envs()  # before any Tune trial: they would reach Ray's logs
    if ray.is_initialized():
        return
    os.environ.update(RAY_ENV)
    # The job's processes on every node: Ray's settings, and `job_env` (the run's remote
    # storage root, `embedlab.artifacts.sync`); never a credential.
    runtime_env = {"env_vars": {**RAY_ENV, **(job_env or {})}}
    named = ""
    if not address and os.environ.get("RAY_ADDRESS"):
        address, named = os.environ["RAY_ADDRESS"], " (RAY_ADDRESS)"
    if address:
        check_address(address, "RAY_ADDRESS" if named else "--address")
        progress(f"ray: connecting to {redact(address)}{named}")
        _check_reachable(address)
        # Ray uses ~/.ray/auth_token by itself only for a cluster it finds locally; for an
        # explicit address the token must be switched on before connecting.
        ray_compat.enable_token_auth_from_local_token()
        try:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ConnectionError(
                f"cannot reach the Ray cluster at {redact(address)!r}: {redact(str(error))} (a cluster with token "
                "authentication needs its token here: ~/.ray/auth_token or RAY_AUTH_TOKEN, with "
                "RAY_AUTH_MODE=token)") from None
    else:
        progress("ray: starting a local cluster")
        require_token_auth()
        # Loopback only: the head, its workers and the dashboard are unreachable from the
        # network; Ray's token authentication (on by default in 2.60) guards the rest.
        # ray.init maps 127.0.0.1 to the machine's routable address unless Ray runs in its
        # single-machine mode.
        ray_compat.force_single_machine_mode()
        local = {name: os.environ.get(name, value) for name, value in LOCAL_RAY_ENV.items()}
        os.environ.update(local)
        runtime_env["env_vars"].update(local)
        # WARNING: Ray's own INFO lines ("Started a local Ray instance") stay off the console,
        # which has embedlab's progress lines (the dashboard's address among them).
        context = ray.init(address="local", runtime_env=runtime_env, log_to_driver=False, include_dashboard=True,
                           dashboard_host=LOCAL_HOST, logging_level=logging.WARNING)
        if context.dashboard_url:
            progress(f"ray: dashboard at http://{context.dashboard_url}")
    keep_ray_data_off_the_console()
    resources = ray.cluster_resources()
    progress(f"ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs")


def require_token_auth() -> None:
    """Refuse to start a cluster with Ray's token authentication switched off."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        raise ConnectionError("RAY_AUTH_MODE=disabled: embedlab keeps Ray's token authentication on; "
                              "unset it to start a local cluster")


def check_address(address: str, option: str = "--address") -> tuple[str, int] | None:
    """A Ray address's (host, port), or None for "auto" and "local" (found or started by Ray);
    a UsageError, before anything connects, for an address that carries a credential (Ray's
    token belongs in RAY_AUTH_TOKEN or ~/.ray/auth_token, not in an address printed and logged),
    has a scheme other than ray://, or a port that is no TCP port."""
    if address in ("auto", "local"):
        return None
    shown = f"{option} {redact(address)}"
    scheme, separator, target = address.rpartition("://")
    if separator and scheme != "ray":
        raise UsageError(f"{shown}: a Ray address is HOST:PORT or ray://HOST:PORT (the client port), not a "
                         f"{scheme}:// URI")
    if "@" in target or redact(address) != address:
        raise UsageError(f"{shown}: an address carries no credential (it is printed and logged); give Ray's token "
                         "as RAY_AUTH_TOKEN or in ~/.ray/auth_token, with RAY_AUTH_MODE=token")
    host, colon, port = target.rpartition(":")
    if not colon or not host or "/" in target:
        raise UsageError(f"{shown}: a Ray address is HOST:PORT (e.g. 10.0.0.5:6379) or ray://HOST:PORT")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"{shown}: port {port!r} is not a TCP port (1-65535)")
    return host.strip("[]"), int(port)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at a host:port address
    (ray.init retries an unreachable GCS for a long time)."""
    target = check_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as error:
        raise ConnectionError(f"cannot reach the Ray cluster at {redact(address)!r}: {error}") from None


@dataclasses.dataclass(frozen=True)
class GpuShares:
    """The GPU shares of the processes that encode beside the trainers: the evaluation actor
    and each mining trial's driver (0: none, and that process encodes on CPU)."""

    evaluator: float = 0.0
    mining_driver: float = 0.0


def mines_negatives(trial: TrialConfig) -> bool:
    """Whether the trial's driver encodes with the parent before training: a phase with hard
    negatives (`contrastive.negatives.count`, phase 3), mining them or screening given negatives
    by the margin."""
    settings = trial.contrastive
    return trial.spec.negatives and settings.negatives.count > 0 and (
        settings.negatives.mine or (bool(trial.data.pair_sources) and settings.negatives.given_threshold is not None))


def _trainer_gpus(trial: TrialConfig) -> float:
    return float(trial.train.num_workers) if trial.train.use_gpu else 0.0


def _whole_gpus_held(shares: float) -> int:
    """Devices a sum of fractional requests occupies once Ray packs them (float-tolerant)."""
    return math.ceil(shares - 1e-9) if shares > 0 else 0


def max_concurrent_trials(trial: TrialConfig, resources: dict[str, float], shares: GpuShares = GpuShares()) -> int:
    """Trials that fit side by side, keeping `RESERVED_CPUS` free for data and evaluation
    (trial drivers reserve no CPU: they only wait on their trainers) and, on a GPU cluster,
    the devices the evaluator's and mining drivers' `shares` occupy."""
    cluster_cpus, cluster_gpus = resources.get("CPU", 0), resources.get("GPU", 0)
    per_trial = trial.train.num_workers * trial.train.cpus_per_worker
    if per_trial + RESERVED_CPUS > cluster_cpus:
        raise UsageError(
            f"a trial needs {per_trial:g} CPUs for its workers plus {RESERVED_CPUS:g} kept free "
            f"for data and evaluation, but the cluster has {cluster_cpus:g}: lower "
            "train.num_workers or train.cpus_per_worker, or use a smaller --profile"
        )
    fit = math.floor((cluster_cpus - RESERVED_CPUS) / per_trial)
    if trial.train.use_gpu:
        if cluster_gpus < trial.train.num_workers:
            raise UsageError(
                f"a trial needs {trial.train.num_workers} GPUs (train.use_gpu, one per worker), but the "
                f"cluster has {cluster_gpus:g}: run on a GPU cluster (--address) or use --profile demo"
            )
        fit = min(fit, math.floor(cluster_gpus / trial.train.num_workers))
    driver = shares.mining_driver if mines_negatives(trial) else 0.0
    # Trainers' workers take whole devices; the shares, packed, take the devices they fill.
    while fit > 1 and fit * _trainer_gpus(trial) + _whole_gpus_held(shares.evaluator + fit * driver) > cluster_gpus:
        fit -= 1
    return max(1, fit)


def study_concurrency(arms: dict[str, TrialConfig], resources: dict[str, float], search: tuple = (),
                      shares: GpuShares = GpuShares()) -> int:
    """Trials of a study that fit side by side: the arm needing the most resources decides,
    as arms may differ in workers or GPUs, and a `search` over a resource path (Optuna may
    pick any value) counts at its most demanding value. An arm that fits nowhere is named."""
    worst, searched = at_searched_maximum(arms, search)
    fits = []
    for arm, trial in worst.items():
        try:
            fits.append(max_concurrent_trials(trial, resources, shares))
        except ValueError as error:
            raise UsageError(f"arm {arm}{' (at its searched maximum)' if searched else ''}: {error}") from None
    return min(fits)


def gpu_shares(arms: dict[str, TrialConfig], resources: dict[str, float], search: tuple = ()) -> GpuShares:
    """The GPU shares to request on a cluster with `resources` (`ray.cluster_resources()`):
    none where it advertises no GPU; else the evaluator's (`EVALUATOR_GPU_SHARE`) and, when an
    arm mines hard negatives, `MINING_GPU_SHARE` for each mining trial's driver; but none
    where one trial's workers need every device, since a trainer takes whole GPUs and shares
    on one of them would leave it waiting forever (that encoding then stays on CPU)."""
    # here: Ray (the actor's module imports it), which a dry run does not need
    from embedlab.evaluate.actor import evaluator_gpus

    evaluator = evaluator_gpus(resources)
    if not evaluator:
        return GpuShares()
    trials = list(at_searched_maximum(arms, search)[0].values())
    mining = MINING_GPU_SHARE if any(mines_negatives(t) for t in trials) else 0.0
    if max(map(_trainer_gpus, trials)) + _whole_gpus_held(evaluator + mining) > resources.get("GPU", 0):
        return GpuShares()
    return GpuShares(evaluator=evaluator, mining_driver=mining)


def trial_driver_resources(trial: TrialConfig, shares: GpuShares = GpuShares()) -> dict[str, float]:
    """What one trial's driver reserves: `TRIAL_DRIVER_RESOURCES`, plus the mining driver's GPU
    share when the trial mines hard negatives (in the driver, before its trainer starts)."""
    if shares.mining_driver and mines_negatives(trial):
        return {**TRIAL_DRIVER_RESOURCES, "GPU": shares.mining_driver}
    return dict(TRIAL_DRIVER_RESOURCES)


def local_resources() -> dict[str, float]:
    """What a local cluster started here would offer, found without starting one: the CPUs
    this process may run on and the CUDA devices torch sees (both honour their masks)."""
    import torch  # here: torch, which sizing a study on given resources does not need

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"CPU": float(cpus), "GPU": float(torch.cuda.device_count())}


def check_fits(study_path: str | Path, study: Study, resources: dict[str, float], where: str,
               shares: GpuShares = GpuShares()) -> int:
    """The study's concurrency on `resources`; where it does not fit, a UsageError (a ValueError)
    naming the profile of the same study file that fits there (`--profile demo` on a CPU machine)."""
    try:
        return study_concurrency(study.arms, resources, study.search, shares)
    except ValueError as error:
        fitting = profiles_that_fit(study_path, study, resources)
        remedy = (f"run it with --profile {fitting[0]}, or on a cluster that fits it with --address" if fitting
                  else "no profile of this study file fits there: run it on a cluster that fits it with --address")
        remedy += "; on an autoscaling cluster, --wait-for-resources SECONDS waits for its nodes to arrive"
        raise UsageError(
            f"{study_path} at profile {study.profile or '-'} does not fit {where} ({resources.get('CPU', 0):g} CPUs, "
            f"{resources.get('GPU', 0):g} GPUs): {remedy} ({error})") from None


def profiles_that_fit(study_path: str | Path, study: Study, resources: dict[str, float]) -> list[str]:
    """The other profiles (`embedlab.studies.recipes.PROFILES`) at which the study file's every arm fits `resources`."""
    fitting = []
    for name in PROFILES:
        if name == study.profile:
            continue
        try:
            other = load_study(study_path, name)
            study_concurrency(other.arms, resources, other.search)
        except ValueError:  # a study() that takes no profile, or an arm that does not fit either
            continue
        fitting.append(name)
    return fitting
