"""Study files: every file in ablations/ loads and validates; uncontrolled arms are refused."""

from dataclasses import replace
from pathlib import Path

import pytest

from embedlab import Study, recipes
from embedlab.core.config import ConfigError, DEFAULT_BUDGET, TrialConfig
from embedlab.studies.study import load_study

BUDGET = replace(DEFAULT_BUDGET, tokens=10_000)  # a phase-1 study's: 10,000 tokens (it reads no pairs)
ABLATIONS = sorted((Path(__file__).parent.parent / "ablations").glob("*.py"))


TOURS = [p for p in ABLATIONS if "def tour(" in p.read_text()]
STUDIES = [p for p in ABLATIONS if p not in TOURS]


@pytest.mark.parametrize("profile", sorted(recipes.PROFILES))
@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_ablation_file_loads_and_validates(path, profile):
    """Each study file defines study(profile) returning a valid Study that round-trips through
    JSON, at both profiles; every arm becomes a trial with the study's budget and seed."""
    study = load_study(path, profile)
    assert study.profile == profile and len(study.seeds) >= 2
    assert Study.from_dict(study.to_dict()) == study
    parent = "/checkpoints/parent" if study.needs_parent else None
    for arm in study.arms:
        config = study.trial_config(arm, study.seeds[0], parent)
        assert config.train.budget == study.budget and config.parent == parent
        assert TrialConfig.from_dict(config.to_dict()) == config
    # The demo profile keeps a subset of the full study's arms.
    assert set(study.arms) <= set(load_study(path, "full").arms)


PROBES = sorted((Path(__file__).parent.parent / "ablations" / "probes").glob("*.py"))


@pytest.mark.parametrize("path", PROBES, ids=lambda p: p.name)
def test_every_probe_file_loads_at_the_cpu_profile(path, monkeypatch):
    """The cpu profile's probes (one seed each, recipe-dev only) load, validate and round-trip:
    the cpu tour page's probe figures come from these files as they are."""
    monkeypatch.setenv("PROBE_VOCAB", "8192")
    study = load_study(path, "cpu")
    assert study.profile == "cpu" and len(study.arms) >= 2 and len(study.seeds) == 1
    assert Study.from_dict(study.to_dict()) == study
    parent = "/checkpoints/parent" if study.needs_parent else None
    for arm in study.arms:
        config = study.trial_config(arm, study.seeds[0], parent)
        assert TrialConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("path", TOURS, ids=lambda p: p.name)
def test_every_tour_file_loads(path):
    """A tour's stages load and train consecutive phases (the recipe: 1, 2, 3)."""
    from embedlab.studies.tour import load_tour, stage_path

    for profile in sorted(recipes.PROFILES):
        tour = load_tour(path, profile)
        assert [load_study(stage_path(path, s), profile).phase for s in tour.stages] == [1, 2, 3]


# Data-matched on purpose (its file says why): a longer sequence costs more per token.
DATA_MATCHED = {"length_extension.py"}


@pytest.mark.parametrize("path", [p for p in STUDIES if p.name not in DATA_MATCHED], ids=lambda p: p.name)
def test_cpu_profile_studies_budget_in_measured_flops(path):
    """At the cpu profile every study but the data-matched one trains to measured FLOPs: its
    budget is a FLOPs figure, every trial carries it, and it is what its control arm's steps
    cost over the profile's data (`recipes.budget_for`), not a count of tokens or pairs."""
    from embedlab.model.flops import expected_step_flops
    from embedlab.train.budget import step_units

    study = load_study(path, "cpu")
    p = recipes.profile("cpu")
    assert study.unit == "flops" and study.budget.flops > 0
    parent = "/checkpoints/parent" if study.needs_parent else None
    for arm in study.arms:
        trial = study.trial_config(arm, study.seeds[0], parent)
        assert trial.train.budget.flops == study.budget.flops
        assert (trial.train.num_workers, trial.train.torch_threads) == (p.num_workers, p.torch_threads)
    control = study.trial_config(next(iter(study.arms)), study.seeds[0], parent)
    units = p.phase1_tokens if study.phase == 1 else (p.phase2_pairs if study.phase == 2 else p.phase3_pairs)
    per_step = expected_step_flops(control)
    if study.budget.flops != pytest.approx(units / step_units(control) * per_step, rel=1e-12):
        # A study whose budget is a sum of phases' budgets (the MLM-initialisation study) is
        # checked in its own test file.
        assert path.name == "mlm_init.py"


