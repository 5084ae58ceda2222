"""Base recipes that study files derive their arms from, at the sizes of a profile.

A profile fixes what a study runs at (model preset, workers, budgets, seeds, how many arms);
the study file fixes what it compares. `demo` fits a 2-core CPU in minutes (a `small`
2-layer, width-128 encoder, a few 10^5 tokens a trial, two workers so the distributed paths
run); `cpu` is the same machine's hour: one worker with two torch threads (no gloo between
processes sharing two cores) and budgets large enough that the tour ends with a model worth
using and studies that can detect effects; `full` is the size the studies are
declared for on a GPU cluster (the `5m` preset, every arm, three seeds, budgets the built-in
corpus can feed without passing its repetition cap); `gpu-300m` is the recipe's own size on
8 GPUs a trial (the `300m` preset at length 512 in bf16, 10^9 tokens in phase 1 and millions of
pairs in phases 2-3, read from public Hugging Face datasets pinned by revision, `GPU_SOURCES`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from embedlab.core.config import (DEFAULT_BUDGET, MODEL_PRESETS, PRETRAINED_TOKENIZER, Budget, ConfigError,
                                  ContrastiveConfig, DataConfig, MaskingConfig, MixtureConfig, NegativesConfig,
                                  TrainConfig, TrialConfig)
from embedlab.core.config.sources import HFPairs
from embedlab.sources.builtin import available_sources
from embedlab.sources.external import HFDataset
from embedlab.sources.mixture import MixtureError, PHASE1_FAMILIES, PHASE1_PILOT, pilot_mixture

# The recipe's pilot pair mixtures mapped onto the built-in pair builders.
BUILTIN_PHASE2_PAIRS = (("same-source-spans", 0.5), ("title-body", 0.3), ("term-definition", 0.2))
BUILTIN_PHASE3_PAIRS = (("title-body", 0.6), ("synonyms", 0.25), ("same-source-spans", 0.15))
# The cpu profile adds lead-rest (a text's opening summary -> the rest of it) at a fifth of
# phase 2, taken from the spans: ablations/probes/phase2_lead_rest.py measured 0.6068 recipe-dev
# nDCG@10 against 0.5877 for the pilot mixture (seed 1, 100,000 pairs). Phase 3 gets it at the
# same rate relative to title-body, its other target-like builder.
CPU_PHASE2_PAIRS = (("same-source-spans", 0.3), ("title-body", 0.3), ("term-definition", 0.2), ("lead-rest", 0.2))
CPU_PHASE3_PAIRS = (("title-body", 0.45), ("lead-rest", 0.15), ("synonyms", 0.25), ("same-source-spans", 0.15))
@dataclass(frozen=True, kw_only=True)
class Profile:
    """The sizes a study runs at. Budgets are per trial, summed over workers."""

    name: str
    summary: str  # one line for --help: where it runs and what it gives
    model: str
    seeds: tuple[int, ...]
    phase1_tokens: int
    phase2_pairs: int
    phase3_pairs: int
    num_workers: int
    cpus_per_worker: float
    use_gpu: bool
    phase1_batch_rows: int
    contrastive_batch_rows: int
    sequence_length: int
    all_arms: bool  # False: a study keeps only the arms it marks for a short tour
    torch_threads: int = 1  # torch's intra-op threads in each worker
    phase2_learning_rate: float = 2e-4  # peak learning rates of the contrastive phases
    max_epochs: float = 4.0  # data.mixture.max_epochs: how often a source (or pair builder) may be reread
    phase3_learning_rate: float = 1e-4
    precision: str = TrainConfig.precision
    tokenizer_vocab_size: int = DataConfig.tokenizer_vocab_size
    # Phase-1 documents beyond the built-in corpus, and which of the recipe's pilot families
    # (`data.mixture.PHASE1_FAMILIES`) each stands for. Empty: the built-in corpus, mapped by
    # PHASE1_FAMILIES when the data is prepared. Set: phase 1 trains on these alone, at the
    # pilot's family shares (`phase1_shares`); the built-in corpus is still built, for
    # recipe-dev and the evaluation task.
    documents: tuple[HFDataset, ...] = ()
    document_families: tuple[tuple[str, tuple[str, ...]], ...] = ()
    pair_sources: tuple[HFPairs, ...] = ()  # phases 2-3: pairs beside the built-in builders
    phase2_pair_shares: tuple[tuple[str, float], ...] = BUILTIN_PHASE2_PAIRS
    phase3_pair_shares: tuple[tuple[str, float], ...] = BUILTIN_PHASE3_PAIRS
    # The overlap with final-eval data that the contamination audit finds in this profile's
    # phase-2/3 pairs, declared by every phase-2/3 study at this profile (None: no overlap).
    disclosed_overlap: str | None = None
    # Phases 2-3: the parent every study at this profile starts from when `--parent` names none,
    # e.g. a pretrained one (`hf:ORG/NAME@<commit>` or a model directory,
    # `embedlab.checkpoints.pretrained`); None: given at sweep time or by promotion.
    parent: str | None = None
    # Phase 3 mines among a fixed sample of this many training documents
    # (`contrastive.negatives.corpus_sample`; 0: every one), for a profile that must mine in
    # seconds rather than minutes; the table says its negatives came from a sample.
    mining_corpus_sample: int = 0


# Public Hugging Face datasets for the gpu-300m profile, each pinned by a commit and read by
# `datasets.load_dataset` at it, so a wrong commit fails when the data is prepared, never
# silently. Nothing was fetched from the Hub to choose them: each commit is one that public
# repositories pin or that the Hub's own pages (as stored by a search index) show, as said per
# source; the licences are the dataset cards'. HFDataset records no rights, so they are here.
GPU_SOURCES = {
    # ODC-By 1.0. Common Crawl pages kept by an educational-quality classifier, the 10^10-token
    # sample; this commit is the one many public projects pin for sample-10BT.
    "fineweb-edu": HFDataset(name="fineweb-edu", dataset="HuggingFaceFW/fineweb-edu", config="sample-10BT",
                             revision="87f09149ef4734204d70ed1d046ddc9ca3f2b8f9", id_field="id"),
    # CC BY-SA 3.0 and GFDL. The English dump of 2023-11-01; a commit public projects pin for
    # the 20231101.* configs.
    "wikipedia-en": HFDataset(name="wikipedia-en", dataset="wikimedia/wikipedia", config="20231101.en",
                              revision="b04c8d1ceb2f5cd4588862100d08de323dccfbaa", title_field="title",
                              id_field="id"),
    # The card states no licence; CodeSearchNet's functions come from public GitHub repositories
    # under their own licences. 1,375,067 functions: the code is the text, its docstring the
    # title. The commit is the card's "Update README.md" (the Hub's tree page at it).
    "codesearchnet": HFDataset(name="codesearchnet", dataset="sentence-transformers/codesearchnet", config="pair",
                               revision="079a958b01dc87cf07b66a68414c4b4196d889cc", text_field="code",
                               title_field="comment"),
}
GPU_PAIRS = (
    # question -> answer, 3,012,496 rows; the commit is the card's "Update README.md" (its Hub page).
    HFPairs(name="gooaq", dataset="sentence-transformers/gooaq", config="pair",
            revision="b089f728748a068b7bc5234e5bcf5b25e3c8279c",
            rights="sentence-transformers/gooaq's card states no licence; its source, GooAQ (allenai/gooaq), is "
                   "Apache-2.0 by its card; the answers are Google search snippets"),
    # anchor / positive / negative, 557,850 training rows (the commit sentence-transformers' own
    # model cards record for this set).
    HFPairs(name="all-nli", dataset="sentence-transformers/all-nli", config="triplet",
            revision="d482672c8e74ce18da116f430137434ba2e52fab",
            rights="sentence-transformers/all-nli's card states no licence; it is built from SNLI (CC BY-SA 4.0) "
                   "and MultiNLI (the multi_nli card: OANC's licence, CC BY-SA 3.0 and CC BY 3.0 portions)"),
)


PROFILES: dict[str, Profile] = {
    "demo": Profile(
        name="demo", summary="2-core CPU, minutes: what `make demo` runs",
        model="small", seeds=(0, 1), phase1_tokens=300_000, phase2_pairs=2_048, phase3_pairs=1_024,
        num_workers=2, cpus_per_worker=0.5, use_gpu=False, phase1_batch_rows=8, contrastive_batch_rows=16,
        sequence_length=128, all_arms=False,
        # Encoding all 146,555 training documents took about 85 s of the demo on two cores
        # (16,384: about 12 s); the sample's neighbours are real documents, only fewer.
        mining_corpus_sample=16_384,
    ),
    # Sized for a 2-core CPU machine: a three-phase tour within an hour that ends with a released
    # model (below BM25 on the built-in task: docs/results/cpu-tour.md). One worker with two torch threads (no all-gather between processes on two cores).
    # Phases 2-3 were 100,000 / 50,000 pairs until a tour on a busy machine took 63 minutes (its
    # 12 trials trained for 50 of them, phase 2 for 28); 75,000 / 40,000 leave about 9 minutes
    # of that run's training as margin.
    "cpu": Profile(
        name="cpu", summary="2-core CPU, under an hour, a small released model",
        model="small", seeds=(0, 1), phase1_tokens=3_000_000, phase2_pairs=75_000, phase3_pairs=40_000,
        num_workers=1, cpus_per_worker=1.0, use_gpu=False, phase1_batch_rows=32, contrastive_batch_rows=64,
        sequence_length=128, all_arms=False, torch_threads=2, phase2_learning_rate=5e-4, phase3_learning_rate=2e-4,
        # The built-in corpus has 5,562 title-body and 3,182 lead-rest pairs; phase 2's 75,000
        # pairs read them about 4x and 5x.
        max_epochs=8.0, phase2_pair_shares=CPU_PHASE2_PAIRS, phase3_pair_shares=CPU_PHASE3_PAIRS,
    ),
    "full": Profile(
        name="full", summary="a GPU cluster; the study files' default",
        model="5m", seeds=(0, 1, 2), phase1_tokens=5_000_000, phase2_pairs=200_000,
        phase3_pairs=50_000, num_workers=4, cpus_per_worker=2.0, use_gpu=True, phase1_batch_rows=32,
        contrastive_batch_rows=64, sequence_length=256, all_arms=True,
    ),
    # The recipe's own size: one trial is 8 GPUs (a node), 64 rows of 512 tokens a GPU in
    # phase 1 (what `bench mfu` times), 256 pairs a GPU in phases 2-3 gathered into 2,048
    # candidates. Phase 1 reads the Hugging Face documents alone: the built-in corpus would pass
    # its repetition cap in the first percent of 10^9 tokens. The code source is the scarcest
    # (about 1 GB of text): mixture.py's 40%-technical arm should read it two to three times,
    # under the cap of 4, which the sweep checks on the prepared tokens before any trial.
    "gpu-300m": Profile(
        name="gpu-300m", summary="8-GPU nodes, the recipe's 300M encoder on 10^9 tokens",
        model="300m", seeds=(0, 1, 2), phase1_tokens=1_000_000_000, phase2_pairs=8_000_000,
        phase3_pairs=1_500_000, num_workers=8, cpus_per_worker=8.0, use_gpu=True, phase1_batch_rows=64,
        contrastive_batch_rows=256, sequence_length=512, all_arms=True, phase2_learning_rate=1e-4,
        phase3_learning_rate=3e-5, precision="bf16", tokenizer_vocab_size=49152,
        documents=tuple(GPU_SOURCES.values()),
        document_families=(("general", ("fineweb-edu",)), ("reference", ("wikipedia-en",)),
                           ("technical", ("codesearchnet",)), ("question-answer", ())),
        pair_sources=GPU_PAIRS,
        # Broad pretraining: spans of the documents and question-answer pairs. Fine-tuning:
        # questions to answers (the target), entailment (semantic), spans (general).
        phase2_pair_shares=(("same-source-spans", 0.6), ("gooaq", 0.4)),
        phase3_pair_shares=(("gooaq", 0.5), ("all-nli", 0.3), ("same-source-spans", 0.2)),
    ),
}
DEFAULT_PROFILE = "full"


def profiles_help() -> str:
    """Every profile with its summary, for the --profile option's help."""
    return "; ".join(f"{name} ({profile.summary})" for name, profile in PROFILES.items())


