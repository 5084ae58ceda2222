"""`embedlab plan STUDY`: time, memory and storage of a study, estimated from measured pilots.

For every arm (at the study's first seed) a pilot trains the arm's real trial on the current
cluster for `PILOT_REPORTS` of its report intervals (`train.report_every_steps`, so the
per-report cost is paid as often as in the real run), through the same `TorchTrainer` path
and data pipeline a sweep uses, with one intermediate checkpoint, then has the evaluation
actor score its checkpoint. From it:

    start-up       the pilot's wall time not spent in steps: a Tune trial driver (as a sweep
                   runs trials), trainer and worker start, data stream start, the final
                   checkpoint and teardown, and the first interval's excess
    step time      median seconds per step over report intervals not following a checkpoint
                   (the quartiles give the range); budget units per step (tokens or pairs)
    checkpoint     extra seconds of the interval right after the intermediate checkpoint
    evaluation     the actor's wall time on the pilot's checkpoint (same task, split, index)
    peak memory    rank 0's peak (resident set on CPU, allocated CUDA memory on GPU)
    storage        the checkpoint's size x checkpoints kept per trial

The estimate for a trial is  start-up + steps x step time + intermediate checkpoints x
checkpoint time + evaluation, with steps = budget / units per step; the study's wall time is
the set-up (joining the cluster, preparing the data, as measured by the planner) plus the sum
over its trials (Optuna's tuning trials included) divided by the trials that run side by side. The range uses the step-time quartiles; start-up and evaluation are single samples.
Trials sharing the cluster slow each other (pilots run alone), which the estimate ignores.

Without pilots (`--throughput FILE`, `measured_plan`): a GPU study is planned from one GPU's
measurement by `embedlab bench mfu --json` (phase-1 training of a preset at a length and batch,
`embedlab.bench.mfu`), by one rule. The measured tokens/s at the bench's own setting, times the
training FLOPs a token costs there (`embedlab.model.flops.expected_step_flops`), is the GPU's
rate in training FLOP/s; a trial runs that on each of its workers (linear scaling: gradient
all-reduce and all-gather cost nothing), so

    trial seconds = the trial's training FLOPs / (rate x workers)

where the training FLOPs are the budget (a FLOPs budget), or the budget's tokens or pairs at
the arm's FLOPs per step (a data budget). An arm at the bench's own setting (its preset,
length and rows a GPU, 15% masking) then takes budget tokens / (tokens/s x workers). Phases
2-3 and other presets or lengths are extrapolated at the same FLOP/s: short pair texts, mined
negatives and the MLM head's share run at utilisations the bench did not measure. Start-up,
checkpoints, evaluation and data preparation are not measured, so they count for nothing, and
trials run one at a time (a cluster of one trial's GPUs). Nothing starts: no Ray, no data.
A GPU study on a machine without a GPU and without `--address` is planned this way or not at
all: piloting it here would download its datasets and time its model on CPU cores.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from embedlab.core.config import DataConfig, TrainConfig, TrialConfig, model_preset, phase_spec
from embedlab.core.errors import UsageError
from embedlab.tasks.resolve import resolve_task
from embedlab.model.flops import expected_step_flops
from embedlab.prepared.directory import PreparedData
from embedlab.stats.ladder import project_study
from embedlab.stats.rerun import RerunSize, rerun_size, with_seeds
from embedlab.studies.recipes import PROFILES
from embedlab.studies.study import Study, load_study, resolve_parent
from embedlab.sweep.arm_data import prepare_arms
from embedlab.sweep.cluster import check_address, connect, gpu_shares, study_concurrency, trial_driver_resources
from embedlab.sweep.driver import train_trial
from embedlab.sweep.preflight import preflight
from embedlab.studies.tour import load_tour, stage_path
from embedlab.train.budget import step_units
from embedlab.train.launch import CHECKPOINTS_KEPT

PILOT_REPORTS = 6  # report intervals a pilot trains: the first, 4 steady ones, one after a checkpoint


@dataclass(frozen=True)
class Pilot:
    """What one arm's pilot measured."""

    arm: str
    steps: int
    units_per_step: float  # budget units (tokens, pairs or FLOPs) per step
    step_seconds: float  # median over steady steps
    step_seconds_low: float  # first quartile
    step_seconds_high: float  # third quartile
    checkpoint_seconds: float
    startup_seconds: float
    eval_seconds: float
    peak_memory_bytes: int
    checkpoint_bytes: int

    @property
    def units_per_second(self) -> float:
        return self.units_per_step / self.step_seconds


