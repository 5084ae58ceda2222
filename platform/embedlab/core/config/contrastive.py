"""The configs of phases 2 and 3 (contrastive training from a parent checkpoint): the loss and
its batch in `ContrastiveConfig`, with one sub-config per concern: hard negatives
(`NegativesConfig`), distillation from a teacher (`DistillationConfig`), Matryoshka widths
(`MatryoshkaConfig`) and the texts' prefixes (`PrefixConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from embedlab.core.config.checks import check, check_fields

# "mean": the text's own tokens (CLS and SEP excluded); "cls": the first position's state;
# "mean_all": every token of the row, CLS and SEP included, sentence-transformers' "mean" (a
# pretrained parent's pooling, which a native sentence-transformers release expresses).
POOLING_METHODS = ("mean", "cls", "mean_all")
GIVEN_MARGIN_WORDS = ("mining_margin", "off")
# How phase 3 drops likely false negatives among the mined candidates (`NegativesConfig.rule`).
NEGATIVE_RULES = ("margin", "relative", "window")
# Teachers whose scores phase 3 can distil (`embedlab.teacher.labels`); "" is none.
TEACHERS = ("all-MiniLM-L6-v2",)
# How a phase-2/3 batch draws its pairs: "mixed" (every batch mixes the builders by share) or
# "one-source" (every batch comes from one builder, batches scheduled so the shares hold).
BATCH_COMPOSITIONS = ("mixed", "one-source")
# Where a phase-2/3 encoder starts: the parent checkpoint's weights, or a fresh random
# initialisation of the same architecture (the parent then supplies only the tokenizer).
INITIALISATIONS = ("parent", "random")


@dataclass(frozen=True, kw_only=True)
class NegativesConfig:
    """Phase 3's hard negatives: `count` per query, mined among the `top_k` nearest training
    documents under the parent encoder, then selected by a `rule` (NEGATIVE_RULES) against
    likely false negatives: "margin" drops any that scores within `margin` of (or above) the
    positive; "relative" any that scores above `relative_fraction` times the positive's score
    (NV-Retriever's TopK-PercPos, 0.95); "window" keeps only search ranks `window` = (first,
    last), 1-based, skipping the nearest. Then `skip_top` survivors are skipped and `count` kept:
    the first, or with `sample` a sample drawn by the trial's data seed. The search is stored
    once per parent, pairs and `top_k` and every rule selects from it, so a study that varies
    the rule mines once (`embedlab.negatives.candidates`). `mining_workers` > 1 encodes and
    searches on that many Ray workers (the same candidates as one process; not part of what is
    mined). `false_negative_sample` > 0 measures the false-negative rate on that many of the
    selected negatives, drawn by a fixed seed: the share a teacher (all-MiniLM-L6-v2, a model's
    judgment) scores at or above the positive, and the share in the query's own source group or
    near-duplicate cluster (`embedlab.teacher.false_negatives`). `corpus_sample` > 0 searches a
    fixed sample of that many training documents instead of all of them (the same sample for
    every trial, seed and study: the documents whose id hashes lowest), for a profile that must
    mine in seconds; its negatives are easier than a full search finds, and the table says so.

    A pair of a user source (`data.pair_files` ...) that carries negatives of its own gets
    those first, then mined ones fill its `count` slots (`mine` False: given ones only). A
    given negative scoring above (positive score - `given_margin`) under the parent encoder is
    dropped and counted, as a mined one would be: "mining_margin" (the default) uses `margin`,
    a number >= 0 its own margin, "off" keeps every given negative. 0 negatives: in-batch
    negatives only."""

    count: int = 0
    top_k: int = 100  # candidates searched per query when mining
    margin: float = 0.05  # rule "margin": drop candidates scoring above (positive score - margin)
    mine: bool = True  # with count > 0: mine from the corpus (else given negatives only)
    given_margin: float | str = "mining_margin"  # a margin >= 0, "mining_margin" or "off"
    rule: str = "margin"  # NEGATIVE_RULES: how likely false negatives are dropped
    relative_fraction: float = 0.95  # rule "relative": drop candidates above this fraction of the positive's score
    window: tuple[int, int] | None = None  # rule "window": the (first, last) search ranks kept, 1-based
    skip_top: int = 0  # survivors of the rule skipped, nearest first
    sample: bool = False  # keep a seeded sample of the survivors, not the first
    mining_workers: int = 1  # Ray workers that encode and search (1: the trial's driver alone)
    false_negative_sample: int = 0  # selected negatives the teacher judges for the false-negative rate (0: none)
    corpus_sample: int = 0  # training documents searched: a fixed sample of this many (0: every one)

    def __post_init__(self) -> None:
        check_fields(self, "contrastive.negatives")
        check(self.count >= 0, "contrastive.negatives.count", "must be >= 0")
        check(self.top_k >= max(self.count, 1), "contrastive.negatives.top_k", "must be at least negatives.count")
        check(self.margin >= 0, "contrastive.negatives.margin", "must be >= 0")
        margin = self.given_margin
        check(margin in GIVEN_MARGIN_WORDS or (isinstance(margin, int | float) and not isinstance(margin, bool)
                                               and margin >= 0), "contrastive.negatives.given_margin",
              f"{margin!r}; valid: a number >= 0 or one of {list(GIVEN_MARGIN_WORDS)}")
        check(self.rule in NEGATIVE_RULES, "contrastive.negatives.rule", f"{self.rule!r}; valid: {list(NEGATIVE_RULES)}")
        check(0 < self.relative_fraction <= 1, "contrastive.negatives.relative_fraction",
              f"{self.relative_fraction}: must be in (0, 1]")
        window = None if self.window is None else tuple(self.window)
        object.__setattr__(self, "window", window)  # JSON gives a list: the config's own form is a tuple
        check((window is None) == (self.rule != "window"), "contrastive.negatives.window",
              f"{window}: (first, last) ranks with rule 'window', and None with any other rule")
        check(window is None or (len(window) == 2 and all(isinstance(r, int) for r in window)
                                 and 1 <= window[0] <= window[1] <= self.top_k),
              "contrastive.negatives.window", f"{window}: needs whole ranks 1 <= first <= last <= top_k ({self.top_k})")
        check(self.skip_top >= 0 and self.skip_top + self.count <= self.top_k, "contrastive.negatives.skip_top",
              f"{self.skip_top}: must be >= 0 with skip_top + count <= top_k ({self.top_k})")
        check(self.mining_workers >= 1, "contrastive.negatives.mining_workers", f"{self.mining_workers}: must be >= 1")
        check(self.false_negative_sample >= 0, "contrastive.negatives.false_negative_sample",
              f"{self.false_negative_sample}: must be >= 0")
        check(self.corpus_sample == 0 or self.corpus_sample >= self.top_k, "contrastive.negatives.corpus_sample",
              f"{self.corpus_sample}: 0 (every training document) or at least top_k ({self.top_k})")

    @property
    def given_threshold(self) -> float | None:
        """The false-negative margin applied to given negatives; None: they are kept as given."""
        if self.given_margin == "off":
            return None
        return self.margin if self.given_margin == "mining_margin" else float(self.given_margin)


@dataclass(frozen=True, kw_only=True)
class DistillationConfig:
    """Distillation from a frozen `teacher` (TEACHERS; `embedlab.objectives.distillation`).

    The teacher scores every (query, candidate) of the scheduled pairs once, offline, with
    `query_prefix` / `passage_prefix`; `kl_weight` weighs KL distillation over each query's own
    positive and negatives (teacher scores / `teacher_temperature`, student cosines /
    `student_temperature`) and `margin_mse_weight` MarginMSE over its (positive, negative)
    margins (both phase 3 with negatives). Rows whose teacher margin (positive minus best
    negative) is below `min_confidence` get no distillation label (None: every row keeps its
    label). `embedding_mse_weight` (phase 2 or 3) regresses the student's unit embedding of one
    unlabelled training-split document per scheduled pair onto the teacher's embedding of the
    same text, projected to the student's width by a fixed orthonormal projection when the
    widths differ (`embedlab.teacher.embeddings`). The InfoNCE keeps weight 1 - `weight`
    (0: distillation only)."""

    teacher: str = ""
    query_prefix: str = ""
    passage_prefix: str = ""
    kl_weight: float = 0.0
    margin_mse_weight: float = 0.0
    embedding_mse_weight: float = 0.0
    student_temperature: float = 0.05
    teacher_temperature: float = 0.05
    min_confidence: float | None = None

    def __post_init__(self) -> None:
        check_fields(self, "contrastive.distillation")
        check(self.teacher in ("", *TEACHERS), "contrastive.distillation.teacher",
              f"{self.teacher!r}; valid: {['', *TEACHERS]}")
        for name in ("kl_weight", "margin_mse_weight", "embedding_mse_weight"):
            check(0.0 <= getattr(self, name) <= 1.0, f"contrastive.distillation.{name}",
                  f"{getattr(self, name)}: must be in [0, 1]")
        check(self.weight <= 1.0 + 1e-9, "contrastive.distillation.kl_weight",
              f"kl_weight + margin_mse_weight + embedding_mse_weight = {self.weight:g}: "
              "must be at most 1 (the InfoNCE keeps the rest)")
        if self.weight > 0:
            check(bool(self.teacher), "contrastive.distillation.teacher",
                  "kl_weight / margin_mse_weight / embedding_mse_weight > 0 need a teacher to distil; "
                  f"valid: {list(TEACHERS)}")
        check(self.student_temperature > 0 and self.teacher_temperature > 0,
              "contrastive.distillation.student_temperature", "both KL temperatures must be positive")
        check(self.min_confidence is None or -2.0 <= self.min_confidence <= 2.0,
              "contrastive.distillation.min_confidence",
              f"{self.min_confidence}: a margin of cosines, in [-2, 2], or None")

    @property
    def weight(self) -> float:
        """The distillation terms' total weight; the InfoNCE keeps 1 minus it."""
        return self.kl_weight + self.margin_mse_weight + self.embedding_mse_weight

    @property
    def score_weight(self) -> float:
        """The weight of the terms that read teacher labels (KL and MarginMSE: phase 3 with negatives)."""
        return self.kl_weight + self.margin_mse_weight


