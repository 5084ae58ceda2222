"""Run a study on Ray Tune (`run_sweep`): one trial per (arm, seed), each a Tune driver
function (`embedlab.sweep.driver`) that fits the arm's phase on Ray Train and asks the shared
evaluation actor for its dev metrics, after Optuna's tuning trials where the study searches;
or say what it would run (`dry_run`). The run directory it fills: `embedlab.records.rundir`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedlab.artifacts.sync import STORAGE_ENV
from embedlab.core import code_identity, store, timing
from embedlab.core.config import TrialConfig
from embedlab.core.errors import UsageError
from embedlab.core.schema import SCHEMA
from embedlab.sweep import capacity
from embedlab.prepared.build import undone_on_refusal
from embedlab.sweep.arm_data import prepare_arms, publish_prepared
from embedlab.tasks.resolve import arm_eval_tasks
from embedlab.sweep.cluster import (TRIAL_DRIVER_RESOURCES, GpuShares, check_address, check_fits, connect,
                                    gpu_shares, local_resources, trial_driver_resources)
from embedlab.checkpoints import MANIFEST_FILE
from embedlab.checkpoints.io import read_manifest, verify_checkpoint, versions
from embedlab.checkpoints.pretrained import is_pretrained_spec, pretrained_arms, pretrained_lineage
from embedlab.records.rundir import finished_rows, new_run_dir, write_json
from embedlab.records.scores import score_trial
from embedlab.stats.looks import design_for
from embedlab.stats.references import distilled_teacher, score_teacher
from embedlab.stats.sequential import difference_threshold
from embedlab.stats.table import STUDY_FILE, read_study_record
from embedlab.studies.recipes import derive
from embedlab.studies.study import Study, load_study, resolve_parent, study_origin
from embedlab.sweep.driver import trial_driver, trial_params
from embedlab.sweep.experiment import fit, tune_output_to_log
from embedlab.sweep.gate import check_contamination, check_pair_schedules
from embedlab.sweep.preflight import preflight
from embedlab.sweep.reuse import copy_trial, lookup, trial_key
from embedlab.sweep.rounds import run_rounds
from embedlab.sweep.tuning import tune_arms
from embedlab.train.trial_data import build_trial_data as build_trial_data_task, makes_sets


def dry_run(study_path: str | Path, *, profile: str | None = None, parent: str | None = None,
            storage: str | Path | None = None, resume: str | Path | None = None, check_parent: bool = True,
            budget_scale: float = 1.0, address: str | None = None, max_concurrent: int | None = None,
            wait_for_resources: float = 0.0, until_decided: bool = False, max_seeds: int | None = None,
            equivalence_margin: float | None = None) -> str:
    """What `embedlab sweep` would run, without starting Ray or preparing data, after every
    check that needs neither (`check_options`, then `embedlab.sweep.preflight`: storage, resume,
    arms, memory, pair and document sources, evaluation tasks) and, unless not `check_parent`
    (a tour's later stages name a parent that does not exist yet), the parent checkpoint; for a
    study run until decided, its design (looks, weights, seed order and each look's boundaries)."""
    check_options(address, max_concurrent, wait_for_resources)
    study = Sequential(until_decided, max_seeds, equivalence_margin).apply(load_study(study_path, profile, budget_scale))
    if check_parent:
        if parent is None and study.parent is not None and is_pretrained_spec(study.parent):
            parent = study.parent  # a study or profile that declares a pretrained parent
        # A pretrained parent is materialised (a file conversion, no training): the plan shows
        # the arms on its backbone.
        study, parent = resolve_parent(study, parent)
    if parent is not None and check_parent:
        verify_checkpoint(parent)
    checked = preflight(study, storage=storage, resume=resume, parent=parent)
    budget = study.budget_text

    def shape(trial: TrialConfig) -> str:
        return (f"model {trial.model.preset}: {trial.model.layers} layers, width {trial.model.width}; "
                f"{trial.train.num_workers} workers x {trial.train.cpus_per_worker:g} CPU"
                + (" + 1 GPU" if trial.train.use_gpu else "") + " per trial")

    shapes = {arm: shape(trial) for arm, trial in study.arms.items()}
    # One line when the arms share model and workers; else each arm's (they size concurrency).
    shape_lines = [f"  {next(iter(shapes.values()))}"] if len(set(shapes.values())) == 1 else \
        [f"  {arm}: {text}" for arm, text in shapes.items()]
    lines = [
        f"study {study.name} ({study_path}), profile {study.profile or '-'}, phase {study.phase}",
        f"  {study.description}" if study.description else "",
        f"  factor {study.factor}; metric {study.metric} (recipe-dev)",
        f"  budget per trial: {budget}",
        *shape_lines,
        "  arms:",
        *[f"    {arm:<22} {study.factor} = {study.factor_value(arm)}" for arm in study.arms],
        f"  seeds: {', '.join(map(str, study.seeds))}",
    ]
    if study.search:
        # here: Ray Tune (its module imports it), which the rest of a dry run does not need
        from embedlab.sweep.optuna_search import SamplerChoice

        sampler = SamplerChoice.for_trials(study.search_trials, study.tuning_seeds[0]).description
        lines.append(f"  tuning seeds: {_seed_range(study.tuning_seeds)} (never a study seed: reported numbers "
                     "come from the seeds above alone)")
        lines.append(f"  Optuna search, {study.search_trials} trials per arm, {sampler}:")
        lines += [f"    {s.path}: " + (f"one of {list(s.choices)}" if s.choices else
                                          f"{s.low:g} .. {s.high:g}" + (" (log)" if s.log else "")) for s in study.search]
    if study.needs_parent:
        lines.append(f"  parent: {parent or 'required: --parent CKPT_DIR or a promoted study'}")
    lines.append(f"  trials: {study.trials} ({len(study.arms)} arms x "
                 + (f"({study.search_trials} tuning + {len(study.seeds)} seeds))" if study.search
                    else f"{len(study.seeds)} seeds)"))
    if study.equivalence_margin is not None:
        lines.append(f"  equivalence margin: ±{study.equivalence_margin:g} ({study.metric})")
    if study.until_decided:
        lines += sequential_plan(study)
    lines += ["  checked:", *[f"    {line}" for line in checked]]
    return "\n".join(line for line in lines if line)


def sequential_plan(study: Study) -> list[str]:
    """A study run until decided, as a dry run shows it: its looks, weights, seed order and the
    Satterthwaite-p boundary of each look at Holm's strictest level."""
    design = design_for(study)
    strictest = [difference_threshold(design, look, 0) for look in range(len(design.looks))]
    return [f"  until decided: rounds at {', '.join(map(str, design.looks))} seeds (max {design.max_seeds}), "
            f"seed order {', '.join(map(str, design.seed_order))}; up to "
            f"{len(study.arms) * design.max_seeds} grid trials",
            f"    alpha {design.alpha:g} over the looks, weights {', '.join(f'{w:.3g}' for w in design.weights)}; "
            f"Satterthwaite-p boundary at Holm's strictest level (alpha/{design.arms}): "
            + ", ".join("no test" if b == 0 else f"{b:.3g}" for b in strictest)]


def _seed_range(seeds: tuple[int, ...]) -> str:
    return f"{seeds[0]}..{seeds[-1]}" if len(seeds) > 2 else ", ".join(map(str, seeds))


def check_options(address: str | None, max_concurrent: int | None, wait_for_resources: float) -> None:
    """The cluster options, before anything is loaded: an address Ray can take (no credential, a
    TCP port), at least one trial at a time, no negative wait."""
    capacity.check_options(max_concurrent, wait_for_resources)
    if address is not None:
        check_address(address)


def require_parent(study: Study, parent: str | None) -> None:
    """A phase 2-3 study (or a phase-1 extension) names the checkpoint it starts from, or the
    sweep is refused before its cluster starts."""
    if study.needs_parent and parent is None:
        stage = "a phase-1 extension" if study.spec.number == 1 else f"phase {study.phase}"
        raise UsageError(f"study {study.name} trains {stage} from a parent checkpoint: give --parent CKPT_DIR "
                         "(e.g. a promoted winner's checkpoint), or sweep a promoted study (RUN_DIR/next_study.py)")


@dataclass(frozen=True)
class Resolved:
    """What a sweep runs and where (`resolve`): the study at its budget scale, the storage root
    (remote: an object store every node reads through), the parent and what a lineage budget
    charges each arm, and, for a resumed run, its directory and record."""

    study: Study
    study_path: str | Path
    storage: str | Path
    storage_root: str
    remote: bool
    parent: str | None
    lineage: dict[str, dict[str, float]]
    run_dir: str | None = None
    record: dict[str, Any] | None = None
    pretrained: dict[str, Any] | None = None  # the pinned pretrained parent the arms descend from


@dataclass(frozen=True)
class Cluster:
    """The cluster a sweep runs on (`start_cluster`): trials at once and the GPU shares."""

    concurrency: int
    shares: GpuShares


def run_sweep(
    study_path: str | Path,
    *,
    storage: str | Path = "runs",
    address: str | None = None,
    parent: str | None = None,
    profile: str | None = None,
    resume: str | Path | None = None,
    max_concurrent: int | None = None,
    wait_for_resources: float = 0.0,
    progress: Callable[[str], None] = print,
    budget_scale: float = 1.0,
    verbose: bool = False,
    reuse: bool = True,
    until_decided: bool = False,
    max_seeds: int | None = None,
    equivalence_margin: float | None = None,
) -> Path:
    """Run every trial of the study file (at `budget_scale` times its budget, `Study.scaled`);
    returns the run directory.

    `reuse`: a grid trial already finished under the storage root with the same key (its
    config, parent, data and training code: `embedlab.sweep.reuse`) is copied, not trained.
    `until_decided` (or a study that declares it) runs seeds in rounds until every arm is
    decided or `max_seeds` are reached (`embedlab.sweep.rounds`); `equivalence_margin` sets the
    study's margin. A resumed run continues as it was started.

    `parent` (phases 2-3) is the checkpoint every arm starts from, e.g. a phase-1 winner.
    `resume` is an earlier run directory of the same study: its finished trials are kept
    and only the missing ones run. `max_concurrent` trials run at once (default: as many as
    the cluster's resources hold); on an autoscaling cluster that does not hold one trial
    of every arm yet, the sweep waits up to `wait_for_resources` seconds for its nodes
    (`embedlab.sweep.capacity`; 0 refuses at once). Ray Tune's own console output goes to the
    run directory's ray.log, and with `verbose` to the console too (`tune_output_to_log`).

    Named stages, each with a typed result: `resolve` the study, parent and run, `verify`
    every check that needs no cluster, `start_cluster`, `prepare` each arm's data and pass the
    gate, `record_run`, `score_references` (parent, teacher), then `launch` the trials. The
    run's wall time by stage (`embedlab.core.timing`) is this run's attempt in the study
    record, saved as each stage ends (`StudyTimes`)."""
    clock = timing.StageClock()
    with timing.timed(clock):
        resolved = resolve(study_path, storage=storage, parent=parent, profile=profile, resume=resume,
                           budget_scale=budget_scale, design=Sequential(until_decided, max_seeds, equivalence_margin),
                           progress=progress)
        verify(resolved, address=address, max_concurrent=max_concurrent, wait_for_resources=wait_for_resources,
               progress=progress)
        with timing.stage("cluster_start"):
            cluster = start_cluster(resolved, address=address, max_concurrent=max_concurrent,
                                    wait_for_resources=wait_for_resources, progress=progress)
        with timing.stage("data_preparation"):  # the gate's audits are charged to the audit
            prepared, overlap = prepare(resolved, progress)
        run_dir, record = record_run(resolved, prepared, overlap, progress, reuse=reuse)
        times = StudyTimes(run_dir, record, clock)
        with timing.stage("evaluation"):
            score_references(resolved, prepared, run_dir, record, cluster, progress)
        with tune_output_to_log(run_dir, progress, verbose=verbose) as shown:
            launch(resolved, prepared, run_dir, record, cluster, shown, reuse=reuse)
        times.save()
    return run_dir


class StudyTimes:
    """This run's attempt in its study record's wall time by stage (`timing.RECORD_KEY`: a
    resumed run's earlier attempts are kept and this one added), saved now, whenever one of
    `clock`'s outermost stages ends, and by `save`; each save also goes to the Ray dashboard."""

    def __init__(self, run_dir: str, record: dict[str, Any], clock: timing.StageClock) -> None:
        self.run_dir, self.record, self.clock = run_dir, record, clock
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        attempts = record.setdefault(timing.RECORD_KEY, [])
        self.index = len(attempts)
        attempts.append({})
        clock.on_change = self.save
        self.save()

    def save(self) -> None:
        from embedlab.core.telemetry import publish_stages  # here: Ray, which the record does not need

        breakdown = self.clock.breakdown()
        self.record[timing.RECORD_KEY][self.index] = {"started": self.started, **breakdown}
        write_json(store.join(self.run_dir, STUDY_FILE), self.record)
        publish_stages(store.name(self.run_dir), breakdown)


def add_to_last_attempt(run_dir: str | Path, breakdown: dict[str, float]) -> None:
    """Add `breakdown` (what a tour spends on a stage after its sweep: the table, promotion and
    release) to the last attempt of the study record's wall time by stage."""
    record = read_study_record(run_dir)
    attempts = record.get(timing.RECORD_KEY)
    if not attempts:
        return
    attempts[-1] = {**attempts[-1], **timing.add_breakdowns([attempts[-1], breakdown])}
    write_json(store.join(run_dir, STUDY_FILE), record)


DEFAULT_MAX_SEEDS = 8  # `--until-decided` without `--max-seeds` (nor a study's own)


@dataclass(frozen=True)
class Sequential:
    """What the command line asks of the study's seeds and verdicts: run until decided (to
    `max_seeds`, default the study's or `DEFAULT_MAX_SEEDS`), an equivalence margin."""

    until_decided: bool = False
    max_seeds: int | None = None
    equivalence_margin: float | None = None

    def apply(self, study: Study) -> Study:
        """`study` as asked; unchanged when nothing is asked."""
        if self.max_seeds is not None and not (self.until_decided or study.until_decided):
            raise UsageError("--max-seeds: only with --until-decided (or a study that runs until decided)")
        changes: dict[str, Any] = {}
        if self.until_decided or (study.until_decided and self.max_seeds is not None):
            changes.update(until_decided=True, max_seeds=self.max_seeds or study.max_seeds or DEFAULT_MAX_SEEDS)
        if self.equivalence_margin is not None:
            changes["equivalence_margin"] = self.equivalence_margin
        return dataclasses.replace(study, **changes) if changes else study

    @classmethod
    def of_record(cls, study: dict[str, Any]) -> Sequential:
        """What a run's recorded study asked (a resumed run continues as it started)."""
        return cls(bool(study.get("until_decided")), study.get("max_seeds"), study.get("equivalence_margin"))


def resolve(study_path: str | Path, *, storage: str | Path, parent: str | None, profile: str | None,
            resume: str | Path | None, budget_scale: float, design: Sequential = Sequential(),
            progress: Callable[[str], None] = lambda line: None) -> Resolved:
    """The study (with what `design` asks of its seeds and verdicts), its storage root, its
    parent (with what a lineage budget charges) and, on `resume`, the run it continues: refused
    when the study or the embedlab source changed (a resumed run keeps the sequential design it
    recorded unless `design` asks for another). A pretrained parent is materialised here and the
    arms moved onto its backbone (`embedlab.studies.study.resolve_parent`); on object storage it
    is published there."""
    store.check_location(resume if resume is not None else storage)  # no credentials in a location
    storage_root = store.parent(store.resolve(resume)) if resume is not None else store.resolve(storage)
    study = load_study(study_path, profile, budget_scale)
    run_dir = record = None
    if resume is not None:
        run_dir = store.resolve(resume)
        record = read_study_record(run_dir)
        if design == Sequential():
            design = Sequential.of_record(record["study"])
        parent = record["parent"] if parent is None else parent
    study = design.apply(study)
    if parent is None and study.needs_parent:
        parent = study.parent  # a promoted study names its parent itself
    # A pretrained parent is materialised, and moves the arms onto its backbone, before the
    # study's hash is compared: the recorded study is the one that ran.
    study, parent = resolve_parent(study, parent, progress)
    on_backbone = parent is not None and next(iter(study.arms.values())).model.pretrained
    if on_backbone and store.local_path(storage_root) is None and store.local_path(parent) is not None:
        parent = publish_parent(Path(parent), storage_root, progress)
        study = study.with_pretrained_parent(parent, pretrained_arms(parent))
    if resume is not None:
        if record["study_hash"] != study.hash:
            raise UsageError(
                f"{run_dir} holds study {record['study']['name']!r} (hash {record['study_hash'][:12]}), not "
                f"{study_path} as loaded now (hash {study.hash[:12]}): the study file or --profile changed; "
                "resume refused so the two are never mixed"
            )
        started = record.get("code")  # absent in runs from before code identities were recorded
        if started is not None and not code_identity.is_current(started):
            raise UsageError(
                f"{run_dir} was run by {code_identity.CodeIdentity(**started)}, this is {code_identity.current()}: "
                "the embedlab source changed since; resume refused so one table never mixes trials of two codes "
                "(start the study again, or resume with the code it started with)")
    lineage: dict[str, dict[str, float]] = {}
    pretrained = None
    if parent is not None:
        # Fail before any work on a missing or corrupt parent, or one whose FLOPs a
        # lineage-scoped budget needs and it does not record.
        manifest = verify_checkpoint(parent)
        lineage = study.lineage_budgets(manifest)
        pretrained = pretrained_lineage(manifest)
        parent = store.resolve(parent)
    return Resolved(study=study, study_path=study_path, storage=storage, storage_root=storage_root,
                    remote=store.local_path(storage_root) is None, parent=parent, lineage=lineage,
                    run_dir=run_dir, record=record, pretrained=pretrained)


def publish_parent(directory: Path, storage_root: str, progress: Callable[[str], None]) -> str:
    """A materialised pretrained parent copied to the sweep's object storage, where every node
    fetches it by URI (`local_checkpoint`); its content-addressed name is kept, and a copy
    already there is reused."""
    target = store.join(storage_root, "pretrained", directory.name)
    if not store.is_file(store.join(target, MANIFEST_FILE)):
        store.upload_tree(directory, target, last=MANIFEST_FILE)
        progress(f"parent: published to {target}")
    return target


def verify(resolved: Resolved, *, address: str | None, max_concurrent: int | None, wait_for_resources: float,
           progress: Callable[[str], None]) -> None:
    """Every check a dry run makes (`check_options`, `embedlab.sweep.preflight`), each Hub
    dataset resolved at its revision, and, for a local cluster, that this machine holds the
    study (its CPUs, GPUs and memory): before Ray starts and data are prepared."""
    check_options(address, max_concurrent, wait_for_resources)
    import ray  # here: Ray, which a dry run does not need

    local = address is None and not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    if local:
        # A local cluster would offer this machine: a study that cannot run here fails now,
        # naming the profile that can, before the memory check asks the same machine for
        # workers of a size it has no device for.
        check_fits(resolved.study_path, resolved.study, local_resources(), "this machine")
    resume = resolved.run_dir
    preflight(resolved.study, storage=None if resume is not None else resolved.storage, resume=resume,
              parent=resolved.parent, progress=progress, resolve_hub=True,
              nodes=(capacity.this_machine(),) if local else None)
    require_parent(resolved.study, resolved.parent)


def start_cluster(resolved: Resolved, *, address: str | None, max_concurrent: int | None,
                  wait_for_resources: float, progress: Callable[[str], None]) -> Cluster:
    """Join (or start) the cluster and wait, where allowed, until one trial of every arm fits."""
    import ray  # here: Ray, which a dry run does not need

    study = resolved.study
    # Every process of the job (not this driver) reads prepared data through the storage root.
    connect(address, progress, job_env={STORAGE_ENV: resolved.storage_root} if resolved.remote else None)
    where = f"the cluster at {store.redact(address)}" if address else "the cluster"
    concurrency, resources = capacity.wait_for_capacity(
        lambda present: check_fits(resolved.study_path, study, present, where,
                                   gpu_shares(study.arms, present, study.search)),
        ray.cluster_resources, needs=capacity.trial_needs(study.arms, study.search), timeout_s=wait_for_resources,
        max_concurrent=max_concurrent, progress=progress,
        request=lambda bundles: capacity.request_from_autoscaler(bundles, progress))
    shares = gpu_shares(study.arms, resources, study.search)
    if resources.get("GPU", 0):
        progress(f"ray: GPU shares: evaluator {shares.evaluator:g}, mining trial drivers {shares.mining_driver:g}"
                 if shares.evaluator else "ray: evaluation and mining encode on CPU: one trial's workers take "
                 f"every one of the cluster's {resources['GPU']:g} GPUs")
    progress(f"study {study.name} (phase {study.phase}, profile {study.profile or '-'}): {len(study.arms)} arms x "
             f"{len(study.seeds)} seeds at {study.budget_text} each")
    for arm, split in resolved.lineage.items():
        progress(f"budget: arm {arm} inherits {split['inherited_flops']:.4g} FLOPs with its weights and trains "
                 f"{split['phase_flops']:.4g} in phase {study.phase}")
    return Cluster(concurrency=concurrency, shares=shares)


def prepare(resolved: Resolved, progress: Callable[[str], None]) -> tuple[dict[str, dict], list[dict]]:
    """Each arm's prepared data (`embedlab.sweep.arm_data`), past the gate: the contamination
    audit of its phase-1 stages and pairs (the final-eval findings a disclosed policy allows are
    returned) and pair schedules the frozen pairs can fill; published to every node when the
    storage is remote."""
    study = resolved.study
    prepared = prepare_arms(study, progress)
    # A refused gate leaves the shared prepared directories as it found them (frozen pairs, card).
    with undone_on_refusal({Path(record["directory"]) for record in prepared.values()}, progress):
        overlap = check_contamination(study, prepared, progress)
        check_pair_schedules(study, prepared, resolved.parent)
    if resolved.remote:  # no shared disk: every node fetches the driver's prepared bytes by hash
        publish_prepared(prepared, resolved.storage_root, progress)
    return prepared, overlap


def record_run(resolved: Resolved, prepared: dict[str, dict], overlap: list[dict],
               progress: Callable[[str], None], *, reuse: bool = True) -> tuple[str, dict[str, Any]]:
    """The run directory and its study record (`study.json`, `prepared.json`): a new one, or the
    resumed run's. The record says whether the run reuses finished trials (`reuse`)."""
    study = resolved.study
    if resolved.run_dir is not None:
        run_dir, record = resolved.run_dir, dict(resolved.record)
    else:
        run_dir = new_run_dir(store.resolve(resolved.storage), study.name)
        record = {
            "schema": SCHEMA,
            "study": study.to_dict(),
            "arm_order": list(study.arms),  # the JSON below sorts keys; the study's order is kept here
            "study_hash": study.hash,
            "study_file": store.resolve(resolved.study_path),
            "study_source": store.read_text(resolved.study_path),
            "study_origin": str(study_origin(resolved.study_path)),
            "versions": versions(),
            "code": code_identity.current().to_dict(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "final_eval_overlap": overlap,
            "parent": resolved.parent,
            **({"lineage_budgets": resolved.lineage} if resolved.lineage else {}),
            "reuse": reuse,
            # only with a pretrained parent: what it is, pinned (`embedlab.checkpoints.pretrained`)
            **({"pretrained_parent": resolved.pretrained} if resolved.pretrained else {}),
        }
        write_json(store.join(run_dir, STUDY_FILE), record)
        write_json(store.join(run_dir, "prepared.json"), prepared)
    progress(f"results in {run_dir}")
    return run_dir, record


def score_references(resolved: Resolved, prepared: dict[str, dict], run_dir: str, record: dict[str, Any],
                     cluster: Cluster, progress: Callable[[str], None]) -> None:
    """The parent's scores under the same evaluator (gains and forgetting side by side) and a
    distilling study's teacher's, into the study record, once per run."""
    import ray  # here: Ray, which a dry run does not need

    from embedlab.evaluate.actor import get_evaluator  # here: Ray (the actor's module imports it)

    study, parent = resolved.study, resolved.parent
    # Created by this driver, so it outlives every trial; detached, it stays for later sweeps.
    evaluator = get_evaluator(num_gpus=cluster.shares.evaluator)
    if parent is not None and "parent_scores" not in record:
        arm = next(iter(study.arms))
        config = study.trial_config(arm, study.seeds[0], parent)
        directory = Path(prepared[arm]["directory"])
        scored = score_trial(
            lambda task_dir, retention_dir: ray.get(evaluator.evaluate.remote(
                parent, task_dir, config.eval.split, config.eval.index, retention_dir,
                max_length=config.eval.max_length, dims=config.eval.dims)),
            arm_eval_tasks(config.eval, prepared[arm]), config.eval.split, str(directory / "retention"))
        # Score columns only, as before panels: the evaluation's cost is the parent's, not a trial's.
        record["parent_scores"] = {k: v for k, v in scored.columns.items() if not k.startswith("compute/")}
        write_json(store.join(run_dir, STUDY_FILE), record)
        progress(f"parent {store.name(parent)}: {study.metric} {record['parent_scores'][study.metric]:.4f}")
    teacher = distilled_teacher(study.arms)
    if teacher is not None and "teacher_scores" not in record:
        # What the students are distilled from, on the main task's same split and queries.
        arm = next(iter(study.arms))
        config = study.arms[arm]
        _, task_dir = arm_eval_tasks(config.eval, prepared[arm])[0]
        progress(f"teacher {teacher}: scoring {config.eval.split} of the study's task as a reference")
        record["teacher_scores"] = score_teacher(teacher, task_dir, config.eval.split)
        write_json(store.join(run_dir, STUDY_FILE), record)
        progress(f"teacher {teacher}: {study.metric} {record['teacher_scores'].get(study.metric, float('nan')):.4f}")


def launch(resolved: Resolved, prepared: dict[str, dict], run_dir: str, record: dict[str, Any], cluster: Cluster,
           progress: Callable[[str], None], *, reuse: bool = True) -> None:
    """Optuna's tuning trials where the study searches, then the grid trials not yet done (every
    arm at every seed, or a study run until decided round by round: `embedlab.sweep.rounds`):
    each found finished under the storage root is copied (`reuse`), the rest run as Tune
    experiments, a phase 2-3 trial's data (negatives, teacher sets) built and gated first
    (`build_trial_data`), once, so trials only read it."""
    from ray import tune  # here: Ray, which a dry run does not need

    study = resolved.study
    # "code": every trial checks that it imported the code this driver runs (`driver.run_trial`).
    context = {"study": study.to_dict(), "prepared": prepared, "run_dir": run_dir, "parent": resolved.parent,
               "code": code_identity.current().to_dict()}
    driver = tune.with_resources(tune.with_parameters(trial_driver, context=context),
                                 _driver_resources(study, cluster.shares))
    rows = finished_rows(run_dir)
    if resolved.run_dir is not None:
        progress(resume_line(rows, study.trials) if not study.until_decided else
                 f"resume: {sum(_kept_on_resume(r) for r in rows)} finished trial(s) kept; the rounds continue "
                 "from the trials' data")
    best: dict[str, dict[str, Any]] = {arm: {} for arm in study.arms}
    if study.search:
        best = tune_arms(study, driver, run_dir, record, rows, cluster.concurrency, progress)
        write_json(store.join(run_dir, "search.json"), best)
    grid = Grid(resolved, prepared, run_dir, cluster, driver, best, reuse, progress)
    if study.until_decided:
        run_rounds(study, run_dir, grid.run, progress)
    else:
        grid.run([(arm, seed) for arm in study.arms for seed in study.seeds])


@dataclass(frozen=True)
class Grid:
    """Runs grid trials of a sweep: `run(pairs)` copies each (arm, seed) finished elsewhere
    under the storage root (with `reuse`), and fits the rest not yet done in this run."""

    resolved: Resolved
    prepared: dict[str, dict]
    run_dir: str
    cluster: Cluster
    driver: Any
    best: dict[str, dict[str, Any]]
    reuse: bool
    progress: Callable[[str], None]

    def run(self, pairs: list[tuple[str, int]]) -> None:
        from ray import tune  # here: Ray, which a dry run does not need

        study = self.resolved.study
        done = _done_grid_trials([r for r in finished_rows(self.run_dir) if _kept_on_resume(r)])
        todo = [self.entry(arm, seed) for arm, seed in pairs if (arm, seed) not in done]
        if self.reuse:
            todo = self.reused(todo)
        if todo:
            build_trial_data(self.resolved, self.prepared, todo, self.cluster.shares, self.progress)
            self.progress(f"tune: {len(todo)} trials, at most {self.cluster.concurrency} at a time")
            fit(self.driver, {"trial": tune.grid_search(todo)}, self.run_dir, "grid", self.cluster.concurrency,
                self.progress, study=study)

    def entry(self, arm: str, seed: int) -> dict[str, Any]:
        """A grid trial's Tune config, with its key (`embedlab.sweep.reuse.trial_key`)."""
        study, parent = self.resolved.study, self.resolved.parent
        trial = derive(study.trial_config(arm, seed, parent), self.best[arm])
        key = trial_key(trial, self.prepared[arm], _parent_hash(parent))
        return {"arm": arm, "seed": seed, "stage": "final", "params": self.best[arm], "key": key}

    def reused(self, todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Copy every trial of `todo` finished under the storage root; the rest, to train."""
        study, left, copied = self.resolved.study, [], 0
        for entry in todo:
            found = lookup(self.resolved.storage_root, entry["key"], study.metric)
            if found is None:
                left.append(entry)
                continue
            source, row = found
            copy_trial(source, row, self.run_dir, study, entry["arm"])
            copied += 1
            self.progress(f"reuse: trial final {entry['arm']} seed {entry['seed']}: finished in "
                          f"{store.name(source)} ({row['trial_id']}), same config, parent, data and code: copied")
        if copied:
            self.progress(f"reuse: {copied} of {len(todo)} trial(s) copied from earlier runs, {len(left)} to train")
        return left


@functools.cache
def _parent_hash(parent: str | None) -> str | None:
    return None if parent is None else read_manifest(parent)["content_hash"]


def build_trial_data(resolved: Resolved, prepared: dict[str, dict], todo: list[dict[str, Any]],
                     shares: GpuShares, progress: Callable[[str], None]) -> None:
    """Build and gate what each phase 2-3 grid trial in `todo` trains on
    (`embedlab.train.trial_data`) before any trial starts, so each set is made once and the
    trials find it: one trial's at a time, in a Ray task shaped like its own driver (its
    resources, a GPU share where it mines on a GPU cluster; published to every node as it is
    made). Charged to mining, less what each task measured of its audits and data preparation."""
    study = resolved.study
    trials = [(entry, derive(study.trial_config(entry["arm"], entry["seed"], resolved.parent), entry["params"]))
              for entry in todo]
    # A trial that makes no set reads the frozen pairs table the prepare stage built and gated.
    trials = [(entry, trial) for entry, trial in trials if makes_sets(trial)]
    if not trials:
        return
    from ray.util.queue import Queue  # here: Ray, which a dry run does not need

    progress(f"data: building and checking what {len(trials)} trial(s) train on, before any starts")
    lines = Queue()  # the task's progress lines, shown as they come: mining runs for minutes
    for entry, trial in trials:
        with timing.stage("mining"):
            measured = _build_sets(entry, trial, prepared[entry["arm"]], study.disclosed_overlap, shares, lines,
                                   progress)
        clock = timing.current()
        if clock is not None:  # the task's own split: its audits and data preparation
            clock.move("mining", {stage: measured[stage] for stage in ("audit", "data_preparation")})
    lines.shutdown()


def _build_sets(entry: dict[str, Any], trial: TrialConfig, prepared: dict, overlap_policy: str | None,
                shares: GpuShares, lines, progress: Callable[[str], None]) -> dict[str, float]:
    """One trial's sets, built by a Ray task (`embedlab.train.trial_data.build_trial_data`) whose
    lines go to `progress` as they come; returns the task's time by stage."""
    import ray  # here: Ray, which a dry run does not need

    wanted = trial_driver_resources(trial, shares)
    task = ray.remote(build_trial_data_task).options(num_cpus=wanted["CPU"], memory=wanted["memory"],
                                                     num_gpus=wanted.get("GPU", 0))
    done = task.remote(trial.to_dict(), prepared, overlap_policy, lines)
    finished = False
    while not finished:
        finished = bool(ray.wait([done], timeout=0.5)[0])
        while not lines.empty():  # named by its trial, as the trial's own lines are (`progress.TrialProgress`)
            progress(f"trial final {entry['arm']} seed {entry['seed']}: {lines.get()}")
    try:
        return ray.get(done)
    except ray.exceptions.RayTaskError as error:
        raise error.cause from None  # the task's own error (a ContaminationError, ...), not Ray's wrapper


def resume_line(rows: list[dict[str, Any]], trials: int) -> str:
    """What `--resume` keeps and runs, given the run directory's trial rows and the study's
    trial count. A failed grid row is counted as run again only if its (arm, seed) has no
    finished row: a trial that crashed and then finished (Tune's retry, or an orphaned worker
    that finished after its driver was killed) is done, and its failed row stays as a record."""
    kept = [r for r in rows if _kept_on_resume(r)]
    rerun = {(r["arm"], r["seed"]) for r in rows if not _kept_on_resume(r)} - _done_grid_trials(kept)
    return (f"resume: {len(kept)} finished trial(s) kept, {trials - len(kept)} to run"
            + (f" ({len(rerun)} failed grid trial(s) among them run again)" if rerun else ""))


def _done_grid_trials(kept: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(arm, seed) of each final-stage trial among the rows a resumed run keeps: the grid
    skips them, and the resume line does not count their failed rows as run again."""
    return {(r["arm"], r["seed"]) for r in kept if r.get("stage", "final") == "final"}


def _kept_on_resume(row: dict[str, Any]) -> bool:
    """Whether a resumed run keeps a trial's row as done. A failed grid trial (a crash, after
    Tune's retry) runs again; a nonfinite one would stop the same way, so it stays. Tuning
    trials all stay, failed ones too: each spent one of the arm's equal tuning budget."""
    return row.get("stage", "final") == "tune" or row.get("status") != "failed"


def _driver_resources(study: Study, shares: GpuShares):
    """Tune's resource request for `trial_driver`: a fixed dict without a mining share, else
    per trial, from the arm (and tuned values) in its config."""
    if not shares.mining_driver:
        return dict(TRIAL_DRIVER_RESOURCES)
    from ray import tune  # here: Ray, which a dry run does not need

    def request(config: dict[str, Any]):
        trial = derive(study.arms[config.get("trial", config)["arm"]], trial_params(config))
        return tune.PlacementGroupFactory([trial_driver_resources(trial, shares)])

    return request
