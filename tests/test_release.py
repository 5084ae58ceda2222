"""Release packages: sentence-transformers embeds exactly as embedlab's evaluator does; the
package holds no MLM head and states its contract and lineage; bad inputs are refused."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from embedlab.checkpoints.io import CheckpointError, load_encoder, save_checkpoint
from embedlab.core.config import (ContrastiveConfig, DataConfig, EvalConfig, MatryoshkaConfig, ModelConfig, PrefixConfig,
                                  TrialConfig)
from embedlab.model.encode import encode_texts
from embedlab.model.encoder import Encoder, MLMModel
from embedlab.release.export import ZERO_VECTOR_RULE, export_release
from embedlab.tokenizer.frozen import save_tokenizer, train_tokenizer

MAX_LENGTH = 24
LONG = " ".join(["Return a new list containing all items from the iterable in ascending order."] * 6)
TEXTS = [
    "Return a new list containing all items from the iterable in ascending order.",
    "Open file and return a corresponding file object.",
    "x",
    "",
    "How do I read a file line by line?",
    LONG,
]
PARENT_HASH = "ab" * 32


def tiny_trial(pooling: str) -> TrialConfig:
    """A phase-2 config around a 2-layer width-32 encoder, scored at MAX_LENGTH tokens."""
    return TrialConfig(
        model=ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=512, max_length=64),
        data=DataConfig(tokenizer_vocab_size=300, sequence_length=64),
        eval=EvalConfig(max_length=MAX_LENGTH),
        phase=2,
        contrastive=ContrastiveConfig(pooling=pooling, prefixes=PrefixConfig(query="query: ", passage="passage: ")),
    )


def write_checkpoint(directory, pooling: str):
    """A checkpoint as a contrastive phase writes it: encoder, MLM head, tokenizer, lineage."""
    trial = tiny_trial(pooling)
    tokenizer = save_tokenizer(train_tokenizer(TEXTS * 10, 300), directory / "tokenizer")
    torch.manual_seed(0)
    model = MLMModel(trial.model)
    with torch.no_grad():  # far from the 0.02 init, so a pooling or truncation slip moves the vector
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    settings = trial.contrastive
    return save_checkpoint(
        directory / "checkpoint", model.encoder, head=model.mlm_head, tokenizer=tokenizer,
        pooling=settings.pooling, prefixes={"query": settings.prefixes.query, "passage": settings.prefixes.passage},
        fields={"phase": 2, "parent_hash": PARENT_HASH, "config": trial.to_dict(), "data_revision": "rev-test"},
    )


@pytest.fixture(scope="module", params=["mean", "cls"])
def release(request, tmp_path_factory):
    """(checkpoint dir, package dir, package manifest) for each pooling method."""
    root = tmp_path_factory.mktemp(f"release-{request.param}")
    write_checkpoint(root, request.param)
    manifest = export_release(root / "checkpoint", root / "package")
    return root / "checkpoint", root / "package", manifest


@pytest.fixture
def offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def load_st(package):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(package), device="cpu", trust_remote_code=True, local_files_only=True)


def evaluator_embeddings(checkpoint, texts, side: str, max_length: int = MAX_LENGTH) -> np.ndarray:
    """What the evaluator computes for one side: the checkpoint's own pooling and prefix."""
    encoder, tokenizer, manifest = load_encoder(checkpoint)
    pooling = manifest["pooling"]
    return encode_texts(encoder, tokenizer, texts, max_length=max_length, pooling=pooling["method"],
                        prefix=pooling["prefixes"][side])


def test_sentence_transformers_embeds_as_the_evaluator(release, offline):
    """SentenceTransformer query and passage embeddings equal encode_texts to 1e-5, long text truncated alike."""
    checkpoint, package, _ = release
    model = load_st(package)
    _, tokenizer, _ = load_encoder(checkpoint)
    assert len(tokenizer.encode_batch([LONG])[0]) > 2 * MAX_LENGTH
    queries = evaluator_embeddings(checkpoint, TEXTS, "query")
    passages = evaluator_embeddings(checkpoint, TEXTS, "passage")
    np.testing.assert_allclose(model.encode(TEXTS, prompt_name="query"), queries, atol=1e-5)
    np.testing.assert_allclose(model.encode(TEXTS, prompt_name="document"), passages, atol=1e-5)
    np.testing.assert_allclose(model.encode_query(TEXTS), queries, atol=1e-5)
    np.testing.assert_allclose(model.encode_document(TEXTS), passages, atol=1e-5)
    np.testing.assert_allclose(model.encode(TEXTS), passages, atol=1e-5)  # the default prompt is the passage side
    # Truncation is exercised: the long text's full-length embedding is a different vector.
    untruncated = evaluator_embeddings(checkpoint, [LONG], "passage", max_length=512)[0]
    assert np.abs(untruncated - passages[-1]).max() > 1e-2
    assert model.max_seq_length == MAX_LENGTH and model.get_embedding_dimension() == 32


