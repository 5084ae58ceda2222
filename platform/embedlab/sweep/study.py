"""Studies: a controlled ablation declared as arms derived from one base recipe.

A study file in `ablations/` defines `study() -> Study`. Every arm is a `TrialConfig`; the
study names the factor it varies (a dotted config path such as `masking.ratio`), and
construction refuses arms that differ anywhere else, so a comparison is controlled by
construction. The budget and the seeds belong to the study, not to the arms: every arm
trains to the same measured budget under the same seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedlab.config import ConfigError, TrialConfig

METRICS = ("dev/ndcg@10", "dev/recall@100", "dev/mrr@10", "dev/map")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{path}."))
        else:
            out[path] = value
    return out


@dataclass(frozen=True, kw_only=True)
class Study:
    """Arms x seeds at one budget of consumed non-padding tokens, ranked by `metric`."""

    name: str
    factor: str
    arms: dict[str, TrialConfig]
    seeds: tuple[int, ...]
    budget_tokens: int
    budget_pairs: int = 0  # phases 2-3: consumed positive pairs per trial (required there)
    metric: str = "dev/ndcg@10"
    description: str = ""
    # A disclosed-overlap policy: when the contamination audit finds final-eval items in the
    # training data, training is refused unless this says how the overlap is handled; it is
    # then printed with every table.
    disclosed_overlap: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"study.name: {self.name!r} must match {_NAME.pattern}")
        if len(self.arms) < 2:
            raise ConfigError("study.arms: a controlled comparison needs at least 2 arms")
        for arm, config in self.arms.items():
            if not _NAME.match(arm):
                raise ConfigError(f"study.arms: arm name {arm!r} must match {_NAME.pattern}")
            if not isinstance(config, TrialConfig):
                raise ConfigError(f"study.arms[{arm!r}]: must be a TrialConfig, got {type(config).__name__}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"study.seeds: must be non-empty and distinct, got {self.seeds}")
        if self.budget_tokens <= 0:
            raise ConfigError("study.budget_tokens: must be positive")
        if any(c.phase > 1 for c in self.arms.values()) and self.budget_pairs <= 0:
            raise ConfigError("study.budget_pairs: phase 2 and 3 arms train to a budget of positive pairs; set it")
        if len({c.phase for c in self.arms.values()}) != 1:
            raise ConfigError("study.arms: all arms must train the same phase")
        if self.disclosed_overlap is not None and not self.disclosed_overlap.strip():
            raise ConfigError("study.disclosed_overlap: must say what the policy is, or be None")
        if self.metric not in METRICS:
            raise ConfigError(f"study.metric: {self.metric!r}; valid: {list(METRICS)}")
        self._check_controlled()

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
                elif key not in ("train.budget_tokens", "train.budget_pairs", "train.seed", "parent"):
                    raise ConfigError(
                        f"study.arms[{arm!r}]: differs from arm {first_arm!r} in {key} "
                        f"({value!r} vs {reference[key]!r}), outside the declared factor {self.factor}"
                    )
        if not varied:
            raise ConfigError(f"study.arms: no two arms differ in the declared factor {self.factor}")

    @property
    def phase(self) -> int:
        return next(iter(self.arms.values())).phase

    def trial_config(self, arm: str, seed: int, parent: str | None = None) -> TrialConfig:
        """The arm's config with the study's budget, this seed and (phases 2-3) the parent
        checkpoint: `parent` when given (`embedlab sweep --parent`), else the arm's own."""
        if arm not in self.arms:
            raise KeyError(f"study {self.name}: no arm {arm!r}; arms: {list(self.arms)}")
        config = self.arms[arm]
        train = dataclasses.replace(config.train, budget_tokens=self.budget_tokens, seed=seed)
        if self.budget_pairs:
            train = dataclasses.replace(train, budget_pairs=self.budget_pairs)
        config = dataclasses.replace(config, train=train, parent=parent or config.parent)
        if config.phase > 1 and config.parent is None:
            raise ConfigError(f"study {self.name}: phase {config.phase} needs a parent checkpoint "
                              "(embedlab sweep --parent CKPT_DIR)")
        return config

    def factor_value(self, arm: str) -> Any:
        flat = flatten(self.arms[arm].to_dict())
        if self.factor in flat:
            return flat[self.factor]
        return json.dumps({k: v for k, v in flat.items() if k.startswith(f"{self.factor}.")})

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "factor": self.factor,
            "arms": {arm: config.to_dict() for arm, config in self.arms.items()},
            "seeds": list(self.seeds),
            "budget_tokens": self.budget_tokens,
            "budget_pairs": self.budget_pairs,
            "metric": self.metric,
            "description": self.description,
            "disclosed_overlap": self.disclosed_overlap,
        }

    @property
    def hash(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Study:
        return cls(
            name=raw["name"],
            factor=raw["factor"],
            arms={arm: TrialConfig.from_dict(config) for arm, config in raw["arms"].items()},
            seeds=tuple(raw["seeds"]),
            budget_tokens=raw["budget_tokens"],
            budget_pairs=raw.get("budget_pairs", 0),
            metric=raw["metric"],
            description=raw.get("description", ""),
            disclosed_overlap=raw.get("disclosed_overlap"),
        )


def load_study(path: str | Path) -> Study:
    """Import a study file by path and call its `study()`; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"study file not found: {path}")
    spec = importlib.util.spec_from_file_location(f"embedlab_study_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    factory = getattr(module, "study", None)
    if not callable(factory):
        raise ConfigError(f"{path}: defines no study() function")
    try:
        study = factory()
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
    if not isinstance(study, Study):
        raise ConfigError(f"{path}: study() returned {type(study).__name__}, expected embedlab.Study")
    return study