@dataclass(frozen=True, kw_only=True)
class MatryoshkaConfig:
    """Matryoshka training (`embedlab.objectives.matryoshka`): the contrastive loss at each of
    `dims` (increasing widths, each at most `model.width`) of the truncated, re-normalised
    embedding, weighted by `weights` (default 1 each). Empty: the full width alone. Only the
    listed widths are trained: list `model.width` to keep the full one."""

    dims: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        dims, weights = tuple(self.dims), tuple(self.weights)
        check(all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
              and list(dims) == sorted(set(dims)), "contrastive.matryoshka.dims",
              f"{list(dims)}: positive integer widths in increasing order, each once")
        check(not weights or (len(weights) == len(dims) and all(w > 0 for w in weights)),
              "contrastive.matryoshka.weights",
              f"{list(weights)}: one positive weight per width of dims {list(dims)} (or none: 1 each)")
        # JSON round trips give lists: the config's own form is a tuple.
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "weights", weights)
        check_fields(self, "contrastive.matryoshka")

    def trained_widths(self, width: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The widths the contrastive loss is computed at and their weights, for an encoder of
        `width`: `dims` (weights default 1), or the full width alone."""
        if not self.dims:
            return (width,), (1.0,)
        return self.dims, self.weights or (1.0,) * len(self.dims)


@dataclass(frozen=True, kw_only=True)
class PrefixConfig:
    """The texts prepended to a pair's two sides (`query`, `passage`) in training, evaluation,
    mining and the release, recorded with every checkpoint."""

    query: str = "query: "
    passage: str = "passage: "

    def __post_init__(self) -> None:
        check_fields(self, "contrastive.prefixes")


@dataclass(frozen=True, kw_only=True)
class ContrastiveConfig:
    """Phases 2 and 3: contrastive training from a parent checkpoint.

    `pairs` gives shares of consumed *positive pairs* per pair builder (`embedlab.pairs.builders`).
    The loss is the multi-positive InfoNCE at `temperature` (a temperature: logits are
    divided by it), optionally learnable and optionally symmetric; candidates are gathered
    across workers when `gather_across_workers`. `gradcache_chunk` > 0 turns on GradCache
    with that many pairs per chunk (the same gradient, with or without a joint MLM term).
    `mlm_weight` > 0 makes the phase joint: mlm_weight * L_MLM + (1 - mlm_weight) *
    L_contrastive, with MLM on separately corrupted copies of the same texts.
    `batch_composition` (BATCH_COMPOSITIONS) says whether a batch mixes the builders or holds
    one builder's pairs; `init` (INITIALISATIONS) whether the encoder starts from the parent's
    weights or from a random initialisation of the same architecture. `negatives`,
    `distillation`, `matryoshka` and `prefixes` are the sub-configs of their own sections.
    """

    pairs: tuple[tuple[str, float], ...] = (
        ("same-source-spans", 0.5), ("title-body", 0.3), ("term-definition", 0.2),
    )
    pair_length: int = 64
    temperature: float = 0.05
    learnable_temperature: bool = False
    symmetric: bool = False
    gather_across_workers: bool = True
    gradcache_chunk: int = 0
    mlm_weight: float = 0.0
    pooling: str = "mean"
    continue_optimizer: bool = False
    batch_composition: str = "mixed"
    init: str = "parent"
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    matryoshka: MatryoshkaConfig = field(default_factory=MatryoshkaConfig)
    prefixes: PrefixConfig = field(default_factory=PrefixConfig)

    def __post_init__(self) -> None:
        check_fields(self, "contrastive")
        if self.distillation.score_weight > 0:
            check(self.negatives.count >= 1, "contrastive.negatives.count",
                  "distillation scores each query's own positive and negatives: needs negatives.count >= 1")
        check(self.batch_composition in BATCH_COMPOSITIONS, "contrastive.batch_composition",
              f"{self.batch_composition!r}; valid: {list(BATCH_COMPOSITIONS)}")
        check(self.init in INITIALISATIONS, "contrastive.init", f"{self.init!r}; valid: {list(INITIALISATIONS)}")
        check(bool(self.pairs), "contrastive.pairs", "needs at least one pair builder")
        total = sum(share for _, share in self.pairs)
        check(abs(total - 1.0) < 1e-6, "contrastive.pairs", f"shares must sum to 1, got {total:.6f}")
        check(self.pair_length >= 8, "contrastive.pair_length", "must be >= 8")
        check(self.temperature > 0, "contrastive.temperature", "must be positive")
        check(self.gradcache_chunk >= 0, "contrastive.gradcache_chunk", "must be >= 0")
        check(0.0 <= self.mlm_weight < 1.0, "contrastive.mlm_weight", "must be in [0, 1)")
        check(self.pooling in POOLING_METHODS, "contrastive.pooling",
              f"{self.pooling!r}; valid: {list(POOLING_METHODS)}")
        check(not self.continue_optimizer, "contrastive.continue_optimizer",
              "a changed objective is not an exact resume: optimizer state and schedule clocks reset")
