"""Studies: a controlled ablation declared as arms derived from one base recipe.

A study file in `ablations/` defines `study() -> Study`. Every arm is a `TrialConfig`; the
study names the factor it varies (a dotted config path such as `masking.ratio`), and
construction refuses arms that differ anywhere else, so a comparison is controlled by
construction. The budget and the seeds belong to the study, not to the arms: every arm
trains to the same measured budget under the same seeds.

Tuning runs at its own seeds (`Study.tuning_seeds`, from `TUNING_SEED_OFFSET` up), never at
a study seed: the tuning trial Optuna picks is the best of several noisy draws, so its value
is biased upward (the winner's curse), and a final trial at the same seed would repeat it
and carry that bias into the reported mean. Reported numbers come from the study seeds only.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import inspect
import json
import math
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedlab.core import config as config_module, paths, store
from embedlab.core.config import Budget, ConfigError, PhaseSpec, TrialConfig, check_fields, check_seed, phase_spec
from embedlab.core.errors import StudyCodeError, UnknownKey, UserError
from embedlab.core.schema import FLAT_BUDGET_KEYS, upgrade
from embedlab.evaluate.panel import METRICS, UnknownPanelMetric, resolve_study_metric
from embedlab.studies.recipes import derive, on_backbone

# Tuning trial k of every arm runs at seed TUNING_SEED_OFFSET + k: the same seeds for every
# arm (equal tuning conditions), and far from the small seeds studies use (0, 1, 2).
TUNING_SEED_OFFSET = 10_000
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# A study run until decided tests from 4 seeds on (`embedlab.stats.sequential.EFFICACY_MIN_SEEDS`,
# held equal to it by tests/test_sequential.py), so it must be able to reach them.
MIN_MAX_SEEDS = 4
# Config paths a search may not touch: the factor is what the study compares, and the
# budget and seed belong to the study, so tuning them would break equal compute.
_BUDGET_PATHS = tuple(f"train.budget.{f.name}" for f in dataclasses.fields(Budget))
_UNSEARCHABLE = (*_BUDGET_PATHS, "train.seed", "parent", "phase")


@dataclass(frozen=True)
class Search:
    """One nuisance hyperparameter Optuna tunes per arm: a float range (log-uniform when
    `log`), or a categorical over `choices`."""

    path: str  # a dotted config path, e.g. "train.learning_rate"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple = ()

    def __post_init__(self) -> None:
        check_fields(self, f"study.search[{self.path!r}]")

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "low": self.low, "high": self.high, "log": self.log, "choices": list(self.choices)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Search:
        return cls(path=raw["path"], low=raw["low"], high=raw["high"], log=raw["log"], choices=tuple(raw["choices"]))


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


def _width_metric(metric: str) -> int | None:
    """The width of a truncated-width metric ("dev/dim32/ndcg@10" -> 32), else None."""
    split, _, rest = metric.partition("/")
    head, _, name = rest.partition("/")
    if not (head.startswith("dim") and head[3:].isdigit() and f"{split}/{name}" in METRICS):
        return None
    return int(head[3:])


@dataclass(frozen=True, kw_only=True)
class Study:
    """Arms x seeds at one measured budget, ranked by `metric` on recipe-dev.

    `budget` (`Budget`) is what every trial trains to, stamped on every arm's config by
    `trial_config`; its unit (`Budget.unit`) is measured training `flops` (`budget.flops`;
    the unit whenever it is set, and what every shipped study declares through
    `recipes.budget_for`), `device_seconds` (`budget.device_seconds`: device time summed over
    a trial's workers), or a data unit: consumed non-padding `tokens` (phase 1 without a FLOPs
    budget) or positive `pairs` (phases 2-3 without one), whose tables then say the arms are
    data-matched and by how much their FLOPs differ. `search` names nuisance
    hyperparameters that Optuna tunes with `search_trials` trials for every arm (equal tuning
    effort) at `tuning_seeds`; each arm's `seeds` then run with that arm's best values.
    `profile` records the sizes the file was built at.

    `budget.scope` "lineage" (phases 2-3, a FLOPs budget) makes `budget.flops` the total over
    each arm's lineage: an arm that starts from the parent's weights is charged the parent's
    measured training FLOPs and trains the rest, one that starts from a random initialisation
    trains it all (`lineage_budgets`); tables then match the arms on `budget/total_flops`.
    "phase" counts each trial's own training only.

    `until_decided` runs the seeds in rounds to `max_seeds`, each arm until it is decided
    (`embedlab.stats.sequential`); `equivalence_margin` (metric units) adds the question of
    whether an arm's difference lies inside plus or minus it. Both enter `to_dict` and the
    hash only when set.
    """

    name: str
    factor: str
    arms: dict[str, TrialConfig]
    seeds: tuple[int, ...]
    budget: Budget
    metric: str = "dev/ndcg@10"
    description: str = ""
    search: tuple[Search, ...] = ()
    search_trials: int = 0
    profile: str = ""
    # A disclosed-overlap policy: when the contamination audit finds final-eval items in the
    # training data, training is refused unless this says how the overlap is handled; it is
    # then printed with every table.
    disclosed_overlap: str | None = None
    # Trials score the final-eval split (eval.split "test") only in a study that says it is a
    # final report: selection and tuning read recipe-dev, and a sweep scoring test on every
    # trial would let the test split choose.
    final_report: bool = False
    # Seeds until decided (`embedlab.stats.sequential`): `seeds` are the first round, and the
    # arms not yet decided get rounds of more seeds, up to `max_seeds`.
    until_decided: bool = False
    max_seeds: int | None = None
    # The smallest difference that matters, in metric units: an arm whose difference is shown
    # to lie inside plus or minus it is "equivalent within ±margin" (two one-sided tests).
    equivalence_margin: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, "study")  # first: every later check reads arms that are TrialConfigs, seeds that are ints
        object.__setattr__(self, "seeds", tuple(self.seeds))
        for seed in self.seeds:
            check_seed(seed, "study.seeds")
        if not _NAME.match(self.name):
            raise ConfigError(f"study.name: {self.name!r} must match {_NAME.pattern}")
        if len(self.arms) < 2:
            raise ConfigError("study.arms: a controlled comparison needs at least 2 arms")
        on_test = [arm for arm, config in self.arms.items() if config.eval.split == "test"]
        if on_test and not self.final_report:
            raise ConfigError(
                f"study.arms: {', '.join(on_test)} score eval.split 'test', the final-eval split, on every trial; "
                "selection reads recipe-dev (eval.split 'dev') and promotion scores test once for the winner. "
                "A study that only reports test scores says so with final_report=True")
        for arm in self.arms:
            if not _NAME.match(arm):
                raise ConfigError(f"study.arms: arm name {arm!r} must match {_NAME.pattern}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"study.seeds: must be non-empty and distinct, got {self.seeds}")
        if len({c.phase for c in self.arms.values()}) != 1:
            raise ConfigError("study.arms: all arms must train the same phase")
        if self.disclosed_overlap is not None and not self.disclosed_overlap.strip():
            raise ConfigError("study.disclosed_overlap: must say what the policy is, or be None")
        self._check_metric()
        self._check_sequential()
        # The Budget checked its own values (a FLOPs budget for 'lineage' among them); the
        # phase is the study's. Its unit is derived from it (`Budget.unit`), so phase 1 never
        # trains on pairs and a FLOPs or device-time amount is set exactly when it is the unit.
        if self.budget.scope == "lineage" and not self.spec.from_parent:
            raise ConfigError("study.budget.scope: 'lineage' adds a parent's training FLOPs to its children's, so "
                              "it needs a phase-2 or phase-3 study with a FLOPs budget")
        self._check_controlled()
        self._check_search()
        self._check_tuning_seeds()
        self._check_budget()

    def _check_metric(self) -> None:
        """`metric` is one of `METRICS` (the main task's) or, when the arms score a panel of
        tasks (`EvalConfig.tasks`, `hub_tasks`), "<task>/<metric>" or "mean/<metric>"
        (`embedlab.evaluate.panel.resolve_study_metric`); every arm must score the same panel."""
        panels = {config.eval.task_names for config in self.arms.values()}
        if len(panels) != 1 and any(config.eval.panel for config in self.arms.values()):
            raise ConfigError(f"study.arms: arms score different task panels {sorted(panels)}; a comparison needs "
                              "every arm scored on the same tasks")
        if self.metric in METRICS:
            return
        width = _width_metric(self.metric)
        if width is not None:  # "dev/dim32/ndcg@10": a width every arm scores (`EvalConfig.dims`)
            missing = [arm for arm, config in self.arms.items() if width not in config.eval.dims]
            if missing:
                raise ConfigError(f"study.metric: {self.metric!r} is scored at width {width}, which arms {missing} "
                                  "do not list in eval.dims")
            return
        names = panels.pop()
        if len(panels) > 0 or len(names) == 1:
            raise ConfigError(f"study.metric: {self.metric!r}; valid: {list(METRICS)}")
        try:
            resolve_study_metric(self.metric, names, METRICS)
        except UnknownPanelMetric as error:
            raise ConfigError(f"study.metric: {error.args[0]}; or the main task's plain {', '.join(METRICS)}") from None

    def _check_sequential(self) -> None:
        if self.until_decided:
            if not isinstance(self.max_seeds, int) or self.max_seeds < max(MIN_MAX_SEEDS, len(self.seeds) + 1):
                raise ConfigError(
                    f"study.max_seeds: {self.max_seeds!r}; a study run until decided needs more seeds than its first "
                    f"round's {len(self.seeds)}, and at least {MIN_MAX_SEEDS} (the first seed count a look tests at)")
        elif self.max_seeds is not None:
            raise ConfigError("study.max_seeds: only a study run until decided (until_decided=True) has a maximum")
        margin = self.equivalence_margin
        if margin is not None and not (isinstance(margin, (int, float)) and 0 < margin < 1):
            raise ConfigError(f"study.equivalence_margin: {margin!r}; a difference in metric units, between 0 and 1")

    def _check_controlled(self) -> None:
        flat = {arm: flatten(config.to_dict()) for arm, config in self.arms.items()}
        if self.factor not in next(iter(flat.values())) and not any(
            key.startswith(f"{self.factor}.") for key in next(iter(flat.values()))
        ):
            raise ConfigError(f"study.factor: {self.factor!r} is not a config path")
        first_arm, reference = next(iter(flat.items()))
        varied = False
        for arm, values in flat.items():
            for key, value in values.items():
                if value == reference[key]:
                    continue
                if key == self.factor or key.startswith(f"{self.factor}."):
                    varied = True
                elif key not in (*_BUDGET_PATHS, "train.seed", "parent"):
                    raise ConfigError(
                        f"study.arms[{arm!r}]: differs from arm {first_arm!r} in {key} "
                        f"({value!r} vs {reference[key]!r}), outside the declared factor {self.factor}"
                    )
        if not varied:
            raise ConfigError(f"study.arms: no two arms differ in the declared factor {self.factor}")

    def _check_search(self) -> None:
        if self.search_trials < 0 or (self.search_trials > 0) != bool(self.search):
            raise ConfigError("study.search_trials: must be > 0 exactly when study.search names parameters")
        keys = flatten(next(iter(self.arms.values())).to_dict())
        paths = [s.path for s in self.search]
        if len(set(paths)) != len(paths):
            raise ConfigError(f"study.search: a path repeats: {paths}")
        for item in self.search:
            if item.path not in keys:
                raise ConfigError(f"study.search: {item.path!r} is not a config path")
            if item.path in _UNSEARCHABLE or item.path == self.factor or item.path.startswith(f"{self.factor}."):
                raise ConfigError(f"study.search: {item.path!r} is the factor, a budget or a seed; it cannot be tuned")
            if item.path.startswith("data."):
                # Data is prepared once per arm before tuning starts: a tuned data value would
                # train on data prepared for another config.
                raise ConfigError(f"study.search: {item.path!r} is a data setting, prepared once per arm before "
                                  "tuning; compare data settings as arms instead")
            if not item.choices and not (item.low < item.high and (not item.log or item.low > 0)):
                raise ConfigError(f"study.search[{item.path!r}]: needs low < high (and low > 0 when log) or choices")
            for arm, config in self.arms.items():
                # Every choice and both ends of a range make valid configs: a bad value found
                # here names its field, instead of failing each trial that draws it.
                for value in item.choices or (item.low, item.high):
                    derive(config, {item.path: value})

    def _check_tuning_seeds(self) -> None:
        clash = sorted(set(self.seeds) & set(self.tuning_seeds))
        if clash:
            raise ConfigError(
                f"study.seeds: {clash} are tuning seeds (tuning trial k runs at seed {TUNING_SEED_OFFSET} + k, "
                f"here {self.tuning_seeds[0]}..{self.tuning_seeds[-1]}); a final trial there would repeat a "
                "tuning trial, so choose study seeds outside that range")

    def _check_budget(self) -> None:
        """A budget below one optimizer step would stop every arm after a single step,
        overshooting it by up to 100%: refuse it, naming the step size."""
        budget = self.budget
        for arm, config in self.arms.items():
            train = config.train
            if self.unit == "tokens":
                step = train.num_workers * train.batch_rows * train.microbatches * config.data.sequence_length
                if budget.tokens < step:
                    raise ConfigError(
                        f"study.budget.tokens: {budget.tokens:,} is less than one step of arm {arm!r} "
                        f"(up to {step:,} tokens = {train.num_workers} workers x {train.batch_rows} rows x "
                        f"{train.microbatches} microbatches x {config.data.sequence_length} tokens)")
            elif self.unit == "pairs":
                step = train.num_workers * train.batch_rows * train.microbatches
                if budget.pairs < step:
                    raise ConfigError(
                        f"study.budget.pairs: {budget.pairs:,} is less than one step of arm {arm!r} "
                        f"({step:,} pairs = {train.num_workers} workers x {train.batch_rows} rows x "
                        f"{train.microbatches} microbatches)")
            elif self.unit == "flops":
                from embedlab.model.flops import expected_step_flops  # here: torch, which `import embedlab` (the study API) does not need

                step = expected_step_flops(config)  # the first step is never cut to the budget
                if budget.flops < step:
                    raise ConfigError(
                        f"study.budget.flops: {budget.flops:.3g} is less than one step of arm {arm!r} "
                        f"(about {step:.3g} training FLOPs, `expected_step_flops`)")

    @property
    def unit(self) -> str:
        """What every trial trains to (`Budget.unit` at the study's phase)."""
        return self.budget.unit(self.phase)

    @property
    def budget_text(self) -> str:
        """Each trial's budget in words, in the study's unit."""
        budget = self.budget
        return {"tokens": f"{budget.tokens:,} non-padding tokens",
                "pairs": f"{budget.pairs:,} positive pairs",
                "flops": f"{budget.flops:.3g} measured training FLOPs" + (
                    ", the parent's training counted for arms that start from its weights"
                    if budget.scope == "lineage" else ""),
                "device_seconds": f"{budget.device_seconds:,g} device seconds"}[self.unit]

    @property
    def tuning_seeds(self) -> tuple[int, ...]:
        """The seeds Optuna's tuning trials run at: trial k of every arm at
        `TUNING_SEED_OFFSET` + k, one per tuning trial (empty without a search). Disjoint from
        `seeds` (checked at construction), so no final trial reruns a tuning trial and the
        tuning winner's upward-biased value never enters a reported mean."""
        return tuple(TUNING_SEED_OFFSET + k for k in range(self.search_trials if self.search else 0))

    @property
    def trials(self) -> int:
        """Trials the study runs: Optuna's tuning trials plus the arms x seeds grid."""
        return len(self.arms) * (self.search_trials + len(self.seeds))

    @property
    def phase(self) -> int:
        return next(iter(self.arms.values())).phase

    @property
    def spec(self) -> PhaseSpec:
        """The phase the study's arms train (`embedlab.core.config.phases`)."""
        return phase_spec(self.phase)

    @property
    def needs_parent(self) -> bool:
        """Phases 2-3 and phase-1 extensions start from a parent checkpoint."""
        return self.spec.from_parent or any(config.extension for config in self.arms.values())

    def trial_config(self, arm: str, seed: int, parent: str | None = None) -> TrialConfig:
        """The arm's config with the study's budget, this seed and (phases 2-3) the parent
        checkpoint: `parent` when given (`embedlab sweep --parent`), else the arm's own."""
        if arm not in self.arms:
            raise UnknownKey(f"study {self.name}: no arm {arm!r}; arms: {list(self.arms)}")
        config = self.arms[arm]
        # The study's one Budget on every arm: no arm can train to a budget of its own.
        train = dataclasses.replace(config.train, budget=self.budget, seed=seed)
        config = dataclasses.replace(config, train=train, parent=parent or config.parent)
        if (config.spec.from_parent or config.extension) and config.parent is None:
            stage = "a phase-1 extension" if config.extension else f"phase {config.phase}"
            raise ConfigError(f"study {self.name}: {stage} needs a parent checkpoint "
                              "(embedlab sweep --parent CKPT_DIR)")
        return config

    def scaled(self, factor: float) -> Study:
        """This study at `factor` times its budget (a rung of a budget ladder): every unit of the
        budget scaled, the name suffixed with the factor (`rung_name`), arms and seeds unchanged;
        ConfigError when the scaled budget falls below one step."""
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < math.inf:
            raise ConfigError(f"budget scale: {factor}: must be a finite positive factor")
        if factor == 1:
            return self
        budget = self.budget
        scaled = dataclasses.replace(budget, tokens=max(1, round(budget.tokens * factor)),
                                     pairs=max(1, round(budget.pairs * factor)),
                                     flops=budget.flops * factor, device_seconds=budget.device_seconds * factor)
        try:
            return dataclasses.replace(self, name=rung_name(self.name, factor), budget=scaled)
        except ConfigError as error:
            raise ConfigError(f"budget scale {factor:g}: {error}") from None

    def lineage_budgets(self, parent_manifest: dict[str, Any]) -> dict[str, dict[str, float]]:
        """Each arm's split of a lineage-scoped budget under the parent of `parent_manifest`:
        {"inherited_flops", "phase_flops"} (`embedlab.train.budget.split_lineage_budget`); empty
        in scope "phase". ConfigError when the parent's FLOPs are unknown, or leave an arm less
        than one step of its own."""
        if self.budget.scope != "lineage":
            return {}
        # Here: torch, which `import embedlab` (the study API) does not need.
        from embedlab.model.flops import expected_step_flops
        from embedlab.train.budget import recorded_flops, split_lineage_budget

        parent_flops = recorded_flops(parent_manifest)
        budgets = {}
        for arm, config in self.arms.items():
            inherited, phase = split_lineage_budget(self.budget.flops, parent_flops,
                                                    inherits_weights=config.contrastive.init == "parent")
            step = expected_step_flops(config)
            if phase < step:
                raise ConfigError(f"study.budget.flops: arm {arm!r} has {phase:.3g} FLOPs left after the parent's "
                                  f"{inherited:.3g}, less than one step (about {step:.3g})")
            budgets[arm] = {"inherited_flops": inherited, "phase_flops": phase}
        return budgets

    def with_parent(self, parent: str | Path, expected_hash: str | None = None) -> Study:
        """The study with `parent` as every arm's parent checkpoint (a promoted winner);
        with `expected_hash`, a checkpoint whose content changed since promotion is refused."""
        if expected_hash is not None:
            from embedlab.checkpoints.io import verify_checkpoint  # here: torch, which `import embedlab` (the study API) does not need

            found = verify_checkpoint(parent)["content_hash"]
            if found != expected_hash:
                raise ConfigError(f"parent {parent}: content hash {found[:16]} is not the promoted {expected_hash[:16]}")
        arms = {arm: dataclasses.replace(config, parent=str(parent)) for arm, config in self.arms.items()}
        return dataclasses.replace(self, arms=arms)

    def with_pretrained_parent(self, parent: str, pretrained: Any) -> Study:
        """The study with every arm on the pretrained backbone of `parent` (a materialised
        pretrained parent, or a checkpoint descending from one; `pretrained` its
        `embedlab.checkpoints.pretrained.PretrainedArms`): the model config derived from its
        checkpoint (the arm's declared one is not used), data prepared with its tokenizer, and
        its sentence-transformers pooling and prefixes where it has them, else the arm's own
        ("mean" taken as "mean_all", `parent_pooling`). A study whose arms vary the pooling or
        prefixes is refused when the parent fixes them: the factor would be void."""
        st = pretrained.sentence_transformers
        choices = {(c.contrastive.pooling, c.contrastive.prefixes) for c in self.arms.values()}
        if st is not None and len(choices) > 1:
            raise ConfigError(f"study {self.name}: its arms vary contrastive.pooling or contrastive.prefixes, but the "
                              f"pretrained parent {pretrained.spec} fixes them (its sentence-transformers configuration: "
                              f"{st['pooling']} pooling, prompts {st['prompts']})")
        arms = {arm: on_backbone(config, pretrained, parent) for arm, config in self.arms.items()}
        return dataclasses.replace(self, arms=arms)

    @property
    def parent(self) -> str | None:
        """The parent checkpoint all arms declare, if they share one."""
        parents = {config.parent for config in self.arms.values()}
        return parents.pop() if len(parents) == 1 else None

    def factor_value(self, arm: str) -> Any:
        """The arm's value of the factor; for a factor that is a config section, the fields
        of it that differ between arms (as JSON)."""
        flat = flatten(self.arms[arm].to_dict())
        if self.factor in flat:
            return flat[self.factor]
        others = [flatten(config.to_dict()) for config in self.arms.values()]
        varied = {k: v for k, v in flat.items()
                  if k.startswith(f"{self.factor}.") and any(o[k] != v for o in others)}
        return json.dumps(varied)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "factor": self.factor,
            "arms": {arm: config.to_dict() for arm, config in self.arms.items()},
            "seeds": list(self.seeds),
            "budget": dataclasses.asdict(self.budget),
            "metric": self.metric,
            "description": self.description,
            "disclosed_overlap": self.disclosed_overlap,
            "search": [s.to_dict() for s in self.search],
            "search_trials": self.search_trials,
            "profile": self.profile,
            # only when set, so the hash of every study without them stays what it was
            **({"final_report": True} if self.final_report else {}),
            **({"until_decided": True, "max_seeds": self.max_seeds} if self.until_decided else {}),
            **({"equivalence_margin": self.equivalence_margin} if self.equivalence_margin is not None else {}),
        }

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Study:
        """Inverse of `to_dict`, for a study of any schema (`embedlab.core.schema.upgrade`)."""
        raw = upgrade(raw, "study")
        arms = {arm: TrialConfig.from_dict(config) for arm, config in raw["arms"].items()}
        return cls(
            name=raw["name"],
            factor=raw["factor"],
            arms=arms,
            seeds=tuple(raw["seeds"]),
            budget=_recorded_budget(raw, arms),
            metric=raw["metric"],
            description=raw.get("description", ""),
            disclosed_overlap=raw.get("disclosed_overlap"),
            search=tuple(Search.from_dict(s) for s in raw.get("search", ())),
            search_trials=raw.get("search_trials", 0),
            profile=raw.get("profile", ""),
            final_report=raw.get("final_report", False),
            until_decided=raw.get("until_decided", False),
            max_seeds=raw.get("max_seeds"),
            equivalence_margin=raw.get("equivalence_margin"),
        )


def resolve_parent(study: Study, parent: str | None, progress: Callable[[str], None] = lambda line: None
                   ) -> tuple[Study, str | None]:
    """The study and the parent a sweep runs them from. A pretrained parent (`hf:ORG/NAME@COMMIT`
    or a Hugging Face or sentence-transformers directory) is materialised as an embedlab
    checkpoint (with the first arm's pooling and prefixes where its own configuration names
    none), and a parent on a pretrained backbone (that one, or a checkpoint descending from
    one) moves every arm onto it (`Study.with_pretrained_parent`); any other parent leaves the
    study as it is. Resolving the same parent again gives the same study and parent."""
    if parent is None:
        return study, None
    # here: torch and the checkpoint readers, which `import embedlab` (the study API) does not need
    from embedlab.checkpoints.pretrained import is_pretrained_spec, pretrained_arms, pretrained_parent

    if is_pretrained_spec(parent):
        first = next(iter(study.arms.values())).contrastive
        materialised = pretrained_parent(parent, pooling=first.pooling,
                                         prefixes={"query": first.prefixes.query, "passage": first.prefixes.passage})
        progress(f"parent {parent}: materialised as an embedlab checkpoint at {materialised}")
        parent = str(materialised)
    pretrained = pretrained_arms(parent)
    if pretrained is None:
        return study, parent
    declared = {config.model.preset for config in study.arms.values()}
    progress(f"parent {pretrained.spec}: every arm trains its pretrained {pretrained.model.backbone} backbone "
             f"({pretrained.model.layers} layers, width {pretrained.model.width}), not the declared model "
             f"{', '.join(sorted(declared))}, on data tokenised with its own tokenizer")
    return study.with_pretrained_parent(parent, pretrained), parent


def _recorded_budget(raw: dict[str, Any], arms: dict[str, TrialConfig]) -> Budget:
    """The Budget of a recorded study (upgraded: one mapping). A unit it recorded beside the
    amounts (`budget_unit`, schema 1) must be the one the Budget derives, as a unit chosen apart
    from the amounts is no longer expressible."""
    budget = Budget(**raw["budget"])
    phase = next(iter(arms.values())).phase
    recorded = raw.get("budget_unit") or budget.unit(phase)
    if recorded != budget.unit(phase):
        raise ConfigError(f"study.budget_unit: recorded {recorded!r}, but its budget trains to "
                          f"{budget.unit(phase)!r} (the unit follows from the amounts set)")
    return budget


def _import(path: Path):
    spec = importlib.util.spec_from_file_location(f"embedlab_study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_user_code(path: Path, call: Callable[[], Any]) -> Any:
    """`call()`, which runs a study or tour file's own code (its import, its `study()`): an
    exception raised there is the user's, and comes back as one line naming the file, the line
    of it the exception passed through last, its type and message (`StudyCodeError`, the
    original as its cause, for `embedlab --debug`). embedlab's own user errors raised inside it
    (a ConfigError of a config the file builds) keep their message, prefixed with the file;
    an exception raised inside embedlab's own code that is no user error is a bug, and
    propagates with its traceback."""
    try:
        return call()
    except UserError as error:
        raise ConfigError(f"{path}{_study_line(error, path)}: {error}") from error
    except SyntaxError as error:
        if Path(error.filename or "").resolve() != path.resolve():
            raise
        raise StudyCodeError(f"{path}:{error.lineno}: syntax error: {error.msg}") from error
    except Exception as error:
        if _raised_in_embedlab(error):
            raise
        where = f"{path}{_study_line(error, path)}"
        if isinstance(error, TypeError) and "unexpected keyword argument" in str(error):
            # Usually a misspelt key: Study(...) or a config's replace(...); name the fields.
            raise StudyCodeError(f"{where}: {error}; {_fields_hint(error)}") from error
        message = " ".join(str(error).split()) or "(no message)"
        raise StudyCodeError(f"{where}: {type(error).__name__}: {message} (raised by the study file's own code; "
                             "`embedlab --debug ...` shows its traceback)") from error


def _raised_in_embedlab(error: BaseException) -> bool:
    """Whether the exception was raised inside embedlab's own package (its innermost frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    package = Path(__file__).resolve().parents[1]
    return bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(package)


def study_origin(path: str | Path) -> str:
    """The study file a generated one (a promotion's next_study.py) stands for."""
    origin = getattr(_import(store.fetch(path)), "ORIGIN", None)
    return str(Path(origin).resolve()) if origin else store.resolve(path)


def _fields_hint(error: TypeError) -> str:
    """The fields of the class an unknown keyword was given to (Study, or the config section a
    `replace(...)` built), the closest first when one is close."""
    match = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(error))
    owner = getattr(config_module, match.group(1), None) if match else None
    owner = owner if owner is not None and dataclasses.is_dataclass(owner) else Study
    fields = sorted(f.name for f in dataclasses.fields(owner))
    close = difflib.get_close_matches(match.group(2), fields, n=1) if match else []
    # Study files written before the budget was one object pass budget_tokens= and the like.
    moved = ("; the budget is one object: budget=Budget(tokens=..., pairs=..., flops=...)"
             if owner is Study and any(key in str(error) for key in FLAT_BUDGET_KEYS) else "")
    return (f"did you mean {close[0]!r}? " if close else "") + f"{owner.__name__} fields are {fields}{moved}"


def _study_line(error: BaseException, path: Path) -> str:
    """':<line>' of the study file's frame the error passed through, or ''."""
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
             if Path(frame.filename).resolve() == Path(path).resolve()]
    return f":{lines[-1]}" if lines else ""


def rung_name(name: str, factor: float) -> str:
    """A study's name at a budget scale: `<name>-x0p25` for 0.25."""
    return f"{name}-x{factor:g}".replace(".", "p")


_RUNG_SUFFIX = re.compile(r"-x[0-9]+(?:p[0-9]+)?(?:e[-+]?[0-9]+)?$")  # what `rung_name` appends


def rung_base(name: str) -> str:
    """The study name a `rung_name` was made from (`<name>-x0p25` -> `<name>`); other names unchanged."""
    return _RUNG_SUFFIX.sub("", name)


def is_rung_run_dir(directory_name: str, base: str) -> bool:
    """Whether a run directory's name (`<study>-<YYYYMMDD>-<HHMMSS>[-n]`, `new_run_dir`'s) is a
    run of study `base` or of one of its rungs (`<base>-x<F>`), by its name alone."""
    suffix = _RUNG_SUFFIX.pattern.removesuffix("$")
    return re.fullmatch(rf"{re.escape(base)}(?:{suffix})?-\d{{8}}-\d{{6}}(?:-\d+)?", directory_name) is not None


def load_study(path: str | Path, profile: str | None = None, budget_scale: float = 1.0) -> Study:
    """Import a study file by path and call its `study()` (with `profile` when the file takes
    one: `study(profile="demo")`), at `budget_scale` times its budget (`Study.scaled`); errors
    name the file."""
    return _load_study(path, profile).scaled(budget_scale)


def _load_study(path: str | Path, profile: str | None) -> Study:
    if store.is_uri(path):  # a promoted study in a remote run directory
        if not store.is_file(path):
            raise FileNotFoundError(f"study file not found: {store.redact(path)}")
        path = store.fetch(path)
    path = paths.require_file(path, "study file", suffixes=(".py",))
    module = run_user_code(path, lambda: _import(path))
    factory = getattr(module, "study", None)
    if not callable(factory):
        raise ConfigError(f"{path}: defines no study() function")
    takes_profile = "profile" in inspect.signature(factory).parameters
    if profile is not None and not takes_profile:
        raise ConfigError(f"{path}: study() takes no profile, so --profile {profile} cannot apply")
    study = run_user_code(path, lambda: factory(profile=profile) if profile is not None else factory())
    if not isinstance(study, Study):
        raise ConfigError(f"{path}: study() returned {type(study).__name__}, expected embedlab.Study")
    return study
