"""A tour: studies of consecutive phases, each winner promoted into the next study.

A tour file (`ablations/recipe.py`) defines `tour(profile) -> Tour`; `embedlab tour FILE`
(and `make demo`, on the demo profile) runs each stage's study, prints its table, promotes
its winner on recipe-dev under the stage's retention margin, and starts the next stage from
the promoted checkpoint. The last winner is exported as an inference release.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from embedlab.config import ConfigError
from embedlab.sweep import store
from embedlab.sweep.study import load_study


@dataclass(frozen=True)
class Stage:
    """One study of the tour and the rule that promotes its winner."""

    study: str  # a study file, relative to the tour file
    max_retention_drop: float = 0.05
    metric: str = "dev/ndcg@10"


@dataclass(frozen=True)
class Tour:
    name: str
    stages: tuple[Stage, ...]
    profile: str
    description: str = ""


def load_tour(path: str | Path, profile: str | None = None) -> Tour:
    """Import a tour file and check that its stages load and train phases 1, 2, 3 in order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tour file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"embedlab_tour_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    factory = getattr(module, "tour", None)
    if not callable(factory):
        raise ConfigError(f"{path}: defines no tour() function")
    tour = factory(profile) if profile is not None else factory()
    if not isinstance(tour, Tour) or not tour.stages:
        raise ConfigError(f"{path}: tour() must return an embedlab Tour with at least one stage")
    phases = [load_study(stage_path(path, stage), tour.profile).phase for stage in tour.stages]
    if phases != list(range(phases[0], phases[0] + len(phases))):
        raise ConfigError(f"{path}: stages must train consecutive phases, got {phases}")
    return tour


def stage_path(tour_path: Path, stage: Stage) -> Path:
    return (Path(tour_path).parent / stage.study).resolve()


def run_tour(
    path: str | Path,
    *,
    profile: str | None = None,
    storage: str | Path = "runs",
    address: str | None = None,
    show: Callable[[Path], None] = lambda run_dir: None,
    progress: Callable[[str], None] = print,
) -> list[Path]:
    """Run every stage, promoting between them; returns the stages' run directories."""
    from embedlab.sweep.promote import NEXT_STUDY_FILE, PromotionError, promote
    from embedlab.sweep.run import run_sweep

    tour = load_tour(path, profile)
    run_dirs: list[Path] = []
    study_file = stage_path(Path(path), tour.stages[0])
    for index, stage in enumerate(tour.stages):
        progress(f"\n== tour {tour.name} ({tour.profile}): stage {index + 1}/{len(tour.stages)}: {store.name(study_file)}")
        run_dir = run_sweep(study_file, storage=storage, address=address,
                            profile=tour.profile if index == 0 else None, progress=progress)
        run_dirs.append(run_dir)
        show(run_dir)
        following = tour.stages[index + 1] if index + 1 < len(tour.stages) else None
        rule = dict(metric=stage.metric, max_retention_drop=stage.max_retention_drop,
                    next_study=stage_path(Path(path), following) if following else None, progress=progress)
        try:
            promotion = promote(run_dir, **rule)
        except PromotionError as error:
            # The dev winner broke the margin: say so, and carry on with the best arm within
            # it when there is one (the refusal names it), so the tour shows what follows.
            progress(f"promote: refused: {error}")
            if "--arm " not in str(error):
                raise
            promotion = promote(run_dir, arm=str(error).rsplit("--arm ", 1)[1].rstrip(")"), **rule)
        if following is None:
            from embedlab.release import export_release

            release = Path(run_dir) / "release"
            export_release(Path(promotion["checkpoint"]), release)
            progress(f"release: {release} (SentenceTransformer({str(release)!r}, trust_remote_code=True) loads it)")
        else:
            study_file = store.join(run_dir, NEXT_STUDY_FILE)
    return run_dirs
