"""The command output the documentation shows, written by running the commands, never pasted.

A page marks a block it wants generated with an HTML comment on the line before its fence:

    <!-- output: embedlab table docs/results/runs/dual-heads --cut-before "trials:" -->
    ```
    ...what the command prints...
    ```

Everything after `output:` is the command line as a reader would type it (`embedlab ...`,
run in-process through `embedlab.cli.main`); `--cut-before TEXT`, at its end, keeps the output
up to the first line that starts with TEXT. Commands run in a scratch directory that holds
links to the repository's `ablations/` and `docs/` (so a dry run sees no `runs/` of a past
run, and relative paths read as they do from the repository root), with `COLUMNS=100` for
argparse's help; a path into the checkout that a command resolves is shown from its root, so
the pages read the same from every clone.

    python docs/outputs.py           rewrite every marked block with what its command prints now
    python docs/outputs.py --check   exit 1, listing each block whose page differs from its command

`tests/test_docs.py` runs the check: every marked block's command is deterministic (a dry run,
a plan, `--help`, a table re-rendered from run records kept under `docs/results/runs/`), so a
page that drifts from the code fails the suite. Output of long runs (a tour, a benchmark) is
not marked: such a page names the command, date, commit and machine at its top instead.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent
MARKER = re.compile(r"^<!-- output: (?P<command>.+?) -->$")
LINKED = ("ablations", "docs")  # what the scratch directory links to, from the repository root
HELP_COLUMNS = "100"


@dataclass(frozen=True)
class Block:
    """One marked block: its page, the marker's line number (0-based), the command and the
    lines between the fences."""

    page: Path
    line: int
    command: str
    body: list[str]


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def blocks(page: Path) -> list[Block]:
    """The marked blocks of a page; a marker not followed by a fenced block is a ValueError."""
    lines = page.read_text(encoding="utf-8").split("\n")
    found = []
    for number, line in enumerate(lines):
        match = MARKER.match(line)
        if match is None:
            continue
        if number + 1 >= len(lines) or not lines[number + 1].startswith("```"):
            raise ValueError(f"{page.relative_to(REPO)}:{number + 1}: an output marker must be followed by a ``` fence")
        end = next((k for k in range(number + 2, len(lines)) if lines[k] == "```"), None)
        if end is None:
            raise ValueError(f"{page.relative_to(REPO)}:{number + 2}: the fence after an output marker never closes")
        found.append(Block(page, number, match["command"], lines[number + 2:end]))
    return found


def run(command: str) -> list[str]:
    """What `command` prints to stdout, as lines (a trailing empty line dropped)."""
    words = shlex.split(command)
    cut = None
    if "--cut-before" in words:
        at = words.index("--cut-before")
        cut, words = words[at + 1], words[:at] + words[at + 2:]
    if words[0] != "embedlab":
        raise ValueError(f"{command!r}: an output marker runs an embedlab command")
    from embedlab.cli import main  # here: the package, which listing the markers does not need

    out = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch, _cwd(Path(scratch)), _env(COLUMNS=HELP_COLUMNS), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        for name in LINKED:
            os.symlink(REPO / name, Path(scratch) / name)
        try:
            code = main(words[1:])
        except SystemExit as exit_:  # --help
            code = exit_.code
    if code not in (0, None):
        raise RuntimeError(f"{command!r} exited {code}")
    # A path the command resolved through the links is the checkout's: shown from its root.
    lines = out.getvalue().replace(f"{REPO}/", "").rstrip("\n").split("\n")
    if cut is not None:
        lines = lines[:next((k for k, line in enumerate(lines) if line.startswith(cut)), len(lines))]
        while lines and not lines[-1].strip():
            lines.pop()
    return lines


@contextlib.contextmanager
def _cwd(path: Path):
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _env(**values: str):
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def commands() -> list[list[str]]:
    """Every command of `embedlab`'s parser that takes no further subcommand, as words."""
    from embedlab.cli import build_parser  # here: the package

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk(sub, [*prefix, name]) or [[*prefix, name]]
        return found

    return walk(build_parser(), [])


def drifted(pages_: list[Path] | None = None) -> list[str]:
    """`page:line: command` for every marked block whose body is not what its command prints."""
    return [f"{block.page.relative_to(REPO)}:{block.line + 1}: {block.command}"
            for page in (pages_ if pages_ is not None else pages()) for block in blocks(page)
            if block.body != run(block.command)]


def rewrite(page: Path) -> int:
    """Rewrite a page's marked blocks from their commands; the number changed."""
    lines = page.read_text(encoding="utf-8").split("\n")
    changed = 0
    for block in reversed(blocks(page)):  # from the end, so earlier line numbers stay valid
        body = run(block.command)
        if body != block.body:
            lines[block.line + 2:block.line + 2 + len(block.body)] = body
            changed += 1
    if changed:
        page.write_text("\n".join(lines), encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list drifted blocks and exit 1 instead of rewriting")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "platform"))
    if args.check:
        stale = drifted()
        for line in stale:
            print(f"drifted: {line}")
        return 1 if stale else 0
    for page in pages():
        changed = rewrite(page)
        if changed:
            print(f"{page.relative_to(REPO)}: {changed} block(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
