"""A pretrained parent: a Hugging Face or sentence-transformers checkpoint, turned once into an
ordinary embedlab checkpoint directory whose manifest names its backbone.

A parent is named (`--parent`, or a study's or profile's declaration) as one of

    hf:ORG/NAME@REVISION   a Hub model pinned by its full 40-hex commit, read from the local
                           Hugging Face cache's layout (`<HF_HUB_CACHE>/models--ORG--NAME/
                           snapshots/<commit>/`); embedlab never downloads
    DIRECTORY              a Hugging Face model directory (config.json, model.safetensors,
                           tokenizer.json) or a sentence-transformers one (modules.json naming a
                           Transformer, a Pooling and a Normalize module)

and anything else is an embedlab checkpoint as before. `resolve_pretrained` reads and checks it
(one-line refusals, `PretrainedParentError`: an architecture outside `FAMILIES`, remote code,
pickled or sharded weights, no fast tokenizer, a sentence-transformers pipeline embedlab cannot
reproduce, an unpinned or uncached revision); `materialize_parent` writes it, once, as an
embedlab checkpoint under `<EMBEDLAB_CACHE>/pretrained/<key>/`:

    encoder.safetensors   the base model's weights (`PretrainedEncoder`; no pooler)
    mlm_head.safetensors  its masked-LM head as embedlab's `MLMHead`, when it has one (tied decoder)
    config.json           its Hugging Face config
    tokenizer.json        its tokenizer, frozen (`embedlab.tokenizer.frozen.canonical_tokenizer`)
    manifest.json         phase "pretrained", the derived `model` (its `backbone` is the family),
                          the `backbone` record, the pooling and prefixes its sentence-transformers
                          configuration names (else the study's), and `pretrained`: the spec, the
                          pinned revision, every source file's sha256, the head and what was dropped

The directory is content-addressed (the source files' hashes, the pooling and prefixes), so the
same parent materialises to the same directory and manifest on every run; everything downstream
(workers, the evaluator, mining, retention, lineage, releases) reads it as it reads any parent
and dispatches on `manifest["model"]["backbone"]`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from embedlab.checkpoints import CheckpointError, HF_CONFIG_FILE, MANIFEST_FILE
from embedlab.checkpoints.io import local_checkpoint, read_manifest, save_checkpoint
from embedlab.core import store
from embedlab.core.config import ModelConfig
from embedlab.core.errors import UserError
from embedlab.core.store import file_sha256, files_sha256
from embedlab.model.pretrained import (FAMILIES, PretrainedBackboneError, PretrainedEncoder, family_of,
                                       head_options, model_config, with_mlm_head)
from embedlab.tokenizer.frozen import (FILE_NAME as TOKENIZER_FILE, SPECIAL_ROLES, canonical_tokenizer, describe,
                                       load_tokenizer, special_tokens, store_tokenizer, stored_tokenizer)

FORMAT = "embedlab-pretrained/1"  # what decides a materialised directory's bytes, with its inputs
HUB_PREFIX = "hf:"
PHASE = "pretrained"  # a materialised parent's `phase`
CACHE_DIR = "pretrained"  # under `store.cache_dir()`
WEIGHTS_FILE = "model.safetensors"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# sentence-transformers' module classes embedlab reproduces (any of its import paths, old or new).
ST_MODULES = ("Transformer", "Pooling", "Normalize")
ST_POOLING = {"mean": "mean_all", "cls": "cls"}  # sentence-transformers' pooling mode -> embedlab's
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                       "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
ST_ORIGIN = "the parent's sentence-transformers configuration"
STUDY_ORIGIN = "the study (the parent has no sentence-transformers configuration)"


class PretrainedParentError(UserError, ValueError):
    """A pretrained parent embedlab cannot use; the one-line message says what is supported."""


@dataclass(frozen=True)
class PretrainedSource:
    """A pretrained parent, located and checked (`resolve_pretrained`): where its files are
    (`root`, and `model_dir` for the transformer's own), what it is and what its
    sentence-transformers configuration says (`st`, None without one)."""

    spec: str
    kind: str  # "hub" or "dir"
    root: Path
    model_dir: Path
    repo_id: str | None
    revision: str | None
    hf_config: dict[str, Any]
    st: dict[str, Any] | None
    source_files: dict[str, str]  # path relative to `root` -> sha256

    @property
    def family(self) -> str:
        return family_of(self.hf_config).name

    def record(self) -> dict[str, Any]:
        """The manifest's `pretrained` record (without the head, which materialising decides)."""
        return {"spec": self.spec, "kind": self.kind, "repo_id": self.repo_id, "revision": self.revision,
                "source_files": self.source_files, "weights_sha256": self.source_files[self.relative(WEIGHTS_FILE)],
                "sentence_transformers": self.st}

    def relative(self, name: str) -> str:
        """A file of the transformer's directory, named as `source_files` names it."""
        return str((self.model_dir / name).relative_to(self.root))


def is_pretrained_spec(parent: str | Path) -> bool:
    """Whether `parent` names a pretrained parent (`hf:...`, or a local directory of a Hugging
    Face or sentence-transformers model) rather than an embedlab checkpoint."""
    text = str(parent)
    if text.startswith(HUB_PREFIX):
        return True
    if store.is_uri(text):
        return False
    path = Path(text)
    return path.is_dir() and not (path / MANIFEST_FILE).is_file() and (
        (path / HF_CONFIG_FILE).is_file() or (path / "modules.json").is_file())


def resolve_pretrained(spec: str | Path) -> PretrainedSource:
    """Locate and check the pretrained parent `spec` names (module docstring); every refusal is
    one line (`PretrainedParentError`)."""
    text = str(spec)
    if text.startswith(HUB_PREFIX):
        repo_id, revision, root = _hub_snapshot(text)
        kind = "hub"
    else:
        repo_id, revision, root, kind = None, None, Path(text).resolve(), "dir"
        if not root.is_dir():
            raise PretrainedParentError(f"{text}: not a directory")
        text = str(root)  # recorded as the absolute path it was read from
    try:
        return _inspect(text, kind, root, repo_id, revision)
    except PretrainedBackboneError as error:
        raise PretrainedParentError(f"{text}: {error}") from None


def hub_cache() -> Path:
    """The local Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub),
    read when asked, as `huggingface_hub` reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(home) / "hub"


def _hub_snapshot(text: str) -> tuple[str, str, Path]:
    """(repo id, commit, snapshot directory) of `hf:ORG/NAME@COMMIT` in the local cache."""
    body = text[len(HUB_PREFIX):]
    repo_id, at, revision = body.partition("@")
    if not REPO_ID.match(repo_id):
        raise PretrainedParentError(f"{text}: not a Hub model id; write hf:ORG/NAME@<40-hex commit>")
    if not at:
        raise PretrainedParentError(f"{text} needs a pinned revision: {text}@<40-hex commit>")
    if not COMMIT.match(revision):
        raise PretrainedParentError(
            f"{text}: revision {revision!r} is not a full 40-hex commit (a branch, tag or short hash can move or "
            f"be ambiguous); pin one: {HUB_PREFIX}{repo_id}@<40-hex commit>")
    cache = hub_cache()
    snapshots = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    root = snapshots / revision
    if not root.is_dir():
        cached = sorted(p.name for p in snapshots.iterdir()) if snapshots.is_dir() else []
        raise PretrainedParentError(
            f"{text}: revision not in the local Hugging Face cache ({cache}; cached: {', '.join(cached) or 'none'}); "
            f"embedlab never downloads: fetch it on a connected machine (hf download {repo_id} --revision "
            f"{revision}) and copy the cache")
    return repo_id, revision, root


def _inspect(text: str, kind: str, root: Path, repo_id: str | None, revision: str | None) -> PretrainedSource:
    st, model_dir, st_files = _sentence_transformers(text, root)
    config_path = model_dir / HF_CONFIG_FILE
    if not config_path.is_file():
        raise PretrainedParentError(f"{text}: no {HF_CONFIG_FILE}; supported: a Hugging Face model directory "
                                    f"({HF_CONFIG_FILE}, {WEIGHTS_FILE}, {TOKENIZER_FILE}), a sentence-transformers "
                                    "one, or hf:ORG/NAME@<commit>")
    hf_config = json.loads(config_path.read_text())
    if "auto_map" in hf_config:
        raise PretrainedParentError(f"{text}: {HF_CONFIG_FILE} asks for remote code (auto_map); embedlab loads "
                                    "transformers' own classes only (no trust_remote_code)")
    family_of(hf_config)
    if not (model_dir / WEIGHTS_FILE).is_file():
        sharded = (model_dir / f"{WEIGHTS_FILE}.index.json").is_file()
        raise PretrainedParentError(
            f"{text}: " + ("sharded safetensors weights are not supported yet" if sharded else
                           f"no {WEIGHTS_FILE} (pickled weights are never loaded)") + f"; supported: a single {WEIGHTS_FILE}")
    if not (model_dir / TOKENIZER_FILE).is_file():
        raise PretrainedParentError(f"{text}: no {TOKENIZER_FILE} (a fast tokenizer); supported: directories with "
                                    f"{TOKENIZER_FILE}")
    _check_tokenizer(text, model_dir)
    names = [HF_CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json"]
    files = [model_dir / name for name in names if (model_dir / name).is_file()] + st_files
    source_files = {str(path.relative_to(root)): file_sha256(path) for path in sorted(set(files))}
    return PretrainedSource(spec=text, kind=kind, root=root, model_dir=model_dir, repo_id=repo_id, revision=revision,
                            hf_config=hf_config, st=st, source_files=source_files)


def _sentence_transformers(text: str, root: Path) -> tuple[dict[str, Any] | None, Path, list[Path]]:
    """What a sentence-transformers directory's configuration says (None for a plain Hugging
    Face directory), the transformer's own directory, and the configuration's files."""
    modules_path = root / "modules.json"
    if not modules_path.is_file():
        return None, root, []
    modules = json.loads(modules_path.read_text())
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not kinds or kinds[0] != "Transformer" or any(k not in ST_MODULES for k in kinds) or len(set(kinds)) != len(kinds):
        raise PretrainedParentError(f"{text}: modules.json holds [{', '.join(kinds)}]; supported: Transformer, "
                                    "Pooling (mean or cls), Normalize")
    model_dir = root / modules[0].get("path", "")
    files = [modules_path]
    pooling = "mean"  # a sentence-transformers model without a Pooling module pools by mean
    pooling_module = next((m for m, k in zip(modules, kinds) if k == "Pooling"), None)
    if pooling_module is not None:
        pooling_path = root / pooling_module["path"] / "config.json"
        if not pooling_path.is_file():
            raise PretrainedParentError(f"{text}: modules.json names a Pooling module at {pooling_module['path']!r} "
                                        "without its config.json")
        files.append(pooling_path)
        pooling = _pooling_mode(text, json.loads(pooling_path.read_text()))
    max_seq_length = None
    bert_config = model_dir / "sentence_bert_config.json"
    if bert_config.is_file():
        files.append(bert_config)
        raw = json.loads(bert_config.read_text())
        if raw.get("do_lower_case"):
            raise PretrainedParentError(f"{text}: sentence_bert_config.json sets do_lower_case true; supported: "
                                        "false (lower-casing belongs in the tokenizer)")
        max_seq_length = raw.get("max_seq_length")
    prompts: dict[str, str] = {}
    st_config = root / "config_sentence_transformers.json"
    if st_config.is_file():
        files.append(st_config)
        prompts = json.loads(st_config.read_text()).get("prompts") or {}
    passage = next((prompts[name] for name in ("document", "passage", "corpus") if name in prompts), "")
    record = {"modules": kinds, "pooling": pooling, "normalize": "Normalize" in kinds,
              "prompts": {"query": prompts.get("query", ""), "passage": passage}, "max_seq_length": max_seq_length}
    return record, model_dir, files


def _pooling_mode(text: str, config: dict[str, Any]) -> str:
    """The single pooling mode of a sentence-transformers Pooling config (legacy or new keys)."""
    if "pooling_mode" in config:
        modes = config["pooling_mode"] if isinstance(config["pooling_mode"], list) else [config["pooling_mode"]]
    else:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key)]
    if len(modes) != 1 or modes[0] not in ST_POOLING:
        raise PretrainedParentError(f"{text}: pooling mode {'+'.join(map(str, modes)) or 'none'} is not supported; "
                                    "supported: mean, cls")
    if config.get("include_prompt", True) is False:
        raise PretrainedParentError(f"{text}: pooling include_prompt false is not supported; supported: prompts "
                                    "pooled with the text (include_prompt true)")
    return modes[0]


def _check_tokenizer(text: str, model_dir: Path) -> None:
    """The tokenizer names the five special tokens as a supported family does, as its
    tokenizer_config.json names them, and wraps a text in CLS ... SEP, as embedlab's rows are."""
    tokenizer = Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
    names = special_tokens(tokenizer)
    if names is None:
        raise PretrainedParentError(f"{text}: {TOKENIZER_FILE} lacks the special tokens of a supported family; "
                                    "a pretrained tokenizer needs pad, unk, cls, sep and mask tokens")
    config_path = model_dir / "tokenizer_config.json"
    if config_path.is_file():
        declared = json.loads(config_path.read_text())
        fallback = {"cls": "bos", "sep": "eos"}
        for role, name in zip(SPECIAL_ROLES, names):
            value = declared.get(f"{role}_token") or declared.get(f"{fallback.get(role, role)}_token")
            value = value.get("content") if isinstance(value, dict) else value
            if value is not None and value != name:
                raise PretrainedParentError(f"{text}: tokenizer_config.json names {role}_token {value!r}, not {name!r}; "
                                            f"supported: the special tokens {list(names)}")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = tokenizer.encode("a", add_special_tokens=True).ids
    cls, sep = tokenizer.token_to_id(names[2]), tokenizer.token_to_id(names[3])
    if not ids or ids[0] != cls or ids[-1] != sep:
        raise PretrainedParentError(f"{text}: {TOKENIZER_FILE} does not wrap a text in {names[2]} ... {names[3]} "
                                    "(its post-processor); supported: tokenizers that do, as sentence-transformers "
                                    "encodes with them")


