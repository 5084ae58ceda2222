"""The MLM-initialisation study: phase 2 from the phase-1 checkpoint vs from a random
initialisation, at equal total FLOPs (the parent's training charged to the arm that inherits
its weights); in-process loops on tiny random models, synthetic run directories, no Ray."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import synthetic
from embedlab import Study, recipes
from embedlab.checkpoints.io import CheckpointError, save_checkpoint
from embedlab.core.config import Budget, ConfigError, DEFAULT_BUDGET, TrainConfig, TrialConfig
from embedlab.model.flops import expected_step_flops
from embedlab.stats.table import UnequalComputeError, check_equal_compute, compute_match_line, load_table, render
from embedlab.studies.study import flatten, load_study
from embedlab.train.budget import recorded_flops, split_lineage_budget

STUDY_FILE = Path(__file__).parent.parent / "ablations" / "mlm_init.py"
STEPS_CHARGED = 2  # the parent's recorded FLOPs, in steps of the child's
STEPS_TOTAL = 5  # the lineage budget: the from-parent arm trains 3 steps, the random arm 5


def write_parent(directory: Path, frozen, flops: float | None) -> Path:
    """A random phase-1 checkpoint (encoder and MLM head) recording `flops` measured training FLOPs."""
    from embedlab.model.encoder import MLMModel

    torch.manual_seed(7)
    model = MLMModel(synthetic.MODEL)
    budget = {} if flops is None else {"budget": {"budget/flops": flops, "budget/tokens": 1234}}
    save_checkpoint(directory, model.encoder, head=model.mlm_head, tokenizer=frozen, fields={"phase": 1, **budget})
    return directory


def child(parent: Path, *, init: str, seed: int = 0, joint: bool = False, total: float = 0.0) -> TrialConfig:
    """A contrastive-only (or joint) phase-2 trial from `parent`; with `total`, a lineage-scoped FLOPs budget."""
    trial = synthetic.contrastive_trial(parent, seed=seed)
    trial = dataclasses.replace(trial, contrastive=dataclasses.replace(
        trial.contrastive, init=init, mlm_weight=0.3 if joint else 0.0))
    if total:
        budget = dataclasses.replace(trial.train.budget, flops=total, scope="lineage")
        trial = dataclasses.replace(trial, train=dataclasses.replace(trial.train, budget=budget))
    return trial


@pytest.fixture
def frozen(tmp_path):
    return synthetic.tokenizer(tmp_path / "tokenizer")


@pytest.fixture
def step(tmp_path) -> float:
    """The predicted FLOPs of one step of the child trials."""
    return expected_step_flops(child(tmp_path / "unused", init="parent"))


def encoder_state(loop) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in loop.encoder.state_dict().items()}


def final_manifest(root: Path) -> dict:
    return json.loads(max(root.rglob("manifest.json"), key=lambda p: p.stat().st_mtime).read_text())


def test_the_study_charges_phase_1_flops_to_the_initialised_arm_only(tmp_path, frozen, step):
    """Budget oracle: from the same parent and lineage budget, the from-parent loop's phase-2
    budget is exactly total - the parent's recorded FLOPs and the random loop's is the total;
    trained out, each stops at the first step reaching its own budget and reports
    budget/total_flops = budget/inherited_flops + budget/flops, which its manifest records."""
    parent_flops, total = STEPS_CHARGED * step, STEPS_TOTAL * step
    parent = write_parent(tmp_path / "parent", frozen, parent_flops)
    for init, charged in (("parent", parent_flops), ("random", 0.0)):
        trial = child(parent, init=init, total=total)
        loop = synthetic.make_loop(trial, frozen)
        assert loop.clock() == (0.0, total - charged)
        reports, _ = synthetic.train(trial, frozen, tmp_path / f"run-{init}")
        last = reports[-1]
        assert last["budget/inherited_flops"] == charged
        assert last["budget/total_flops"] == charged + last["budget/flops"]
        assert reports[-2]["budget/flops"] < total - charged <= last["budget/flops"]
        manifest = final_manifest(tmp_path / f"run-{init}")
        assert manifest["budget"]["budget/total_flops"] == last["budget/total_flops"]
        assert manifest["initialisation"]["encoder"] == init
        assert recorded_flops(manifest) == last["budget/total_flops"]  # a phase 3 from it counts the lineage
    # The study's own split, as `embedlab sweep` prints and records it before any trial starts.
    study = load_study(STUDY_FILE, "demo")
    split = study.lineage_budgets({"parent_hash": None, "budget": {"budget/flops": 1e11}})
    assert split["from-mlm"] == {"inherited_flops": 1e11, "phase_flops": study.budget.flops - 1e11}
    assert split["random-init"] == {"inherited_flops": 0.0, "phase_flops": study.budget.flops}


def test_a_random_init_loop_starts_from_fresh_weights_drawn_from_the_seed(tmp_path, frozen):
    """Random init: every random-initialised tensor differs from the parent's, the weights are
    identical for the same seed (and equal phase 1's own starting encoder at that seed) and
    differ for another; the tokenizer is the parent's; a contrastive-only arm carries no MLM
    head (masked-token retention not measured), a joint one a fresh head."""
    from embedlab.checkpoints.io import read_manifest

    parent = write_parent(tmp_path / "parent", frozen, 1e9)
    parent_state = load_file(str(parent / "encoder.safetensors"))
    torch.manual_seed(123)  # the caller's RNG state does not enter the draw
    first = synthetic.make_loop(child(parent, init="random", seed=3), frozen)
    again = encoder_state(synthetic.make_loop(child(parent, init="random", seed=3), frozen))
    other = encoder_state(synthetic.make_loop(child(parent, init="random", seed=4), frozen))
    start = encoder_state(first)
    random_tensors = [k for k, v in start.items() if v.dim() == 2]
    assert random_tensors and all(not torch.equal(start[k], parent_state[k]) for k in random_tensors)
    assert start.keys() == again.keys() and all(torch.equal(start[k], again[k]) for k in start)
    assert all(not torch.equal(start[k], other[k]) for k in random_tensors)
    phase1 = synthetic.make_loop(synthetic.phase1_trial(seed=3), frozen)
    assert all(torch.equal(start[k], v) for k, v in phase1.model.encoder.state_dict().items())
    assert first.tokenizer.hash == read_manifest(parent)["tokenizer_hash"]
    assert first.weights()[1] is None
    record = first.initialisation_record()
    assert record["encoder"] == "random" and "not measured" in record["weights"]
    # The joint term gets a fresh head, not the parent's.
    joint = synthetic.make_loop(child(parent, init="random", seed=3, joint=True), frozen)
    parent_head = load_file(str(parent / "mlm_head.safetensors"))
    assert not torch.equal(joint.weights()[1].dense.weight.detach(), parent_head["dense.weight"])
    assert all(torch.equal(joint.encoder.state_dict()[k], start[k]) for k in start)


def test_a_random_init_child_still_needs_the_parents_tokenizer(tmp_path, frozen):
    """The parent supplies the tokenizer to a random arm too: a parent with another tokenizer is refused."""
    from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

    other = save_tokenizer(train_tokenizer([f"other words {i} here" for i in range(200)], vocab_size=280),
                           tmp_path / "other-tokenizer")
    parent = write_parent(tmp_path / "parent", other, 1e9)
    with pytest.raises(CheckpointError, match="tokenizer"):
        synthetic.make_loop(child(parent, init="random"), frozen)


def test_a_from_parent_loop_starts_from_the_parents_weights(tmp_path, frozen, step):
    """Unchanged behaviour: init "parent" starts from the parent's encoder and head bit for bit,
    with or without a lineage-scoped budget."""
    parent = write_parent(tmp_path / "parent", frozen, 2 * step)
    parent_state = load_file(str(parent / "encoder.safetensors"))
    parent_head = load_file(str(parent / "mlm_head.safetensors"))
    for total in (0.0, 5 * step):
        loop = synthetic.make_loop(child(parent, init="parent", total=total), frozen)
        start = encoder_state(loop)
        assert start.keys() == parent_state.keys() and all(torch.equal(start[k], parent_state[k]) for k in start)
        head = loop.weights()[1].state_dict()
        assert all(torch.equal(head[k], v) for k, v in parent_head.items())
        assert loop.initialisation_record()["encoder"] == "parent"
    unscoped = child(parent, init="parent")
    assert synthetic.make_loop(unscoped, frozen).clock() == (0.0, unscoped.train.budget.pairs)


def test_unknown_or_too_large_parent_flops_are_refused(tmp_path, frozen, step):
    """One-line ConfigErrors: a lineage budget needs the parent's recorded FLOPs, and a total above them."""
    with pytest.raises(ConfigError, match="records none"):
        split_lineage_budget(10.0, None, inherits_weights=True)
    with pytest.raises(ConfigError, match="not above the parent's"):
        split_lineage_budget(10.0, 10.0, inherits_weights=True)
    assert split_lineage_budget(10.0, None, inherits_weights=False) == (0.0, 10.0)
    assert split_lineage_budget(10.0, 4.0, inherits_weights=True) == (4.0, 6.0)
    # What a manifest records: a from-scratch phase 1's own FLOPs; a continuation only its lineage's total.
    assert recorded_flops({"parent_hash": None, "budget": {"budget/flops": 5.0}}) == 5.0
    assert recorded_flops({"parent_hash": "abc", "budget": {"budget/flops": 5.0}}) is None
    assert recorded_flops({"parent_hash": "abc", "budget": {"budget/flops": 5.0, "budget/total_flops": 9.0}}) == 9.0
    assert recorded_flops({"parent_hash": None, "budget": {"budget/flops_estimate": 5.0}}) is None
    unknown = write_parent(tmp_path / "unknown", frozen, None)
    with pytest.raises(ConfigError, match="records none") as error:
        synthetic.make_loop(child(unknown, init="parent", total=5 * step), frozen)
    assert "\n" not in str(error.value)
    synthetic.make_loop(child(unknown, init="random", total=5 * step), frozen)  # inherits nothing, needs nothing
    heavy = write_parent(tmp_path / "heavy", frozen, 6 * step)
    with pytest.raises(ConfigError, match="nothing left to train"):
        synthetic.make_loop(child(heavy, init="parent", total=5 * step), frozen)
    study = load_study(STUDY_FILE, "demo")
    with pytest.raises(ConfigError, match="records none"):
        study.lineage_budgets({"parent_hash": None, "budget": {}})
    with pytest.raises(ConfigError, match="less than one step"):
        study.lineage_budgets({"parent_hash": None, "budget": {"budget/flops": study.budget.flops * (1 - 1e-9)}})
    # The scope itself: FLOPs budgets of phases 2-3 only.
    with pytest.raises(ConfigError, match="train.budget.scope"):
        dataclasses.replace(DEFAULT_BUDGET, scope="lineage")
    with pytest.raises(ConfigError, match="train.budget.scope"):
        Budget(tokens=1, pairs=1, scope="everything", flops=1.0)
    lineage = Budget(tokens=100_000, pairs=2_000, scope="lineage", flops=1.0)
    with pytest.raises(ConfigError, match="train.budget.scope"):
        TrialConfig(train=TrainConfig(budget=lineage))
    with pytest.raises(ConfigError, match="train.budget.scope"):  # the study's Budget: a FLOPs one
        dataclasses.replace(study, budget=dataclasses.replace(study.budget, flops=0.0))
    phase1 = recipes.phase1_baseline("demo")
    arms = {"a": phase1, "b": dataclasses.replace(phase1, masking=dataclasses.replace(phase1.masking, ratio=0.3))}
    with pytest.raises(ConfigError, match="study.budget.scope: 'lineage' .* phase-2 or phase-3"):
        Study(name="x", factor="masking.ratio", arms=arms, seeds=(0,), budget=dataclasses.replace(lineage, flops=1e15))


def load_module(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("profile", ["demo", "cpu", "full"])
def test_the_study_validates_and_its_arms_differ_only_in_the_factor(profile):
    """At every profile: the arms differ in contrastive.init alone, the total is the profile's
    phase-1 FLOPs budget plus PHASE2_SHARE of its phase-2 one, and every trial gets it with
    the lineage scope."""
    study = load_study(STUDY_FILE, profile)
    assert study.profile == profile and study.phase == 2 and study.factor == "contrastive.init"
    assert list(study.arms) == ["from-mlm", "random-init"] and study.budget.scope == "lineage"
    control, random = (flatten(c.to_dict()) for c in study.arms.values())
    assert {k for k in control if control[k] != random[k]} == {"contrastive.init"}
    assert (control["contrastive.init"], random["contrastive.init"]) == ("parent", "random")
    p = recipes.profile(profile)
    phase1 = recipes.budget_for(p, phase=1, control=recipes.phase1_baseline(profile)).flops
    phase2 = recipes.budget_for(p, phase=2, control=recipes.phase2_baseline(profile))
    share = load_module(STUDY_FILE).PHASE2_SHARE
    assert study.budget.flops == phase1 + share * phase2.flops
    assert study.budget.pairs == round(share * phase2.pairs)
    assert Study.from_dict(study.to_dict()) == study
    for arm in study.arms:
        train = study.trial_config(arm, study.seeds[0], "/checkpoints/parent").train
        assert train.budget == study.budget and train.budget.scope == "lineage"


def lineage_run(root: Path, totals: dict[str, float], inherited: float = 4e11) -> Path:
    """A run directory of the demo study: two seeds per arm at the given total FLOPs."""
    study = load_study(STUDY_FILE, "demo")
    run_dir = root / "run"
    (run_dir / "trials").mkdir(parents=True)
    (run_dir / "study.json").write_text(json.dumps({"study": study.to_dict(), "arm_order": list(study.arms),
                                                    "parent": "/p", "final_eval_overlap": []}))
    for arm, total in totals.items():
        charged = inherited if arm == "from-mlm" else 0.0
        for seed in (0, 1):
            row = {"trial_id": f"{arm}-{seed}", "arm": arm, "seed": seed, "status": "finished", "stage": "final",
                   "factor_value": arm, "budget/pairs": 3000, "budget/inherited_flops": charged,
                   "budget/flops": total - charged, "budget/total_flops": total, "dev/ndcg@10": 0.3 + 0.01 * seed,
                   "dev/recall@100": 0.5, "train/loss": 2.0,
                   "retention/mlm_accuracy": 0.4 if arm == "from-mlm" else None}
            (run_dir / "trials" / f"{row['trial_id']}.json").write_text(json.dumps(row))
    return run_dir


def test_tables_match_the_arms_on_total_flops_within_one_percent(tmp_path):
    """The 1% compute-match check applies to budget/total_flops, not this phase's FLOPs (which
    differ by the parent's); tables show both, and the random arm's masked-token accuracy is absent."""
    total = load_study(STUDY_FILE, "demo").budget.flops
    run_dir = lineage_run(tmp_path / "equal", {"from-mlm": total * 1.002, "random-init": total * 0.999})
    table = load_table(run_dir)
    assert table.attrs["scope"] == "lineage"
    assert check_equal_compute(table, "flops") == pytest.approx(1.002 / 0.999 - 1)
    assert "equal total measured training FLOPs" in compute_match_line(table)
    text = render(run_dir, "text")
    header = next(line for line in text.splitlines() if line.startswith("arm "))
    assert all(c in header for c in ("budget/inherited_flops", "budget/flops", "budget/total_flops"))
    assert json.loads(render(run_dir, "json"))["arms"][1]["retention/mlm_accuracy:mean"] is None
    unequal = lineage_run(tmp_path / "unequal", {"from-mlm": total, "random-init": total * 1.02})
    with pytest.raises(UnequalComputeError, match="unequal compute in flops"):
        check_equal_compute(load_table(unequal), "flops")
