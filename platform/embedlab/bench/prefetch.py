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

The last rows read the stream as 1, 2 and 4 Train workers do, each worker a Ray task of its
own, all at once, with no training step: each worker's own Dataset (`WorkerSplit`, what
training reads: its tasks expand to tokens only the driver's fragments of its rows) against
every worker reading the whole stream, packing every window, and keeping its rows
(`worker_rows`, what it read before the split). The figure is the slowest worker's
delivered tokens/s (its own rows' non-padding tokens from its first batch): a step waits
for every worker. The driver's pass that decides the fragments runs before the readers
start and is not in the figure. A stream of one schedule window (`WINDOW_PIECES` draws,
about 140,000 tokens of the built-in corpus) is packed, a worker's share or whole, before its
first batch arrives, so at the default budget (one window) these rows measure delivery
(collation, transfer), not packing.
Both sides must deliver the same tokens in all, or the bench fails.

So the packing each worker does is measured apart, on a stream of many windows
(`packing_tokens`, 4 million tokens by default): in this process, with no Ray, the seconds
the slowest of W workers spends packing its items (`pack_window` over `worker_items`: its
rows' fragments, expanded to tokens) against one worker packing every window, which is what
each worker did when every worker read the whole stream. The driver's pass that decides the
fragments, once for all workers, is timed and reported beside.

    embedlab bench prefetch SPEC --json
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from embedlab.bench.measure import Comparison, median
from embedlab.core.config import DataConfig, TrialConfig, model_preset
from embedlab.core.errors import UsageError
from embedlab.prepared.directory import PreparedData
from embedlab.sources.mixture import Schedule
from embedlab.streams.packed import pack_window, packed_dataset, schedule_windows, worker_items, worker_rows
from embedlab.train.loop import run
from embedlab.train.phase1 import Phase1Loop, phase1_worker_config, trial_schedule, trial_streams
from embedlab.train.session import DatasetSession, PREFETCH_BATCHES

SPLIT_WORKERS = (1, 2, 4)  # worker counts the split stream is read at


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrefetchBench:
    budget_tokens: int = 100_000  # one pass: a demo-sized phase-1 trial
    preset: str = "small"
    repeats: int = 3
    packing_tokens: int = 4_000_000  # the packing rows' stream: about 30 schedule windows

    def __post_init__(self) -> None:
        if self.budget_tokens < 1 or self.repeats < 1 or self.packing_tokens < 1:
            raise UsageError(f"bench prefetch needs budget_tokens, repeats and packing_tokens >= 1, "
                             f"got {self.budget_tokens}, {self.repeats} and {self.packing_tokens}")


def bench_trial(bench: PrefetchBench, data: DataConfig) -> TrialConfig:
    """The default phase-1 trial on `data` (what the prepared directory was built from) with
    the bench's preset and budget, never checkpointing mid-run."""
    trial = TrialConfig(model=model_preset(bench.preset), data=data)
    return dataclasses.replace(trial, train=dataclasses.replace(
        trial.train, budget=dataclasses.replace(trial.train.budget, tokens=bench.budget_tokens),
        checkpoint_every_steps=0))


def worker_streams(trial: TrialConfig, prepared: PreparedData, drawn: tuple[Schedule, dict[str, int]],
                   workers: int) -> list:
    """The trial's stream as `workers` Train workers read it: one Dataset each (one worker: the
    whole stream)."""
    schedule, offsets = drawn
    trial = dataclasses.replace(trial, train=dataclasses.replace(trial.train, num_workers=workers))
    return trial_streams(trial, prepared, schedule, offsets)


def one_pass(trial: TrialConfig, prepared: PreparedData, drawn: tuple[Schedule, dict[str, int]],
             prefetch_batches: int) -> dict:
    """Train `trial` once from scratch on its stream (`drawn`: `trial_schedule`'s schedule and
    offsets) as one worker; the loop's figures."""
    schedule, _ = drawn
    session = DatasetSession(worker_streams(trial, prepared, drawn, 1)[0], prefetch_batches)
    loop = Phase1Loop(phase1_worker_config(trial, prepared, schedule), rank=0, world=1, device=torch.device("cpu"))
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
    return read_share(DatasetSession(worker_streams(trial, prepared, drawn, 1)[0]), trial.train.batch_rows)


def read_share(session, rows: int, keep: Callable[[dict], dict] = lambda batch: batch) -> dict:
    """Read a session's batches of `rows` rows to the end, counting the non-padding tokens of
    `keep(batch)` from the first batch's arrival."""
    started = time.perf_counter()
    tokens, first = 0, None
    for batch in session.worker_batches(rows):
        first = first or time.perf_counter()
        tokens += int((keep(batch)["segment_ids"] > 0).sum())
    if first is None:
        raise RuntimeError("bench prefetch: a stream delivered no batch; raise --budget-tokens")
    return {"tokens": tokens, "tokens_per_s": tokens / max(time.perf_counter() - first, 1e-9),
            "stream_start_seconds": first - started}


def _read_worker(dataset, rows: int, rank: int, world: int, whole: bool) -> dict:
    """Ray task body: one worker's read, of its own Dataset (`rows` rows a batch), or of the
    whole stream in global batches keeping its `worker_rows`."""
    if whole:
        return read_share(DatasetSession(dataset), world * rows, lambda batch: worker_rows(batch, rank, world))
    return read_share(DatasetSession(dataset), rows)


def workers_pass(trial: TrialConfig, prepared: PreparedData, drawn: tuple[Schedule, dict[str, int]], workers: int,
                 *, whole: bool) -> list[dict]:
    """`workers` readers at once, each a Ray task as a Train worker is its own process: each
    worker's own Dataset, or (`whole`) the whole stream each; every worker's figures."""
    import ray

    if whole:
        schedule, offsets = drawn
        tokenizer = prepared.tokenizer  # read from its file at each access: once here
        stream = packed_dataset(prepared.pieces_path, schedule, offsets, sequence_length=trial.data.sequence_length,
                                pad_id=tokenizer.pad_id, cls_id=tokenizer.cls_id)
        datasets = [stream] * workers
    else:
        datasets = worker_streams(trial, prepared, drawn, workers)
    # No CPU held: the readers only wait and collate, as Train workers' Data pipelines run in tasks of their own.
    read = ray.remote(num_cpus=0)(_read_worker)
    return ray.get([read.remote(dataset, trial.train.batch_rows, rank, workers, whole)
                    for rank, dataset in enumerate(datasets)])


def packing_pass(trial: TrialConfig, prepared: PreparedData, windows: list[dict], workers: int) -> dict:
    """Each of `workers` workers' packing of its items (`worker_items`, in this process), and
    the driver's pass that made them: {"seconds": per worker, "driver_seconds", "tokens": per
    worker}."""
    started = time.perf_counter()
    shares = worker_items(prepared.pieces_path, windows, sequence_length=trial.data.sequence_length, world=workers,
                          batch_rows=trial.train.batch_rows)
    driver = time.perf_counter() - started if workers > 1 else 0.0
    tokenizer = prepared.tokenizer  # loaded from its file at every access
    packing = {"pieces_path": str(prepared.pieces_path), "sequence_length": trial.data.sequence_length,
               "pad_id": tokenizer.pad_id, "cls_id": tokenizer.cls_id}
    seconds, tokens = [], []
    for items in shares:
        started, packed = time.perf_counter(), 0
        for item in items:
            rows = pack_window({name: [value] for name, value in item.items()}, **packing)
            packed += int((rows["segment_ids"] > 0).sum())
        seconds.append(time.perf_counter() - started)
        tokens.append(packed)
    return {"seconds": seconds, "driver_seconds": driver, "tokens": tokens}


def bench_packing(trial: TrialConfig, prepared: PreparedData, bench: PrefetchBench) -> dict[int, dict[str, list]]:
    """`packing_pass` at every `SPLIT_WORKERS` count ("split") and at one worker ("whole", what
    each worker packed when all read the whole stream), alternating, `repeats` times after a
    warm-up; {workers: {"split": [passes], "whole": [passes]}}."""
    long_trial = dataclasses.replace(trial, train=dataclasses.replace(
        trial.train, budget=dataclasses.replace(trial.train.budget, tokens=bench.packing_tokens)))
    schedule, offsets = trial_schedule(long_trial, prepared)
    windows = schedule_windows(schedule, offsets)
    packing_pass(trial, prepared, windows, 1)  # the piece arrays load once per process
    passes: dict[int, dict[str, list]] = {w: {"split": [], "whole": []} for w in SPLIT_WORKERS}
    for repeat in range(bench.repeats):
        for workers in SPLIT_WORKERS:
            for side in (["split", "whole"] if repeat % 2 == 0 else ["whole", "split"]):
                passes[workers][side].append(packing_pass(trial, prepared, windows, workers if side == "split" else 1))
    whole_tokens = {sum(p["tokens"]) for sides in passes.values() for p in sides["whole"]}
    split_tokens = {sum(p["tokens"]) for sides in passes.values() for p in sides["split"]}
    # The split drops the last partial global batch, as training does; it never adds a token.
    if len(whole_tokens) != 1 or max(split_tokens) > min(whole_tokens):
        raise RuntimeError(f"bench prefetch: packing passes hold token counts {sorted(whole_tokens)} (whole) "
                           f"and {sorted(split_tokens)} (split)")
    return passes


def bench_prefetch(prepared: PreparedData, data: DataConfig, bench: PrefetchBench = PrefetchBench(),
                   progress: Callable[[str], None] = print) -> dict:
    """Prefetching (`PREFETCH_BATCHES`) against none, the stream's own rate, and its rate per
    worker split against whole at `SPLIT_WORKERS` workers: {"comparisons", "passes",
    "streamed", "tokens", "per_worker", ...}. `data`: the prepared data's config."""
    trial = bench_trial(bench, data)
    drawn = trial_schedule(trial, prepared)  # read and drawn once; every pass streams it anew
    sides = {"embedlab": PREFETCH_BATCHES, "reference": 0}
    progress(f"bench prefetch: phase-1 loop on its Ray Data stream, {bench.budget_tokens:,} tokens a pass, "
             f"prefetch {PREFETCH_BATCHES} vs 0, a warm-up pass of each then {bench.repeats} alternating; "
             f"then each repeat the stream read by {', '.join(map(str, SPLIT_WORKERS))} workers, split vs whole")
    for prefetch in sides.values():
        one_pass(trial, prepared, drawn, prefetch)  # Ray Data workers and the tokenizer warm up
    passes: dict[str, list[dict]] = {side: [] for side in sides}
    streamed = []
    # per_worker[workers][side]: every repeat's list of every worker's figures
    per_worker: dict[int, dict[str, list[list[dict]]]] = {w: {"split": [], "whole": []} for w in SPLIT_WORKERS}
    for repeat in range(bench.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            passes[side].append(one_pass(trial, prepared, drawn, sides[side]))
        streamed.append(stream_pass(trial, prepared, drawn))
        for workers in SPLIT_WORKERS:
            for side in (["split", "whole"] if repeat % 2 == 0 else ["whole", "split"]):
                per_worker[workers][side].append(workers_pass(trial, prepared, drawn, workers, whole=side == "whole"))
    tokens = {p["tokens"] for side in passes.values() for p in side}
    if len(tokens) != 1:
        raise RuntimeError(f"bench prefetch: passes consumed different token counts {sorted(tokens)}")
    for workers, sides_read in per_worker.items():
        delivered = {sum(w["tokens"] for w in run) for runs in sides_read.values() for run in runs}
        if len(delivered) != 1:
            raise RuntimeError(f"bench prefetch: {workers} workers' own Datasets and their rows of the whole stream "
                               f"hold different token counts {sorted(delivered)}")

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
    for workers, sides_read in per_worker.items():
        slowest = {side: [min(w["tokens_per_s"] for w in run) for run in runs] for side, runs in sides_read.items()}
        comparisons.append(Comparison(
            name=f"data: tokens/s per worker, {workers} workers",
            embedlab=median(slowest["split"]), reference=median(slowest["whole"]), unit="tokens/s", better="higher",
            embedlab_measures=f"the slowest of {workers} workers reading its own Dataset (WorkerSplit), which packs "
                              "only its rows, no step",
            reference_measures=f"the slowest of {workers} workers reading the whole stream, keeping its worker_rows",
            runs={"embedlab": slowest["split"], "reference": slowest["whole"]}))
    packing = bench_packing(trial, prepared, bench)
    for workers, sides_packed in packing.items():
        slowest = {side: [1e3 * max(p["seconds"]) for p in runs] for side, runs in sides_packed.items()}
        comparisons.append(Comparison(
            name=f"data: packing per worker, {workers} workers",
            embedlab=median(slowest["split"]), reference=median(slowest["whole"]), unit="ms", better="lower",
            embedlab_measures=f"the slowest of {workers} workers packing its own items (its rows' fragments, "
                              f"{bench.packing_tokens:,}-token stream, in process)",
            reference_measures="one worker packing every window (each worker's work when all read the whole stream)",
            runs={"embedlab": slowest["split"], "reference": slowest["whole"]}))
    return {"comparisons": comparisons, "passes": passes, "streamed": streamed, "tokens": tokens.pop(),
            "stream_start_seconds": figure("stream_start_seconds"), "per_worker": per_worker,
            "packing": packing, "trial": trial.to_dict()}


def prefetch_note(result: dict) -> str:
    """One line: what a pass was, and the stream start-up both sides paid."""
    starts = [f"{s:.1f}" for side in result["stream_start_seconds"].values() for s in side]
    span = starts[0] if len(set(starts)) == 1 else f"{min(starts, key=float)}-{max(starts, key=float)}"
    driver = {w: median([p["driver_seconds"] for p in sides["split"]]) for w, sides in result["packing"].items() if w > 1}
    packed = sum(result["packing"][1]["whole"][0]["tokens"])
    return (f"{result['tokens']:,} non-padding tokens a pass (phase-1 trial, preset "
            f"{result['trial']['model']['preset']}); first batch after {span}s, excluded from the rates; "
            f"packing rows: {packed:,} tokens packed, the driver's fragment pass "
            + ", ".join(f"{1e3 * seconds:.0f} ms at {w} workers" for w, seconds in driver.items()))
