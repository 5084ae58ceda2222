"""The module graph of embedlab has no import cycles and no module reaches into another's private names.

Every import statement counts, at module level and inside functions alike: a function-level
import hides a dependency without removing it, so a cycle through one is still a cycle. Only
imports under `if TYPE_CHECKING:` are left out of the cycle check: they never run, and they
exist so that an annotation can name a type without the import.
"""

from __future__ import annotations

import ast
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "embedlab"
SOURCE_ROOT = Path(__file__).resolve().parent.parent / "platform"

# Import edges (importer, imported) allowed on a cycle: none are left. Kept as a mechanism for a
# refactor in steps, never to grow: `test_allowlist_only_shrinks` fails on an edge that no longer
# exists or is not needed to keep the rest of the graph acyclic.
ALLOWED_CYCLE_EDGES: frozenset[tuple[str, str]] = frozenset()
# The layers, bottom to top (docs/architecture.md draws them): each top-level package of
# embedlab belongs to one, and an import only ever points to its own layer or one below it.
# Within a layer, packages import each other without a cycle. A new package is a decision that
# belongs here, with its layer, not an accident of where a folder was created.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("core",)),
    ("library", ("model", "objectives", "tokenizer", "checkpoints", "release", "st_module")),
    ("artifacts", ("artifacts",)),
    ("data", ("sources", "contamination", "tasks", "prepared", "pairs", "negatives", "teacher", "streams")),
    ("train and evaluate", ("evaluate", "train")),
    ("declarations", ("studies",)),
    ("orchestration and statistics", ("records", "stats", "sweep")),
    ("interfaces", ("report", "bench", "cli")),
    ("public API", ("__init__",)),
)
LAYER_OF = {package: rank for rank, (_, packages) in enumerate(LAYERS) for package in packages}
# The package root's own modules: the public API, and the path every release's modules.json names.
ROOT_MODULES = {
    "__init__": "the public API (Study, Search, Stage, Tour, recipes, load_table, Budget, __version__), loaded on first use",
    "st_module": "the stable path every release's modules.json names for EmbedlabTransformer",
}
# The library imports with torch alone: what a fresh interpreter may not have loaded after
# importing it (the harness's libraries).
LIBRARY = ("embedlab.model.encoder", "embedlab.model.heads", "embedlab.model.pooling", "embedlab.model.encode",
           "embedlab.model.flops", "embedlab.objectives.contrastive", "embedlab.objectives.distillation",
           "embedlab.objectives.dual_mlm", "embedlab.objectives.gather", "embedlab.objectives.gradcache",
           "embedlab.objectives.masking", "embedlab.objectives.matryoshka", "embedlab.objectives.mlm",
           "embedlab.tokenizer.frozen", "embedlab.checkpoints.io", "embedlab.checkpoints.state",
           "embedlab.release.export", "embedlab.model.pretrained", "embedlab.checkpoints.pretrained",
           "embedlab.release.native")
HARNESS_LIBRARIES = ("ray", "pandas", "pyarrow", "optuna", "faiss", "scipy", "matplotlib")
# Modules that existed only to break a cycle between two folders; the layering made each
# unnecessary, and none comes back under its name.
CYCLE_BREAKERS = ("pair_builder_names", "trial_rows", "checkpoint_files", "panel_names", "hub_task_config",
                  "source_config", "pair_source_config")


@dataclass(frozen=True)
class Import:
    """One import of an embedlab module by another, as written in the importer's source."""

    importer: str
    imported: str
    line: int
    deferred: bool  # inside a function or method
    type_checking: bool  # under `if TYPE_CHECKING:`
    names: tuple[str, ...]  # the names taken by `from ... import`, empty for `import x`


def module_files() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import `from .{level}target import ...` in `module`."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


