"""A tour's declaration: studies of consecutive phases, each winner promoted into the next study.

A tour file (`ablations/recipe.py`) defines `tour(profile) -> Tour`; `embedlab.sweep.tour` runs
one (`embedlab tour FILE`, and `make demo` on the demo profile).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from embedlab.core import paths
from embedlab.core.config import DEFAULT_MAX_RETENTION_DROP, ConfigError, check_fields
from embedlab.core.errors import UserError
from embedlab.studies.study import Study, load_study, run_user_code


@dataclass(frozen=True)
class Stage:
    """One study of the tour and the rule that promotes its winner."""

    study: str  # a study file, relative to the tour file
    # Absolute, in metric points: 0.10 lets a retention score end 0.10 below the parent's.
    max_retention_drop: float = DEFAULT_MAX_RETENTION_DROP
    metric: str = "dev/ndcg@10"

    def __post_init__(self) -> None:
        check_fields(self, "tour.stages")
        if self.max_retention_drop < 0:
            raise ConfigError(f"tour.stages.max_retention_drop: {self.max_retention_drop:g}: must be >= 0 "
                              "(absolute, in metric points)")


@dataclass(frozen=True)
class Tour:
    """Studies of consecutive phases under one profile, each stage's winner promoted into the next."""

    name: str
    stages: tuple[Stage, ...]
    profile: str
    description: str = ""


def load_tour(path: str | Path, profile: str | None = None) -> Tour:
    """Import a tour file and check that its stages load and train phases 1, 2, 3 in order."""
    path = paths.require_file(path, "tour file", suffixes=(".py",))
    spec = importlib.util.spec_from_file_location(f"embedlab_tour_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    run_user_code(path, lambda: spec.loader.exec_module(module))
    factory = getattr(module, "tour", None)
    if not callable(factory):
        raise ConfigError(f"{path}: defines no tour() function")
    tour = run_user_code(path, lambda: factory(profile) if profile is not None else factory())
    if not isinstance(tour, Tour) or not tour.stages:
        raise ConfigError(f"{path}: tour() must return an embedlab Tour with at least one stage")
    phases = [study.phase for study in load_stage_studies(path, tour)]
    if phases != list(range(phases[0], phases[0] + len(phases))):
        raise ConfigError(f"{path}: stages must train consecutive phases, got {phases}")
    return tour


def stage_path(tour_path: Path, stage: Stage) -> Path:
    return (Path(tour_path).parent / stage.study).resolve()


def load_stage_studies(path: str | Path, tour: Tour) -> list[Study]:
    """Every stage's study under the tour's profile; a stage that fails to load is named: in the
    one-line ConfigError of a study file that is missing or invalid, and as a note on the
    traceback of anything else its code raises."""
    studies = []
    for number, stage in enumerate(tour.stages, start=1):
        where = f"{path}: stage {number}/{len(tour.stages)} ({stage.study})"
        try:
            studies.append(load_study(stage_path(Path(path), stage), tour.profile))
        except (UserError, FileNotFoundError) as error:  # the cause kept: `embedlab --debug` shows it
            raise ConfigError(f"{where}: {error}") from error
        except Exception as error:
            error.add_note(f"while loading {where}")
            raise
    return studies
