"""`embedlab bench layout`: the arithmetic and the table, not how fast anything is (no timed assertions)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from embedlab.bench.layout import (
    LAYOUTS,
    Layout,
    LayoutBench,
    TrialTiming,
    format_layout,
    gap_closed,
    layout_trial,
    summarise,
    trial_timing,
)
from embedlab.cli import build_parser
from embedlab.cli.bench import cmd_bench_layout
from embedlab.core.config import TrialConfig
from embedlab.core.errors import UsageError
from embedlab.train.budget import step_units

pytestmark = pytest.mark.timeout(120)

DEMO, MIDDLE, CPU = LAYOUTS
# Four reports 640 pairs apart: 8 s to the first, then 4 s each (160 pairs/s).
REPORTS = [{"train/step": 10 * (i + 1), "budget/pairs": 640 * (i + 1), "compute/wall_seconds": 8.0 + 4.0 * i,
            "compute/data_wait_fraction": 0.01} for i in range(4)]


def timing(layout: Layout, rate: float, train: float, end_to_end: float) -> TrialTiming:
    return TrialTiming(layout=layout, pairs=2048, reports=4, steady_pairs_per_s=rate, warmup_seconds=2.0,
                       train_seconds=train, end_to_end_seconds=end_to_end, data_wait_fraction=0.01)


TIMINGS = [timing(DEMO, 60.0, 40.0, 70.0), timing(MIDDLE, 85.0, 30.0, 62.0), timing(CPU, 185.0, 15.0, 43.0)]
# One-process passes before each trial and after the last: 160 pairs/s at 64 a step throughout.
BLOCKS = [{64: [160.0], 16: [16 * rate]} for rate in (6.25, 7.5, 6.875, 6.875)]
LOAD = {"before": 3.5, "after": 3.25, "cpus": 2.0, "trials": [4.0, 4.5, 5.0]}


def test_layouts_are_the_demo_profile_then_one_change_at_a_time_to_the_cpu_profile():
    """demo: 2 workers x 0.5 CPU x 1 thread x 16 pairs; then 1 x 1 x 2 threads x 16; then the cpu profile's 64."""
    shapes = [(l.num_workers, l.cpus_per_worker, l.torch_threads, l.batch_pairs, l.step_pairs) for l in LAYOUTS]
    assert shapes == [(2, 0.5, 1, 16, 32), (1, 1.0, 2, 16, 16), (1, 1.0, 2, 64, 64)]
    assert [l.name for l in LAYOUTS] == ["demo", "1w-2t-16", "cpu"]


def test_steady_state_rate_leaves_out_the_first_report():
    """Pairs/s runs from the first report to the last; warm-up is the first report's excess over that rate."""
    t = trial_timing(CPU, REPORTS, end_to_end_seconds=50.0)
    assert t.steady_pairs_per_s == 160.0  # (2560 - 640) / (20 - 8)
    assert t.warmup_seconds == 4.0  # 8 s for 640 pairs that steady state takes 4 s for
    assert (t.pairs, t.reports, t.train_seconds, t.data_wait_fraction) == (2560, 4, 20.0, 0.01)
    assert t.fixed_seconds == 30.0 and t.end_to_end_pairs_per_s == 51.2


def test_too_few_reports_a_restart_or_missing_keys_are_refused():
    """One report has no steady state; repeated steps mean a restarted worker group; renamed keys are named."""
    with pytest.raises(ValueError, match="1 report"):
        trial_timing(CPU, REPORTS[:1], 10.0)
    with pytest.raises(RuntimeError, match="restarted"):
        trial_timing(CPU, REPORTS[:3] + REPORTS[1:], 10.0)
    with pytest.raises(ValueError, match="budget/pairs"):
        trial_timing(CPU, [{k: v for k, v in r.items() if k != "budget/pairs"} for r in REPORTS], 10.0)


