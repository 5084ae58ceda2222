"""Waiting for an autoscaling fleet (embedlab.sweep.capacity): the pure core driven by a fake
sequence of cluster resources and a fake clock, so nothing starts Ray or really sleeps."""

from __future__ import annotations

import math

import pytest

from embedlab.core.errors import UsageError
from embedlab.sweep.capacity import RESERVED_CPUS, TrialNeed, trial_needs, wait_for_capacity
from embedlab.sweep.cluster import max_concurrent_trials

from conftest import tiny_trial

NEED = TrialNeed("mask-15", ({"CPU": 0.5}, {"CPU": 1.0}))  # one 0.5-CPU worker and the CPUs kept free
EMPTY = {"CPU": 0.0, "memory": 1e9}


def fits(resources: dict) -> int:
    """Trials of NEED side by side, or the refusal `check_fits` raises."""
    if resources.get("CPU", 0) < 1.5:
        raise UsageError(f"does not fit the cluster ({resources.get('CPU', 0):g} CPUs)")
    return math.floor((resources["CPU"] - 1.0) / 0.5)


class Fleet:
    """A fake cluster: `resources()` gives the dict for the current fake time from `timeline`
    [(from second, resources)]; `sleep` advances the clock; `request` records the asks."""

    def __init__(self, *timeline: tuple[float, dict]) -> None:
        self.timeline, self.now, self.reads, self.asks, self.slept = list(timeline), 0.0, 0, [], []

    def resources(self) -> dict:
        self.reads += 1
        return dict([entry for entry in self.timeline if entry[0] <= self.now][-1][1])

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def wait(self, timeout_s: float, lines: list[str], **options):
        return wait_for_capacity(fits, self.resources, needs=[NEED], timeout_s=timeout_s, progress=lines.append,
                                 request=self.asks.append, clock=self.clock, sleep=self.sleep, **options)


def test_a_cluster_that_fits_at_once_goes_on_without_waiting():
    """One trial already fits: the concurrency is what fits, nothing is polled, asked or printed."""
    fleet, lines = Fleet((0, {"CPU": 4.0})), []
    assert fleet.wait(600, lines) == (6, {"CPU": 4.0})
    assert (fleet.reads, fleet.slept, fleet.asks, lines) == (1, [], [], [])


def test_without_waiting_the_refusal_stands_at_once():
    """--wait-for-resources 0 (the default): a cluster with no CPU is refused with `fits`' own
    message after one read, as before the flag existed."""
    fleet = Fleet((0, EMPTY))
    with pytest.raises(UsageError, match=r"does not fit the cluster \(0 CPUs\)"):
        fleet.wait(0, [])
    assert (fleet.reads, fleet.slept, fleet.asks) == (1, [], [])


def test_the_sweep_goes_on_once_nodes_arrive_sized_from_them():
    """Nodes arrive after the second poll: one waiting line naming the need and what is there,
    one line on their arrival, the concurrency from the resources then, and the autoscaler
    asked for the trial's bundles, then the ask cleared."""
    fleet, lines = Fleet((0, EMPTY), (10, {"CPU": 2.0})), []
    concurrency, resources = fleet.wait(600, lines, poll_s=5)
    assert (concurrency, resources) == (2, {"CPU": 2.0})
    assert fleet.slept == [5, 5] and fleet.reads == 3
    assert lines == ["waiting for the autoscaler: need 1.5 CPUs/0 GPUs for one trial of arm mask-15, cluster has "
                     "0 CPUs/0 GPUs; 0 s of 600 s",
                     "ray: the autoscaler's nodes arrived after 10 s: 2 CPUs/0 GPUs"]
    assert fleet.asks == [[{"CPU": 0.5}, {"CPU": 1.0}], []]


def test_max_concurrent_is_used_instead_of_the_resources_present():
    """--max-concurrent N runs N at once: fewer than fit as asked; more than fit goes on with
    a line while waiting is on, and is refused on a cluster that does not grow (no waiting)."""
    assert Fleet((0, {"CPU": 4.0})).wait(600, [], max_concurrent=2)[0] == 2
    lines: list[str] = []
    assert Fleet((0, EMPTY), (5, {"CPU": 2.0})).wait(600, lines, max_concurrent=5)[0] == 5
    assert lines[-1].startswith("ray: --max-concurrent 5: the cluster holds 2 trial(s) at once now; going on")
    with pytest.raises(UsageError, match=r"--max-concurrent 9: the cluster holds 6 .*--wait-for-resources"):
        Fleet((0, {"CPU": 4.0})).wait(0, [], max_concurrent=9)
    with pytest.raises(UsageError, match="at least 1"):
        Fleet((0, {"CPU": 4.0})).wait(600, [], max_concurrent=0)


