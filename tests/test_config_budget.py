"""The compute budget is one typed object, `config.Budget`: it validates its own values, derives
its unit, is stamped by a study on every arm, and run directories written with the older flat
`budget_*` keys still load to the same configs and tables."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from embedlab import Budget, Study, recipes
from embedlab.core.config import ConfigError, DEFAULT_BUDGET, TrainConfig, TrialConfig
from embedlab.core.schema import nest_flat_budget
from embedlab.stats.table import STUDY_BUDGETS, budget_scope, budget_unit, declared_budget
from embedlab.studies.study import load_study

ABLATIONS = Path(__file__).resolve().parent.parent / "ablations"


def flat_train(train: dict) -> dict:
    """A TrainConfig mapping as run directories held it before Budget: flat budget_* keys."""
    budget = train.pop("budget")
    return {**train, **{f"budget_{name}": value for name, value in budget.items()}}


def flat_study(record: dict) -> dict:
    """A study record as written before Budget: flat budget_* keys and the resolved unit, a
    phase-1 study declaring no pairs (0), its arms' configs flat too."""
    study = dict(record)
    budget = study.pop("budget")
    phase = next(iter(study["arms"].values()))["phase"]
    unit = Budget(**budget).unit(phase)
    study["arms"] = {arm: {**config, "train": flat_train(dict(config["train"]))} for arm, config in study["arms"].items()}
    return {**study, **{f"budget_{name}": value for name, value in budget.items()}, "budget_unit": unit,
            **({"budget_pairs": 0} if phase == 1 else {})}


def two_arms(base: TrialConfig) -> dict[str, TrialConfig]:
    return {"a": base, "b": dataclasses.replace(base, masking=dataclasses.replace(base.masking, ratio=0.3))}


@pytest.mark.parametrize("fields, message", [
    ({"tokens": 0}, "train.budget.tokens: must be positive"),
    ({"pairs": -5}, "train.budget.pairs: must be positive"),
    ({"flops": -1.0}, r"train.budget.flops: must be >= 0 \(0: budget in tokens or pairs\)"),
    ({"device_seconds": -1.0}, r"train.budget.device_seconds: must be >= 0"),
    ({"flops": 1e12, "device_seconds": 60.0}, "train.budget.device_seconds: a trial trains to one budget: set flops "
                                               "or device_seconds, not both"),
    ({"scope": "everything", "flops": 1e12}, r"train.budget.scope: 'everything'; valid: \['phase', 'lineage'\]"),
    ({"scope": "lineage"}, "train.budget.scope: 'lineage' .* needs a train.budget.flops budget"),
])
def test_a_budget_refuses_bad_values_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(DEFAULT_BUDGET, **fields)


def test_a_budget_needs_its_data_figures_and_train_needs_a_budget():
    """Tokens and pairs have no default: a study states both; TrainConfig's default is
    DEFAULT_BUDGET, and a TrainConfig given anything but a Budget is refused by name."""
    with pytest.raises(TypeError, match="pairs"):
        Budget(tokens=10_000)
    assert TrainConfig().budget == DEFAULT_BUDGET == Budget(tokens=100_000, pairs=2_000)
    with pytest.raises(ConfigError, match="train.budget: must be a Budget, got dict"):
        TrainConfig(budget={"tokens": 1, "pairs": 1})


