"""The configs of evaluation tasks: `HubTask`, a retrieval task on the Hugging Face Hub
(`embedlab.tasks.hub_tasks` loads it), and the rule for a panel's task names, each of which
prefixes its task's columns (`embedlab.evaluate.panel`).

Configs only: the standard library, `embedlab.core.errors` and the BEIR layout's constants.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from embedlab.core.beir import REQUIRED_SPLIT
from embedlab.core.errors import UserError


class HubTaskError(UserError, ValueError):
    """A Hub task cannot be loaded or materialised; the message names the dataset, config and row."""


@dataclass(frozen=True)
class HubTask:
    """A BEIR/MTEB-layout retrieval task on the Hugging Face Hub (or in a local directory in its layout).

    `revision` is required (`embedlab.tasks.hub_tasks` says what it means for a local
    directory). `qrels_dataset` is None when the qrels are a config of `dataset`; a separate
    qrels dataset is a separate repository with its own history, so it needs its own
    `qrels_revision`. `splits` are the qrels splits to read (None: all of them; "test" is
    required either way). `dev_fraction` (with `dev_seed`) derives a dev split from the train
    qrels when the dataset has no dev split (`hub_tasks.derive_dev_split`); a dataset's own dev split is
    kept as it is.
    """

    name: str
    dataset: str
    revision: str
    corpus_config: str = "corpus"
    queries_config: str = "queries"
    qrels_dataset: str | None = None
    qrels_config: str = "default"
    splits: tuple[str, ...] | None = None
    qrels_revision: str | None = None
    corpus_split: str | None = None
    queries_split: str | None = None
    dev_fraction: float | None = None
    dev_seed: int = 0

    def __post_init__(self) -> None:
        where = f"hub task {self.name!r}"
        if not self.name or any(c in self.name for c in "/\\\t\r\n") or self.name.startswith("."):
            raise HubTaskError(f"{where}: the name must be a plain folder name (it names the task's folder)")
        if not (self.dataset or "").strip():
            raise HubTaskError(f"{where}: dataset must be a Hub dataset id or a local directory")
        _check_revision(where, self.dataset, self.revision, "revision")
        if self.qrels_dataset is not None and self.qrels_dataset != self.dataset:
            _check_revision(where, self.qrels_dataset, self.qrels_revision, "qrels_revision")
        elif self.qrels_revision is not None and self.qrels_revision != self.revision:
            raise HubTaskError(
                f"{where}: qrels_revision is only for a separate qrels_dataset; the qrels config of "
                f"{self.dataset!r} is read at `revision` ({self.revision!r})"
            )
        if self.splits is not None:
            splits = tuple(self.splits)  # a list from a config file is accepted, and stored hashable
            object.__setattr__(self, "splits", splits)
            if len(set(splits)) != len(splits) or REQUIRED_SPLIT not in splits:
                raise HubTaskError(
                    f"{where}: splits {list(splits)} must be distinct and include {REQUIRED_SPLIT!r} "
                    "(every BEIR task has a test split); leave splits unset to read every qrels split"
                )
        if self.dev_fraction is not None:
            check_fraction(where, self.dev_fraction)
        if isinstance(self.dev_seed, bool) or not isinstance(self.dev_seed, int) or not 0 <= self.dev_seed < 2**32:
            raise HubTaskError(f"{where}: dev_seed must be an integer in [0, 2**32), got {self.dev_seed!r}")

    @property
    def qrels_source(self) -> tuple[str, str]:
        """(dataset, requested revision) the qrels are read from."""
        if self.qrels_dataset is None or self.qrels_dataset == self.dataset:
            return self.dataset, self.revision
        return self.qrels_dataset, str(self.qrels_revision)


def _check_revision(where: str, dataset: str, revision: str | None, field_name: str) -> None:
    if not (revision or "").strip():  # None too: it is what an unset config value reads as
        raise HubTaskError(
            f"{where}: dataset {dataset!r} needs a {field_name} (a commit sha or tag on the Hub; "
            "for a local directory, its local_dataset_revision): without one the Hub serves whatever "
            "the default branch holds today, so the task could change between runs without anything saying so"
        )


def check_fraction(where: str, fraction: float) -> None:
    """A dev-split fraction strictly between 0 and 1, else HubTaskError naming `where`."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise HubTaskError(f"{where}: dev fraction must be a number strictly between 0 and 1, got {fraction!r}")

MEAN = "mean"


class PanelError(UserError, ValueError):
    """A panel cannot be scored: bad task names, or a metric some task did not report."""


def check_task_names(names: Iterable[str]) -> list[str]:
    """The names as a list, after checking they can prefix panel columns unambiguously."""
    names = list(names)
    if not names:
        raise PanelError("a panel needs at least one task")
    for name in names:
        if not name or "/" in name or name == MEAN:
            raise PanelError(f"task name {name!r} cannot name panel columns: it must be non-empty, without '/', "
                             f"and not {MEAN!r} (the mean's prefix)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PanelError(f"task names repeat in the panel: {', '.join(repeated)}; each task's columns need their own prefix")
    return names
