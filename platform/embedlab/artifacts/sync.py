"""Prepared data on a cluster without a shared disk: published once to object storage by
content hash, fetched and verified by every node that reads it.

The sweep's driver prepares the data (`embedlab.prepared.build`) in its own cache and, when the
run's storage is remote, publishes the directory to `<storage>/prepared/<name>/`: each file,
then `files-<tree hash>.json` (each file's sha256: what the run records and verifies
against), then `files.json` (the union of every publication of that directory: a later phase
adds its pair tables, and a file once published never changes). Every process of the
sweep's Ray job finds that root in `EMBEDLAB_STORAGE` (the sweep sets it in the job's
runtime environment). A reader on any node names a path as the driver wrote it; `node_path`
maps it onto this node's cache (`EMBEDLAB_CACHE`, which may differ per node), fetching the
tree on first use and checking every file's hash, also of a copy the node already holds: a
mismatch refuses to train (PreparedDataError) instead of training on other bytes.

Trees written later inside a prepared directory (a phase-3 trial's mined or screened
negatives) are published the same way by the trial that wrote them (`publish_subtree`); the
first writer's bytes are the ones every node reads. Without `EMBEDLAB_STORAGE` (a local run,
or a shared disk) every path is used as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

from embedlab.core import store
from embedlab.core.errors import UserError
from embedlab.core.store import file_sha256, files_sha256

STORAGE_ENV = "EMBEDLAB_STORAGE"
MANIFEST = "files.json"
REMOTE_DIR = "prepared"  # under the storage root
PREPARED_NAME = re.compile(r"prepared-[0-9a-f]{16}")
# Written into a prepared directory after it is published, by the trials that read it: not
# part of the published tree (each node computes its own; `contamination` caches audits here).
UNPUBLISHED = ("audits", "mined", "given-negatives")

_verified: set[str] = set()  # trees this process has checked or fetched


class PreparedDataError(UserError, ValueError):
    """Prepared data on this node differs from the published tree, or cannot be fetched."""


def tree_manifest(directory: Path, exclude: tuple[str, ...] = ()) -> dict:
    """{"files": {relative path: sha256}, "tree_hash": sha256 of that mapping} over every file
    under `directory`, hidden files and the top-level folders in `exclude` left out."""
    files = {}
    for path in sorted(Path(directory).rglob("*")):
        relative = path.relative_to(directory).as_posix()
        parts = relative.split("/")
        if path.is_file() and parts[0] not in exclude and not any(p.startswith(".") for p in parts) \
                and relative != MANIFEST:
            files[relative] = file_sha256(path)
    return {"files": files, "tree_hash": files_sha256(files)}


def remote_root(storage: str) -> str:
    return store.join(storage, REMOTE_DIR)


def publish(directory: Path, storage: str, progress=print) -> str:
    """Publish the prepared `directory` under `storage`; returns its tree hash.

    A prepared directory grows (a later phase adds its pair tables), so publication adds: a
    file already published must hold the same bytes (else PreparedDataError: nodes would
    train on different data), new files are uploaded, this tree's manifest is written as
    `files-<tree hash>.json` (what a run records and its nodes verify against), and the union
    of every publication as `files.json`, last."""
    manifest = tree_manifest(directory, exclude=UNPUBLISHED)
    remote = store.join(remote_root(storage), Path(directory).name)
    union = _remote_manifest(remote) or {"files": {}}
    differing = sorted(r for r, sha in manifest["files"].items() if union["files"].get(r, sha) != sha)
    if differing:
        raise PreparedDataError(
            f"{directory}: {len(differing)} file(s) differ from the prepared data already published at {remote}, "
            f"e.g. {differing[0]}; nodes would train on different bytes. Remove the published copy, or prepare "
            "afresh here")
    new = [r for r in manifest["files"] if r not in union["files"]]
    if new:
        progress(f"data: publishing {len(new)} file(s) of {Path(directory).name} to {remote}")
    for relative in new:
        store.upload(Path(directory) / relative, store.join(remote, *relative.split("/")))
    snapshot = store.join(remote, f"files-{manifest['tree_hash']}.json")
    if not store.is_file(snapshot):
        store.write_text(snapshot, json.dumps(manifest, indent=1, sort_keys=True))
    if new or not union["files"]:
        files = {**union["files"], **manifest["files"]}
        store.write_text(store.join(remote, MANIFEST), json.dumps(
            {"files": files, "tree_hash": files_sha256(files)},
            indent=1, sort_keys=True))
    return manifest["tree_hash"]


def publish_subtree(directory: Path) -> Path:
    """Publish a tree written inside a prepared directory after its publication (mined
    negatives) when the sweep's storage is remote; returns the directory every node reads:
    this one, or, when another node published the same tree first with other bytes, this
    node's copy of theirs."""
    storage = os.environ.get(STORAGE_ENV)
    located = _locate(directory)
    if not storage or located is None:
        return Path(directory)
    name, relative = located
    remote = store.join(remote_root(storage), name, *relative)
    manifest = tree_manifest(directory)
    published = _remote_manifest(remote)
    if published is None:
        _upload(directory, remote, manifest)
        _verified.add(f"{directory}@None")
        return Path(directory)
    if published["tree_hash"] != manifest["tree_hash"]:
        shutil.rmtree(directory)  # the first writer's bytes win, on every node
    _ensure(Path(directory), remote)
    return Path(directory)


