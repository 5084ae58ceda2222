"""A tour: studies of consecutive phases, each winner promoted into the next study.

A tour file (`ablations/recipe.py`) defines `tour(profile) -> Tour`; `embedlab tour FILE`
(and `make demo`, on the demo profile) runs each stage's study, prints its table, promotes
its winner on recipe-dev under the stage's retention margin, and starts the next stage from
the promoted checkpoint. The last winner is exported as an inference release.
`embedlab tour FILE --dry-run` prints each stage's study plan instead (`dry_run_tour`),
starting nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from embedlab.core import store, timing
from embedlab.core.errors import UsageError
from embedlab.sweep.promote import NEXT_STUDY_FILE, RetentionMarginError, packaged_ablations, promote
from embedlab.studies.tour import Stage, load_stage_studies, load_tour, stage_path

DEMO_TOUR = "recipe.py"  # `make demo`'s tour file, in the repository's ablations/


def dry_run_tour(path: str | Path, profile: str | None = None, *, storage: str | Path | None = None,
                 address: str | None = None, max_concurrent: int | None = None,
                 wait_for_resources: float = 0.0) -> str:
    """What `embedlab tour` would run, stage by stage, without starting Ray or touching data:
    each stage's study plan (`embedlab.sweep.run.dry_run`, under the tour's profile, with every
    check a sweep's dry run makes: `storage` and the cluster options among them) and how its
    winner is promoted. Stages after the first start from the previous stage's winner, which
    exists only once that stage has run."""
    from embedlab.sweep.run import check_options, dry_run  # here: torch and Ray, which loading a tour does not need

    check_options(address, max_concurrent, wait_for_resources)
    tour = load_tour(path, profile)
    blocks = [f"tour {tour.name} ({path}), profile {tour.profile}: {len(tour.stages)} stages"
              + (f"\n  {tour.description}" if tour.description else "")]
    for number, (stage, study) in enumerate(zip(tour.stages, load_stage_studies(path, tour)), start=1):
        parent = None if number == 1 else (f"the winner promoted from stage {number - 1} "
                                            f"({tour.stages[number - 2].study}), known once that stage has run")
        plan = dry_run(stage_path(Path(path), stage), profile=tour.profile, parent=parent,
                       check_parent=number == 1, storage=storage)
        header = f"== stage {number}/{len(tour.stages)}: {stage.study}"
        has_parent = number > 1 or study.needs_parent or study.parent is not None
        last = number == len(tour.stages)
        blocks.append(f"{header}\n{plan}\n{promotion_plan(stage, has_parent, last)}")
    return "\n\n".join(blocks)


def promotion_plan(stage: Stage, has_parent: bool, last: bool) -> str:
    """How a stage's winner is chosen (the retention margin only where there is a parent to
    retain) and where it goes next."""
    rule = f"  promotion: best arm by mean {stage.metric} over seeds (recipe-dev)"
    if has_parent:
        rule += (f"; an arm whose mean over seeds of a retention metric falls more than "
                 f"{stage.max_retention_drop:g} (absolute, metric points) below the parent's is refused, "
                 "and the best-ranked arm within that margin promoted instead")
    following = ("is exported as the release (RUN_DIR/release)" if last
                 else "becomes every arm's parent in the next stage")
    return f"{rule}\n  then: the winner's checkpoint {following}"


def run_tour(
    path: str | Path,
    *,
    profile: str | None = None,
    storage: str | Path = "runs",
    address: str | None = None,
    max_concurrent: int | None = None,
    wait_for_resources: float = 0.0,
    show: Callable[[Path], None] = lambda run_dir: None,
    progress: Callable[[str], None] = print,
    verbose: bool = False,
    reuse: bool = True,
) -> list[Path]:
    """Run every stage, promoting between them; returns the stages' run directories.
    `max_concurrent`, `wait_for_resources`, `verbose` and `reuse` go to each stage's `run_sweep`.
    Every stage's checks that need no cluster run first (`dry_run_tour`), so a tour whose third
    stage reads a missing file stops before its first stage trains. What a stage spends after
    its sweep (its table, promotion, release) joins its study record's wall time by stage, and
    the tour ends with a line of its whole wall time by stage (`timing.text`)."""
    from embedlab.sweep.run import add_to_last_attempt, run_sweep  # here: torch and Ray, which loading a tour does not need

    started = time.monotonic()
    dry_run_tour(path, profile, storage=storage, address=address, max_concurrent=max_concurrent,
                 wait_for_resources=wait_for_resources)
    tour = load_tour(path, profile)
    run_dirs: list[Path] = []
    study_file = stage_path(Path(path), tour.stages[0])
    for index, stage in enumerate(tour.stages):
        progress(f"\n== tour {tour.name} ({tour.profile}): stage {index + 1}/{len(tour.stages)}: {store.name(study_file)}")
        run_dir = run_sweep(study_file, storage=storage, address=address,
                            profile=tour.profile if index == 0 else None, max_concurrent=max_concurrent,
                            wait_for_resources=wait_for_resources, progress=progress, verbose=verbose, reuse=reuse)
        run_dirs.append(run_dir)
        after = timing.StageClock()
        with timing.timed(after):
            show(run_dir)
            following = tour.stages[index + 1] if index + 1 < len(tour.stages) else None
            with timing.stage("promotion"):
                study_file = promote_and_release(run_dir, stage, following, path, progress)
        add_to_last_attempt(run_dir, after.breakdown())
    progress(f"tour time: {timing.text(tour_breakdown(run_dirs, time.monotonic() - started))}")
    return run_dirs


def tour_breakdown(run_dirs: list[Path], wall: float) -> dict[str, float]:
    """A tour's `wall` seconds by stage: its stages' last attempts (each sweep, its table and
    promotion, as their study records hold them) summed, and the tour's own checks and loading
    in "other"."""
    from embedlab.stats.table import read_study_record  # here: pandas, which loading a tour does not need

    return timing.within(wall, [read_study_record(run_dir)[timing.RECORD_KEY][-1] for run_dir in run_dirs])


def promote_and_release(run_dir: Path, stage: Stage, following: Stage | None, path: str | Path,
                        progress: Callable[[str], None]) -> str | None:
    """Promote the stage's winner; export it as the release after the last stage. Returns the
    next stage's study file (the promoted one), None after the last."""
    rule = dict(metric=stage.metric, max_retention_drop=stage.max_retention_drop,
                next_study=stage_path(Path(path), following) if following else None, progress=progress)
    promotion = promote_stage(run_dir, rule)
    if following is not None:
        return store.join(run_dir, NEXT_STUDY_FILE)
    from embedlab.release.export import export_release_to  # here: torch, which loading a tour does not need

    release = store.join(run_dir, "release")
    export_release_to(promotion["checkpoint"], release)
    loads = (f"SentenceTransformer({release!r}, trust_remote_code=True) loads it" if store.local_path(release)
             else "copy it to a local directory for SentenceTransformer to load it")
    progress(f"release: {release} ({loads})")
    return None


