"""Which embedlab code is running: its version and a hash of its source.

Long-lived processes on a cluster (the detached evaluation actor) can outlive the checkout that
started them; comparing identities tells a sweep whether the code serving it is its own. The
version alone does not: edits between releases keep it. The hash is sha256 over every .py file
of the imported `embedlab` package, in sorted order of relative path, each as its path and its
bytes, so an edit, an added or removed module, or a rename changes it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

VERSION = "0.1.0"  # the package's version: `embedlab.__version__`, as pyproject.toml states it
PACKAGE_DIR = Path(__file__).parent.parent  # the imported `embedlab` package (this file is in its core/)


@dataclasses.dataclass(frozen=True)
class CodeIdentity:
    version: str  # VERSION
    code_hash: str  # hex sha256, `code_hash` of the package directory

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"embedlab {self.version} (code {self.code_hash[:12]})"


def code_hash(package_dir: Path) -> str:
    """sha256 over the sorted relative paths and bytes of every .py file under `package_dir`."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py"), key=lambda p: p.relative_to(package_dir).as_posix()):
        data = path.read_bytes()
        name = path.relative_to(package_dir).as_posix().encode()
        # Lengths first, so no two different trees hash the same stream.
        digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


class CodeChangedError(RuntimeError):
    """This process imported other embedlab code than the sweep it serves was started with."""


@functools.cache
def current() -> CodeIdentity:
    """The identity of the embedlab this process imported (computed once)."""
    return CodeIdentity(version=VERSION, code_hash=code_hash(PACKAGE_DIR))


def is_current(identity: dict[str, str]) -> bool:
    """Whether `identity` (`CodeIdentity.to_dict()`, or an evaluator's report with more keys)
    names this process's code: the same version and source hash."""
    running = current()
    return (identity["version"], identity["code_hash"]) == (running.version, running.code_hash)


def check_same_code(expected: dict[str, str]) -> None:
    """Refuse to go on when this process's code is not `expected` (`CodeIdentity.to_dict()` of
    the process that started the work). Ray starts each trial's process afresh, and it imports
    the source on disk at that moment: an edit to the checkout during a sweep would otherwise
    train later trials on other code than earlier ones, in one table, with nothing recorded."""
    if not is_current(expected):
        started = CodeIdentity(version=expected["version"], code_hash=expected["code_hash"])
        raise CodeChangedError(
            f"this trial imported {current()}, but its sweep started with {started}: the embedlab source "
            f"changed on disk during the sweep. Restore the source it started with, or start the sweep again: "
            f"one table never mixes trials of two codes")


def code_revision(sources: Sequence[str], root: Path = PACKAGE_DIR) -> str:
    """Hash of the named source files' names (relative to `root`, the package directory) and
    bytes: equal code, equal revision, wherever the package is installed. What keys an artifact
    by the code that builds it (prepared data, pairs tables, mined sets, teacher sets), where
    `code_hash` would re-key it at any edit anywhere."""
    digest = hashlib.sha256()
    for name in sources:
        path = Path(root) / name
        if not path.is_file():
            raise FileNotFoundError(f"embedlab source {name!r} not found under {root}")
        content = path.read_bytes()
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()[:16]


def _module_file(module: str, root: Path) -> Path | None:
    """The source file of an embedlab module (a package's __init__.py), None if it has none."""
    path = root.joinpath(*module.split(".")[1:])
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _imported(path: Path, module: str) -> set[str]:
    """Every embedlab module `path` (the source of `module`) imports, at any level: module level,
    inside functions, relative or absolute, and `from package import name` as both."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.update({name, *(f"{name}.{alias.name}" for alias in node.names)})
    return {name for name in found if name == PACKAGE_DIR.name or name.startswith(f"{PACKAGE_DIR.name}.")}


def import_closure(modules: Sequence[str], root: Path = PACKAGE_DIR) -> tuple[str, ...]:
    """The source files (relative to `root`, sorted) of `modules` and of every embedlab module
    they import, directly or not, the packages on the way included: the code that can run when
    they run (a module named by a string, not an import, is not followed)."""
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = _module_file(module, root)
        if path is None:  # a name imported from a module, not a module
            continue
        seen[module] = path
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += sorted(_imported(path, module))
    return tuple(sorted({path.relative_to(root).as_posix() for path in seen.values()}))
