"""Evaluation panels wired in: `EvalConfig.tasks` / `hub_tasks`, a trial scored on every task of a
panel, the study metric naming a task or the mean, the stratified paired bootstrap of a panel
mean, promotion's final eval on the same task(s), and the contamination pre-flight over every
task. In process and without Ray; the tasks are real text (standard-library docstrings, as in
test_hub_tasks), scored by BM25 or a checkpoint's evaluator stand-in."""

from __future__ import annotations

import dataclasses
import inspect
import json
import shutil
import textwrap
from pathlib import Path

import pytest

from embedlab.config import ConfigError, EvalConfig, TrialConfig, _build, read_mapping_file
from embedlab.evaluate.beir import Task, write_task
from embedlab.evaluate.hub_tasks import HubTask, derive_dev_split, local_dataset_revision

from test_hub_tasks import docstring_records, docstring_task, offline_hub, write_hub_directory  # noqa: F401

PANEL_TOML = """\
task = "python-docstrings"
tasks = ["{beir}"]
split = "dev"

[[hub_tasks]]
name = "shell-utils"
dataset = "{hub}"
revision = "{revision}"
dev_fraction = 0.3
splits = ["train", "test"]
"""


@pytest.fixture(scope="module")
def shell_task() -> Task:
    return docstring_task("shell-utils", docstring_records(shutil, textwrap))


@pytest.fixture(scope="module")
def data_task() -> Task:
    return derive_dev_split(docstring_task("data-formats", docstring_records(json, inspect)), 0.3, seed=0)[0]


# ---------------------------------------------------------------------------------------------
# Config


def test_panel_config_round_trips_through_toml_and_json(tmp_path, shell_task, data_task):
    """A panel written as TOML builds the EvalConfig written by hand; its JSON (`to_dict`) builds it
    again, inside a TrialConfig too; the default config has no panel and its dict is unchanged."""
    beir = tmp_path / "data-formats"
    write_task(data_task, beir)
    hub = write_hub_directory(tmp_path / "hub", shell_task)
    path = tmp_path / "eval.toml"
    path.write_text(PANEL_TOML.format(beir=beir, hub=hub, revision=local_dataset_revision(hub)), encoding="utf-8")

    built = _build(EvalConfig, read_mapping_file(path), "eval")

    spec = HubTask(name="shell-utils", dataset=str(hub), revision=local_dataset_revision(hub), dev_fraction=0.3,
                   splits=("train", "test"))
    assert built == EvalConfig(tasks=(str(beir),), hub_tasks=(spec,))
    assert built.panel and built.task_names == ("python-docstrings", "data-formats", "shell-utils")
    as_json = json.loads(json.dumps(dataclasses.asdict(built)))
    assert _build(EvalConfig, as_json, "eval") == built
    trial = dataclasses.replace(TrialConfig(), eval=built)
    assert TrialConfig.from_dict(json.loads(trial.to_json())) == trial
    (tmp_path / "eval.json").write_text(json.dumps(as_json), encoding="utf-8")
    assert _build(EvalConfig, read_mapping_file(tmp_path / "eval.json"), "eval") == built

    default = EvalConfig()
    assert not default.panel and default.task_names == ("python-docstrings",)
    assert set(dataclasses.asdict(default)) == {"task", "tasks", "hub_tasks", "split", "batch_size", "max_length",
                                                "index"}


def test_panel_task_names_must_be_distinct_and_usable(tmp_path):
    """Names repeat (a directory named like the main task), or cannot prefix columns: refused naming them;
    a Hub task missing its revision names the missing key."""
    clash = tmp_path / "python-docstrings"
    clash.mkdir()
    with pytest.raises(ConfigError, match="eval.tasks: task names repeat in the panel: python-docstrings"):
        EvalConfig(tasks=(str(clash),))
    with pytest.raises(ConfigError, match="cannot name panel columns"):
        EvalConfig(hub_tasks=(HubTask(name="mean", dataset="mteb/scifact", revision="v1"),))
    with pytest.raises(ConfigError, match=r"eval.hub_tasks\[0\]: missing required keys \['revision'\]"):
        _build(EvalConfig, {"hub_tasks": [{"name": "scifact", "dataset": "mteb/scifact"}]}, "eval")