def promote_stage(run_dir: str | Path, rule: dict) -> dict:
    """Promote a stage's winner under `rule` (`promote`'s keyword arguments, `progress`
    among them). When the dev winner breaks the retention margin, say so and carry on with
    the best arm within it (the refusal's `within_margin`), so the tour shows what follows;
    with no arm within it, the refusal stands."""
    try:
        return promote(run_dir, **rule)
    except RetentionMarginError as refusal:
        rule.get("progress", print)(f"promote: refused: {refusal}")
        if refusal.within_margin is None:
            raise
        return promote(run_dir, **{**rule, "arm": refusal.within_margin})


def find_demo_tour(ablations: str | Path | None = None) -> Path:
    """The demo's tour file: `ablations/recipe.py` in the directory given (--ablations), else in
    the installed checkout's `ablations/` (beside `platform/`, wherever the command runs from),
    else in the working directory's. UsageError naming where it looked when none has it."""
    places = [Path(ablations)] if ablations is not None else [packaged_ablations(), Path.cwd() / "ablations"]
    found = next((place / DEMO_TOUR for place in places if (place / DEMO_TOUR).is_file()), None)
    if found is None:
        raise UsageError(f"the demo's study files ({DEMO_TOUR} and the studies it names) are not in "
                         f"{' or '.join(str(p) for p in dict.fromkeys(places))}; point at the repository's "
                         "ablations/ directory with `embedlab demo --ablations DIR`")
    return found