def profile(name: str = DEFAULT_PROFILE) -> Profile:
    if name not in PROFILES:
        raise ConfigError(f"profile: unknown profile {name!r}; valid: {sorted(PROFILES)}")
    return PROFILES[name]


def phase1_shares(p: Profile, families: dict[str, float] = PHASE1_PILOT) -> dict[str, float]:
    """Family shares (the recipe's phase-1 pilot by default) mapped onto the profile's phase-1
    sources: the built-in ones available here (`data.mixture.pilot_mixture`), or the profile's
    own documents by `document_families`, by the same rule (a family's share split evenly over
    its sources; a family without sources redistributed over the rest by their shares)."""
    if not p.document_families:
        return pilot_mixture(available_sources(), families).shares
    present = dict(p.document_families)
    if set(present) != set(PHASE1_FAMILIES) or set(families) != set(PHASE1_FAMILIES):
        raise MixtureError(f"profile {p.name}: families must be {sorted(PHASE1_FAMILIES)}, got "
                           f"{sorted(present)} and {sorted(families)}")
    usable = {family: share for family, share in families.items() if present[family] and share > 0}
    scale = 1.0 / sum(usable.values())
    return {source: share * scale / len(present[family]) for family, share in usable.items()
            for source in present[family]}


def _train(p: Profile, batch_rows: int, learning_rate: float) -> TrainConfig:
    return TrainConfig(batch_rows=batch_rows, learning_rate=learning_rate, num_workers=p.num_workers,
                       cpus_per_worker=p.cpus_per_worker, use_gpu=p.use_gpu, torch_threads=p.torch_threads,
                       precision=p.precision)


