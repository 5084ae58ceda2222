"""The gpu-300m profile: every study file loads at it, at the recipe's own size, from Hugging Face
sources pinned by revision, and its dry runs start nothing and fetch nothing (no Ray, no download)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from embedlab.cli import main
from embedlab import recipes
from embedlab.studies.study import load_study

ROOT = Path(__file__).parent.parent
ABLATIONS = sorted((ROOT / "ablations").glob("*.py"))
STUDIES = [p for p in ABLATIONS if "def tour(" not in p.read_text()]
COMMIT = re.compile(r"[0-9a-f]{40}")


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_study_file_loads_at_the_gpu_profile_at_the_recipes_size(path, capsys):
    """At gpu-300m every arm is the 300m preset on 8 GPUs in bf16 at length 512 (the extension:
    2,048 from a 512 parent), budgets are >= 10^9 tokens and >= 10^6 pairs (the extension: an
    eighth of phase 1), every Hugging Face source is pinned by a commit and every pair source
    states its rights; the sweep's dry run says so and exits 0."""
    study = load_study(path, "gpu-300m")
    extension = any(config.extension for config in study.arms.values())
    assert study.budget.tokens == (1_000_000_000 // 8 if extension else 1_000_000_000) and study.budget.tokens >= 1e8
    assert extension or study.budget.tokens >= 1e9
    assert study.phase == 1 or study.budget.pairs >= 1e6
    for arm in study.arms:
        config = study.trial_config(arm, study.seeds[0], "/checkpoints/parent" if study.needs_parent else None)
        assert (config.model.preset, config.train.num_workers, config.train.use_gpu, config.train.precision) == (
            "300m", 8, True, "bf16")
        assert config.data.sequence_length == (2048 if extension else 512)
        assert config.data.hf_datasets and all(COMMIT.fullmatch(s.revision) for s in config.data.hf_datasets)
        assert set(config.data.mixture.share_map) <= {s.name for s in config.data.hf_datasets}
        if config.phase > 1:
            assert all(COMMIT.fullmatch(s.revision) and s.rights.strip() for s in config.data.hf_pairs)
            named = {name for name, _ in config.contrastive.pairs}
            # Spans and keywords read any source's prose, the profile's own documents included.
            assert named - {"same-source-spans", "keyword"} <= set(config.data.pair_source_names)
    assert main(["sweep", str(path), "--profile", "gpu-300m", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "profile gpu-300m" in out and "model 300m: 24 layers, width 1024; 8 workers x 8 CPU + 1 GPU" in out


def test_the_tour_dry_run_at_the_gpu_profile_lists_its_three_stages(capsys):
    """`embedlab tour ablations/recipe.py --profile gpu-300m --dry-run` validates every stage."""
    assert main(["tour", str(ROOT / "ablations" / "recipe.py"), "--profile", "gpu-300m", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("model 300m: 24 layers") == 3 and "== stage 3/3: hard_negatives.py" in out


def test_the_pilot_families_map_onto_the_gpu_profiles_documents():
    """Hand arithmetic: the pilot's 50/20/20/10 with no question-answer source is 5/9, 2/9, 2/9;
    mixture.py's 30/20/40/10 is 3/9, 2/9, 4/9; and the study's arms carry exactly those shares."""
    p = recipes.profile("gpu-300m")
    assert recipes.phase1_shares(p) == pytest.approx({"fineweb-edu": 5 / 9, "wikipedia-en": 2 / 9,
                                                      "codesearchnet": 2 / 9})
    more = {"general": 0.3, "reference": 0.2, "technical": 0.4, "question-answer": 0.1}
    assert recipes.phase1_shares(p, more) == pytest.approx({"fineweb-edu": 3 / 9, "wikipedia-en": 2 / 9,
                                                            "codesearchnet": 4 / 9})
    study = load_study(ROOT / "ablations" / "mixture.py", "gpu-300m")
    assert study.arms["more-technical"].data.mixture.share_map == pytest.approx(recipes.phase1_shares(p, more))


def test_the_full_profile_keeps_its_meaning():
    """`full` is still the 5m preset on the built-in corpus and builders: no external source."""
    full = recipes.profile("full")
    assert (full.model, full.sequence_length, full.phase1_tokens, full.use_gpu) == ("5m", 256, 5_000_000, True)
    phase3 = recipes.phase3_baseline("full")
    assert not phase3.data.hf_datasets and not phase3.data.hf_pairs and not phase3.data.mixture.shares
    assert phase3.contrastive.pairs == recipes.BUILTIN_PHASE3_PAIRS
    assert recipes.phase2_baseline("full").contrastive.pairs == recipes.BUILTIN_PHASE2_PAIRS


def test_dry_runs_and_a_measured_plan_import_neither_ray_nor_datasets(tmp_path):
    """In a fresh interpreter, the sweep and tour dry runs and `plan --throughput` at gpu-300m
    finish without importing Ray or datasets: nothing starts and nothing is downloaded."""
    measured = tmp_path / "bench-mfu.json"
    measured.write_text(json.dumps({"bench": {"preset": "300m", "sequence_length": 512, "batch_rows": 64,
                                              "precision": "bf16"}, "device": "NVIDIA H200", "tokens_per_s": 1e5}))
    script = f"""
import sys
from embedlab.cli import main
for argv in (["sweep", "ablations/hard_negatives.py", "--profile", "gpu-300m", "--dry-run"],
             ["tour", "ablations/recipe.py", "--profile", "gpu-300m", "--dry-run"],
             ["plan", "ablations/recipe.py", "--profile", "gpu-300m", "--throughput", {str(measured)!r}]):
    assert main(argv) == 0, argv
print("imported:", sorted(m for m in ("ray", "datasets", "huggingface_hub") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "platform"), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "imported: []"
