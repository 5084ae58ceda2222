"""The memory a plan states and the nodes it is compared with: the parameter count held to the
real module tree, the floor's arithmetic by hand, the fleet's nodes held to workers/, and the
dry run's line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from embedlab.cli import main
from embedlab.core.config import MODEL_PRESETS, ContrastiveConfig, NegativesConfig, TrialConfig
from embedlab.model.memory import STATE_BYTES_PER_PARAMETER, encoder_parameters, gib, training_memory
from embedlab.sweep.capacity import FLEET_NODES

from conftest import tiny_trial, write_study

WORKERS = Path(__file__).parent.parent / "workers"


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_the_parameter_count_is_the_real_module_trees(preset):
    """`encoder_parameters` and the phase-1 head term equal the counts of the modules built on
    the meta device (`parameter_counts`), for every preset."""
    from embedlab.model.encoder import parameter_counts

    model = MODEL_PRESETS[preset]
    counts = parameter_counts(model)
    assert encoder_parameters(model) == counts["encoder"]
    trial = TrialConfig(model=model, data=dataclasses.replace(TrialConfig().data, tokenizer_vocab_size=256))
    assert training_memory(trial).parameters == counts["with_mlm_head"]


def test_the_floor_is_state_plus_one_microbatchs_activations_by_hand():
    """Phase 1: 8 rows x 64 tokens x 2 layers x (2*64 + 128) values x 4 bytes (fp32 on CPU);
    phase 3 with 2 negatives and a GradCache chunk of 4: 4 rows x 4 texts x 64 tokens."""
    trial = tiny_trial()  # width 64, ffn 128, 2 layers, 8 rows, sequence 64, fp32 on CPU
    memory = training_memory(trial)
    assert memory.state == STATE_BYTES_PER_PARAMETER * memory.parameters
    assert memory.activations == 8 * 64 * 2 * (2 * 64 + 128) * 4 and memory.device == "CPU"
    contrastive = ContrastiveConfig(negatives=NegativesConfig(count=2), gradcache_chunk=4, pair_length=64)
    phase3 = dataclasses.replace(trial, phase=3, contrastive=contrastive,
                                 train=dataclasses.replace(trial.train, precision="bf16"))
    memory = training_memory(phase3)
    assert memory.parameters == encoder_parameters(trial.model)  # no MLM head in phase 3
    assert memory.activations == 4 * (2 + 2) * 64 * 2 * (2 * 64 + 128) * 2
    assert (gib(2**30 * 0.5), gib(2**30 * 81_000_000)) == ("0.5 GiB", "8.10e+07 GiB")


def test_the_fleet_nodes_are_the_workers_files():
    """FLEET_NODES holds the gpu_worker of workers/cluster.yaml (a g5.12xlarge: 4 A10G) and the
    gpu group of workers/raycluster.yaml (a 60Gi pod with one GPU)."""
    cluster = yaml.safe_load((WORKERS / "cluster.yaml").read_text())["available_node_types"]["gpu_worker"]
    assert cluster["node_config"]["InstanceType"] == "g5.12xlarge" and cluster["resources"]["GPU"] == 4
    group = next(g for document in yaml.safe_load_all((WORKERS / "raycluster.yaml").read_text()) if document
                 for g in document.get("spec", {}).get("workerGroupSpecs", []) if g["groupName"] == "gpu")
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["memory"], limits["nvidia.com/gpu"]) == ("60Gi", "1")
    assert [(n.host_memory, n.gpu_memory) for n in FLEET_NODES] == [(192 * 2**30, 24 * 2**30), (60 * 2**30, 141 * 2**30)]


def test_the_dry_run_states_the_memory_a_worker_needs(tmp_path, capsys):
    """A study that fits: the dry run's checked lines say what one worker needs and what holds it."""
    trial = tiny_trial(num_workers=1)
    path = write_study(tmp_path / "study.py", trial)
    memory = training_memory(trial)
    assert main(["sweep", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (f"    memory: at least {gib(memory.total)} per CPU worker ({memory.parameters:,} parameters: "
            f"{gib(memory.state)} of weights, gradients and AdamW state; {gib(memory.activations)} of activations a "
            "microbatch)\n") in out
