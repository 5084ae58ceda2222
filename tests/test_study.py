"""Study files: every file in ablations/ loads and validates; uncontrolled arms are refused."""

from dataclasses import replace
from pathlib import Path

import pytest

from embedlab import Study, recipes
from embedlab.config import ConfigError, TrialConfig
from embedlab.sweep.study import load_study

ABLATIONS = sorted((Path(__file__).parent.parent / "ablations").glob("*.py"))


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: p.name)
def test_every_ablation_file_loads_and_validates(path):
    """Each study file defines study() returning a valid Study that round-trips through JSON."""
    study = load_study(path)
    assert Study.from_dict(study.to_dict()) == study
    parent = "/checkpoints/parent" if study.phase > 1 else None
    for arm in study.arms:
        config = study.trial_config(arm, study.seeds[0], parent)
        assert config.train.budget_tokens == study.budget_tokens
        assert config.phase == 1 or (config.parent == parent and config.train.budget_pairs == study.budget_pairs)
        assert TrialConfig.from_dict(config.to_dict()) == config


def test_phase2_study_without_parent_is_refused():
    """A phase-2 arm cannot become a trial until a parent checkpoint is given."""
    study = load_study(Path(__file__).parent.parent / "ablations" / "pooling.py")
    with pytest.raises(ConfigError, match="--parent"):
        study.trial_config("mean", 0)


def test_masking_ratio_study_compares_15_and_30_percent():
    """The demo study has two arms that differ only in masking.ratio (0.15 vs 0.30)."""
    study = load_study(Path(__file__).parent.parent / "ablations" / "masking_ratio.py")
    assert sorted(study.factor_value(a) for a in study.arms) == [0.15, 0.30]


def test_arm_differing_outside_the_factor_is_refused():
    """An arm that also changes the learning rate is refused, naming the field."""
    base = recipes.phase1_baseline()
    other = replace(base, masking=replace(base.masking, ratio=0.3), train=replace(base.train, learning_rate=5e-4))
    with pytest.raises(ConfigError, match="train.learning_rate"):
        Study(name="x", factor="masking.ratio", arms={"a": base, "b": other}, seeds=(0,), budget_tokens=10)


def test_study_errors_name_the_field():
    """Bad seeds, metric and factor are reported by field name."""
    base = recipes.phase1_baseline()
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    with pytest.raises(ConfigError, match="study.seeds"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(), budget_tokens=10)
    with pytest.raises(ConfigError, match="study.metric"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget_tokens=10, metric="loss")
    with pytest.raises(ConfigError, match="study.factor"):
        Study(name="x", factor="masking.nope", arms=arms, seeds=(0,), budget_tokens=10)


def test_study_file_without_study_function(tmp_path):
    """A file without study() is refused with its path in the message."""
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="empty.py"):
        load_study(path)


def test_config_unknown_keys_are_named():
    """Unknown config keys are errors that list them and the valid keys."""
    with pytest.raises(ConfigError, match="ratioo"):
        TrialConfig.from_dict({"masking": {"ratioo": 0.2}})
    with pytest.raises(ConfigError, match="masking.ratio"):
        TrialConfig.from_dict({"masking": {"ratio": 1.5}})


def test_contrastive_phase_config_rules():
    """Phases 2-3 refuse gradient accumulation, GradCache with a joint MLM term, and negatives outside phase 3."""
    from embedlab.config import ContrastiveConfig, TrainConfig

    with pytest.raises(ConfigError, match="train.microbatches"):
        TrialConfig(phase=2, parent="p", train=TrainConfig(microbatches=2))
    with pytest.raises(ConfigError, match="gradcache_chunk"):
        ContrastiveConfig(gradcache_chunk=4, mlm_weight=0.3)
    with pytest.raises(ConfigError, match="hard_negatives"):
        TrialConfig(phase=2, parent="p", contrastive=ContrastiveConfig(hard_negatives=2))
    with pytest.raises(ConfigError, match="continue_optimizer"):
        ContrastiveConfig(continue_optimizer=True)
