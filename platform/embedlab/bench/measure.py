"""How `embedlab bench` measures: comparisons, interleaved repeats, peak memory.

A comparison is two values measured in the same run (embedlab's and a reference's) and
their ratio embedlab / reference; `better` says which direction wins ("higher" for rates,
"lower" for seconds and bytes), so a ratio is never read without its unit.

Rates are medians over repeats, and the repeats of the two sides alternate (A B, B A,
A B, ...): on a shared 2-core machine load drifts by the minute, and alternating spreads
the drift over both sides instead of charging it to whichever ran second.

Peak memory on CPU: the Linux high-water mark of resident memory (VmHWM), reset through
`/proc/self/clear_refs` just before the measured work starts, minus the resident memory
at that moment. Python-level tracers (tracemalloc) do not see torch's allocations, and a
process-lifetime `ru_maxrss` would include whatever imports and data loading peaked at,
so each side runs in a fresh spawned process that imports the same libraries.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Two values measured side by side; `ratio` is embedlab / reference."""

    name: str
    embedlab: float
    reference: float
    unit: str
    better: str  # "higher" or "lower": which direction of the ratio favours embedlab
    embedlab_measures: str
    reference_measures: str
    runs: dict[str, list[float]] = field(default_factory=dict)  # every repeat, per side

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"better: {self.better!r}; valid: ['higher', 'lower']")

    @property
    def ratio(self) -> float:
        return self.embedlab / self.reference if self.reference else float("nan")

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "name"}, "ratio": self.ratio}


def comparisons_json(comparisons: list[Comparison]) -> dict[str, dict]:
    """{name: {embedlab, reference, ratio, unit, ...}}: the shape `bench --json` prints."""
    return {c.name: c.to_dict() for c in comparisons}


def _value(value: float, unit: str) -> str:
    if unit in ("s", "MiB", "%"):
        return f"{value:,.2f}"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3f}"


def format_comparisons(comparisons: list[Comparison], notes: list[str] = ()) -> str:
    """A fixed-width table, one comparison a line, then what each side measured."""
    width = max([len(c.name) for c in comparisons] + [10])
    lines = [f"{'comparison':<{width}} {'embedlab':>12} {'reference':>12} {'ratio':>7}  unit (better)"]
    for c in comparisons:
        lines.append(f"{c.name:<{width}} {_value(c.embedlab, c.unit):>12} {_value(c.reference, c.unit):>12} "
                     f"{c.ratio:>7.3f}  {c.unit} ({c.better})")
    lines.append("")
    for c in comparisons:
        lines.append(f"{c.name}: {c.embedlab_measures} | vs {c.reference_measures}")
    lines += list(notes)
    return "\n".join(lines)


Epoch = Callable[[], int]  # runs the work once, returns the units (tokens, pairs) it processed


def interleaved_rates(sides: dict[str, Epoch], repeats: int) -> dict[str, list[float]]:
    """Units per second of each side, `repeats` times, alternating the order every repeat."""
    names = list(sides)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            units = sides[name]()
            rates[name].append(units / (time.perf_counter() - started))
    return rates


def median(values: list[float]) -> float:
    return statistics.median(values)


def _status_kib(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field_name}")


def start_peak_window() -> int:
    """Reset the resident high-water mark to now; returns the resident KiB at this moment."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def peak_since(start_kib: int) -> float:
    """MiB by which resident memory peaked above `start_peak_window()`'s value."""
    return (_status_kib("VmHWM") - start_kib) / 1024
