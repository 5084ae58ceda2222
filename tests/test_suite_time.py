"""The suite stays fast: no single test takes longer than `CEILING_S` unless `SLOW_TESTS` names
it, with the reason it cannot be cut. Runs last (conftest orders it), reading the durations
pytest recorded for this session's tests (every xdist worker's); run on its own, it reads the
last whole run's.

The ceiling is stated for the 2-core machine the suite is sized for. On a slower or busier
machine (CI's ran the same tests about 1.5x slower) it scales by this run's measured slowdown:
the median, over the tests that took at least `REFERENCE_MIN_S` there, of each test's time now
over its time in `durations-reference.json` (an idle whole run on the sized machine). A median
over many tests moves with the machine, not with one test that grew. Never below 1: a faster
machine keeps the stated ceiling. To refresh the reference after an idle whole `make test`:
`.venv/bin/python tests/test_suite_time.py`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import conftest

REFERENCE = Path(__file__).with_name("durations-reference.json")
REFERENCE_MIN_S = 1.0  # shorter tests measure start-up noise more than the machine
REFERENCE_MIN_TESTS = 20  # fewer shared tests than this: no slowdown is estimated (1.0)

# Wall time of one test, setup and teardown included (a module fixture's cost lands on the
# first test that uses it), on the 2-core machine the suite is sized for.
CEILING_S = 90.0

# The only tests allowed over the ceiling, and why: each already proves several properties at
# once, so splitting it would cost more start-ups than it saves.
SLOW_TESTS = {
    "tests/test_multinode.py::test_a_fleet_without_a_shared_disk_grows_and_takes_sweeps_by_address_and_by_job":
        "a three-node rehearsal fleet (started, grown and stopped once) and two sweeps on it: a real cluster "
        "is the property",
    "tests/test_object_storage.py::test_a_tuned_panel_study_on_s3_from_sweep_to_release":
        "the whole study path once (a tuned sweep, promotion, a child sweep, export, report) on a real "
        "S3 server: eight Ray trials",
    "tests/test_pretrained.py::test_a_sweep_from_a_pretrained_parent_ends_in_a_gated_promotion_and_a_native_release":
        "the pretrained-parent path once through the CLI: data prepared afresh with the parent's own tokenizer "
        "(corpus, pieces, task, panel and audit, nothing shared with the suite's prepared data), two Ray "
        "trials, the parent scored by the evaluator, promotion and a native release",
    "tests/test_reuse_and_rounds_on_ray.py::test_a_finished_trial_is_copied_and_equals_the_same_trial_trained_again":
        "carries its module fixture's cost (the tiny study's four trials, trained once and reused by both tests "
        "of the module) and trains two of them again to prove a copy equals a retrained trial",
    "tests/test_reuse_and_rounds_on_ray.py::test_a_killed_sequential_sweep_resumes_at_its_round":
        "a driver subprocess run until decided, killed mid-round and resumed: a Ray job start, two rounds "
        "and three trials trained (72-107 s on clean runs, at the ceiling)",
    "tests/test_heldout.py::test_real_tasks_have_zero_findings_against_the_builtin_corpus":
        "audits the real held-out tasks against the whole built-in corpus with every rule, the shared-window "
        "index included (43 s in one process, 111 s on the low-priority worker of two); sharing that index "
        "with the built-in task's audit is the cut that would bring it under the ceiling",
}


SELF = "tests/test_suite_time.py::"  # this file's tests: the check's own time is its wait for the others


def _recorded(session) -> dict[str, float]:
    here = conftest.session_durations(session, exclude=SELF)
    if len(here) > 1:
        return here
    cache = getattr(session.config, "cache", None)
    last = (cache.get(conftest.DURATIONS_CACHE_KEY, None) if cache is not None else None) or {}
    return {test: seconds for test, seconds in last.items() if not test.startswith(SELF)}


def slowdown(durations: dict[str, float], reference: dict[str, float]) -> float:
    """This run's speed against the reference machine's: the median of now/reference over the
    tests both hold that took at least `REFERENCE_MIN_S` there, floored at 1; 1.0 when fewer
    than `REFERENCE_MIN_TESTS` tests are shared."""
    ratios = [durations[test] / seconds for test, seconds in reference.items()
              if seconds >= REFERENCE_MIN_S and test in durations]
    return max(1.0, statistics.median(ratios)) if len(ratios) >= REFERENCE_MIN_TESTS else 1.0


def _reference() -> dict[str, float]:
    return json.loads(REFERENCE.read_text())["seconds"] if REFERENCE.is_file() else {}


# Under pytest-xdist it waits for the other worker's last tests (conftest.session_durations).
@pytest.mark.timeout(1800)
def test_no_test_takes_longer_than_the_ceiling_unless_listed(request):
    durations = _recorded(request.session)
    if not durations:
        pytest.skip("no durations recorded: run it with other tests, or after a whole `make test`")
    factor = slowdown(durations, _reference())
    ceiling = CEILING_S * factor
    over = {test: seconds for test, seconds in durations.items() if seconds > ceiling and test not in SLOW_TESTS}
    assert not over, "over the %.0f s ceiling (%.0f s x this run's slowdown %.2f; cut it, or list it with its " \
        "reason in SLOW_TESTS): %s" % (ceiling, CEILING_S, factor, ", ".join(f"{test} {seconds:.0f} s" for test, seconds in sorted(over.items(), key=lambda kv: -kv[1])))


def test_every_listed_slow_test_exists():
    """A renamed or removed test leaves no stale entry that would let another through."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for test in SLOW_TESTS:
        path, name = test.split("::")
        tree = ast.parse((root / path).read_text())
        assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, test


def test_slowdown_is_the_median_ratio_over_the_reference_tests():
    reference = {f"t{i}": 1.0 + i for i in range(REFERENCE_MIN_TESTS)} | {"short": 0.5, "gone": 9.0}
    now = {f"t{i}": (1.0 + i) * (1.5 if i % 2 else 2.0) for i in range(REFERENCE_MIN_TESTS)} | {"short": 50.0}
    now["t0"] = 1000.0  # one test that grew moves the median by one place, not by its size
    assert slowdown(now, reference) == statistics.median([now[t] / reference[t] for t in now if t != "short"]) == 1.75
    assert slowdown({t: v / 3 for t, v in now.items()}, reference) == 1.0  # a faster machine keeps the ceiling
    assert slowdown({"t1": 20.0}, reference) == 1.0  # too few shared tests to estimate


def test_the_reference_is_a_whole_run_of_the_suite():
    seconds = _reference()
    assert len(seconds) > 500 and all(test.startswith("tests/") for test in seconds)


def write_reference() -> None:
    """The last whole run's durations (pytest's cache, written by conftest) become the reference."""
    cache = Path(__file__).resolve().parent.parent / ".pytest_cache" / "v" / conftest.DURATIONS_CACHE_KEY
    seconds = json.loads(cache.read_text()) if cache.is_file() else {}
    if len(seconds) < 500:
        raise SystemExit(f"{cache} holds {len(seconds)} tests: run the whole suite (make test) first")
    REFERENCE.write_text(json.dumps({
        "about": "per-test seconds (setup, call, teardown) of an idle whole `make test` on the 2-core machine the "
                 "suite is sized for; tests/test_suite_time.py scales its ceiling by this run's median slowdown",
        "seconds": {test: round(value, 3) for test, value in sorted(seconds.items())}}, indent=1) + "\n")
    print(f"{REFERENCE}: {len(seconds)} tests")


if __name__ == "__main__":
    write_reference()