def phase1_baseline(profile_name: str = "demo") -> TrialConfig:
    """Phase-1 MLM at the recipe's pilot setting: 15% selection, 80/10/10 replacement."""
    p = profile(profile_name)
    # Explicit shares only for a profile's own documents: the built-in mapping is resolved
    # when the data is prepared, on the sources that machine has.
    shares = tuple(sorted(phase1_shares(p).items())) if p.document_families else ()
    return TrialConfig(
        model=MODEL_PRESETS[p.model],
        masking=MaskingConfig(ratio=0.15),
        data=DataConfig(sequence_length=p.sequence_length, hf_datasets=p.documents,
                        tokenizer_vocab_size=p.tokenizer_vocab_size,
                        mixture=MixtureConfig(shares=shares, max_epochs=p.max_epochs)),
        train=_train(p, p.phase1_batch_rows, 1e-3),
    )


def phase2_baseline(profile_name: str = "demo") -> TrialConfig:
    """Phase-2 broad contrastive pretraining from a phase-1 checkpoint (given at sweep time):
    the recipe's pilot pair mixture mapped onto the built-in builders, mean pooling,
    temperature 0.05, candidates gathered across workers."""
    p = profile(profile_name)
    base = phase1_baseline(profile_name)
    return dataclasses.replace(
        base,
        phase=2,
        data=dataclasses.replace(base.data, hf_pairs=p.pair_sources),
        contrastive=ContrastiveConfig(
            pairs=p.phase2_pair_shares,
            pair_length=64,
            temperature=0.05,
        ),
        train=_train(p, p.contrastive_batch_rows, p.phase2_learning_rate),
        parent=p.parent,
    )