def test_cpu_profile_contrastive_studies_train_on_lead_rest_and_declare_no_overlap():
    """At the cpu profile every phase-2/3 study mixes lead-rest into its arms; none declares an
    overlap (the built-in task's cleaning removes what the audit would find, so the gate
    refuses any final-eval item it meets); the other profiles train on the pilot mixtures."""
    cpu = recipes.profile("cpu")
    assert cpu.disclosed_overlap is None
    assert dict(cpu.phase2_pair_shares)["lead-rest"] == 0.2 and dict(cpu.phase3_pair_shares)["lead-rest"] == 0.15
    contrastive = [path for path in STUDIES if load_study(path, "cpu").phase in (2, 3)]
    assert {path.name for path in contrastive} >= {"joint_vs_contrastive.py", "hard_negatives.py"}
    for path in contrastive:
        study = load_study(path, "cpu")
        assert study.disclosed_overlap is None, path.name
        parent = "/checkpoints/parent" if study.needs_parent else None
        for arm in study.arms:
            assert "lead-rest" in dict(study.trial_config(arm, study.seeds[0], parent).contrastive.pairs)
        for other in ("demo", "full"):
            assert load_study(path, other).disclosed_overlap is None
            assert "lead-rest" not in dict(load_study(path, other).trial_config(
                next(iter(load_study(path, other).arms)), 0, parent).contrastive.pairs)


def test_the_recipe_studies_the_issue_names_exist():
    """The base recipe, mixture, masking ratio (5/15/30/50), dual heads, pooling and joint studies."""
    names = {p.name for p in ABLATIONS}
    assert {"recipe.py", "mixture.py", "masking_ratio.py", "dual_heads.py", "pooling.py",
            "joint_vs_contrastive.py"} <= names
    ratios = sorted(load_study(ABLATIONS[0].parent / "masking_ratio.py", "full").factor_value(a)
                    for a in load_study(ABLATIONS[0].parent / "masking_ratio.py", "full").arms)
    assert ratios == [0.05, 0.15, 0.30, 0.50]


def test_dry_run_prints_the_plan_and_starts_nothing(capsys, monkeypatch):
    """`sweep --dry-run` prints arms, seeds, budget, search and the trial count without Ray."""
    import embedlab.sweep.arm_data as arm_data
    import embedlab.sweep.run as run
    from embedlab.cli import main

    monkeypatch.setattr(run, "connect", lambda *a, **k: pytest.fail("a dry run connected to Ray"))
    monkeypatch.setattr(arm_data, "prepare_data", lambda *a, **k: pytest.fail("a dry run prepared data"))

    path = ABLATIONS[0].parent / "masking_ratio.py"
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for text in ("mask-5", "mask-50", "seeds: 0, 1, 2", f"budget per trial: {load_study(path).budget_text}\n",
                 "train.learning_rate: 0.0003 .. 0.003 (log)", "trials: 28 (4 arms x (4 tuning + 3 seeds))",
                 "tuning seeds: 10000..10003 (never a study seed",
                 "Optuna search, 4 trials per arm, RandomSampler(seed=10000), random search (TPE needs at least 6"):
        assert text in out
    assert main(["sweep", str(ABLATIONS[0].parent / "masking_ratio.py"), "--dry-run", "--profile", "big"]) == 2
    assert "unknown profile 'big'" in capsys.readouterr().err