@pytest.mark.parametrize("fields, phase, unit, amount", [
    ({}, 1, "tokens", 100_000),
    ({}, 2, "pairs", 2_000),
    ({}, 3, "pairs", 2_000),
    ({"flops": 1e12}, 1, "flops", 1e12),
    ({"flops": 1e12, "scope": "lineage"}, 2, "flops", 1e12),
    ({"device_seconds": 90.0}, 1, "device_seconds", 90.0),
    ({"device_seconds": 90.0}, 3, "device_seconds", 90.0),
])
def test_the_unit_is_flops_then_device_seconds_then_the_phase_data(fields, phase, unit, amount):
    budget = dataclasses.replace(DEFAULT_BUDGET, **fields)
    assert budget.unit(phase) == unit and budget.amount(phase) == amount
    # Pairs are declared in phases 2-3 only; a FLOPs or time amount only when set.
    declared = budget.declared(phase)
    assert ("pairs" in declared) == (phase > 1) and declared["tokens"] == 100_000
    assert set(declared) - {"tokens", "pairs"} == ({unit} if unit not in ("tokens", "pairs") else set())
    with pytest.raises(ConfigError, match=r"phase: 4; valid: 1 \(masked language modelling\), 2"):
        budget.unit(4)


def test_a_study_stamps_its_one_budget_on_every_arm():
    """Arms declared with budgets of their own all train to the study's: no arm can differ."""
    base = recipes.phase1_baseline("demo")
    arms = two_arms(base)
    arms["b"] = dataclasses.replace(arms["b"], train=dataclasses.replace(
        arms["b"].train, budget=Budget(tokens=7, pairs=3, device_seconds=5.0)))
    budget = dataclasses.replace(DEFAULT_BUDGET, tokens=50_000, flops=1e13)
    study = Study(name="x", factor="masking.ratio", arms=arms, seeds=(0, 1), budget=budget)
    trials = [study.trial_config(arm, seed) for arm in study.arms for seed in study.seeds]
    assert {trial.train.budget for trial in trials} == {budget}
    assert study.unit == "flops" and study.budget_text == "1e+13 measured training FLOPs"
    # The phase-2 study: pairs and a lineage scope reach every arm the same way.
    phase2 = recipes.phase2_baseline("demo")
    lineage = Budget(tokens=1, pairs=600, flops=1e14, scope="lineage")
    study = Study(name="y", factor="masking.ratio", arms=two_arms(phase2), seeds=(0,), budget=lineage)
    assert {study.trial_config(arm, 0, "/parent").train.budget for arm in study.arms} == {lineage}
    with pytest.raises(ConfigError, match="study.budget.pairs: 1 is less than one step of arm 'a'"):
        Study(name="y", factor="masking.ratio", arms=two_arms(phase2), seeds=(0,), budget=Budget(tokens=1, pairs=1))


def test_an_old_flat_keyed_config_loads_to_the_same_config():
    """A resolved config written with flat budget_* keys builds the same TrialConfig as the
    nested one; both layouts at once are refused; other mappings pass through unchanged."""
    budget = Budget(tokens=12_345, pairs=678, flops=2.5e12, scope="lineage")
    trial = dataclasses.replace(recipes.phase2_baseline("demo"), parent="/parent")
    trial = dataclasses.replace(trial, train=dataclasses.replace(trial.train, budget=budget))
    nested = trial.to_dict()
    assert nested["train"]["budget"] == dataclasses.asdict(budget)
    old = json.loads(json.dumps(nested))
    old["train"] = flat_train(old["train"])
    assert "budget" not in old["train"] and old["train"]["budget_flops"] == 2.5e12
    assert TrialConfig.from_dict(old) == TrialConfig.from_dict(nested) == trial
    both = {**old["train"], "budget": nested["train"]["budget"]}
    with pytest.raises(ConfigError, match="trial.train: has both a budget mapping and the older flat keys"):
        TrialConfig.from_dict({**old, "train": both})
    assert nest_flat_budget(nested["train"], "train") is nested["train"]


@pytest.mark.parametrize("study_file, phase", [("masking_ratio.py", 1), ("length_extension.py", 1),
                                               ("joint_vs_contrastive.py", 2), ("mlm_init.py", 2)])