def parent_pooling(st: dict[str, Any] | None, pooling: str, prefixes: dict[str, str]) -> tuple[str, dict[str, str], str]:
    """(pooling method, prefixes, where they come from) of a pretrained parent: its
    sentence-transformers configuration's when it has one, else `pooling` and `prefixes` (a
    study's), with embedlab's content-only "mean" taken as "mean_all", the mean a native
    sentence-transformers release can state."""
    if st is not None:
        return ST_POOLING[st["pooling"]], dict(st["prompts"]), ST_ORIGIN
    return ("mean_all" if pooling == "mean" else pooling), dict(prefixes), STUDY_ORIGIN


def materialize_parent(source: PretrainedSource, *, pooling: str, prefixes: dict[str, str],
                       cache_root: Path | None = None) -> Path:
    """The embedlab checkpoint directory of `source` (module docstring) with `pooling` and
    `prefixes` (`parent_pooling`), written once: a directory already there (same source
    files, pooling and prefixes) is returned as it is."""
    inputs = {"format": FORMAT, "source_files": source.source_files, "pooling": pooling, "prefixes": prefixes}
    key = files_sha256({"inputs": json.dumps(inputs, sort_keys=True)})[:32]
    directory = (cache_root or store.cache_dir() / CACHE_DIR) / key
    if (directory / MANIFEST_FILE).is_file():
        return directory
    encoder = PretrainedEncoder(source.hf_config)
    weights = _read_weights(source.model_dir / WEIGHTS_FILE)
    base, dropped = _base_state(source, weights, set(encoder.model.state_dict()))
    encoder.model.load_state_dict(base)
    head_state, head = _head_state(source, weights, encoder)
    frozen = canonical_tokenizer(source.model_dir / TOKENIZER_FILE).encode()
    tokenizer = load_tokenizer(stored_tokenizer(store_tokenizer(frozen)))
    used = set(head.get("keys", {}).values())
    record = {**source.record(), "head": head, "dropped_keys": [key for key in dropped if key not in used]}
    fields = {"phase": PHASE, "pretrained": record,
              "tokenizer": {**describe(tokenizer, pretrained=True),
                            "source_sha256": source.source_files[source.relative(TOKENIZER_FILE)],
                            "frozen": "the parent's tokenizer.json, padding and truncation off"},
              "pooling_source": ST_ORIGIN if source.st is not None else STUDY_ORIGIN}
    model = with_mlm_head(encoder, head_state) if head_state is not None else None
    try:
        save_checkpoint(directory, encoder, head=None if model is None else model.mlm_head, tokenizer=tokenizer,
                        fields=fields, pooling=pooling, prefixes=prefixes)
    except CheckpointError:
        if not (directory / MANIFEST_FILE).is_file():  # else another process wrote the same directory first
            raise
    return directory


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, floating ones as float32 (a checkpoint stored in
    bf16 trains in float32)."""
    weights = {}
    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            tensor = handle.get_tensor(key)
            weights[key] = tensor.float() if tensor.is_floating_point() else tensor
    return weights


def _base_state(source: PretrainedSource, weights: dict[str, torch.Tensor],
                expected: set[str]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The base model's tensors (under its own keys: a masked-LM checkpoint's family prefix
    stripped) and the keys left out (pooler, head, buffers), or a refusal naming what is missing."""
    prefix = FAMILIES[source.family].prefix
    # A masked-LM checkpoint keeps the base model under the family's prefix; a base one does not.
    prefixed = any(key.startswith(prefix) and key[len(prefix):] in expected for key in weights)
    base, dropped = {}, []
    for key, tensor in weights.items():
        name = (key[len(prefix):] if key.startswith(prefix) else None) if prefixed else key
        if name in expected:
            base[name] = tensor
        else:
            dropped.append(key)
    missing = sorted(expected - set(base))
    if missing:
        raise PretrainedParentError(f"{source.spec}: {WEIGHTS_FILE} lacks {len(missing)} of the {source.family} "
                                    f"base model's tensors (first: {missing[0]}); supported: a checkpoint of its config")
    return base, sorted(dropped)


