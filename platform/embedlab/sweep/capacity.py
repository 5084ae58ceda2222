"""Waiting for an autoscaling fleet to grow until one trial of every arm fits.

A fleet scaled to zero (workers/cluster.yaml, workers/raycluster.yaml: a head with no CPU)
offers nothing when a sweep connects; its autoscaler adds workers when asked.
`embedlab sweep STUDY --address ... --wait-for-resources 600` polls the cluster's resources
through `wait_for_capacity`, asks the autoscaler for one trial's bundles meanwhile
(`request_from_autoscaler`), and goes on as soon as one trial of every arm fits.
`--max-concurrent N` sets how many trials Tune runs at once instead of sizing it from the
resources present. The core is pure: tests drive it with fake resources and a fake clock.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from embedlab.core.config import TrialConfig
from embedlab.core.errors import UsageError
from embedlab.model.memory import gib, training_memory
from embedlab.studies.recipes import derive

# Fixed rules, not settings: none of them changes what a study computes.
# Between reads of the cluster's resources while waiting, and at most this long between two
# waiting lines when nothing changes: they pace the wait and the console, not the sweep.
POLL_SECONDS = 5.0
LINE_SECONDS = 30.0
# CPUs left free for Ray Data's read tasks and the evaluation actor: a trainer that takes
# every CPU starves its own data pipeline and hangs. The trials' own CPUs are the setting
# (`train.num_workers`, `train.cpus_per_worker`); this is what every sweep needs beside them.
RESERVED_CPUS = 1.0
# What a trial reserves: the config paths Ray's resource requests are made of.
RESOURCE_PATHS = ("train.num_workers", "train.cpus_per_worker", "train.use_gpu")


@dataclasses.dataclass(frozen=True)
class Node:
    """A node a trial's workers can be placed on: its host memory, and its GPUs' memory each
    (0: no GPU), in bytes."""

    name: str
    host_memory: int
    gpu_memory: int = 0


# The nodes of the fleets embedlab ships (workers/), beside the machine a local cluster starts
# on (`this_machine`): a plan is refused only when none of them holds one worker.
# tests/test_memory_plan.py holds them to the files.
FLEET_NODES = (
    # workers/cluster.yaml's gpu_worker: an EC2 g5.12xlarge, 192 GiB and four 24 GiB A10G.
    Node("workers/cluster.yaml gpu_worker (g5.12xlarge)", host_memory=192 * 2**30, gpu_memory=24 * 2**30),
    # workers/raycluster.yaml's gpu group: a 60Gi pod with one GPU of the node pool's type,
    # counted at 141 GiB, the largest GPU embedlab measures (an H200, `embedlab.bench.mfu`).
    Node("workers/raycluster.yaml gpu pod", host_memory=60 * 2**30, gpu_memory=141 * 2**30),
)


def this_machine() -> Node:
    """This machine as a local cluster would offer it: its physical memory and, per GPU, the
    memory of the largest CUDA device torch sees (0 without one)."""
    import torch  # here: torch, which sizing a study on given resources does not need

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    gpus = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
    return Node("this machine", host_memory=memory, gpu_memory=max(gpus, default=0))


def check_memory(arms: dict[str, TrialConfig], nodes: Sequence[Node], where: str) -> list[str]:
    """One line per arm (one line when they agree) stating the memory a worker needs
    (`embedlab.model.memory.training_memory`: the same on every machine, so a plan reads alike
    everywhere); a UsageError naming the arm, the estimate and the largest node when no node in
    `nodes` holds one worker (a GPU worker: in one GPU's memory; a
    CPU worker: in the node's memory)."""
    lines = {}
    for arm, trial in arms.items():
        need = training_memory(trial)
        gpu = need.device == "GPU"
        node = max(nodes, key=lambda n: n.gpu_memory if gpu else n.host_memory)
        largest = node.gpu_memory if gpu else node.host_memory
        held = f"one GPU of {node.name}" if gpu else node.name
        if need.total > largest:
            raise UsageError(
                f"arm {arm}: a model of {trial.model.layers:,} layers at width {trial.model.width:,}, "
                f"{trial.train.batch_rows} rows a microbatch, needs {need.text}; the largest of {where}, {held}, "
                f"holds {gib(largest)}: use a smaller model or batch (or --profile)")
        lines[arm] = f"memory: {need.text}"  # the nodes are this machine's: named only in a refusal
    if len(set(lines.values())) == 1:
        return [next(iter(lines.values()))]
    return [f"{arm}: {line}" for arm, line in lines.items()]


@dataclasses.dataclass(frozen=True)
class TrialNeed:
    """What one trial of `arm` reserves: `bundles`, one per trainer worker plus the CPUs kept
    free for data and evaluation (`RESERVED_CPUS`)."""

    arm: str
    bundles: tuple[dict[str, float], ...]

    def amount(self, resource: str) -> float:
        return sum(bundle.get(resource, 0.0) for bundle in self.bundles)

    def met_by(self, resources: dict[str, float]) -> bool:
        return all(resources.get(r, 0.0) >= self.amount(r) for r in ("CPU", "GPU"))

    @property
    def text(self) -> str:
        return f"{self.amount('CPU'):g} CPUs/{self.amount('GPU'):g} GPUs for one trial of arm {self.arm}"


def trial_needs(arms: dict[str, TrialConfig], search: tuple = ()) -> list[TrialNeed]:
    """Each arm's `TrialNeed`, at its searched maximum where a search varies its resources
    (the rule `embedlab.sweep.cluster.max_concurrent_trials` sizes concurrency by)."""
    needs = []
    for arm, trial in at_searched_maximum(arms, search)[0].items():
        worker = {"CPU": float(trial.train.cpus_per_worker), **({"GPU": 1.0} if trial.train.use_gpu else {})}
        needs.append(TrialNeed(arm, (*[dict(worker)] * trial.train.num_workers, {"CPU": RESERVED_CPUS})))
    return needs


def at_searched_maximum(arms: dict[str, TrialConfig], search: tuple) -> tuple[dict[str, TrialConfig], bool]:
    """Each arm with every searched resource path at its most demanding value (Optuna may
    pick any), and whether the search named any."""
    worst = {item.path: max(item.choices) if item.choices else item.high
             for item in search if item.path in RESOURCE_PATHS}
    return ({arm: derive(trial, worst) for arm, trial in arms.items()} if worst else dict(arms)), bool(worst)


def check_options(max_concurrent: int | None, wait_s: float) -> None:
    """Refuse a `--max-concurrent` below 1 or a negative `--wait-for-resources`."""
    if max_concurrent is not None and max_concurrent < 1:
        raise UsageError(f"--max-concurrent {max_concurrent}: Tune needs at least 1 trial at a time")
    if wait_s < 0:
        raise UsageError(f"--wait-for-resources {wait_s:g}: give seconds to wait, 0 to refuse at once")


def _cpus_gpus(resources: dict[str, float]) -> str:
    return f"{resources.get('CPU', 0):g} CPUs/{resources.get('GPU', 0):g} GPUs"


def _fit_or_none(fits: Callable[[dict], int], resources: dict[str, float]) -> int | None:
    try:
        return fits(resources)
    except ValueError:  # UsageError: not one trial of some arm fits yet
        return None


def _shortfall(needs: Sequence[TrialNeed], resources: dict[str, float]) -> TrialNeed:
    """The need to show: the first arm the cluster cannot hold yet, else the most demanding."""
    missing = [need for need in needs if not need.met_by(resources)]
    return missing[0] if missing else max(needs, key=lambda n: (n.amount("GPU"), n.amount("CPU")))


def _concurrency(fit: int, max_concurrent: int | None, waiting: bool, progress: Callable[[str], None]) -> int:
    """`max_concurrent` when given, else `fit` (the trials that fit side by side now). More than
    fit is refused on a cluster that does not grow (no waiting: the extra trainers would take
    the CPUs kept free and hang their data pipelines) and said where an autoscaler adds nodes."""
    if max_concurrent is None or max_concurrent <= fit:
        return fit if max_concurrent is None else max_concurrent
    if not waiting:
        raise UsageError(
            f"--max-concurrent {max_concurrent}: the cluster holds {fit} trial(s) at once; lower it, or on an "
            "autoscaling cluster add --wait-for-resources SECONDS so the extra trials wait for new nodes")
    progress(f"ray: --max-concurrent {max_concurrent}: the cluster holds {fit} trial(s) at once now; going on, "
             "the others start as the autoscaler adds nodes")
    return max_concurrent


def wait_for_capacity(
    fits: Callable[[dict[str, float]], int],
    resources: Callable[[], dict[str, float]],
    *,
    needs: Sequence[TrialNeed],
    timeout_s: float,
    max_concurrent: int | None = None,
    progress: Callable[[str], None] = print,
    request: Callable[[list[dict[str, float]]], None] = lambda bundles: None,
    poll_s: float = POLL_SECONDS,
    line_s: float = LINE_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, dict[str, float]]:
    """(trials to run at once, the resources they were sized on) once one trial of every arm fits.

    `fits(resources)` is the number of trials that fit side by side and raises a ValueError
    (a UsageError) where not one does; `resources()` reads the cluster's
    (`ray.cluster_resources`). With `timeout_s` 0, `fits`' refusal stands at once. Otherwise the
    resources are read every `poll_s` seconds until one trial fits, with a line to `progress`
    whenever the CPUs or GPUs change and at least every `line_s` seconds; meanwhile
    `request(bundles)` asks for the most demanding arm's bundles and `request([])` clears
    that ask on the way out. Past `timeout_s`, a UsageError says what was needed and what
    arrived. The count is `max_concurrent` when given (`_concurrency`), else what fits then."""
    check_options(max_concurrent, timeout_s)
    present = resources()
    if not timeout_s:
        return _concurrency(fits(present), max_concurrent, False, progress), present
    fit = _fit_or_none(fits, present)
    if fit is not None:
        return _concurrency(fit, max_concurrent, True, progress), present
    first, start = present, clock()
    shown: tuple[str, float] | None = None  # the resources last shown, and when
    request([dict(b) for b in max(needs, key=lambda n: (n.amount("GPU"), n.amount("CPU"))).bundles])
    try:
        while fit is None:
            waited = clock() - start
            if waited >= timeout_s:
                need = _shortfall(needs, present)
                arrived = (f"the cluster went from {_cpus_gpus(first)} to {_cpus_gpus(present)}"
                           if _cpus_gpus(first) != _cpus_gpus(present) else f"nothing arrived ({_cpus_gpus(present)})")
                raise UsageError(
                    f"waited {timeout_s:g} s for the autoscaler: need {need.text}, but {arrived}; check that the "
                    "fleet has a node type that holds it and room under max_workers (workers/cluster.yaml, "
                    "workers/raycluster.yaml; `ray status` shows pending demands), wait longer with "
                    "--wait-for-resources, or use a smaller --profile")
            if shown is None or shown[0] != _cpus_gpus(present) or waited - shown[1] >= line_s:
                progress(f"waiting for the autoscaler: need {_shortfall(needs, present).text}, cluster has "
                         f"{_cpus_gpus(present)}; {waited:.0f} s of {timeout_s:g} s")
                shown = (_cpus_gpus(present), waited)
            sleep(min(poll_s, timeout_s - waited))
            present = resources()
            fit = _fit_or_none(fits, present)
    finally:
        request([])
    progress(f"ray: the autoscaler's nodes arrived after {clock() - start:.0f} s: {_cpus_gpus(present)}")
    return _concurrency(fit, max_concurrent, True, progress), present


def request_from_autoscaler(bundles: list[dict[str, float]], progress: Callable[[str], None] = print) -> None:
    """Ask Ray's autoscaler to make room for `bundles` (`ray.autoscaler.sdk.request_resources`,
    a hint that persists until replaced; [] clears it). Where the ask fails, say so and go on:
    polling still sees nodes that an operator or another demand adds."""
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=bundles)
    except Exception as error:  # a hint only: no autoscaler, an older GCS, a client connection
        progress(f"ray: could not {'ask the autoscaler for' if bundles else 'clear the ask for'} resources "
                 f"({type(error).__name__}: {error}); polling the cluster only")
