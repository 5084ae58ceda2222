"""`embedlab bench layout`: where the contrastive phase's time goes inside a Ray trial.

    embedlab bench layout [--address ADDR] [--pairs 2048] [--json]

One run measures, on the prepared built-in corpus's pairs, the `small` preset at pair
length 64 (a random-initialised parent, `bench.contrastive.write_parent`):

- the one-process reference: `ContrastiveLoop.step` in this process, 2 torch threads, 64
  pairs a step (and 16, the demo's per-worker batch), timed before every trial and after
  the last; a trial's ratio divides by the passes just before and after it;
- real Ray trials, each `run_contrastive` (what `embedlab sweep` runs for a phase-2 trial,
  without Tune's trial actor and the evaluation), for each worker layout in `LAYOUTS`.

A trial's rates come from its own reports (`metrics.jsonl`: `budget/pairs` and
`compute/wall_seconds` at every report): steady-state pairs/s is taken between the first
report and the last, so the first interval's warm-up (stream start, first-step allocations)
is left out; that warm-up's excess over steady state is reported apart. The cumulative
`train/pairs_per_s` a trial logs includes it, which is why it climbs over a trial. Ray's
fixed cost is the driver's end-to-end time of the trial minus the loop's
`compute/wall_seconds` (the driver's pair schedule, worker actors, the train context,
building the loop, the final checkpoint, tear-down). The machine is shared: the 1-minute load average at each trial's
end is reported beside its figures.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from embedlab.bench.contrastive import ContrastiveBench, contrastive_loop, pair_batch, write_parent
from embedlab.core.config import TrainConfig
from embedlab.core.errors import UsageError
from embedlab.studies.recipes import Profile, profile
from embedlab.train.contrastive import run_contrastive
from embedlab.train.metrics_log import log_location, read_metrics

REPORT_KEYS = ("train/step", "budget/pairs", "compute/wall_seconds", "compute/data_wait_fraction")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """How a trial's phase-2 loop is spread over Ray Train workers."""

    name: str
    num_workers: int
    cpus_per_worker: float
    torch_threads: int
    batch_pairs: int  # per worker per step

    @classmethod
    def of_profile(cls, p: Profile) -> Layout:
        return cls(name=p.name, num_workers=p.num_workers, cpus_per_worker=p.cpus_per_worker,
                   torch_threads=p.torch_threads, batch_pairs=p.contrastive_batch_rows)

    @property
    def step_pairs(self) -> int:
        return self.num_workers * self.batch_pairs

    @property
    def shape(self) -> str:
        workers, threads = self.num_workers, self.torch_threads
        return (f"{workers} worker{'s' * (workers > 1)} x {self.cpus_per_worker:g} CPU x "
                f"{threads} thread{'s' * (threads > 1)}")


def _layouts() -> tuple[Layout, ...]:
    """The demo profile's layout, then one change at a time towards the cpu profile's."""
    demo, cpu = Layout.of_profile(profile("demo")), Layout.of_profile(profile("cpu"))
    return demo, dataclasses.replace(cpu, name="1w-2t-16", batch_pairs=demo.batch_pairs), cpu


