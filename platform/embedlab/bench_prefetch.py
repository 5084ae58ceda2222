"""`embedlab bench prefetch`: data prefetch before and after, on the real training path.

The phase-1 loop (`Phase1Loop` under `embedlab.train.loop.run`, the code Ray Train runs)
reads its trial's real Ray Data stream (the mixture schedule packed by `packed_dataset`)
in this process through `DatasetSession`. The only difference between the two sides is
how many batches Ray Data's iterator collates ahead of the step: `PREFETCH_BATCHES` (what
training uses) against none. Ray Data's streaming executor packs windows in the
background either way; prefetching moves collation (slicing blocks to batch size,
conversion to tensors) off the step's critical path.

Both sides report the loop's own figures, as every trial logs them: tokens per second once
the first batch has arrived (the stream's start-up is the same on both sides and reported
apart), and the share of that time spent waiting for batches
(`compute/data_wait_fraction`). Passes alternate after a warm-up pass of each; the
figures are medians. A third row reads the same stream with no training step: the rate it
can deliver, against the rate the loop consumed. That ratio is the headroom a faster
consumer (a GPU step) has before it would wait.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from embedlab.errors import UsageError
from embedlab.bench_measure import Comparison, median
from embedlab.config import DataConfig, TrialConfig, model_preset
from embedlab.data.mixture import Schedule
from embedlab.data.prepare import PreparedData


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefetchBench:
    budget_tokens: int = 100_000  # one pass: a demo-sized phase-1 trial
    preset: str = "small"
    repeats: int = 3

    def __post_init__(self) -> None:
        if self.budget_tokens < 1 or self.repeats < 1:
            raise UsageError(f"bench prefetch needs budget_tokens >= 1 and repeats >= 1, "
                             f"got {self.budget_tokens} and {self.repeats}")


def bench_trial(bench: PrefetchBench, data: DataConfig) -> TrialConfig:
    """The default phase-1 trial on `data` (what the prepared directory was built from) with
    the bench's preset and budget, never checkpointing mid-run."""
    trial = TrialConfig(model=model_preset(bench.preset), data=data)
    return dataclasses.replace(trial, train=dataclasses.replace(
        trial.train, budget_tokens=bench.budget_tokens, checkpoint_every_steps=0))


def one_pass(trial: TrialConfig, prepared: PreparedData, drawn: tuple[Schedule, dict[str, int]],
             prefetch_batches: int) -> dict:
    """Train `trial` once from scratch on its stream (`drawn`: `trial_schedule`'s schedule and
    offsets); the loop's figures."""
    from embedlab.train.loop import run
    from embedlab.train.phase1 import Phase1Loop, phase1_loop_config, trial_stream
    from embedlab.train.session import DatasetSession

    schedule, offsets = drawn
    session = DatasetSession(trial_stream(trial, prepared, schedule, offsets), prefetch_batches)
    loop = Phase1Loop(phase1_loop_config(trial, prepared, schedule), rank=0, world=1, device=torch.device("cpu"))
    started = time.perf_counter()
    run(loop, session)
    final = session.reports[-1]
    running = final["compute/wall_seconds"] - final["compute/stream_start_seconds"]
    return {
        "tokens": loop.progress.tokens,
        "tokens_per_s": loop.progress.tokens / running,
        "data_wait_fraction": final["compute/data_wait_fraction"],
        "stream_start_seconds": final["compute/stream_start_seconds"],
        "pass_seconds": time.perf_counter() - started,
    }


def stream_pass(trial: TrialConfig, prepared: PreparedData, drawn: tuple[Schedule, dict[str, int]]) -> dict:
    """The same stream, read the way the loop reads it (`DatasetSession`), with no training
    step: how fast it can deliver. Counted as the loop counts: every batch's non-padding
    tokens over the time from the first batch's arrival."""
    from embedlab.train.phase1 import trial_stream
    from embedlab.train.session import DatasetSession

    schedule, offsets = drawn
    session = DatasetSession(trial_stream(trial, prepared, schedule, offsets))
    started = time.perf_counter()
    tokens, first = 0, None
    for batch in session.global_batches(trial.train.batch_rows):
        first = first or time.perf_counter()
        tokens += int((batch["segment_ids"] > 0).sum())
    return {"tokens": tokens, "tokens_per_s": tokens / (time.perf_counter() - first),
            "stream_start_seconds": first - started}