def test_the_loop_reports_the_keys_the_bench_reads(frozen, parent, tmp_path):
    """An in-process phase-2 run (the loop Ray Train runs) reports what `trial_timing` needs, once per report."""
    import synthetic

    reports, _ = synthetic.train(synthetic.contrastive_trial(parent, report_every_steps=2, checkpoint_every_steps=0),
                                 frozen, tmp_path)
    t = trial_timing(CPU, reports, end_to_end_seconds=100.0)
    assert (t.reports, t.pairs) == (synthetic.STEPS // 2, synthetic.STEPS * synthetic.ROWS)
    seconds = reports[-1]["compute/wall_seconds"] - reports[0]["compute/wall_seconds"]
    assert t.steady_pairs_per_s == (t.pairs - reports[0]["budget/pairs"]) / seconds
    assert t.fixed_seconds == 100.0 - reports[-1]["compute/wall_seconds"]


def test_layout_trial_changes_only_the_layout_and_the_budget():
    """A layout's trial keeps the base's model and pairs; its step reads workers x pairs per worker."""
    base = TrialConfig(phase=2, parent="/parent")
    trial = layout_trial(base, DEMO, 2048)
    train = trial.train
    assert (train.num_workers, train.cpus_per_worker, train.torch_threads, train.batch_rows, train.budget.pairs,
            train.report_every_steps) == (2, 0.5, 1, 16, 2048, 10)
    assert step_units(trial) == 32 and step_units(layout_trial(base, CPU, 2048)) == 64
    assert dataclasses.replace(trial, train=base.train) == base


def test_pairs_too_few_for_two_reports_of_every_layout_is_a_usage_error():
    """The cpu layout reports every 640 pairs: fewer than 1,280 pairs leave no steady state."""
    with pytest.raises(UsageError, match=r"bench.pairs: must be >= 1280"):
        LayoutBench(pairs=1279)
    assert LayoutBench(pairs=1280).pairs == 1280


def test_each_change_closes_its_share_of_the_first_layouts_gap():
    """Ratios 0.375 -> 0.53125 -> 1.15625: the gap is 0.625; the changes close 25% and 100%."""
    shares = gap_closed(TIMINGS, [0.375, 0.53125, 1.15625])
    assert [(g["from"], g["to"], g["share"]) for g in shares] == [("demo", "1w-2t-16", 0.25), ("1w-2t-16", "cpu", 1.0)]
    assert shares[0]["change"] == "2 workers x 0.5 CPU x 1 thread -> 1 worker x 1 CPU x 2 threads"
    assert shares[1]["change"] == "16 -> 64 pairs/worker/step"


def test_result_json_shape_and_conclusion():
    """Reference rows are medians of all passes; every trial carries the same columns."""
    result = summarise(LayoutBench(), BLOCKS, TIMINGS, LOAD)
    assert set(json.loads(json.dumps(result, sort_keys=True))) == {
        "bench", "reference_pairs_per_s", "references", "trials", "gap_closed", "load_average", "warning",
        "conclusion"}
    assert set(result["trials"][0]) == {
        "layout", "pairs", "reports", "steady_pairs_per_s", "ratio", "warmup_seconds", "train_seconds",
        "end_to_end_seconds", "fixed_seconds", "end_to_end_pairs_per_s", "data_wait_fraction",
        "reference_pairs_per_s", "load_average"}
    assert result["reference_pairs_per_s"] == 160.0
    assert [(r["batch_pairs"], r["pairs_per_s"], r["ratio"]) for r in result["references"]] == [
        (64, 160.0, 1.0), (16, 110.0, 0.6875)]
    assert [(t["layout"]["name"], t["ratio"], t["fixed_seconds"], t["load_average"]) for t in result["trials"]] == [
        ("demo", 0.375, 30.0, 4.0), ("1w-2t-16", 0.53125, 32.0, 4.5), ("cpu", 1.15625, 28.0, 5.0)]
    assert result["conclusion"] == (
        "fastest: cpu at 185 pairs/s steady, 1.16x one process; of demo's gap to one process (0.38x): "
        "demo -> 1w-2t-16 (2 workers x 0.5 CPU x 1 thread -> 1 worker x 1 CPU x 2 threads) closes 25%; "
        "1w-2t-16 -> cpu (16 -> 64 pairs/worker/step) closes 100%. "
        "Ray's fixed cost: 28-32 s a trial, 51% of end-to-end at 2,048 pairs")


def test_table_has_a_row_per_reference_and_layout_in_aligned_columns():
    """Two one-process rows, three trial rows; every value right-aligned under its heading."""
    lines = format_layout(summarise(LayoutBench(), BLOCKS, TIMINGS, LOAD)).splitlines()
    header, rows = lines[0], lines[1:6]
    assert header == ("layout       W x CPU x thr  pairs/step  pairs/s  1-proc p/s  vs 1-proc  warm-up s  train s   "
                      "e2e s  Ray fixed s  e2e pairs/s   load")
    assert rows[0].split() == ["one", "process", "1", "x", "-", "x", "2", "64", "160", "-", "1.000"] + ["-"] * 6
    assert rows[2].split() == ["demo", "2", "x", "0.5", "x", "1", "2x16", "60", "160", "0.375", "2.0", "40.0", "70.0",
                               "30.0", "29", "4.0"]
    assert rows[4].split()[:10] == ["cpu", "1", "x", "1", "x", "2", "64", "185", "160", "1.156"]
    end = header.index(" pairs/s ") + len(" pairs/s")
    assert all(row[:end].endswith(("160", "110", "60", "85", "185")) for row in rows)
    assert lines[6] == "" and lines[-1].startswith("fastest: cpu")
    assert lines[-4] == "data wait (share of train s waiting for batches): demo 1.0%, 1w-2t-16 1.0%, cpu 1.0%"
    assert lines[-3].endswith("3.5 before the bench, 3.2 after, on 2 CPUs")


def test_a_trials_ratio_divides_by_the_reference_passes_beside_it():
    """Reference passes drifting 100 -> 400 pairs/s: each trial is compared with the two blocks around it."""
    blocks = [{64: [rate], 16: [rate]} for rate in (100.0, 200.0, 300.0, 400.0)]
    result = summarise(LayoutBench(), blocks, TIMINGS, LOAD)
    assert [t["reference_pairs_per_s"] for t in result["trials"]] == [150.0, 250.0, 350.0]
    assert [t["ratio"] for t in result["trials"]] == [60.0 / 150.0, 85.0 / 250.0, 185.0 / 350.0]
    assert result["reference_pairs_per_s"] == 250.0
    with pytest.raises(ValueError, match="3 trials need 4 reference blocks"):
        summarise(LayoutBench(), blocks[:3], TIMINGS, LOAD)


def test_a_load_above_the_cpu_count_adds_a_warning_line():
    """Load 5.0 on 2 CPUs (the test's loads) warns; loads within the CPU count do not."""
    warned = format_layout(summarise(LayoutBench(), BLOCKS, TIMINGS, LOAD)).splitlines()
    assert warned[-2].startswith("warning: the load average reached 5.0 on 2 CPUs")
    idle = {"before": 0.5, "after": 1.0, "cpus": 2.0, "trials": [1.5, 2.0, 1.0]}
    result = summarise(LayoutBench(), BLOCKS, TIMINGS, idle)
    assert result["warning"] is None and format_layout(result).splitlines()[-2].startswith("load: ")


def test_cli_registers_bench_layout():
    """`embedlab bench layout --pairs N --json` reaches cmd_bench_layout; --pairs defaults to LayoutBench's."""
    args = build_parser().parse_args(["bench", "layout", "--pairs", "4096", "--json", "--address", "host:6379"])
    assert (args.func, args.pairs, args.json, args.address) == (cmd_bench_layout, 4096, True, "host:6379")
    assert build_parser().parse_args(["bench", "layout"]).pairs is None
