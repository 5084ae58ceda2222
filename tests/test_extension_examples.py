"""Worked examples of the three places embedlab is extended (docs/architecture.md, "Where to
add things"): a new ablation, a new objective and a new data source, each done the way the
map says and checked for the property that makes it trustworthy."""

from __future__ import annotations

import hashlib
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from embedlab.core.config import ConfigError, DataConfig, LocalFiles, MixtureConfig
from embedlab.objectives.contrastive import ContrastiveLoss, multi_positive_infonce, pair_masks
from embedlab.objectives.gradcache import gradcache_step
from embedlab.sources.corpus import build_corpus
from embedlab.sources.mixture import resolve_mixture
from embedlab.studies.study import load_study
from embedlab.sweep.run import dry_run

# ---------------------------------------------------------------------------------------------
# A new ablation: a study file derived from a base recipe

WARMUP_STUDY = '''"""Warmup: 2% vs 20% of the budget in phase 1, at equal measured training FLOPs."""

from dataclasses import replace

from embedlab import Study, recipes


def study(profile: str = recipes.DEFAULT_PROFILE) -> Study:
    p = recipes.profile(profile)
    base = recipes.phase1_baseline(profile)

    def warmup(fraction: float):
        return replace(base, train=replace(base.train, schedule=replace(base.train.schedule,
                                                                       warmup_fraction=fraction)))

    arms = {"warmup-2": warmup(0.02), "warmup-20": warmup(0.2)}
    return Study(
        name="warmup",
        factor="train.schedule.warmup_fraction",
        arms=arms,
        seeds=p.seeds,
        budget=recipes.budget_for(p, phase=1, control=arms["warmup-2"]),
        metric="dev/ndcg@10",
        profile=p.name,
        description="Does a long warmup pay for itself at equal compute?",
    )
'''


def test_a_new_ablation_is_a_study_file_derived_from_a_base_recipe(tmp_path):
    """The study file above is the whole change: it loads at every profile, its arms differ
    from the base recipe only in the declared factor, every trial gets the study's budget and
    seed, and the dry run prints the plan without Ray. An arm that also changes another field
    is refused, so a study cannot silently compare two things at once."""
    path = tmp_path / "warmup.py"
    path.write_text(WARMUP_STUDY)
    study = load_study(path, "demo")
    assert study.factor_value("warmup-2") == 0.02 and study.factor_value("warmup-20") == 0.2
    trials = {arm: study.trial_config(arm, study.seeds[0]) for arm in study.arms}
    for trial in trials.values():
        assert trial.train.budget == study.budget and study.budget.flops > 0 and trial.train.seed == study.seeds[0]
    # Apart from the factor, the two trials are the same experiment.
    schedule = trials["warmup-20"].train.schedule
    assert replace(trials["warmup-20"], train=replace(
        trials["warmup-20"].train, schedule=replace(schedule, warmup_fraction=0.02))) == trials["warmup-2"]
    plan = dry_run(path, profile="demo")
    assert "warmup-2 " in plan and "warmup-20 " in plan and f"budget per trial: {study.budget_text}" in plan

    path.write_text(WARMUP_STUDY.replace('"warmup-20": warmup(0.2)',
                                         '"warmup-20": replace(warmup(0.2), masking=replace(base.masking, ratio=0.3))'))
    with pytest.raises(ConfigError, match="masking.ratio"):
        load_study(path, "demo")


# ---------------------------------------------------------------------------------------------
# A new objective: a pure tensor function returning a loss sum and a count


def margin_infonce(queries: torch.Tensor, candidates: torch.Tensor, positive: torch.Tensor,
                   eligible: torch.Tensor, *, temperature: float, margin: float) -> ContrastiveLoss:
    """Additive-margin InfoNCE: `margin` is taken off every positive's similarity before the
    softmax, so a positive must beat the negatives by at least that much.

    queries (N, d) and candidates (M, d): L2-normalised; positive and eligible (N, M) bool.
    Reduction: the loss *summed* over valid anchors (rows with a positive) and their count,
    never a mean: the caller divides by the step's global count. Counts stay tensors, so the
    step never reads the device back for them. A row without a positive scores over every
    candidate (a finite zero: its all -inf log-sum would give a nan backward) and is left out
    of the sum by `torch.where`, not dropped by indexing, whose size a GPU would read back.
    """
    valid_rows = positive.any(dim=1)  # (N,)
    eligible = eligible | positive
    everything = ~valid_rows[:, None]
    logits = (queries @ candidates.T - margin * positive.to(queries.dtype)) / temperature
    log_positive_mass = logits.masked_fill(~(positive | everything), -math.inf).logsumexp(dim=1)
    log_eligible_mass = logits.masked_fill(~(eligible | everything), -math.inf).logsumexp(dim=1)
    per_anchor = torch.where(valid_rows, log_eligible_mass - log_positive_mass, 0.0)
    return ContrastiveLoss(loss_sum=per_anchor.sum(), valid=valid_rows.sum(), anchors=len(queries),
                           candidate_sum=(eligible & valid_rows[:, None]).sum())