def test_a_timeout_says_what_was_needed_and_what_arrived():
    """Too small a node arrives and no other: past the timeout a UsageError names the need,
    the resources at the start and at the end, and how to fix it; the ask is cleared too."""
    fleet = Fleet((0, EMPTY), (20, {"CPU": 1.0}))
    with pytest.raises(UsageError) as refusal:
        fleet.wait(60, [], poll_s=7)
    message = str(refusal.value)
    assert "waited 60 s for the autoscaler: need 1.5 CPUs/0 GPUs for one trial of arm mask-15" in message
    assert "the cluster went from 0 CPUs/0 GPUs to 1 CPUs/0 GPUs" in message
    assert "max_workers" in message and "--wait-for-resources" in message and "--profile" in message
    assert sum(fleet.slept) == 60 and fleet.slept[-1] == 60 - 8 * 7  # the last poll lands on the timeout
    assert fleet.asks[-1] == []
    with pytest.raises(UsageError, match=r"nothing arrived \(0 CPUs/0 GPUs\)"):
        Fleet((0, EMPTY)).wait(30, [])


def test_waiting_lines_are_throttled_but_follow_changes():
    """Polled every 5 s for 100 s, an unchanging cluster earns a line every 30 s; a change of
    its CPUs earns one at the next poll."""
    lines: list[str] = []
    with pytest.raises(UsageError):
        Fleet((0, EMPTY)).wait(100, lines, poll_s=5, line_s=30)
    assert [line.rsplit("; ", 1)[1] for line in lines] == ["0 s of 100 s", "30 s of 100 s", "60 s of 100 s",
                                                           "90 s of 100 s"]
    lines = []
    with pytest.raises(UsageError):
        Fleet((0, EMPTY), (12, {"CPU": 1.0})).wait(40, lines, poll_s=5, line_s=30)
    assert [line.rsplit("cluster has ", 1)[1] for line in lines] == [
        "0 CPUs/0 GPUs; 0 s of 40 s", "1 CPUs/0 GPUs; 15 s of 40 s"]


def test_a_trials_need_is_where_max_concurrent_trials_starts_to_fit():
    """`trial_needs`' CPUs and GPUs for one trial are exactly the smallest cluster on which
    `max_concurrent_trials` fits it: a worker's bundle each (a GPU each with train.use_gpu)
    and RESERVED_CPUS."""
    for trial in (tiny_trial(num_workers=2, cpus_per_worker=0.5), tiny_trial(num_workers=3, cpus_per_worker=2.0,
                                                                              use_gpu=True)):
        (need,) = trial_needs({"arm": trial})
        cpus, gpus = need.amount("CPU"), need.amount("GPU")
        assert cpus == trial.train.num_workers * trial.train.cpus_per_worker + RESERVED_CPUS
        assert gpus == (trial.train.num_workers if trial.train.use_gpu else 0)
        assert max_concurrent_trials(trial, {"CPU": cpus, "GPU": gpus}) == 1
        with pytest.raises(ValueError):
            max_concurrent_trials(trial, {"CPU": cpus - 0.5, "GPU": gpus})
        if gpus:
            with pytest.raises(ValueError):
                max_concurrent_trials(trial, {"CPU": cpus, "GPU": gpus - 1})


def test_an_ask_the_cluster_cannot_take_is_said_and_tolerated():
    """Where `ray.autoscaler.sdk.request_resources` fails (here: Ray is not connected), the
    sweep says so and goes on polling instead of failing."""
    import subprocess
    import sys

    # In a process of its own: this session's Ray (other tests) would take the ask.
    code = ("from embedlab.sweep.capacity import request_from_autoscaler; lines = []; "
            "request_from_autoscaler([{'CPU': 1.0}], lines.append); print(repr(lines))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = eval(done.stdout.strip().splitlines()[-1])
    assert len(lines) == 1 and lines[0].startswith("ray: could not ask the autoscaler for resources")