def test_an_old_flat_keyed_study_record_loads_and_tables_read_it_alike(study_file, phase):
    """A study recorded with the flat keys (phase 1 declaring no pairs, its arms then training
    to their own) is the same Study as its nested record, and tables read the same unit,
    declared budgets and scope from either."""
    study = load_study(ABLATIONS / study_file, "demo")
    assert study.phase == phase
    new = json.loads(json.dumps(study.to_dict()))
    old = flat_study(new)
    assert Study.from_dict(old) == Study.from_dict(new) == study
    for record in ({"study": new}, {"study": old}):
        assert budget_unit(record) == study.unit and budget_scope(record) == study.budget.scope
    assert {u: declared_budget({"study": new}, u) for u in STUDY_BUDGETS} == \
        {u: declared_budget({"study": old}, u) for u in STUDY_BUDGETS}
    assert declared_budget({"study": new}, "pairs") == (None if phase == 1 else float(study.budget.pairs))
    # A unit recorded apart from the amounts is no longer expressible: refused, not guessed.
    wrong = {**old, "budget_unit": "device_seconds"}
    with pytest.raises(ConfigError, match="study.budget_unit: recorded 'device_seconds'"):
        Study.from_dict(wrong)


def test_a_study_file_passing_the_old_flat_budget_keys_is_told_the_new_form(tmp_path):
    """A study file written before Budget (`budget_tokens=...`) is refused with the form to use."""
    path = tmp_path / "old_study.py"
    path.write_text(
        "from dataclasses import replace\n"
        "from embedlab import Study, recipes\n\n"
        "def study():\n"
        "    base = recipes.phase1_baseline('demo')\n"
        "    return Study(name='old', factor='masking.ratio', seeds=(0,), budget_tokens=10_000,\n"
        "                 arms={'a': base, 'b': replace(base, masking=replace(base.masking, ratio=0.3))})\n")
    with pytest.raises(ConfigError, match=r"budget_tokens.*the budget is one object: budget=Budget\(tokens="):
        load_study(path)


# Study records as the code before Budget wrote them to a run directory's study.json: the length
# extension (phase 1, 0 pairs declared, a token budget) and the MLM-initialisation study (phase 2,
# a lineage-scoped FLOPs budget), both at the demo profile.
FLAT_RECORDS = Path(__file__).resolve().parent / "fixtures" / "flat_budget_studies.json"


def flat_figures(raw: dict) -> dict:
    """The flat budget_* values of a mapping, by Budget field."""
    return {name: raw[f"budget_{name}"] for name in ("tokens", "pairs", "flops", "device_seconds", "scope")}


@pytest.mark.parametrize("name", ["phase1", "lineage"])
def test_a_study_record_written_before_budget_loads_and_reads_as_it_did(name):
    """The study's Budget holds the recorded figures (a phase-1 study's 0 pairs become its arms'
    own, which its trials trained to), every arm keeps its own recorded figures, the unit is the
    recorded one, and tables read the same unit, declared budgets and scope from the old record
    as from the new one it loads to."""
    old = json.loads(FLAT_RECORDS.read_text())[name]
    study = Study.from_dict(old)
    arm_pairs = {config["train"]["budget_pairs"] for config in old["arms"].values()}
    figures = {**flat_figures(old), "pairs": old["budget_pairs"] or arm_pairs.pop()}
    assert study.budget == Budget(**figures) and study.unit == old["budget_unit"]
    for arm, config in old["arms"].items():
        assert study.arms[arm].train.budget == Budget(**flat_figures(config["train"]))
    new = json.loads(json.dumps(study.to_dict()))
    assert "budget_tokens" not in new and Study.from_dict(new) == study
    for record in ({"study": old}, {"study": new}):
        assert budget_unit(record) == old["budget_unit"] and budget_scope(record) == old["budget_scope"]
        # As tables read the flat keys: a figure > 0 is declared, 0 is not.
        assert {unit: declared_budget(record, unit) for unit in STUDY_BUDGETS} == {
            unit: float(old[f"budget_{unit}"]) if old[f"budget_{unit}"] > 0 else None for unit in STUDY_BUDGETS}