def test_search_and_budget_unit_rules():
    """Search may not tune the factor, a budget or a seed; ranges must be valid; a FLOPs unit
    needs a FLOPs budget; a searched value that breaks a config rule is named."""
    from embedlab import Search

    base = recipes.phase1_baseline()
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    ok = Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET,
               search=(Search("train.learning_rate", low=1e-4, high=1e-2, log=True),), search_trials=2)
    assert ok.trials == 2 * (2 + 1)
    for search, match in [
        (Search("masking.ratio", low=0.1, high=0.2), "factor"),
        (Search("train.seed", choices=(0, 1)), "seed"),
        (Search("train.nope", low=0.1, high=0.2), "not a config path"),
        (Search("train.learning_rate", low=0.0, high=0.1, log=True), "low > 0"),
        (Search("train.schedule.warmup_fraction", low=0.5, high=1.5), "train.schedule.warmup_fraction"),
        (Search("train.precision", choices=("fp32", "fp13")), "train.precision"),  # not only the first choice
    ]:
        with pytest.raises(ConfigError, match=match):
            Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET, search=(search,),
                  search_trials=1)
    with pytest.raises(ConfigError, match="search_trials"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET, search_trials=3)
    flops = Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=replace(BUDGET, flops=1e12))
    assert flops.trial_config("a", 0).train.budget.flops == 1e12 and flops.unit == "flops"
    # The unit follows from the Budget: a phase-1 study without a FLOPs or time budget trains on tokens.
    assert Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET).unit == "tokens"
    with pytest.raises(ConfigError, match="study.budget: must be a Budget"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget={"tokens": 10_000, "pairs": 2_000})


def test_tuning_seeds_never_overlap_the_study_seeds():
    """Tuning trial k of every arm runs at seed 10000 + k, never at a study seed, so no final
    trial reruns a tuning trial; a study seed inside that range is refused by name."""
    from embedlab import Search
    from embedlab.studies.study import TUNING_SEED_OFFSET

    base = recipes.phase1_baseline()
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    search = dict(search=(Search("train.learning_rate", low=1e-4, high=1e-2, log=True),), search_trials=4)
    study = Study(name="x", factor="masking.ratio", arms=arms, seeds=(0, 1, 2), budget=BUDGET, **search)
    assert study.tuning_seeds == (10_000, 10_001, 10_002, 10_003) and TUNING_SEED_OFFSET == 10_000
    assert not set(study.tuning_seeds) & set(study.seeds)
    assert Study.from_dict(study.to_dict()).tuning_seeds == study.tuning_seeds
    for load in STUDIES:  # every shipped study, at both profiles
        for profile in sorted(recipes.PROFILES):
            shipped = load_study(load, profile)
            assert not set(shipped.tuning_seeds) & set(shipped.seeds) and len(shipped.tuning_seeds) == (
                shipped.search_trials if shipped.search else 0)
    with pytest.raises(ConfigError, match=r"study.seeds: \[10002\] are tuning seeds"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0, 10_002), budget=BUDGET, **search)
    # Just past the range, and any seed without a search, are fine.
    assert Study(name="x", factor="masking.ratio", arms=arms, seeds=(10_004,), budget=BUDGET, **search)
    assert Study(name="x", factor="masking.ratio", arms=arms, seeds=(10_000,), budget=BUDGET).tuning_seeds == ()


def test_device_seconds_budget_unit():
    """A device-seconds study trains to its Budget's device seconds, passes them to every trial,
    round-trips through JSON (and its hash), and says its budget in words; a budget of both
    FLOPs and device seconds is refused; FLOPs budgets are measured, and say so."""
    base = recipes.phase1_baseline()
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    timed = Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=replace(BUDGET, device_seconds=90.0))
    assert timed.unit == "device_seconds" and timed.budget_text == "90 device seconds"
    assert timed.trial_config("a", 0).train.budget.device_seconds == 90.0
    assert Study.from_dict(timed.to_dict()) == timed and timed.to_dict()["budget"]["device_seconds"] == 90.0
    assert timed.hash != replace(timed, budget=replace(timed.budget, device_seconds=60.0)).hash
    with pytest.raises(ConfigError, match="train.budget.device_seconds: a trial trains to one budget"):
        replace(BUDGET, device_seconds=5.0, flops=1e12)
    # A FLOPs budget is the unit whenever it is set.
    assert Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,),
                 budget=replace(BUDGET, flops=1e12)).unit == "flops"
    from embedlab import Search

    with pytest.raises(ConfigError, match="train.budget.device_seconds"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET,
              search=(Search("train.budget.device_seconds", low=1.0, high=2.0),), search_trials=1)
    flops = Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=replace(BUDGET, flops=1e12))
    assert flops.budget_text == "1e+12 measured training FLOPs"
    assert flops.trial_config("a", 0).train.budget.device_seconds == 0.0