def _head_state(source: PretrainedSource, weights: dict[str, torch.Tensor],
                encoder: PretrainedEncoder) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """The checkpoint's masked-LM head as an `MLMHead` state, or None, with the record of why."""
    family = FAMILIES[source.family]
    options = head_options(source.hf_config)
    needed = {ours: theirs for ours, theirs in family.head_keys.items()
              if not (ours == "dense.bias" and not options.get("dense_bias", True))
              and not (ours == "norm.bias" and not options.get("norm_bias", True))}
    if not all(key in weights for key in needed.values()):
        return None, {"present": False, "reason": f"no masked-LM head ({', '.join(sorted(needed.values()))})"}
    decoder = weights.get(family.decoder_key)
    tied = source.hf_config.get("tie_word_embeddings", True) and (
        decoder is None or torch.equal(decoder, encoder.embed.weight.detach()))
    if not tied:
        return None, {"present": False, "reason": "its masked-LM decoder is untied from the input embeddings; "
                                                  "supported: tied decoders"}
    if options["activation"] not in ("gelu", "gelu_pytorch_tanh"):
        return None, {"present": False, "reason": f"its head's activation {options['activation']!r} is not supported; "
                                                  "supported: gelu, gelu_pytorch_tanh"}
    return ({ours: weights[theirs] for ours, theirs in needed.items()},
            {"present": True, "keys": dict(sorted(needed.items())), "decoder": "tied to the input embeddings"})