def test_a_new_objective_as_a_sum_and_count_is_exact_under_gradcache():
    """An objective written as (loss sum, count) plugs into the step's contrastive term and
    needs nothing else to be exact: GradCache over chunks of 3 gives the loss and the encoder
    gradients of the plain full-batch computation (float64, to rounding)."""
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)).double()
    query_inputs, doc_inputs = torch.randn(8, 12, dtype=torch.float64), torch.randn(8, 12, dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 2, 3, 3, 4, 5])  # two queries share a group: multi-positive

    def encode(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.normalize(encoder(x), dim=-1)

    def term(queries: torch.Tensor, candidates: torch.Tensor) -> ContrastiveLoss:
        masks = pair_masks(groups, groups)
        return margin_infonce(queries, candidates, masks.positive, masks.eligible, temperature=0.05, margin=0.1)

    # At margin 0 it is the reference objective, to rounding.
    masks = pair_masks(groups, groups)
    q, d = encode(query_inputs).detach(), encode(doc_inputs).detach()
    torch.testing.assert_close(
        margin_infonce(q, d, masks.positive, masks.eligible, temperature=0.05, margin=0.0).loss_sum,
        multi_positive_infonce(q, d, masks.positive, masks.eligible, temperature=0.05).loss_sum)

    plain = term(encode(query_inputs), encode(doc_inputs))
    (plain.loss_sum / plain.valid).backward()
    expected = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()

    cached = gradcache_step(encode, query_inputs.split(3), doc_inputs.split(3), term, global_valid=plain.valid)
    torch.testing.assert_close(cached.loss_sum, plain.loss_sum.detach())
    for got, want in zip((p.grad for p in encoder.parameters()), expected):
        torch.testing.assert_close(got, want)


# ---------------------------------------------------------------------------------------------
# A new data source: a config naming the files, mixed by share

LICENSES = ("GPL-2", "GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1", "Artistic")  # real English prose


def test_a_new_document_source_is_read_mixed_and_recorded(tmp_path):
    """Documents from local files are a config (`LocalFiles`) named in the mixture's shares:
    the corpus reads one document per file, records every file's bytes and sha256 so the
    source can be pinned, splits its documents like any other, and the mixture resolves to the
    configured shares. A share naming a source that does not exist is refused up front."""
    folder = tmp_path / "licenses"
    folder.mkdir()
    for name in LICENSES:
        shutil.copy(Path("/usr/share/common-licenses") / name, folder / f"{name}.txt")
    config = DataConfig(sources=("python-docs",), local_files=(LocalFiles(name="licenses", path=str(folder)),),
                        mixture=MixtureConfig(shares=(("python-docs", 0.9), ("licenses", 0.1))))
    corpus = build_corpus(config, tmp_path / "corpus", progress=lambda line: None)

    record = corpus.manifest["sources"]["licenses"]
    assert record["acquisition"] == "local-files" and record["documents_read"] == len(LICENSES)
    assert record["files"] == [
        {"path": f"{name}.txt", "bytes": (folder / f"{name}.txt").stat().st_size,
         "sha256": hashlib.sha256((folder / f"{name}.txt").read_bytes()).hexdigest()}
        for name in sorted(LICENSES)]
    assert sum(record["retained"].values()) == len(LICENSES)
    documents = pq.read_table(corpus.directory / "documents.parquet").to_pylist()
    titles = sorted(row["title"] for row in documents if row["source"] == "licenses")
    assert titles == sorted(LICENSES)
    resolved = resolve_mixture(config.mixture.share_map, sorted({row["source"] for row in documents}))
    assert resolved.shares == {"python-docs": 0.9, "licenses": 0.1}

    with pytest.raises(ConfigError, match="licences"):
        DataConfig(sources=("python-docs",), local_files=config.local_files,
                   mixture=MixtureConfig(shares=(("python-docs", 0.9), ("licences", 0.1))))