def bench_prefetch(prepared: PreparedData, data: DataConfig, bench: PrefetchBench = PrefetchBench(),
                   progress: Callable[[str], None] = print) -> dict:
    """Prefetching (`PREFETCH_BATCHES`) against none, and the stream's own rate:
    {"comparisons", "passes", "streamed", "tokens", ...}. `data`: the prepared data's config."""
    from embedlab.train.phase1 import trial_schedule
    from embedlab.train.session import PREFETCH_BATCHES

    trial = bench_trial(bench, data)
    drawn = trial_schedule(trial, prepared)  # read and drawn once; every pass streams it anew
    sides = {"embedlab": PREFETCH_BATCHES, "reference": 0}
    progress(f"bench prefetch: phase-1 loop on its Ray Data stream, {bench.budget_tokens:,} tokens a pass, "
             f"prefetch {PREFETCH_BATCHES} vs 0, a warm-up pass of each then {bench.repeats} alternating")
    for prefetch in sides.values():
        one_pass(trial, prepared, drawn, prefetch)  # Ray Data workers and the tokenizer warm up
    passes: dict[str, list[dict]] = {side: [] for side in sides}
    streamed = []
    for repeat in range(bench.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            passes[side].append(one_pass(trial, prepared, drawn, sides[side]))
        streamed.append(stream_pass(trial, prepared, drawn))
    tokens = {p["tokens"] for side in passes.values() for p in side}
    if len(tokens) != 1:
        raise RuntimeError(f"bench prefetch: passes consumed different token counts {sorted(tokens)}")

    def figure(key: str) -> dict[str, list[float]]:
        return {side: [p[key] for p in runs] for side, runs in passes.items()}

    rates, waits = figure("tokens_per_s"), figure("data_wait_fraction")
    measures = {"embedlab": f"Phase1Loop on its Ray Data stream, iterator prefetching {PREFETCH_BATCHES} batch ahead",
                "reference": "the same, prefetch_batches=0"}
    comparisons = [
        Comparison(name="opt: data prefetch", embedlab=median(rates["embedlab"]), reference=median(rates["reference"]),
                   unit="tokens/s", better="higher", embedlab_measures=measures["embedlab"],
                   reference_measures=measures["reference"], runs=rates),
        Comparison(name="data: wait share of training",
                   embedlab=100 * median(waits["embedlab"]), reference=100 * median(waits["reference"]),
                   unit="%", better="lower", embedlab_measures=measures["embedlab"] + " (compute/data_wait_fraction)",
                   reference_measures=measures["reference"],
                   runs={side: [100 * w for w in values] for side, values in waits.items()}),
        Comparison(name="data: stream vs training tokens/s",
                   embedlab=median([p["tokens_per_s"] for p in streamed]), reference=median(rates["embedlab"]),
                   unit="tokens/s", better="higher",
                   embedlab_measures="the same stream read with no training step (what it can deliver)",
                   reference_measures="what the phase-1 loop consumed (its headroom is the ratio)",
                   runs={"embedlab": [p["tokens_per_s"] for p in streamed], "reference": rates["embedlab"]}),
    ]
    return {"comparisons": comparisons, "passes": passes, "streamed": streamed, "tokens": tokens.pop(),
            "stream_start_seconds": figure("stream_start_seconds"), "trial": trial.to_dict()}


def prefetch_note(result: dict) -> str:
    """One line: what a pass was, and the stream start-up both sides paid."""
    starts = [f"{s:.1f}" for side in result["stream_start_seconds"].values() for s in side]
    span = starts[0] if len(set(starts)) == 1 else f"{min(starts, key=float)}-{max(starts, key=float)}"
    return (f"{result['tokens']:,} non-padding tokens a pass (phase-1 trial, preset "
            f"{result['trial']['model']['preset']}); first batch after {span}s, excluded from the rates")