def local_directory(record: dict) -> Path:
    """The prepared directory of a run's `prepared.json` entry on this node: the recorded
    directory, or, for data published to object storage ("published", "tree_hash"), this
    node's copy of that tree, fetched and checked against the recorded tree hash."""
    if not record.get("published"):
        return Path(record["directory"])
    local = store.cache_dir() / Path(record["directory"]).name
    _ensure(local, record["published"], expected=record.get("tree_hash"))
    return local


def node_path(path: str | Path) -> Path:
    """`path` (inside a prepared directory, as the sweep's driver named it) on this node:
    unchanged without `EMBEDLAB_STORAGE` or outside a prepared directory; else in this node's
    cache, its tree fetched and verified first."""
    storage = os.environ.get(STORAGE_ENV)
    located = _locate(path) if storage else None
    if located is None:
        return Path(path)
    name, relative = located
    root = store.cache_dir() / name
    remote = store.join(remote_root(storage), name)
    _ensure(root, remote)
    target = root.joinpath(*relative)
    if not target.exists():
        # A tree published after the prepared directory (a phase-3 trial's negatives).
        for depth in range(len(relative), 0, -1):
            subtree = store.join(remote, *relative[:depth])
            if store.is_file(store.join(subtree, MANIFEST)):
                _ensure(root.joinpath(*relative[:depth]), subtree)
                break
    return target


def _locate(path: str | Path) -> tuple[str, list[str]] | None:
    parts = Path(path).parts
    for index, part in enumerate(parts):
        if PREPARED_NAME.fullmatch(part):
            return part, list(parts[index + 1:])
    return None


def _remote_manifest(remote: str, name: str = MANIFEST) -> dict | None:
    location = store.join(remote, name)
    return json.loads(store.read_text(location)) if store.is_file(location) else None


def _upload(directory: Path, remote: str, manifest: dict) -> None:
    for relative in manifest["files"]:
        store.upload(Path(directory) / relative, store.join(remote, *relative.split("/")))
    store.write_text(store.join(remote, MANIFEST), json.dumps(manifest, indent=1, sort_keys=True))  # last


def _ensure(local: Path, remote: str, expected: str | None = None) -> None:
    """`local` holds the published tree at `remote` (the snapshot `expected`, a tree hash, when
    given; else the union of its publications), every file checked, once per process: a file
    this node lacks is fetched and checked first; one it holds with other bytes refuses."""
    key = f"{local}@{expected}"
    if key in _verified:
        return
    name = MANIFEST if expected is None else f"files-{expected}.json"
    manifest = _remote_manifest(remote, name)
    if manifest is None:
        raise PreparedDataError(f"{store.join(remote, name)}: no such published prepared data; the sweep's driver "
                                "publishes it before any trial starts")
    # The record last: `prepare_data` on this node reuses a directory that has prepared.json.
    order = sorted(manifest["files"], key=lambda r: (r == "prepared.json", r))
    wrong = []
    for relative in order:
        path = local / relative
        if path.is_file():
            if file_sha256(path) != manifest["files"][relative]:
                wrong.append(relative)
            continue
        staging = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            store.download(store.join(remote, *relative.split("/")), staging)
            if file_sha256(staging) != manifest["files"][relative]:
                raise PreparedDataError(f"{remote}/{relative}: content hash mismatch (corrupt object); refused")
            os.replace(staging, path)
        finally:
            staging.unlink(missing_ok=True)
    if wrong:
        raise PreparedDataError(
            f"{local}: {len(wrong)} file(s) differ from the published prepared data {remote} (tree "
            f"{manifest['tree_hash'][:12]}), e.g. {wrong[0]}; refusing to train on other bytes. Remove {local} "
            "to fetch the published copy")
    _verified.add(key)