@dataclass(frozen=True)
class ArmEstimate:
    arm: str
    trials: int  # tuning + final trials of this arm
    budget: float
    steps: int
    checkpoints: int  # intermediate, per trial
    trial_seconds: float
    trial_seconds_low: float
    trial_seconds_high: float


def pilot_steps(config: TrialConfig, reports: int) -> int:
    """Steps a pilot trains: `reports` of the arm's report intervals."""
    return reports * config.train.report_every_steps


def pilot_config(study: Study, arm: str, parent: str | None, reports: int) -> TrialConfig:
    """The arm's trial at the first seed with a budget of `reports` report intervals of full
    steps, its own report cadence, and a checkpoint at the middle report."""
    config = study.trial_config(arm, study.seeds[0], parent)
    train = config.train
    steps = pilot_steps(config, reports)
    rows = train.num_workers * train.batch_rows * train.microbatches
    capacity = rows * config.data.sequence_length  # tokens a step can hold; packing fills most
    budget: dict[str, Any] = {}  # the Budget fields the pilot changes
    if study.unit == "flops":
        budget["flops"] = steps * expected_step_flops(config)
        budget["pairs"] = max(train.budget.pairs, steps * rows * 4)
        budget["tokens"] = max(train.budget.tokens, steps * capacity * 2)
    elif config.spec.data_unit == "tokens":
        budget["tokens"] = steps * capacity
    else:
        budget["pairs"] = steps * rows
    if study.unit == "device_seconds":  # the pilot runs its steps by data and times them
        budget["device_seconds"] = 0.0
    every = train.report_every_steps * (reports // 2)
    train = replace(train, budget=replace(train.budget, **budget), checkpoint_every_steps=every)
    return replace(config, train=train)


def steady_intervals(points: list[tuple[int, float, bool]]) -> tuple[list[float], list[float]]:
    """(seconds per step of steady intervals, of intervals right after a checkpoint) from the
    reports' (step, cumulative wall seconds, checkpoint written) in order. The interval up to
    the first report is neither: it waits for the stream's first batch. A checkpoint is
    written after its report, so its cost lands in the next interval."""
    steady, after = [], []
    for (step0, wall0, checkpoint), (step1, wall1, _) in zip(points, points[1:]):
        (after if checkpoint else steady).append((wall1 - wall0) / (step1 - step0))
    return steady, after


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, median, high


def pilot_driver(config: dict[str, Any]) -> None:
    """The Tune trial a pilot runs in: the arm's real training (phase 1, or 2-3 with mining)."""
    from ray import tune

    trial = TrialConfig.from_dict(config["trial"])
    prepared = PreparedData(Path(config["prepared"]), config["record"])
    result = train_trial(trial, prepared, storage_path=Path(config["storage"]), name=config["name"],
                         overlap_policy=config["overlap_policy"])
    if result.error is not None:
        raise result.error
    tune.report({"checkpoint": result.checkpoint.path})


def directory_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def run_pilot(study: Study, arm: str, prepared: PreparedData, *, parent: str | None, reports: int, storage: Path,
              progress: Callable[[str], None]) -> tuple[Pilot, Path]:
    """Train the arm's pilot on the cluster and score its checkpoint (module docstring);
    returns the measurements and the pilot's checkpoint (a stand-in parent for a next phase)."""
    import ray
    from ray import tune

    # here: Ray (both modules import it), which a plan from a throughput file does not need
    from embedlab.evaluate.actor import get_evaluator
    from embedlab.train.metrics_log import log_location, read_metrics

    trial = pilot_config(study, arm, parent, reports)
    name = f"pilot-{arm}"
    storage = storage.resolve()
    progress(f"plan: pilot of arm {arm}: about {pilot_steps(trial, reports)} steps on the cluster")
    config = {"trial": trial.to_dict(), "prepared": str(prepared.directory), "record": prepared.record,
              "storage": str(storage), "name": name, "overlap_policy": study.disclosed_overlap}
    # The sweep's own requests, GPU shares included, so the pilot times what a trial does.
    shares = gpu_shares(study.arms, ray.cluster_resources(), study.search)
    resources = trial_driver_resources(trial, shares)
    started = time.perf_counter()
    # Through a Tune trial, as a sweep trains: the trial driver's own start-up is part of the cost.
    # Tune prints its experiment box on stdout, which belongs to the plan (`--json`).
    with contextlib.redirect_stdout(sys.stderr):
        tuner = tune.Tuner(tune.with_resources(pilot_driver, resources), param_space=config,
                           run_config=tune.RunConfig(name=f"tune-{name}", storage_path=str(storage), verbose=0))
        (result,) = tuner.fit()
    fit_seconds = time.perf_counter() - started
    if result.error is not None:
        raise RuntimeError(f"the pilot of arm {arm} failed: {result.error}") from result.error
    reports = [r for r in read_metrics(log_location(storage, name)) if "train/step" in r]
    points = [(r["train/step"], r["compute/wall_seconds"], r["checkpoint"]) for r in reports]
    steady, after = steady_intervals(points)
    if not steady:
        raise RuntimeError(f"the pilot of arm {arm} reported {len(points)} times: too few to time "
                           "(raise --pilot-reports)")
    low, median, high = quartiles(steady)
    last = reports[-1]
    clock = {"tokens": last["budget/tokens"], "pairs": last.get("budget/pairs", 0.0), "flops": last["budget/flops"],
             "device_seconds": last["compute/device_seconds"]}
    units = clock[study.unit] / last["train/step"]
    checkpoint_seconds = max(0.0, statistics.mean(after) - median) if after else 0.0
    first_step, first_wall, _ = points[0]
    startup = max(0.0, fit_seconds - points[-1][1]) + max(0.0, first_wall - first_step * median)
    checkpoint = Path(result.metrics["checkpoint"])
    task_dir = str(resolve_task(trial.eval.task, prepared.directory))
    progress(f"plan: pilot of arm {arm}: evaluating its checkpoint")
    started = time.perf_counter()
    ray.get(get_evaluator(num_gpus=shares.evaluator).evaluate.remote(str(checkpoint), task_dir, trial.eval.split, trial.eval.index,
                                            str(prepared.directory / "retention"), f"plan-{arm}",
                                            trial.eval.max_length))
    eval_seconds = time.perf_counter() - started
    return Pilot(
        arm=arm, steps=int(last["train/step"]), units_per_step=units, step_seconds=median, step_seconds_low=low,
        step_seconds_high=high, checkpoint_seconds=checkpoint_seconds, startup_seconds=startup,
        eval_seconds=eval_seconds, peak_memory_bytes=int(last["compute/peak_memory_bytes"]),
        checkpoint_bytes=directory_bytes(checkpoint),
    ), checkpoint


def estimate_arm(study: Study, pilot: Pilot, trials: int) -> ArmEstimate:
    """One trial of the arm at the study's budget, from its pilot (module docstring)."""
    budget = study.budget.amount(study.phase)
    steps = math.ceil(budget / pilot.units_per_step)
    config = study.trial_config(pilot.arm, study.seeds[0], "parent" if study.needs_parent else None)
    every = config.train.checkpoint_every_steps
    checkpoints = (steps - 1) // every if every else 0  # the final one is in the start-up figure

    def seconds(step_seconds: float) -> float:
        return (pilot.startup_seconds + steps * step_seconds + checkpoints * pilot.checkpoint_seconds
                + pilot.eval_seconds)

    return ArmEstimate(arm=pilot.arm, trials=trials, budget=budget, steps=steps, checkpoints=checkpoints,
                       trial_seconds=seconds(pilot.step_seconds), trial_seconds_low=seconds(pilot.step_seconds_low),
                       trial_seconds_high=seconds(pilot.step_seconds_high))


def make_plan(study: Study, pilots: dict[str, Pilot], concurrency: int, checkpoints_kept: int,
              setup_seconds: float) -> dict[str, Any]:
    """The plan as plain values: per arm, its pilot and estimate; for the study, totals
    (`setup_seconds`: joining the cluster and preparing the data, once per sweep)."""
    tuning = study.search_trials if study.search else 0
    arms = {arm: estimate_arm(study, pilot, tuning + len(study.seeds)) for arm, pilot in pilots.items()}
    total = {key: setup_seconds + sum(getattr(a, key) * a.trials for a in arms.values()) / concurrency
             for key in ("trial_seconds", "trial_seconds_low", "trial_seconds_high")}
    config = study.trial_config(next(iter(study.arms)), study.seeds[0], "parent" if study.needs_parent else None)
    return {
        "study": study.name,
        "phase": study.phase,
        "profile": study.profile,
        "budget_unit": study.unit,
        "budget": next(iter(arms.values())).budget,
        "trials": sum(a.trials for a in arms.values()),
        "concurrent_trials": concurrency,
        "checkpoint_every_steps": config.train.checkpoint_every_steps,
        "evaluation": f"once per trial, at its end ({config.eval.task}, {config.eval.split} split, "
                      f"{config.eval.index} index)",
        "storage_bytes": sum(p.checkpoint_bytes * checkpoints_kept * arms[a].trials for a, p in pilots.items()),
        "checkpoints_kept_per_trial": checkpoints_kept,
        "setup_seconds": setup_seconds,
        "wall_seconds": total["trial_seconds"],
        "wall_seconds_low": total["trial_seconds_low"],
        "wall_seconds_high": total["trial_seconds_high"],
        "arms": {arm: {"pilot": asdict(pilots[arm]), "estimate": asdict(estimate)} for arm, estimate in arms.items()},
    }


@dataclass(frozen=True)
class Measurement:
    """What `embedlab bench mfu --json` measured on one GPU: phase-1 training of `preset` at
    `sequence_length`, `batch_rows` rows a step, in `precision`, at `tokens_per_s`."""

    path: str
    device: str
    preset: str
    sequence_length: int
    batch_rows: int
    precision: str
    tokens_per_s: float
    mfu: float | None

    @classmethod
    def read(cls, path: str | Path) -> Measurement:
        """The measurement in a `bench mfu --json` file; a missing file or field is a UsageError naming it."""
        try:
            raw = json.loads(Path(path).read_text())
            bench = raw["bench"]
            measured = cls(path=str(path), device=raw["device"], preset=bench["preset"],
                           sequence_length=int(bench["sequence_length"]), batch_rows=int(bench["batch_rows"]),
                           precision=bench["precision"], tokens_per_s=float(raw["tokens_per_s"]), mfu=raw.get("mfu"))
        except FileNotFoundError:
            raise UsageError(f"--throughput {path}: no such file") from None
        except json.JSONDecodeError as error:
            raise UsageError(f"--throughput {path}: not JSON ({error}); write it with embedlab bench mfu --json") from None
        except (KeyError, TypeError) as error:
            raise UsageError(f"--throughput {path}: no field {error} (need device, tokens_per_s and bench.preset, "
                             "sequence_length, batch_rows, precision, as embedlab bench mfu --json writes)") from None
        if measured.tokens_per_s <= 0:
            raise UsageError(f"--throughput {path}: tokens_per_s must be positive, got {measured.tokens_per_s}")
        return measured

    def reference(self) -> TrialConfig:
        """The bench's step as a one-GPU phase-1 trial (15% masking), for the FLOPs counter."""
        return TrialConfig(model=model_preset(self.preset, max_length=max(512, self.sequence_length)),
                           data=DataConfig(sequence_length=self.sequence_length),
                           train=TrainConfig(num_workers=1, batch_rows=self.batch_rows, use_gpu=True,
                                             precision=self.precision))

    @property
    def flops_per_s(self) -> float:
        """The GPU's rate in training FLOP/s: tokens/s x the FLOPs a token costs at the bench's setting."""
        reference = self.reference()
        return self.tokens_per_s * expected_step_flops(reference) / step_units(reference)


def measured_arm(study: Study, arm: str, measurement: Measurement) -> dict[str, Any]:
    """One trial of the arm from the GPU measurement (module docstring: trial seconds = its
    training FLOPs / (rate x workers))."""
    config = study.trial_config(arm, study.seeds[0], "PARENT" if study.needs_parent else None)
    step_flops, units = expected_step_flops(config), step_units(config)
    workers = config.train.num_workers
    rate = measurement.flops_per_s * workers
    if study.unit == "device_seconds":  # device time summed over workers
        seconds = study.budget.device_seconds / workers
        flops = seconds * rate
    else:
        amount = study.budget.amount(study.phase)
        flops = amount if study.unit == "flops" else amount / units * step_flops
        seconds = flops / rate
    return {"trials": (study.search_trials if study.search else 0) + len(study.seeds), "workers": workers,
            "model": config.model.preset, "layers": config.model.layers, "width": config.model.width,
            "sequence_length": config.contrastive.pair_length if config.spec.reads_pairs else config.data.sequence_length,
            "precision": config.train.precision, "steps": math.ceil(flops / step_flops), "step_flops": step_flops,
            "units_per_step": units, "units_per_second": units * rate / step_flops, "training_flops": flops,
            "trial_seconds": seconds}


def measured_plan(study: Study, measurement: Measurement, *, gpu_here: bool) -> dict[str, Any]:
    """The study's plan from one GPU's measurement alone (module docstring); starts nothing."""
    configs = {arm: study.trial_config(arm, study.seeds[0], "PARENT" if study.needs_parent else None)
               for arm in study.arms}
    if not all(config.train.use_gpu for config in configs.values()):
        raise UsageError(f"--throughput is a GPU measurement, and study {study.name} at profile "
                         f"{study.profile or '-'} trains on CPUs: plan it with pilots (no --throughput)")
    arms = {arm: measured_arm(study, arm, measurement) for arm in study.arms}
    first = next(iter(configs.values()))
    notes = [] if gpu_here else [
        "this machine has no GPU: the time is extrapolated from the GPU measurement above by the rule above, "
        "not from pilots here (CPU pilots of a GPU study are not run)"]
    measured = (measurement.preset, measurement.sequence_length, 1)
    other = next((arm for arm, a in arms.items() if (a["model"], a["sequence_length"], study.phase) != measured), None)
    if other is not None:
        a = arms[other]
        notes.append(f"arm {other} trains preset {a['model']} at length {a['sequence_length']} in phase {study.phase}; "
                     f"the measurement is of preset {measurement.preset} at length {measurement.sequence_length} in "
                     "phase 1: its FLOP/s is carried over unchanged")
    if any(c.contrastive.negatives.count and c.contrastive.negatives.mine for c in configs.values()):
        notes.append("mining hard negatives (a no-grad pass of the parent over the training documents, once per "
                     "parent) is outside the training budget and not counted")
    if study.budget.scope == "lineage":
        notes.append("lineage budget: an arm that starts from the parent's weights trains the total less the "
                     "parent's recorded FLOPs, so its time here is an upper bound")
    data = first.data
    sources = [*data.hf_datasets, *(data.hf_pairs if first.spec.reads_pairs else ())]
    return {
        "study": study.name, "phase": study.phase, "profile": study.profile, "estimate": "measured",
        "budget_unit": study.unit,
        "budget": study.budget.amount(study.phase),
        # The plan's keys as before the budget was one object: a phase-1 study declares no pairs.
        "budget_tokens": study.budget.tokens, "budget_pairs": study.budget.declared(study.phase).get("pairs", 0),
        "trials": sum(a["trials"] for a in arms.values()), "concurrent_trials": 1,
        "measurement": {**asdict(measurement), "flops_per_s": measurement.flops_per_s},
        "rule": "trial seconds = training FLOPs / (measured tokens/s x training FLOPs a token at the bench's "
                "setting x workers); start-up, checkpoints and evaluation not counted; one trial at a time",
        "data_sources": [{"name": s.name, "dataset": s.dataset, "config": s.config, "revision": s.revision}
                         for s in sources],
        "arms": arms,
        "wall_seconds": sum(a["trial_seconds"] * a["trials"] for a in arms.values()),
        "notes": notes,
    }


def plan_study(study_path: str | Path, *, profile: str | None = None, parent: str | None = None,
               address: str | None = None, reports: int = PILOT_REPORTS, throughput: str | Path | None = None,
               seeds_from: str | Path | None = None, trend_from: Sequence[str | Path] = (),
               progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Pilot every arm of the study on the cluster and return the plan (`make_plan`); for a
    tour file, a plan per stage, each stage's pilots starting from the previous stage's
    pilot checkpoint (`{"tour": name, "phases": [plan, ...], "wall_seconds": ...}`). With
    `throughput` (a `bench mfu --json` file), no pilots: every stage from that measurement
    (`measured_plan`). With `seeds_from` (a finished run of the study), the study at the seeds
    that run's paired test says a rerun needs (`sweep.rerun`), and the plan says why under
    `"rerun"`. With `trend_from` (the rungs of a budget ladder of the same comparison), no
    pilots: each arm's trend projected to the study's training budget (`ladder.project_study`),
    labelled an extrapolation where it lies beyond the rungs. A GPU study here without a GPU, `throughput` or `address` is refused before
    anything starts."""
    import torch

    if reports < 4:
        raise UsageError(f"--pilot-reports {reports}: at least 4 are needed to time steady intervals "
                         "around a checkpoint")
    path = Path(study_path)
    tour = load_tour(path, profile) if path.is_file() and "def tour(" in path.read_text() else None
    studies = [load_study(stage_path(path, stage), tour.profile) for stage in tour.stages] if tour else [
        load_study(path, profile)]
    if trend_from:
        if tour:
            raise UsageError("--trend-from projects one study's comparison: give the stage's study file, not the tour")
        study = studies[0]
        return {"projection": project_study(trend_from, list(study.arms), study.budget.flops, study.name),
                "profile": study.profile}
    rerun = None
    if seeds_from is not None:
        if tour:
            raise UsageError("--seeds-from sizes one study from its run: give the stage's study file "
                             f"({', '.join(str(stage_path(path, stage)) for stage in tour.stages)}), not the tour")
        rerun = rerun_size(seeds_from, studies[0])
        studies = [with_seeds(studies[0], rerun.seeds)]
        progress(f"plan: {rerun.line}")
    gpu_here = torch.cuda.is_available()
    if throughput is not None:
        measurement = Measurement.read(throughput)
        plans = [measured_plan(study, measurement, gpu_here=gpu_here) for study in studies]
        if not tour:
            return _with_rerun(plans[0], rerun)
        return {"tour": tour.name, "profile": tour.profile, "estimate": "measured", "phases": plans,
                "trials": sum(plan["trials"] for plan in plans),
                "wall_seconds": sum(plan["wall_seconds"] for plan in plans)}
    gpu_study = next((s for s in studies if any(c.train.use_gpu for c in s.arms.values())), None)
    if gpu_study is not None and address is None and not gpu_here:
        raise UsageError(
            f"study {gpu_study.name} at profile {gpu_study.profile or '-'} trains on GPUs and this machine has none: "
            "plan it from one GPU's measurement with --throughput FILE (embedlab bench mfu --json, as "
            "workers/bench-gpu.sh writes bench-mfu.json), or pilot it on a GPU cluster with --address; it is not "
            "piloted on CPUs here (that would download its datasets and time its model on CPU cores)"
            + (f"; or plan a CPU profile of it here (--profile {', '.join(_cpu_profiles())})" if gpu_study.profile else ""))
    parent = parent or studies[0].parent
    if studies[0].needs_parent and parent is None:
        raise UsageError(f"study {studies[0].name} needs --parent: any checkpoint with the study's tokenizer and "
                         "model will do (the pilots measure speed, not quality)")
    if address is not None:
        check_address(address)
    for study in studies:  # what a dry run checks (sources, tasks, memory), before the pilots' cluster starts
        preflight(study, parent=parent, progress=progress)
    with tempfile.TemporaryDirectory(prefix="embedlab-plan-") as storage:
        plans = []
        for index, study in enumerate(studies):
            if tour:
                progress(f"plan: stage {index + 1}/{len(studies)}: study {study.name} (phase {study.phase})")
            study, parent = resolve_parent(study, parent, progress)  # a pretrained parent: its backbone
            plan, checkpoint = _plan_one(study, parent, address, reports, Path(storage) / study.name, progress)
            plans.append(plan)
            parent = str(checkpoint)  # the next stage's pilots start from this one's
    if not tour:
        return _with_rerun(plans[0], rerun)
    return {"tour": tour.name, "profile": tour.profile, "phases": plans,
            **{key: sum(plan[key] for plan in plans) for key in
               ("wall_seconds", "wall_seconds_low", "wall_seconds_high", "storage_bytes", "trials")}}


def _with_rerun(plan: dict[str, Any], rerun: RerunSize | None) -> dict[str, Any]:
    if rerun is None:
        return plan
    return {**plan, "rerun": {**asdict(rerun), "line": rerun.line}}


def _cpu_profiles() -> list[str]:
    return [name for name, p in PROFILES.items() if not p.use_gpu]


def _plan_one(study: Study, parent: str | None, address: str | None, reports: int, storage: Path,
              progress: Callable[[str], None]) -> tuple[dict[str, Any], Path]:
    """One study's plan and its first arm's pilot checkpoint."""
    import ray

    started = time.perf_counter()
    connect(address, progress)
    prepared = prepare_arms(study, progress)
    setup_seconds = time.perf_counter() - started  # a sweep pays it once too
    concurrency = study_concurrency(study.arms, ray.cluster_resources(), study.search)
    pilots, checkpoints = {}, []
    for arm in study.arms:
        record = prepared[arm]
        pilots[arm], checkpoint = run_pilot(study, arm, PreparedData(Path(record["directory"]), record),
                                            parent=parent, reports=reports, storage=storage, progress=progress)
        checkpoints.append(checkpoint)
    return make_plan(study, pilots, concurrency, CHECKPOINTS_KEPT, setup_seconds), checkpoints[0]


def _amount(value: float) -> str:
    """A count or rate: digits up to 10^7, scientific beyond (FLOPs)."""
    return f"{value:.4g}" if abs(value) >= 1e7 else f"{value:,.0f}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def format_measured_plan(plan: dict[str, Any]) -> str:
    """A plan from a GPU measurement (`measured_plan`) as `embedlab plan --throughput` prints it."""
    m, unit = plan["measurement"], plan["budget_unit"]
    first = next(iter(plan["arms"].values()))
    mfu = f", MFU {m['mfu']:.1%}" if m["mfu"] is not None else ""
    record = f"budget_tokens {plan['budget_tokens']:,}" + (
        f", budget_pairs {plan['budget_pairs']:,}" if plan["budget_pairs"] else "")
    width = max(len(arm) for arm in plan["arms"]) + 2
    lines = [
        f"plan for study {plan['study']} (phase {plan['phase']}, profile {plan['profile']}): {plan['trials']} trials, "
        f"1 at a time; not piloted: extrapolated from a GPU measurement",
        f"  measured: bench mfu on {m['device']} ({m['path']}): preset {m['preset']}, length {m['sequence_length']}, "
        f"{m['batch_rows']} rows a step, {m['precision']}: {m['tokens_per_s']:,.0f} tokens/s = "
        f"{m['flops_per_s']:.4g} training FLOP/s a GPU{mfu}",
        f"  rule: {plan['rule']}",
        f"  budget per trial: {_amount(plan['budget'])} {unit} (the study's {record})",
        f"  model {first['model']} ({first['layers']} layers, width {first['width']}), "
        + (f"pair length {first['sequence_length']}" if phase_spec(plan["phase"]).reads_pairs else
           f"sequence length {first['sequence_length']}")
        + f", {first['workers']} GPUs a trial, {first['precision']}",
        *[f"  data: {s['name']} = {s['dataset']}" + (f" {s['config']}" if s["config"] else "") + f" @ {s['revision']}"
          for s in plan["data_sources"]],
        "",
        f"  {'arm':<{width}}{'trials':>7}{'steps':>8}{'step flops':>12}{'units/s':>12}{'trial':>9}",
    ]
    for arm, a in plan["arms"].items():
        lines.append(f"  {arm:<{width}}{a['trials']:>7}{a['steps']:>8}{a['step_flops']:>12.4g}"
                     f"{_amount(a['units_per_second']):>12}{_duration(a['trial_seconds']):>9}")
    lines += ["", f"  estimated wall time: {_duration(plan['wall_seconds'])} (training steps only)",
              *[f"  note: {note}" for note in plan["notes"]]]
    return "\n".join(lines)


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as the table `embedlab plan` prints (a tour: one table per phase, then the total)."""
    if "projection" in plan:
        return "\n".join(plan["projection"]["lines"]) + "\n"
    if "rerun" in plan:
        return f"{plan['rerun']['line']}\n" + format_plan({key: v for key, v in plan.items() if key != "rerun"})
    if plan.get("estimate") == "measured":
        if "phases" not in plan:
            return format_measured_plan(plan)
        return "\n\n".join([format_measured_plan(phase) for phase in plan["phases"]] + [
            f"tour {plan['tour']} ({plan['profile']}): {plan['trials']} trials in {len(plan['phases'])} phases, "
            f"estimated wall time {_duration(plan['wall_seconds'])} (training steps only, extrapolated from a GPU "
            "measurement), plus promotion and the release export"])
    if "phases" in plan:
        return "\n\n".join([format_plan(phase) for phase in plan["phases"]] + [
            f"tour {plan['tour']} ({plan['profile']}): {plan['trials']} trials in {len(plan['phases'])} phases, "
            f"{plan['storage_bytes'] / 2**20:,.1f} MiB of checkpoints, estimated wall time "
            f"{_duration(plan['wall_seconds'])} ({_duration(plan['wall_seconds_low'])} .. "
            f"{_duration(plan['wall_seconds_high'])}), plus promotion and the release export"])
    unit = plan["budget_unit"]
    width = max(len(arm) for arm in plan["arms"]) + 2
    lines = [
        f"plan for study {plan['study']} (phase {plan['phase']}, profile {plan['profile']}): "
        f"{plan['trials']} trials, {plan['concurrent_trials']} at a time",
        f"  budget per trial: {_amount(plan['budget'])} {unit}; a checkpoint every {plan['checkpoint_every_steps']} "
        f"steps, {plan['checkpoints_kept_per_trial']} kept; evaluation {plan['evaluation']}",
        "",
        f"  {'arm':<{width}}{'trials':>7}{'steps':>8}{unit + '/s':>12}{'step s':>9}{'start s':>9}{'ckpt s':>8}"
        f"{'eval s':>8}{'peak MiB':>10}{'trial':>9}",
    ]
    for arm, entry in plan["arms"].items():
        pilot, estimate = entry["pilot"], entry["estimate"]
        lines.append(
            f"  {arm:<{width}}{estimate['trials']:>7}{estimate['steps']:>8}"
            f"{_amount(pilot['units_per_step'] / pilot['step_seconds']):>12}{pilot['step_seconds']:>9.2f}"
            f"{pilot['startup_seconds']:>9.1f}{pilot['checkpoint_seconds']:>8.2f}{pilot['eval_seconds']:>8.1f}"
            f"{pilot['peak_memory_bytes'] / 2**20:>10,.0f}{_duration(estimate['trial_seconds']):>9}")
    lines += [
        "",
        f"  storage: {plan['storage_bytes'] / 2**20:,.1f} MiB of checkpoints; set-up (cluster, data) "
        f"{plan['setup_seconds']:.0f} s",
        f"  estimated wall time: {_duration(plan['wall_seconds'])} "
        f"(step-time quartiles: {_duration(plan['wall_seconds_low'])} .. {_duration(plan['wall_seconds_high'])}; "
        "start-up and evaluation are single samples; concurrent trials slowing each other is not modelled)",
    ]
    return "\n".join(lines)
