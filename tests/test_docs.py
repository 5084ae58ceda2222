"""The documentation: a README short enough to read, a site that builds strictly, and command
output on its pages that is what the commands print (`docs/outputs.py`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docs"))

import outputs  # noqa: E402  (docs/outputs.py: the pages' generated blocks)

README_MAX_LINES = 260


def test_the_readme_is_a_front_door():
    """At most README_MAX_LINES lines, the two commands in it, and every docs page it links exists."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    assert "make demo" in text and "make test" in text
    import re

    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / target).is_file(), target


def test_no_page_holds_a_placeholder_or_a_todo():
    """A page written before its numbers existed (`@AFTER_TIME@`, `TODO`, `TBD`, `XXX`) is
    caught before it lands."""
    import re

    pattern = re.compile(r"@[A-Z][A-Z_]+@|\bTODO\b|\bTBD\b|\bXXX\b")
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = [f"{page.relative_to(REPO)}:{n}: {line.strip()}" for page in pages
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav, or an API
    object mkdocstrings cannot find fails the build."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.fail(f"{mkdocs} is missing: the dev extra installs mkdocs (make setup)")
    done = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "index.html").is_file()


def test_every_generated_block_is_what_its_command_prints():
    """Each `<!-- output: ... -->` block of every page equals its command's output now."""
    stale = outputs.drifted()
    assert not stale, ("pages out of date with their commands (run `python docs/outputs.py`):\n"
                       + "\n".join(stale))


def test_a_drifted_block_is_caught(tmp_path, monkeypatch):
    """The check is not vacuous: a page whose help block lost a line is listed, and rewriting
    it restores the command's output."""
    page = tmp_path / "cli.md"
    shutil.copyfile(REPO / "docs" / "reference" / "cli.md", page)
    (block, *_) = [b for b in outputs.blocks(page) if b.command == "embedlab table --help"]
    lines = page.read_text(encoding="utf-8").split("\n")
    del lines[block.line + 3]
    page.write_text("\n".join(lines), encoding="utf-8")
    monkeypatch.setattr(outputs, "REPO", tmp_path)  # relative names in the report
    assert outputs.drifted([page]) == [f"cli.md:{block.line + 1}: embedlab table --help"]
    assert outputs.rewrite(page) == 1 and outputs.drifted([page]) == []


def test_the_cli_reference_has_every_command():
    """docs/reference/cli.md holds the --help of every command the parser has, so a new command
    cannot be left out of the reference."""
    documented = {b.command for b in outputs.blocks(REPO / "docs" / "reference" / "cli.md")}
    missing = [" ".join(words) for words in outputs.commands()
               if f"embedlab {' '.join(words)} --help" not in documented]
    assert not missing, f"commands without a --help block in docs/reference/cli.md: {missing}"


def test_the_column_reference_lists_every_column_of_the_saved_runs():
    """Every column `load_table` gives for the tour's saved run records matches a row of the
    column reference (a `<...>` placeholder stands for one path segment)."""
    import re

    from embedlab import load_table

    page = (REPO / "docs" / "guides" / "results-in-pandas.md").read_text(encoding="utf-8")
    reference = page[page.index("## Column reference"):]
    names = [name for row in reference.splitlines() if row.startswith("| `")
             for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])]
    patterns = [re.compile("^" + re.sub(r"<[^>]+>", "[^/]+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">"))
                           + "$") for name in names]
    runs = sorted(p for p in (REPO / "docs" / "results" / "runs").iterdir() if p.is_dir())
    assert runs, "no saved run records under docs/results/runs"
    missing = sorted({column for run in runs for column in load_table(run).columns
                      if not any(pattern.match(column) for pattern in patterns)})
    assert not missing, f"columns the reference does not list: {missing}"


def test_the_readme_study_loads_as_printed(tmp_path):
    """The README's own-pairs study, as printed but for its pairs path: it loads at the cpu
    profile, its arms differ only in the factor, and it budgets in FLOPs as shipped studies do."""
    import re

    from embedlab.studies.study import load_study

    text = (REPO / "README.md").read_text(encoding="utf-8")
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "def study(" in block]
    pairs = tmp_path / "my_pairs.jsonl"
    pairs.write_text('{"query": "a question", "positive": "its answer"}\n', encoding="utf-8")
    (tmp_path / "my_study.py").write_text(code.replace("/abs/path/my_pairs.jsonl", str(pairs)), encoding="utf-8")
    study = load_study(tmp_path / "my_study.py", "cpu")
    assert list(study.arms) == ["in-batch", "mined-2"] and study.factor == "contrastive.negatives.count"
    assert study.budget.flops is not None and study.budget.flops > 0


def test_the_readme_pandas_block_runs_as_printed_on_a_saved_run():
    """The README's pandas block, its run directory replaced by a run kept under
    docs/results/runs, runs as printed: one row per trial, and the groupby gives each arm its
    seed count and the same mean as summarize."""
    import re

    text = (REPO / "README.md").read_text(encoding="utf-8")
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "load_table(" in block]
    run = sorted((REPO / "docs" / "results" / "runs").glob("dual-heads-*"))[-1]
    lines = code.replace("runs/dual-heads-YYYYMMDD-HHMMSS", str(run)).strip().splitlines()
    # The last two lines are expressions a notebook would show: kept as values here.
    namespace: dict = {}
    exec("\n".join(lines[:-2]), namespace)
    by_arm = eval(lines[-2].split("#")[0], namespace)
    summary = eval(lines[-1].split("#")[0], namespace)
    table = namespace["table"]
    assert len(table) == len(list((run / "trials").glob("*.json")))
    assert set(by_arm.index) == set(table["arm"]) and (by_arm["count"] >= 1).all()
    means = summary.set_index("arm")["dev/ndcg@10:mean"]
    assert dict(summary.set_index("arm")["seeds"]) == dict(by_arm["count"])
    for arm, mean in by_arm["mean"].items():
        assert means[arm] == pytest.approx(mean, rel=1e-12)
