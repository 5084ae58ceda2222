"""The suite stays fast: no single test takes longer than `CEILING_S` unless `SLOW_TESTS` names
it, with the reason it cannot be cut. Runs last (conftest orders it), reading the durations
pytest recorded for this session's tests (every xdist worker's); run on its own, it reads the
last whole run's."""

from __future__ import annotations

import pytest

import conftest

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
    "tests/test_heldout.py::test_real_tasks_have_zero_findings_against_the_builtin_corpus":
        "audits the real held-out tasks against the whole built-in corpus with every rule, the shared-window "
        "index included (43 s in one process, 111 s on the low-priority worker of two); sharing that index "
        "with the built-in task's audit is the cut that would bring it under the ceiling",
}


def _recorded(session) -> dict[str, float]:
    here = conftest.session_durations(session, exclude="tests/test_suite_time.py::")
    if len(here) > 1:
        return here
    cache = getattr(session.config, "cache", None)
    return (cache.get(conftest.DURATIONS_CACHE_KEY, None) if cache is not None else None) or {}


# Under pytest-xdist it waits for the other worker's last tests (conftest.session_durations).
@pytest.mark.timeout(1800)
def test_no_test_takes_longer_than_the_ceiling_unless_listed(request):
    durations = _recorded(request.session)
    if not durations:
        pytest.skip("no durations recorded: run it with other tests, or after a whole `make test`")
    over = {test: seconds for test, seconds in durations.items() if seconds > CEILING_S and test not in SLOW_TESTS}
    assert not over, "over the %.0f s ceiling (cut it, or list it with its reason in SLOW_TESTS): %s" % (
        CEILING_S, ", ".join(f"{test} {seconds:.0f} s" for test, seconds in sorted(over.items(), key=lambda kv: -kv[1])))


def test_every_listed_slow_test_exists():
    """A renamed or removed test leaves no stale entry that would let another through."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for test in SLOW_TESTS:
        path, name = test.split("::")
        tree = ast.parse((root / path).read_text())
        assert name in {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}, test
