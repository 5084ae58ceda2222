"""One content-addressed layer for everything embedlab builds from data: built once, found on
every node, whole or absent.

An artifact is named by what decides its bytes (`Artifact`: its kind, its inputs, and the source
files of the code that builds it), and `build_once` returns its location on this node, building
it only where nobody has:

    key       sha256 of the kind, the inputs and the code's revision (`Artifact.key`); an
              artifact whose own version already hashes its code (a mined set's, a teacher
              set's) names that version as its input and no code
    fetch     with object storage (`EMBEDLAB_STORAGE`), a copy another node published is fetched
              and every file's hash checked (`embedlab.artifacts.sync.node_path`) (`shared`)
    lock      this node's processes build it once (`directory_lock`): the others wait, then reuse it
    stage     `build(staging)` writes into a hidden sibling that is this writer's own
    rename    into place, whole: a reader never sees half of one; a writer that finds it there
              (another process's, by a race the lock does not cover) discards its own
    publish   with object storage, to every other node (`publish_subtree`) (`shared`)
    check     `check(location)`, its post-condition, run on a reused copy too: a set that feeds
              training passes the contamination gate against the trial's tasks before any
              step reads it (`embedlab.contamination.gate`)

The prepared data directory, its pairs tables and frozen user pairs, mined and screened
negatives, corpus vectors, teacher labels and teacher embeddings are built through it. A
directory published with its prepared data by the sweep (a pairs table, the user pairs, the
prepared directory itself) is not `shared` on its own: the sweep publishes that tree whole.
`write_staged` is the same whole-or-absent rule for one file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedlab.artifacts.sync import node_path, publish_subtree
from embedlab.core.code_identity import code_revision


@dataclass(frozen=True)
class Artifact:
    """What an artifact is (`kind`, also its folder under a root), what decides its bytes
    (`inputs`, JSON values) and the code that builds it (`code`, source files relative to the
    package, hashed by `code_identity.code_revision`)."""

    kind: str
    inputs: Mapping[str, Any]
    code: tuple[str, ...] = ()
    suffix: str = ""  # a single-file artifact's file suffix (".parquet"); "" for a directory
    length: int = field(default=16, compare=False)  # hex digits of the key its name keeps
    revision: str | None = None  # the code's revision, when not this installation's (a copy's)

    @property
    def key(self) -> str:
        revision = self.revision if self.revision is not None else code_revision(self.code) if self.code else None
        identity = {"kind": self.kind, "inputs": self.inputs, "code": revision}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    @property
    def name(self) -> str:
        return self.key[:self.length] + self.suffix

    def under(self, root: Path) -> Path:
        """Its location under `root`: `<root>/<kind>/<name>`."""
        return Path(root) / self.kind / self.name


@contextlib.contextmanager
def directory_lock(location: Path) -> Iterator[None]:
    """An exclusive lock beside `location` for this node's processes (`fcntl.flock`), held while
    an artifact is checked for and built: processes starting together build it once."""
    location.parent.mkdir(parents=True, exist_ok=True)
    with open(location.parent / f".{location.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def staging_name(location: Path) -> Path:
    """A hidden sibling of `location` that is this writer's alone (pid and a random suffix: two
    hosts sharing a disk may run equal pids)."""
    return location.with_name(f".{location.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def write_staged(path: Path | str, write: Callable[[Path], Any]) -> None:
    """`write(staging)` writes one file, then it is renamed to `path`: whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_name(path)
    try:
        write(staging)
        staging.rename(path)
    finally:
        staging.unlink(missing_ok=True)


def write_text_staged(path: Path | str, text: str) -> None:
    """`text` into `path`, whole or not at all (`write_staged`)."""
    write_staged(path, lambda staging: staging.write_text(text))


def write_json_staged(path: Path | str, value: Any) -> None:
    """`value` as indented, key-sorted JSON into `path`, whole or not at all."""
    write_text_staged(path, json.dumps(value, indent=2, sort_keys=True))


def build_once(
    location: Path,
    build: Callable[[Path], Any],
    *,
    shared: bool = True,
    check: Callable[[Path], Any] | None = None,
    progress: Callable[[str], None] = print,
) -> Path:
    """The artifact at `location` (`Artifact.under`, or a name of the caller's), built by
    `build(staging)` if neither this node nor (with `shared`) any published copy has it; then
    `check(location)`. Returns `location`. A location with a file suffix is one file, which
    `build` writes at the path it is given; any other is a directory, created for `build` to
    write its files in."""
    location = Path(location)
    if shared:
        node_path(location)  # with object storage: another node's published copy, fetched and checked
    with directory_lock(location):
        if not location.exists():
            staging = staging_name(location)
            try:
                if not location.suffix:
                    staging.mkdir(parents=True)
                build(staging)
                try:
                    staging.rename(location)
                except OSError:
                    if not location.exists():
                        raise
                    progress(f"artifact: {location} was built by another process first; kept its copy")
            finally:
                if staging.is_dir():
                    shutil.rmtree(staging, ignore_errors=True)
                else:
                    staging.unlink(missing_ok=True)
            if shared:
                publish_subtree(location)  # every node's processes read the same bytes
    if check is not None:
        check(location)
    return location