def test_zero_vector_rule_matches(release, offline):
    """An empty text without a prompt: zero vector under mean pooling in both paths, unit under CLS; never NaN."""
    checkpoint, package, manifest = release
    model = load_st(package)
    encoder, tokenizer, _ = load_encoder(checkpoint)
    pooling = manifest["pooling"]["method"]
    ours = encode_texts(encoder, tokenizer, [""], max_length=MAX_LENGTH, pooling=pooling)
    theirs = model.encode([""], prompt="")
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert np.isfinite(theirs).all()
    assert np.linalg.norm(theirs) == pytest.approx(0.0 if pooling == "mean" else 1.0, abs=1e-5)


def test_export_rebuilds_the_release_byte_for_byte(release, tmp_path):
    """A release is reproducible from its checkpoint: exporting again writes the same files
    with the same bytes (no timestamps or paths of the machine that exported it)."""
    checkpoint, package, _ = release
    again = tmp_path / "again"
    export_release(checkpoint, again)

    def tree(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    assert tree(again) == tree(package)


def test_package_holds_no_mlm_head(release):
    """The package's only weights are the encoder's, byte for byte the checkpoint's encoder file."""
    checkpoint, package, manifest = release
    assert sorted(p.name for p in package.iterdir()) == [
        "1_Normalize", "config_sentence_transformers.json", "encoder.safetensors", "manifest.json",
        "modules.json", "tokenizer.json",
    ]
    assert (checkpoint / "mlm_head.safetensors").is_file()
    assert list(manifest["files"]) == ["encoder.safetensors"]
    assert (package / "encoder.safetensors").read_bytes() == (checkpoint / "encoder.safetensors").read_bytes()
    from safetensors.torch import load_file

    encoder_keys = set(Encoder(ModelConfig(**manifest["model"])).state_dict())
    assert set(load_file(str(package / "encoder.safetensors"))) == encoder_keys


def test_manifest_states_contract_and_lineage(release):
    """The manifest records the pooling contract (max length, zero-vector rule) and the lineage; ST files agree."""
    checkpoint, package, manifest = release
    source = json.loads((checkpoint / "manifest.json").read_text())
    assert json.loads((package / "manifest.json").read_text()) == manifest
    contract = manifest["pooling"]
    assert contract["method"] == source["pooling"]["method"]
    assert contract["prefixes"] == {"query": "query: ", "passage": "passage: "}
    assert contract["max_length"] == MAX_LENGTH
    assert contract["normalise"].startswith("l2") and contract["zero_vector"] == ZERO_VECTOR_RULE[contract["method"]]
    assert manifest["exported_from"] == source["content_hash"] != manifest["content_hash"]
    assert manifest["parent_hash"] == PARENT_HASH
    assert manifest["data_revision"] == "rev-test" and manifest["config"] == source["config"]
    assert manifest["tokenizer_hash"] == source["tokenizer_hash"] and manifest["phase"] == 2
    st_config = json.loads((package / "config_sentence_transformers.json").read_text())
    assert st_config["prompts"] == {"query": "query: ", "document": "passage: "}
    assert st_config["default_prompt_name"] == "document"
    modules = json.loads((package / "modules.json").read_text())
    assert [m["type"] for m in modules] == [
        "embedlab.st_module.EmbedlabTransformer", "sentence_transformers.base.modules.normalize.Normalize",
    ]


def test_resave_round_trips(release, offline, tmp_path):
    """SentenceTransformer.save writes a package that reloads to the same embeddings and the same content hash."""
    _, package, manifest = release
    model = load_st(package)
    model.save(str(tmp_path / "resaved"))
    resaved = json.loads((tmp_path / "resaved" / "manifest.json").read_text())
    assert resaved["content_hash"] == manifest["content_hash"] and resaved["parent_hash"] == PARENT_HASH
    modules = json.loads((tmp_path / "resaved" / "modules.json").read_text())
    assert modules[0]["type"] == "embedlab.st_module.EmbedlabTransformer"  # the stable path, as exported
    np.testing.assert_allclose(load_st(tmp_path / "resaved").encode(TEXTS, prompt_name="query"),
                               model.encode(TEXTS, prompt_name="query"), atol=1e-6)


def test_non_empty_out_dir_is_refused(release, tmp_path):
    """Exporting into a directory that holds anything fails, names it and leaves it untouched."""
    checkpoint, _, _ = release
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="exists and is not empty"):
        export_release(checkpoint, out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_corrupt_checkpoint_is_refused(release, tmp_path):
    """A flipped byte in the encoder file fails the hash check; no package (or leftover) is written."""
    checkpoint, _, _ = release
    corrupt = tmp_path / "corrupt"
    shutil.copytree(checkpoint, corrupt)
    data = bytearray((corrupt / "encoder.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (corrupt / "encoder.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="hash mismatch"):
        export_release(corrupt, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt"]


def test_checkpoint_without_lineage_is_refused(tmp_path):
    """A checkpoint with no recorded config or data revision cannot become a release."""
    tokenizer = save_tokenizer(train_tokenizer(TEXTS * 10, 300), tmp_path / "tokenizer")
    encoder = Encoder(tiny_trial("mean").model)
    save_checkpoint(tmp_path / "checkpoint", encoder, head=None, tokenizer=tokenizer, fields={})
    with pytest.raises(CheckpointError, match="lineage"):
        export_release(tmp_path / "checkpoint", tmp_path / "out")


@pytest.mark.slow  # a fresh interpreter importing torch
def test_module_class_imports_without_ray():
    """Importing the class that modules.json names does not import Ray."""
    code = "import sys, embedlab.st_module; print('ray' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_truncate_dim_gives_the_trained_widths_scores(tmp_path, offline):
    """A checkpoint trained at widths 8 and 32 records them in its release, and sentence-transformers
    loaded with truncate_dim=8 scores query-passage pairs (cosine) exactly as embedlab's truncated
    evaluation does: the first 8 coordinates, re-normalised."""
    import dataclasses

    from sentence_transformers import SentenceTransformer

    from embedlab.objectives.matryoshka import truncate

    trial = tiny_trial("mean")
    trial = dataclasses.replace(trial, contrastive=dataclasses.replace(
        trial.contrastive, matryoshka=MatryoshkaConfig(dims=(8, 32), weights=(1.0, 0.5))))
    tokenizer = save_tokenizer(train_tokenizer(TEXTS * 10, 300), tmp_path / "tokenizer")
    torch.manual_seed(0)
    model = MLMModel(trial.model)
    checkpoint = tmp_path / "checkpoint"
    save_checkpoint(
        checkpoint, model.encoder, head=model.mlm_head, tokenizer=tokenizer, pooling="mean",
        prefixes={"query": "query: ", "passage": "passage: "},
        fields={"phase": 2, "parent_hash": PARENT_HASH, "config": trial.to_dict(), "data_revision": "rev-test"})
    manifest = export_release(checkpoint, tmp_path / "package")
    assert manifest["matryoshka"]["trained_widths"] == [8, 32] and manifest["matryoshka"]["weights"] == [1.0, 0.5]
    st = SentenceTransformer(str(tmp_path / "package"), device="cpu", trust_remote_code=True, local_files_only=True,
                             truncate_dim=8)
    queries, passages = st.encode_query(TEXTS[:3]), st.encode_document(TEXTS[:3])
    assert queries.shape == (3, 8)
    want = (truncate(torch.from_numpy(evaluator_embeddings(checkpoint, TEXTS[:3], "query")), 8)
            @ truncate(torch.from_numpy(evaluator_embeddings(checkpoint, TEXTS[:3], "passage")), 8).T)
    np.testing.assert_allclose(st.similarity(queries, passages).numpy(), want.numpy(), atol=1e-5)