def pretrained_parent(spec: str | Path, *, pooling: str = "mean", prefixes: dict[str, str] | None = None,
                      cache_root: Path | None = None) -> Path:
    """`spec` resolved and materialised (`resolve_pretrained`, `materialize_parent`) with its
    sentence-transformers pooling and prefixes, else `pooling` and `prefixes` (`parent_pooling`)."""
    source = resolve_pretrained(spec)
    method, resolved, _ = parent_pooling(source.st, pooling, prefixes or {"query": "", "passage": ""})
    return materialize_parent(source, pooling=method, prefixes=resolved, cache_root=cache_root)


def declared_arms(parent: str | Path) -> PretrainedArms | None:
    """`PretrainedArms` of a pretrained parent as `parent` names it, read from its files without
    materialising it (None when `parent` names none): how a study file sizes a FLOPs budget on
    the backbone its arms will train (`embedlab.recipes.budget_for`)."""
    if not is_pretrained_spec(parent):
        return None
    source = resolve_pretrained(parent)
    try:
        model = model_config(source.hf_config)
    except PretrainedBackboneError as error:
        raise PretrainedParentError(f"{parent}: {error}") from None
    frozen = canonical_tokenizer(source.model_dir / TOKENIZER_FILE)
    return PretrainedArms(model=model, tokenizer_hash=hashlib.sha256(frozen.encode()).hexdigest(),
                          vocab_size=Tokenizer.from_str(frozen).get_vocab_size(), sentence_transformers=source.st,
                          spec=source.spec)