class _Collector(ast.NodeVisitor):
    """Walks one module and records its imports of the package and its uses of private names."""

    def __init__(self, module: str, is_package: bool, modules: set[str]):
        self.module, self.is_package, self.modules = module, is_package, modules
        self.imports: list[Import] = []
        self.private_uses: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> embedlab module it is bound to
        self._depth = 0  # function nesting
        self._type_checking = 0

    def _add(self, node: ast.AST, imported: str, names: tuple[str, ...] = ()) -> None:
        self.imports.append(Import(self.module, imported, node.lineno, self._depth > 0,
                                   self._type_checking > 0, names))

    def _visit_function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._type_checking += 1
            for child in node.body:
                self.visit(child)
            self._type_checking -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                self._add(node, alias.name)
                if alias.asname:
                    self.aliases[alias.asname] = alias.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = _absolute(self.module, self.is_package, node.level, node.module)
        if source != PACKAGE and not source.startswith(PACKAGE + "."):
            return
        plain = []  # names that are not themselves modules: an edge to `source`
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if submodule in self.modules:
                self._add(node, submodule)
                self.aliases[alias.asname or alias.name] = submodule
            else:
                plain.append(alias.name)
                if _is_private(alias.name) and source != self.module:
                    self.private_uses.append(
                        f"{self.module}:{node.lineno} imports {alias.name} from {source}")
        if plain:
            self._add(node, source, tuple(plain))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = _dotted(node.value)
        if owner is not None and _is_private(node.attr):
            head, _, rest = owner.partition(".")
            target = self.aliases.get(head) if head in self.aliases else (
                head if head == PACKAGE else None)
            if target is not None:
                target = ".".join([target] + ([rest] if rest else []))
                if target in self.modules and target != self.module:
                    self.private_uses.append(f"{self.module}:{node.lineno} uses {target}.{node.attr}")
        self.generic_visit(node)


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of attribute lookups on a name, None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def collect() -> tuple[list[Import], list[str]]:
    """All imports between embedlab modules, and every cross-module use of a private name."""
    files = module_files()
    imports, private_uses = [], []
    for module, path in files.items():
        collector = _Collector(module, path.name == "__init__.py", set(files))
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        imports += collector.imports
        private_uses += collector.private_uses
    return imports, private_uses