def test_phase2_study_without_parent_is_refused():
    """A phase-2 arm cannot become a trial until a parent checkpoint is given."""
    study = load_study(Path(__file__).parent.parent / "ablations" / "pooling.py")
    with pytest.raises(ConfigError, match="--parent"):
        study.trial_config("mean", 0)


def test_masking_ratio_demo_profile_compares_15_and_30_percent():
    """The demo profile keeps two arms that differ only in masking.ratio (0.15 vs 0.30)."""
    study = load_study(Path(__file__).parent.parent / "ablations" / "masking_ratio.py", "demo")
    assert sorted(study.factor_value(a) for a in study.arms) == [0.15, 0.30]


def test_arm_differing_outside_the_factor_is_refused():
    """An arm that also changes the learning rate is refused, naming the field."""
    base = recipes.phase1_baseline()
    other = replace(base, masking=replace(base.masking, ratio=0.3), train=replace(base.train, learning_rate=5e-4))
    with pytest.raises(ConfigError, match="train.learning_rate"):
        Study(name="x", factor="masking.ratio", arms={"a": base, "b": other}, seeds=(0,), budget=BUDGET)


def test_study_errors_name_the_field():
    """Bad seeds, metric and factor are reported by field name."""
    base = recipes.phase1_baseline()
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    with pytest.raises(ConfigError, match="study.seeds"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(), budget=BUDGET)
    with pytest.raises(ConfigError, match="study.metric"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET, metric="loss")
    with pytest.raises(ConfigError, match="study.factor"):
        Study(name="x", factor="masking.nope", arms=arms, seeds=(0,), budget=BUDGET)


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
    """Phases 2-3 refuse a length schedule and negatives outside phase 3."""
    from embedlab.core.config import ContrastiveConfig, NegativesConfig, TrainConfig

    with pytest.raises(ConfigError, match="train.length_schedule"):
        TrialConfig(phase=2, parent="p", train=TrainConfig(length_schedule=((0.5, 64), (0.5, 128))))
    with pytest.raises(ConfigError, match="negatives.count"):
        TrialConfig(phase=2, parent="p", contrastive=ContrastiveConfig(negatives=NegativesConfig(count=2)))
    with pytest.raises(ConfigError, match="continue_optimizer"):
        ContrastiveConfig(continue_optimizer=True)


def test_concurrency_is_set_by_the_arm_needing_most():
    """Arms with different worker counts: the sweep runs as many trials side by side as the
    largest arm allows (one CPU kept free), whichever arm comes first, and a searched worker
    count or CPU share counts at its largest value; an arm that cannot fit is named."""
    from embedlab.sweep.cluster import study_concurrency

    base = recipes.phase1_baseline("demo")
    small = replace(base, train=replace(base.train, num_workers=1, cpus_per_worker=1.0))
    large = replace(base, train=replace(base.train, num_workers=3, cpus_per_worker=1.0))
    resources = {"CPU": 8.0}
    assert study_concurrency({"small": small}, resources) == 7
    assert study_concurrency({"small": small, "large": large}, resources) == 2
    assert study_concurrency({"large": large, "small": small}, resources) == 2
    huge = replace(base, train=replace(base.train, num_workers=8, cpus_per_worker=1.0))
    with pytest.raises(ValueError, match="arm huge: a trial needs 8 CPUs"):
        study_concurrency({"small": small, "huge": huge}, resources)
    # Optuna may pick any searched value: the most demanding one sizes the sweep.
    from embedlab import Search

    searched = (Search("train.num_workers", choices=(1, 3)), Search("train.learning_rate", low=1e-4, high=1e-3))
    assert study_concurrency({"small": small}, resources, searched) == 2
    assert study_concurrency({"small": small}, resources, (Search("train.cpus_per_worker", low=0.5, high=2.0),)) == 3