def pretrained_lineage(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The pinned pretrained parent a checkpoint is, or descends from, else None."""
    return manifest.get("pretrained") or manifest.get("pretrained_root")


@dataclass(frozen=True)
class PretrainedArms:
    """What every arm of a study takes from a parent on a pretrained backbone (a materialised
    pretrained parent, or a checkpoint descending from one): its derived model config, its
    tokenizer (hash and vocabulary: the arm's data is prepared with it), and the
    sentence-transformers configuration of the pretrained root (None without one)."""

    model: ModelConfig
    tokenizer_hash: str
    vocab_size: int
    sentence_transformers: dict[str, Any] | None
    spec: str | None


def pretrained_arms(parent: str | Path) -> PretrainedArms | None:
    """`PretrainedArms` of the embedlab checkpoint at `parent` (a directory or URI), None when
    its backbone is embedlab's own. Its tokenizer is kept on this node by its hash
    (`store_tokenizer`), where preparing the arms' data finds it."""
    directory = local_checkpoint(parent)
    manifest = read_manifest(directory)
    model = ModelConfig(**manifest["model"])
    if not model.pretrained:
        return None
    digest = store_tokenizer((directory / TOKENIZER_FILE).read_bytes())
    tokenizer = load_tokenizer(stored_tokenizer(digest), expected_hash=manifest["tokenizer_hash"])
    root = pretrained_lineage(manifest) or {}
    return PretrainedArms(model=model, tokenizer_hash=digest, vocab_size=tokenizer.vocab_size,
                          sentence_transformers=root.get("sentence_transformers"), spec=root.get("spec"))
