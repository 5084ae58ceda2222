"""How a trial is scored (`EvalConfig`), and promotion's retention margin by default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedlab.core.config.checks import (
    ConfigError, build_config, check, check_fields, check_positive, read_mapping_file,
)
from embedlab.core.config.tasks import HubTask, PanelError, check_task_names

# Promotion's retention margin when a study or tour stage names none: absolute, in metric
# points (0.10 lets a retention score end 0.10 below the parent's, not 10% below it).
DEFAULT_MAX_RETENTION_DROP = 0.05


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How a trial is scored: the built-in retrieval task, on recipe-dev qrels only.

    `task` is the main task: a built-in task name or a BEIR directory, scored into the row's
    plain `<split>/...` columns. `tasks` (built-in names or BEIR directories) and `hub_tasks`
    (`embedlab.tasks.hub_tasks.HubTask`: a BEIR/MTEB-layout dataset pinned by revision)
    add a panel: every trial is then scored on the main task and each of these too, into
    `<task name>/<split>/...` columns for every task (the main one included) and their
    unweighted means `mean/<split>/...` (`embedlab.evaluate.panel`). Empty (the default): a
    single task, and rows, tables and records exactly as without panels. Task names (a
    directory's folder name, a built-in's or a Hub task's `name`) must be distinct, without
    "/", and not "mean". `dims` (increasing widths, each below `model.width`) scores the main
    task at each width too, on embeddings truncated to it and re-normalised, into
    `<split>/dim<width>/<metric>` columns and per-query values (a study metric can name one).
    """

    task: str = "python-docstrings"
    tasks: tuple[str, ...] = ()
    hub_tasks: tuple[HubTask, ...] = ()
    split: str = "dev"
    batch_size: int = 64
    max_length: int = 128
    index: str = "flat"  # Faiss index: exact "flat", or approximate "ivf" / "hnsw" for large corpora
    dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        dims = tuple(self.dims)
        check(all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
              and list(dims) == sorted(set(dims)), "eval.dims",
              f"{list(dims)}: positive integer widths in increasing order, each once")
        object.__setattr__(self, "dims", dims)
        check(isinstance(self.tasks, tuple) and all(isinstance(t, str) and t for t in self.tasks), "eval.tasks",
              f"must be a tuple of task names or BEIR directories, got {self.tasks!r}")
        check(isinstance(self.hub_tasks, tuple) and all(isinstance(t, HubTask) for t in self.hub_tasks),
              "eval.hub_tasks", "must be a tuple of HubTask")
        check_fields(self, "eval")
        check(self.split in ("dev", "test"), "eval.split", "must be 'dev' or 'test'")
        check(self.index in ("flat", "ivf", "hnsw"), "eval.index", f"{self.index!r}; valid: flat, ivf, hnsw")
        check_positive(self, "eval", "batch_size")
        check(self.max_length >= 8, "eval.max_length", "must be >= 8")
        check(isinstance(self.tasks, tuple) and all(isinstance(t, str) and t for t in self.tasks), "eval.tasks",
              f"must be a tuple of task names or BEIR directories, got {self.tasks!r}")
        check(isinstance(self.hub_tasks, tuple) and all(isinstance(t, HubTask) for t in self.hub_tasks),
              "eval.hub_tasks", "must be a tuple of HubTask")
        if self.panel:
            try:
                check_task_names(self.task_names)
            except PanelError as error:
                raise ConfigError(f"eval.tasks: {error} (names: {list(self.task_names)})") from None

    @classmethod
    def from_file(cls, path: str | Path) -> EvalConfig:
        """An EvalConfig from a TOML or JSON file of its fields (a panel's tasks and Hub tasks)."""
        return build_config(cls, read_mapping_file(path), "eval")

    @property
    def panel(self) -> bool:
        """Whether the trial is scored on a panel of tasks (`tasks` or `hub_tasks` set)."""
        return bool(self.tasks or self.hub_tasks)

    @property
    def task_names(self) -> tuple[str, ...]:
        """The name of every task scored, the main task first, then `tasks`, then `hub_tasks`."""
        return (*map(task_name, (self.task, *self.tasks)), *(spec.name for spec in self.hub_tasks))


def task_name(task: str) -> str:
    """The name a task is loaded under (`beir.load_task`): a built-in's name, a BEIR directory's
    folder name (of its resolved path, so "." names the current folder)."""
    path = Path(task)
    return path.resolve().name if path.is_dir() else path.name