def phase3_baseline(profile_name: str = "demo") -> TrialConfig:
    """Phase-3 supervised contrastive fine-tuning from a phase-2 checkpoint: the recipe's
    pilot pair mixture (target query-document, semantic, general retrieval) mapped onto the
    built-in builders (or the profile's pair sources), with mined hard negatives and a smaller
    learning rate."""
    base = phase2_baseline(profile_name)
    return dataclasses.replace(
        base,
        phase=3,
        contrastive=dataclasses.replace(
            base.contrastive,
            pairs=profile(profile_name).phase3_pair_shares,
            negatives=NegativesConfig(count=2, top_k=200,
                                      corpus_sample=profile(profile_name).mining_corpus_sample),
        ),
        train=dataclasses.replace(base.train, learning_rate=profile(profile_name).phase3_learning_rate),
    )


def on_backbone(config: TrialConfig, pretrained: Any, parent: str) -> TrialConfig:
    """The arm `config` on a pretrained backbone (`pretrained`: the parent's
    `embedlab.checkpoints.pretrained.PretrainedArms`, `parent` where it is): the model config
    derived from its checkpoint (the arm's declared one is not used), data tokenised with its
    tokenizer, and its sentence-transformers pooling and prefixes where it has them, else the
    arm's own, "mean" taken as "mean_all" (`parent_pooling`)."""
    from embedlab.checkpoints.pretrained import parent_pooling  # here: torch, which loading a study file does not need

    prefixes = {"query": config.contrastive.prefixes.query, "passage": config.contrastive.prefixes.passage}
    pooling, prefixes, _ = parent_pooling(pretrained.sentence_transformers, config.contrastive.pooling, prefixes)
    contrastive = dataclasses.replace(config.contrastive, pooling=pooling,
                                      prefixes=dataclasses.replace(config.contrastive.prefixes, **prefixes))
    data = dataclasses.replace(config.data, tokenizer_kind=PRETRAINED_TOKENIZER, tokenizer_hash=pretrained.tokenizer_hash,
                               tokenizer_vocab_size=pretrained.vocab_size)
    return dataclasses.replace(config, model=pretrained.model, data=data, contrastive=contrastive, parent=str(parent))