LAYOUTS = _layouts()
REPORT_EVERY_STEPS = TrainConfig().report_every_steps  # what sweep trials report at


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutBench:
    preset: str = "small"
    pair_length: int = 64
    pairs: int = profile("demo").phase2_pairs  # trained by each trial
    threads: int = 2  # the reference's torch threads
    reference_batches: tuple[int, ...] = (64, 16)  # pairs a step; the first is the reference
    reference_pairs: int = 256  # pairs a timed pass
    reference_repeats: int = 1  # passes of each batch size before every trial and after the last

    def __post_init__(self) -> None:
        # Steady state needs reports after the first: two report intervals of the largest step.
        least = 2 * REPORT_EVERY_STEPS * max(layout.step_pairs for layout in LAYOUTS)
        if self.pairs < least:
            raise UsageError(f"bench.pairs: must be >= {least} (two reports of every layout), got {self.pairs}")
        for name in ("pair_length", "threads", "reference_pairs", "reference_repeats"):
            if getattr(self, name) < 1:
                raise UsageError(f"bench.{name}: must be >= 1, got {getattr(self, name)}")
        if not self.reference_batches or min(self.reference_batches) < 1:
            raise UsageError(f"bench.reference_batches: needs sizes >= 1, got {self.reference_batches}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialTiming:
    """One trial's figures, from its reports and the driver's clock."""

    layout: Layout
    pairs: int  # trained, all workers (`budget/pairs` of the last report)
    reports: int
    steady_pairs_per_s: float  # between the first report and the last
    warmup_seconds: float  # the first report's time beyond what steady state would take for its pairs
    train_seconds: float  # `compute/wall_seconds` of the last report
    end_to_end_seconds: float  # the driver's, around `run_contrastive`
    data_wait_fraction: float

    @property
    def fixed_seconds(self) -> float:
        return self.end_to_end_seconds - self.train_seconds

    @property
    def end_to_end_pairs_per_s(self) -> float:
        return self.pairs / self.end_to_end_seconds


def trial_timing(layout: Layout, reports: Sequence[dict[str, Any]], end_to_end_seconds: float) -> TrialTiming:
    """A trial's timing from its logged reports, in order (`metrics_log.read_metrics`)."""
    if len(reports) < 2:
        raise ValueError(f"layout {layout.name}: {len(reports)} report(s); steady state needs two or more")
    missing = [key for key in REPORT_KEYS if key not in reports[0]]
    if missing:
        raise ValueError(f"layout {layout.name}: reports lack {missing}")
    steps = [r["train/step"] for r in reports]
    if any(later <= earlier for earlier, later in zip(steps, steps[1:])):
        raise RuntimeError(f"layout {layout.name}: steps {steps} are not increasing: the worker group "
                           "restarted, and its rates would mix attempts")
    first, last = reports[0], reports[-1]
    seconds = last["compute/wall_seconds"] - first["compute/wall_seconds"]
    rate = (last["budget/pairs"] - first["budget/pairs"]) / seconds
    return TrialTiming(
        layout=layout, pairs=int(last["budget/pairs"]), reports=len(reports), steady_pairs_per_s=rate,
        warmup_seconds=first["compute/wall_seconds"] - first["budget/pairs"] / rate,
        train_seconds=last["compute/wall_seconds"], end_to_end_seconds=end_to_end_seconds,
        data_wait_fraction=last["compute/data_wait_fraction"],
    )


def _change(before: Layout, after: Layout) -> str:
    parts = []
    if (before.num_workers, before.cpus_per_worker, before.torch_threads) != (
            after.num_workers, after.cpus_per_worker, after.torch_threads):
        parts.append(f"{before.shape} -> {after.shape}")
    if before.batch_pairs != after.batch_pairs:
        parts.append(f"{before.batch_pairs} -> {after.batch_pairs} pairs/worker/step")
    return ", ".join(parts) or "no change"


def gap_closed(timings: Sequence[TrialTiming], ratios: Sequence[float]) -> list[dict[str, Any]]:
    """Each layout change's share of the first layout's gap to one process, in ratios to the
    reference measured beside each trial (negative: the change widened the gap)."""
    gap = 1.0 - ratios[0]
    return [{"change": _change(a.layout, b.layout), "from": a.layout.name, "to": b.layout.name,
             "share": (ratio_b - ratio_a) / gap if gap > 0 else float("nan")}
            for a, b, ratio_a, ratio_b in zip(timings, timings[1:], ratios, ratios[1:])]


def conclusion(timings: Sequence[TrialTiming], ratios: Sequence[float]) -> str:
    best = max(range(len(timings)), key=lambda i: ratios[i])
    first, fastest = timings[0], timings[best]
    line = (f"fastest: {fastest.layout.name} at {fastest.steady_pairs_per_s:,.0f} pairs/s steady, "
            f"{ratios[best]:.2f}x one process; ")
    if ratios[0] < 1.0:
        closed = "; ".join(f"{g['from']} -> {g['to']} ({g['change']}) closes {g['share']:.0%}"
                           for g in gap_closed(timings, ratios))
        line += f"of {first.layout.name}'s gap to one process ({ratios[0]:.2f}x): {closed}"
    else:
        line += f"{first.layout.name} is not slower than one process: no gap to close"
    fixed = [t.fixed_seconds for t in timings]
    share = sum(fixed) / sum(t.end_to_end_seconds for t in timings)
    return line + (f". Ray's fixed cost: {min(fixed):.0f}-{max(fixed):.0f} s a trial, {share:.0%} of end-to-end "
                   f"at {first.pairs:,} pairs")


def summarise(bench: LayoutBench, blocks: Sequence[dict[int, list[float]]], timings: Sequence[TrialTiming],
              load: dict[str, Any]) -> dict[str, Any]:
    """The bench's result (what `--json` prints). `blocks` are the one-process passes (pairs/s
    per batch size, the first size the reference) taken before each trial and after the
    last; a trial's ratio divides by the reference's passes just before and after it."""
    if len(blocks) != len(timings) + 1:
        raise ValueError(f"{len(timings)} trials need {len(timings) + 1} reference blocks, got {len(blocks)}")
    first = bench.reference_batches[0]
    runs = {batch: [rate for block in blocks for rate in block[batch]] for batch in bench.reference_batches}
    reference = median(runs[first])
    beside = [median(blocks[i][first] + blocks[i + 1][first]) for i in range(len(timings))]
    ratios = [t.steady_pairs_per_s / r for t, r in zip(timings, beside)]
    return {
        "bench": dataclasses.asdict(bench),
        "reference_pairs_per_s": reference,
        "references": [{"batch_pairs": batch, "threads": bench.threads, "pairs_per_s": median(rates),
                        "ratio": median(rates) / reference, "runs": rates} for batch, rates in runs.items()],
        "trials": [{"layout": dataclasses.asdict(t.layout), "pairs": t.pairs, "reports": t.reports,
                    "steady_pairs_per_s": t.steady_pairs_per_s, "reference_pairs_per_s": r, "ratio": ratio,
                    "warmup_seconds": t.warmup_seconds, "train_seconds": t.train_seconds,
                    "end_to_end_seconds": t.end_to_end_seconds, "fixed_seconds": t.fixed_seconds,
                    "end_to_end_pairs_per_s": t.end_to_end_pairs_per_s, "data_wait_fraction": t.data_wait_fraction,
                    "load_average": trial_load}
                   for t, r, ratio, trial_load in zip(timings, beside, ratios, load["trials"])],
        "gap_closed": gap_closed(timings, ratios),
        "load_average": load,
        "warning": load_warning(load),
        "conclusion": conclusion(timings, ratios),
    }


def load_warning(load: dict[str, Any]) -> str | None:
    """A line when other work shared the cores during the bench, else None."""
    peak = max(load["before"], load["after"], *load["trials"])
    if peak <= load["cpus"]:
        return None
    return (f"warning: the load average reached {peak:.1f} on {load['cpus']:g} CPUs: other work shared the cores, "
            "so these are not this machine's idle figures (rerun on an idle machine to compare layouts)")


COLUMNS = (("layout", "<", 11), ("W x CPU x thr", "<", 13), ("pairs/step", ">", 10), ("pairs/s", ">", 7),
           ("1-proc p/s", ">", 10), ("vs 1-proc", ">", 9), ("warm-up s", ">", 9), ("train s", ">", 7),
           ("e2e s", ">", 6), ("Ray fixed s", ">", 11), ("e2e pairs/s", ">", 11), ("load", ">", 5))


def _row(cells: Sequence[str]) -> str:
    return "  ".join(f"{cell:{align}{width}}" for cell, (_, align, width) in zip(cells, COLUMNS)).rstrip()


def format_layout(result: dict[str, Any]) -> str:
    """The table, then what each row measured, the load and the conclusion."""
    bench, load = result["bench"], result["load_average"]
    lines = [_row([name for name, _, _ in COLUMNS])]
    for ref in result["references"]:
        lines.append(_row(["one process", f"1 x - x {bench['threads']}", str(ref["batch_pairs"]),
                           f"{ref['pairs_per_s']:.0f}", "-", f"{ref['ratio']:.3f}"] + ["-"] * 6))
    for t in result["trials"]:
        layout = t["layout"]
        workers, batch = layout["num_workers"], layout["batch_pairs"]
        lines.append(_row([
            layout["name"], f"{workers} x {layout['cpus_per_worker']:g} x {layout['torch_threads']}",
            f"{workers}x{batch}" if workers > 1 else str(batch), f"{t['steady_pairs_per_s']:.0f}",
            f"{t['reference_pairs_per_s']:.0f}", f"{t['ratio']:.3f}", f"{t['warmup_seconds']:.1f}",
            f"{t['train_seconds']:.1f}", f"{t['end_to_end_seconds']:.1f}", f"{t['fixed_seconds']:.1f}",
            f"{t['end_to_end_pairs_per_s']:.0f}", f"{t['load_average']:.1f}",
        ]))
    waits = ", ".join(f"{t['layout']['name']} {t['data_wait_fraction']:.1%}" for t in result["trials"])
    lines += [
        "",
        f"one process: ContrastiveLoop.step in the driver on one batch of real pairs, preset {bench['preset']}, "
        f"length {bench['pair_length']}, passes of {bench['reference_pairs']} pairs before every trial and after the "
        "last; its rows: medians of all passes (ratio to the first row); a trial's 1-proc p/s: the passes beside it",
        f"trials: run_contrastive (Ray Train TorchTrainer, no Tune, no evaluation), {bench['pairs']:,} pairs each; "
        "pairs/s between the first and last report; warm-up s: the first report's time beyond steady state; "
        "Ray fixed s: e2e s - train s (the loop's compute/wall_seconds)",
        f"data wait (share of train s waiting for batches): {waits}",
        f"load: 1-min load average at each trial's end (its own processes included); {load['before']:.1f} before "
        f"the bench, {load['after']:.1f} after, on {load['cpus']:g} CPUs",
        *([result["warning"]] if result["warning"] else []),
        result["conclusion"],
    ]
    return "\n".join(lines)


def layout_trial(base, layout: Layout, pairs: int):
    """`base` (a phase-2 TrialConfig) on `layout`, trained to `pairs`, reporting as sweeps do."""
    train = dataclasses.replace(base.train, num_workers=layout.num_workers, cpus_per_worker=layout.cpus_per_worker,
                                torch_threads=layout.torch_threads, batch_rows=layout.batch_pairs,
                                budget=dataclasses.replace(base.train.budget, pairs=pairs),
                                report_every_steps=REPORT_EVERY_STEPS)
    return dataclasses.replace(base, train=train)


def _reference_block(loops: dict[int, Any], batches: dict[int, dict], bench: LayoutBench, order: int) -> dict:
    """`reference_repeats` timed passes of each batch size, in alternating order."""
    block: dict[int, list[float]] = {b: [] for b in loops}
    sizes = list(loops)
    for repeat in range(bench.reference_repeats):
        for b in sizes if (order + repeat) % 2 == 0 else sizes[::-1]:
            steps = max(1, bench.reference_pairs // b)
            started = time.perf_counter()
            for _ in range(steps):
                loops[b].step([batches[b]])
            block[b].append(steps * b / (time.perf_counter() - started))
    return block


def bench_layout(prepared, bench: LayoutBench = LayoutBench(), progress: Callable[[str], None] = print) -> dict:
    """Measure the reference and every layout's trial (module docstring); Ray must be connected."""
    load: dict[str, Any] = {"before": os.getloadavg()[0], "cpus": float(os.cpu_count() or 1), "trials": []}
    sides = {b: ContrastiveBench(preset=bench.preset, batch_pairs=b, pair_length=bench.pair_length,
                                 threads=bench.threads) for b in bench.reference_batches}
    with tempfile.TemporaryDirectory(prefix="embedlab-bench-layout-") as scratch:
        parent = write_parent(prepared, bench.preset, Path(scratch) / "parent")
        loops = {b: contrastive_loop(prepared, parent, side, 0) for b, side in sides.items()}
        batches = {b: pair_batch(prepared, side) for b, side in sides.items()}
        progress(f"bench layout: one process at {list(sides)} pairs a step, {bench.threads} threads "
                 f"(preset {bench.preset}, length {bench.pair_length})")
        for b, loop in loops.items():
            loop.step([batches[b]])  # warm-up
        base = loops[bench.reference_batches[0]].trial
        blocks, timings = [], []
        for layout in LAYOUTS:
            blocks.append(_reference_block(loops, batches, bench, len(blocks)))
            progress(f"bench layout: trial {layout.name} ({layout.shape}, {layout.batch_pairs} "
                     f"pairs/worker/step), {bench.pairs:,} pairs")
            storage = Path(scratch) / "trials"
            started = time.perf_counter()
            result = run_contrastive(layout_trial(base, layout, bench.pairs), prepared, storage_path=storage,
                                     name=layout.name, progress=progress)
            end_to_end = time.perf_counter() - started
            load["trials"].append(os.getloadavg()[0])
            if result.error is not None:
                raise result.error
            timings.append(trial_timing(layout, read_metrics(log_location(storage, layout.name)), end_to_end))
        blocks.append(_reference_block(loops, batches, bench, len(blocks)))
    load["after"] = os.getloadavg()[0]
    return summarise(bench, blocks, timings, load)