def import_graph(imports: list[Import]) -> dict[str, set[str]]:
    """Module -> the modules it imports, leaving out self-imports and TYPE_CHECKING-only ones."""
    graph: dict[str, set[str]] = {module: set() for module in module_files()}
    for edge in imports:
        if not edge.type_checking and edge.imported != edge.importer and edge.imported in graph:
            graph[edge.importer].add(edge.imported)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str, within: set[str]) -> list[str]:
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & within):
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    if child == goal:
                        return paths[child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no path from {start} to {goal}")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """For every edge on a cycle, the shortest cycle through it, each cycle once."""
    found: dict[tuple[str, ...], list[str]] = {}
    for component in strongly_connected(graph):
        members = set(component)
        for importer in component:
            for imported in sorted(graph[importer] & members):
                cycle = [importer] + _shortest_path(graph, imported, importer, members)
                start = cycle.index(min(cycle[:-1]))
                key = tuple(cycle[start:-1] + cycle[:start])
                found.setdefault(key, list(key) + [key[0]])
    return sorted(found.values())


def _explain(chain: list[str], imports: list[Import]) -> str:
    """`a -> b -> a` with the line of each import, marking the deferred ones."""
    steps = [chain[0]]
    for importer, imported in zip(chain, chain[1:]):
        lines = sorted({f"{e.line}{' (in a function)' if e.deferred else ''}" for e in imports
                        if e.importer == importer and e.imported == imported and not e.type_checking})
        steps.append(f" -[line {', '.join(lines)}]-> {imported}")
    return "".join(steps)


def without(graph: dict[str, set[str]], edges: frozenset[tuple[str, str]]) -> dict[str, set[str]]:
    return {module: {child for child in children if (module, child) not in edges}
            for module, children in graph.items()}


def test_no_import_cycles():
    """No chain of imports, module-level or inside a function, leads from a module back to itself."""
    imports, _ = collect()
    found = cycles(without(import_graph(imports), ALLOWED_CYCLE_EDGES))
    assert not found, f"{len(found)} import cycles:\n" + "\n".join(_explain(c, imports) for c in found)


def test_allowlist_only_shrinks():
    """Every allowlisted edge still exists and is still needed to keep the rest of the graph acyclic."""
    imports, _ = collect()
    graph = import_graph(imports)
    missing = sorted(edge for edge in ALLOWED_CYCLE_EDGES if edge[1] not in graph.get(edge[0], set()))
    assert not missing, f"allowlisted edges that no longer exist (remove them from the list): {missing}"
    unneeded = sorted(edge for edge in ALLOWED_CYCLE_EDGES
                      if not cycles(without(graph, ALLOWED_CYCLE_EDGES - {edge})))
    assert not unneeded, f"allowlisted edges on no remaining cycle (remove them from the list): {unneeded}"


def test_no_private_names_across_modules():
    """No module imports or reads a single-underscore name of another embedlab module."""
    _, private_uses = collect()
    assert not private_uses, "private names used across modules:\n" + "\n".join(private_uses)


def test_the_package_root_holds_only_the_public_api():
    """A module at the package root is one of ROOT_MODULES; any other belongs in its layer's folder."""
    root = {path.stem for path in (SOURCE_ROOT / PACKAGE).glob("*.py")}
    assert root == set(ROOT_MODULES), (
        f"not in ROOT_MODULES: {sorted(root - set(ROOT_MODULES))}; listed but gone: {sorted(set(ROOT_MODULES) - root)}")


def package_of(module: str) -> str:
    """The top-level package of an embedlab module (a root module is its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def package_graph(imports: list[Import]) -> dict[str, dict[str, list[Import]]]:
    """Package -> the packages it imports, with the imports that make each edge (TYPE_CHECKING-only
    ones left out)."""
    graph: dict[str, dict[str, list[Import]]] = {package_of(m): {} for m in module_files()}
    for edge in imports:
        importer, imported = package_of(edge.importer), package_of(edge.imported)
        if not edge.type_checking and importer != imported:
            graph[importer].setdefault(imported, []).append(edge)
    return graph


def test_every_folder_is_a_layer():
    """Each top-level package of embedlab is in exactly one layer of LAYERS."""
    listed = [package for _, packages in LAYERS for package in packages]
    assert len(listed) == len(set(listed)), "a package is in two layers"
    packages = {package_of(module) for module in module_files()}
    assert packages == set(listed), (
        f"packages without a layer: {sorted(packages - set(listed))}; layers naming no package: "
        f"{sorted(set(listed) - packages)}")


def test_no_import_points_up_a_layer():
    """Every import, at module level or in a function, goes to the importer's layer or one below it."""
    imports, _ = collect()
    upward = [f"{edge.importer}:{edge.line} ({LAYERS[LAYER_OF[package_of(edge.importer)]][0]}) imports "
              f"{edge.imported} ({LAYERS[LAYER_OF[package_of(edge.imported)]][0]})"
              for edges in package_graph(imports).values() for found in edges.values() for edge in found
              if LAYER_OF[package_of(edge.importer)] < LAYER_OF[package_of(edge.imported)]]
    assert not upward, "imports pointing up a layer:\n" + "\n".join(upward)


def test_no_package_cycles():
    """No chain of imports leads from a top-level package back to itself."""
    imports, _ = collect()
    graph = package_graph(imports)
    found = cycles({package: set(edges) for package, edges in graph.items()})
    lines = []
    for cycle in found:
        steps = [f"{a} -> {b} ({graph[a][b][0].importer}:{graph[a][b][0].line})" for a, b in zip(cycle, cycle[1:])]
        lines.append("; ".join(steps))
    assert not found, f"{len(found)} package cycles:\n" + "\n".join(lines)


def test_the_cycle_breaking_leaf_modules_are_gone():
    """No module bears the name of one that existed only to break a cycle between two folders."""
    left = sorted(module for module in module_files() if module.rsplit(".", 1)[-1] in CYCLE_BREAKERS)
    assert not left, f"cycle-breaking modules still here: {left}"


def test_the_library_imports_with_torch_alone():
    """The model, objectives, tokenizer, checkpoint reading and the release writer import in a
    fresh interpreter without loading Ray, pandas, pyarrow or another harness library."""
    import os
    import subprocess

    code = ("import sys\n"
            f"for name in {list(LIBRARY)!r}:\n    __import__(name)\n"
            f"print(sorted(n for n in {list(HARNESS_LIBRARIES)!r} if n in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)})
    assert result.stdout.strip() == "[]", f"the library loaded {result.stdout.strip()}"
    assert {package_of(module) for module in LIBRARY} <= set(dict(LAYERS)["library"])


def test_the_stable_release_path_is_the_class_itself():
    """`embedlab.st_module`, the path releases record, only re-exports the class from release/."""
    from embedlab import st_module
    from embedlab.release import st_module as home

    assert st_module.EmbedlabTransformer is home.EmbedlabTransformer
    assert st_module.__all__ == ["EmbedlabTransformer"]


def test_core_depends_on_nothing_above_it():
    """`embedlab.core` (configs, errors, storage, code identity) imports no other embedlab package,
    so every layer can import it."""
    imports, _ = collect()
    assert not package_graph(imports)["core"], f"core imports {sorted(package_graph(imports)['core'])}"


def test_the_graph_sees_deferred_and_submodule_imports(tmp_path, monkeypatch):
    """The collector finds imports inside functions, `from package import submodule`, relative
    imports, TYPE_CHECKING blocks and private names read through a module alias."""
    package = tmp_path / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from embedlab.sub import c\n"
        "def f():\n    from embedlab.sub import b\n    return b._hidden\n")
    (package / "sub" / "b.py").write_text("from . import a\nfrom .a import _secret\n")
    (package / "sub" / "c.py").write_text("import embedlab.sub.a\n")
    monkeypatch.setattr(sys.modules[__name__], "SOURCE_ROOT", tmp_path)
    imports, private_uses = collect()
    edges = {(e.importer, e.imported, e.deferred, e.type_checking) for e in imports}
    assert ("embedlab.sub.a", "embedlab.sub.b", True, False) in edges
    assert ("embedlab.sub.a", "embedlab.sub.c", False, True) in edges
    assert ("embedlab.sub.b", "embedlab.sub.a", False, False) in edges
    assert cycles(import_graph(imports)) == [["embedlab.sub.a", "embedlab.sub.b", "embedlab.sub.a"]]
    assert sorted(private_uses) == ["embedlab.sub.a:6 uses embedlab.sub.b._hidden",
                                    "embedlab.sub.b:2 imports _secret from embedlab.sub.a"]


@pytest.mark.parametrize("module", sorted(module_files()))
def test_every_module_imports(module):
    """Each module imports without error."""
    importlib.import_module(module)


def _why_comment(lines: list[str], first: int, last: int) -> bool:
    """Whether an import spanning source lines first..last (1-based) carries a comment: on its
    own lines, or in the run of comments, blank lines and other imports right above it."""
    if any("#" in line for line in lines[first - 1:last]):
        return True
    row = first - 2
    while row >= 0:
        text = lines[row].strip()
        if text.startswith("#"):
            return True
        if text and not text.startswith(("import ", "from ")) and not text.endswith((",", ")")):
            return False
        row -= 1
    return False


def test_a_function_level_import_says_why_and_defers_something():
    """A function-level import of an embedlab module hides a dependency, so it needs a reason:
    a comment naming the heavy library it keeps off the import path (torch, Ray, pandas, ...).
    And it must defer something: a module the file already imports at module level is loaded
    by then, and importing it again inside a function only hides the edge."""
    imports, _ = collect()
    files = module_files()
    at_module_level = {(i.importer, i.imported) for i in imports if not i.deferred and not i.type_checking}
    silent, redundant = [], []
    for edge in imports:
        if not edge.deferred or edge.type_checking:
            continue
        path = files[edge.importer]
        tree_lines = path.read_text().splitlines()
        node = next(n for n in ast.walk(ast.parse(path.read_text()))
                    if isinstance(n, (ast.Import, ast.ImportFrom)) and n.lineno == edge.line)
        if not _why_comment(tree_lines, node.lineno, node.end_lineno):
            silent.append(f"{edge.importer}:{edge.line} imports {edge.imported}")
        if (edge.importer, edge.imported) in at_module_level:
            redundant.append(f"{edge.importer}:{edge.line} imports {edge.imported} again")
    assert not silent, "function-level imports without a comment saying why:\n" + "\n".join(silent)
    assert not redundant, "function-level imports of modules already imported at module level:\n" + "\n".join(redundant)