def derive(config: TrialConfig, changes: dict[str, Any]) -> TrialConfig:
    """`config` with the fields at dotted paths replaced, validated again (a bad value names its
    field): `derive(base, {"contrastive.negatives.count": 2})` is the arm `base` with two mined
    negatives, the way a study varies a field inside a section without spelling each level's
    `dataclasses.replace`. A path that names no field is a ConfigError."""
    raw = config.to_dict()
    for path, value in changes.items():
        node = raw
        *parents, leaf = path.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                raise ConfigError(f"{path}: not a config path")
            node = node[key]
        if leaf not in node:
            raise ConfigError(f"{path}: not a config path")
        node[leaf] = value
    return TrialConfig.from_dict(raw)


def budget_for(p: Profile, phase: int, control: TrialConfig | None = None) -> Budget:
    """The profile's study budget for a phase.

    With `control` (the arm the others are compared to, as the study builds it), the budget is
    measured training FLOPs: what the control's steps cost over the profile's tokens (phase 1)
    or pairs (phases 2-3), predicted by `embedlab.model.flops.expected_step_flops`. Every arm
    then trains to that many FLOPs, so an arm that costs more per token or pair (a joint MLM
    term, mined negatives, a higher masking ratio's head) reads less data: equal compute, not
    equal data. The data figures stay, as the length of the data schedule and for the record.
    Without `control`, the budget is the profile's data unit (tables then say the arms are
    data-matched, and by how much their FLOPs differ)."""
    # Phases 2-3 train on pairs; tokens stay the phase-1 figure for the record. Phase 1 reads
    # no pairs: its Budget keeps the default figure every phase-1 arm carried before studies
    # stamped a whole Budget, so its trials' configs are unchanged.
    pairs = {1: DEFAULT_BUDGET.pairs, 2: p.phase2_pairs, 3: p.phase3_pairs}[phase]
    data = Budget(tokens=p.phase1_tokens, pairs=pairs)
    if control is None:
        return data
    # here: torch (both modules import it), which loading a study file does not need
    from embedlab.model.flops import expected_step_flops
    from embedlab.train.budget import step_units

    if control.parent is not None:  # a pretrained parent: its own backbone's steps, not the declared model's
        from embedlab.checkpoints.pretrained import declared_arms  # here: torch, as above

        pretrained = declared_arms(control.parent)
        control = control if pretrained is None else on_backbone(control, pretrained, control.parent)
    units = data.data(phase)
    return dataclasses.replace(data, flops=float(units / step_units(control) * expected_step_flops(control)))