def test_dry_run_lists_each_arms_workers_when_they_differ(tmp_path, capsys):
    """Arms with different worker counts are printed one per line (they size the sweep's
    concurrency); arms that agree share one line."""
    from embedlab.cli import main

    path = tmp_path / "workers.py"
    path.write_text(
        "from dataclasses import replace\n"
        "from embedlab import Study, recipes\n\n"
        "def study(profile='demo'):\n"
        "    p = recipes.profile(profile)\n"
        "    base = recipes.phase1_baseline(profile)\n"
        "    arms = {'one': replace(base, train=replace(base.train, num_workers=1)),\n"
        "            'two': replace(base, train=replace(base.train, num_workers=2))}\n"
        "    return Study(name='workers', factor='train.num_workers', arms=arms, seeds=p.seeds,\n"
        "                 budget=recipes.budget_for(p, phase=1), metric='dev/ndcg@10', profile=p.name)\n"
    )
    assert main(["sweep", str(path), "--dry-run", "--profile", "demo"]) == 0
    out = capsys.readouterr().out
    assert "  one: model small: 2 layers, width 128; 1 workers x 0.5 CPU per trial" in out
    assert "  two: model small: 2 layers, width 128; 2 workers x 0.5 CPU per trial" in out


def test_a_flops_budget_below_one_step_is_refused():
    """A FLOPs budget smaller than one step of an arm would end after that step, far over it."""
    base = recipes.phase1_baseline("demo")
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    from embedlab.model.flops import expected_step_flops

    step = expected_step_flops(arms["b"])
    with pytest.raises(ConfigError, match="study.budget.flops: .* less than one step of arm 'b'"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=replace(BUDGET, flops=0.99 * step))
    Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=replace(BUDGET, flops=step))


def test_a_data_setting_cannot_be_tuned():
    """Data is prepared once per arm before tuning, so a searched data path is refused."""
    from embedlab import Search

    base = recipes.phase1_baseline("demo")
    arms = {"a": base, "b": replace(base, masking=replace(base.masking, ratio=0.3))}
    with pytest.raises(ConfigError, match="'data.sequence_length' is a data setting"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=BUDGET,
              search=(Search("data.sequence_length", choices=(64, 128)),), search_trials=2)


def test_a_study_scoring_the_final_eval_split_on_every_trial_must_say_it_is_a_final_report():
    """eval.split 'test' on an arm is refused (selection reads recipe-dev) unless the study is
    declared a final report; declaring it changes the study's hash, and leaving it out does not."""
    import dataclasses

    from embedlab import Study
    from embedlab.core.config import ConfigError, DEFAULT_BUDGET
    from conftest import tiny_trial

    base = tiny_trial()
    on_test = dataclasses.replace(base, eval=dataclasses.replace(base.eval, split="test"))
    arms = {"a": on_test, "b": dataclasses.replace(on_test, masking=dataclasses.replace(base.masking, ratio=0.3))}
    with pytest.raises(ConfigError, match=r"study.arms: a, b score eval.split 'test'.*final_report=True"):
        Study(name="s", factor="masking.ratio", seeds=(0,), budget=DEFAULT_BUDGET, arms=arms)
    report = Study(name="s", factor="masking.ratio", seeds=(0,), budget=DEFAULT_BUDGET, arms=arms, final_report=True)
    assert report.to_dict()["final_report"] is True and Study.from_dict(report.to_dict()).final_report
    dev_arms = {"a": base, "b": dataclasses.replace(base, masking=dataclasses.replace(base.masking, ratio=0.3))}
    plain = Study(name="s", factor="masking.ratio", seeds=(0,), budget=DEFAULT_BUDGET, arms=dev_arms)
    assert "final_report" not in plain.to_dict()
