"""Are two checkouts' outputs the same? The check behind a refactor's "behaviour unchanged".

    python workers/compare_outputs.py BEFORE_DIR AFTER_DIR

Each directory holds what `workers/same-outputs.sh` wrote for one commit: `table.STUDY.json`
(`embedlab table RUN --json` of each demo run) and `bench.json` (`embedlab bench --json`).
BEFORE_DIR may also hold `table-read-by-after.STUDY.json`: its runs' records as the AFTER commit
reads them (through `embedlab.core.schema.upgrade`); those are compared in its place, so a
refactor that moves a config field compares what the two commits measured in one layout.

- Tables: the same studies, the same trials (arm, seed, stage) and the same columns, and every
  value bitwise equal (NaN equals NaN) except the columns in RUN_VARYING: wall-clock times,
  peak memory, paths, trial ids and the config hash, which differ between two runs of one
  commit or name where a run lives rather than what it measured. A run-varying column that
  only one side has (a new timing column, `time/*`) is not a difference either.
- Bench: the same JSON key paths (list items by their "name" when they have one), since its
  figures are timings that vary run to run.

Prints each study's and the bench's verdict and exits 1 if anything differs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

# Columns that vary between two runs of the same commit, or that name the run rather than its
# measurements: paths (a checkpoint's and its parent's; their content hashes are compared),
# Tune's trial id, timings and peak memory. `config_hash` is the hash of a config's serialised
# layout: a refactor that moves a field (the budget into one object) changes it while every
# value stays the same. `data/mining_candidates` names a stored search by a key that hashes the
# mining code's revision: any edit of that code renames it while the candidates stay the same.
RUN_VARYING = frozenset({"checkpoint", "parent", "trial_id", "config_hash", "eval/seconds", "data/mining_candidates"})
RUN_VARYING_COMPUTE = ("seconds", "fraction", "peak_memory_bytes", "device_clock")
RUN_VARYING_PREFIXES = ("time/",)  # a trial's wall time by stage and its span (`embedlab.core.timing`)


def run_varying(column: str) -> bool:
    """Whether `column` is left out of the bitwise comparison (see RUN_VARYING_*)."""
    if column in RUN_VARYING or column.startswith(RUN_VARYING_PREFIXES):
        return True
    return column.startswith("compute/") and column.endswith(RUN_VARYING_COMPUTE)


def same_value(a: Any, b: Any) -> bool:
    """Bitwise equality, NaN equal to NaN (a metric that is NaN in both runs did not change)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def compare_tables(before: list[dict], after: list[dict]) -> list[str]:
    """The differences between two tables' rows, keyed by (arm, seed, stage); empty if none."""
    def by_trial(rows: list[dict]) -> dict[tuple, dict]:
        return {(r.get("arm"), r.get("seed"), r.get("stage")): r for r in rows}

    rows_a, rows_b = by_trial(before), by_trial(after)
    problems = [f"trial {key} only before" for key in sorted(rows_a.keys() - rows_b.keys(), key=str)]
    problems += [f"trial {key} only after" for key in sorted(rows_b.keys() - rows_a.keys(), key=str)]
    for key in sorted(rows_a.keys() & rows_b.keys(), key=str):
        a, b = rows_a[key], rows_b[key]
        problems += [f"trial {key}: column {c} only before" for c in sorted(a.keys() - b.keys()) if not run_varying(c)]
        problems += [f"trial {key}: column {c} only after" for c in sorted(b.keys() - a.keys()) if not run_varying(c)]
        problems += [f"trial {key}: {c} {a[c]!r} -> {b[c]!r}" for c in sorted(a.keys() & b.keys())
                     if not run_varying(c) and not same_value(a[c], b[c])]
    return problems


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: dict keys, list items by their "name" or index."""
    if isinstance(value, dict):
        paths = set()
        for key, item in value.items():
            paths |= {f"{prefix}/{key}"} | key_paths(item, f"{prefix}/{key}")
        return paths
    if isinstance(value, list):
        paths = set()
        for index, item in enumerate(value):
            label = item.get("name", index) if isinstance(item, dict) else index
            paths |= {f"{prefix}[{label}]"} | key_paths(item, f"{prefix}[{label}]")
        return paths
    return set()


def compare(before: Path, after: Path) -> list[str]:
    """Every difference between two output directories, each as one printable line."""
    problems = []
    read_by_after = {p.name.replace("table-read-by-after.", "table.", 1): p
                     for p in before.glob("table-read-by-after.*.json")}
    tables_a = {p.name for p in before.glob("table.*.json")}
    tables_b = {p.name for p in after.glob("table.*.json")}
    if not tables_a:
        problems.append(f"{before}: no table.*.json")
    problems += [f"{name}: only before" for name in sorted(tables_a - tables_b)]
    problems += [f"{name}: only after" for name in sorted(tables_b - tables_a)]
    for name in sorted(tables_a & tables_b):
        rows_a = json.loads((read_by_after.get(name) or before / name).read_text())
        rows_b = json.loads((after / name).read_text())
        found = compare_tables(rows_a, rows_b)
        compared = sorted({c for r in rows_a for c in r if not run_varying(c)})
        print(f"{name}{' (before: as after reads its records)' if name in read_by_after else ''}: "
              f"{len(rows_a)} trials, {len(compared)} columns compared bitwise: "
              + ("identical" if not found else f"{len(found)} differences"))
        problems += [f"{name}: {line}" for line in found]
    bench_a = key_paths(json.loads((before / "bench.json").read_text()))
    bench_b = key_paths(json.loads((after / "bench.json").read_text()))
    print(f"bench.json: {len(bench_a)} key paths before, {len(bench_b)} after: "
          + ("identical" if bench_a == bench_b else "different"))
    problems += [f"bench.json: {p} only before" for p in sorted(bench_a - bench_b)]
    problems += [f"bench.json: {p} only after" for p in sorted(bench_b - bench_a)]
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    problems = compare(Path(argv[0]), Path(argv[1]))
    for line in problems:
        print(line)
    print("same outputs" if not problems else f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
