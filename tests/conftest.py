"""Shared fixtures: one Ray session and one prepared data directory per test session."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from embedlab.core.config import (DEFAULT_BUDGET, Budget, DataConfig, MaskingConfig, MixtureConfig, TrainConfig, TrialConfig,
                             model_preset)
from embedlab.sources.external import LocalFiles

FIXTURES = Path(__file__).parent / "fixtures"
PLANTED = LocalFiles(name="planted", path=str(FIXTURES / "planted_docstrings.jsonl"))

# Python's own documentation only: present on every machine, small enough to build in seconds;
# plus a local file of planted near and exact duplicates of docstrings.
TEST_DATA = DataConfig(
    sources=("python-docs", "python-docstrings"),
    local_files=(PLANTED,),
    mixture=MixtureConfig(shares=(("python-docs", 0.3), ("python-docstrings", 0.7))),
    tokenizer_vocab_size=1024,
    sequence_length=64,
)


def run_dirs(storage: str, study: str) -> list[str]:
    """The run directories of `study` under `storage` (a path or URI), oldest first: their names
    are `<study>-<start time>[-n]`."""
    import re

    from embedlab.core import store

    names = {p.split("/")[0] for p in store.list_tree(storage)}
    return sorted(store.join(storage, n) for n in names if re.fullmatch(rf"{study}-\d{{8}}-\d{{6}}(-\d+)?", n))


def only_run(storage: Path) -> Path:
    """The one run directory (it holds a `study.json`) under a local storage root, which also
    holds the finished-trial index (`embedlab.sweep.reuse`)."""
    runs = [p for p in storage.iterdir() if (p / "study.json").is_file()]
    assert len(runs) == 1, f"{storage}: {len(runs)} run directories"
    return runs[0]


def tiny_budget(**fields) -> Budget:
    """The tiny trial's budget, a few thousand tokens (and the default pairs), with `fields` replaced."""
    return dataclasses.replace(DEFAULT_BUDGET, **{"tokens": 6_000, **fields})


def tiny_trial(**train) -> TrialConfig:
    """A 2-layer width-64 model on the test data, trained for a few thousand tokens."""
    return TrialConfig(
        model=model_preset("tiny", vocab_size=1024, max_length=128),
        masking=MaskingConfig(ratio=0.15),
        data=TEST_DATA,
        train=dataclasses.replace(
            TrainConfig(budget=tiny_budget(), batch_rows=8, report_every_steps=5), **train
        ),
    )


def plain_words(text: str) -> list[str]:
    """Lower-cased \\w+ runs: the audit's words, written in plain Python (no NFKC or accent
    folding) for tests that pick text the audit must not find."""
    return re.findall(r"\w+", text.lower())


def word_runs(words: list[str], n: int) -> set[tuple[str, ...]]:
    """Every run of `n` consecutive words."""
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def audit_would_find(item: list[str], stage: list[list[str]], window: int = 10, whole_from: int = 4) -> bool:
    """The audit's shared-window and contained rules for one evaluation item (its words) against
    stage texts (word lists): a `window`-word run in common with one, or the whole item, when
    it has `whole_from` words or more, inside one."""
    windows = word_runs(item, window)
    return any(windows & word_runs(text, window) or (len(item) >= whole_from and tuple(item) in word_runs(text, len(item)))
               for text in stage)


STUDY_TEMPLATE = """
from dataclasses import replace
from embedlab import Budget, Search, Study
from embedlab.core.config import DEFAULT_BUDGET, TrialConfig

def study(profile=None):
    base = TrialConfig.from_dict({config!r})
    return Study(name={name!r}, factor={factor!r}, seeds={seeds!r},
                 arms={{"{first}": base, "{second}": replace(base, {field}=replace(base.{field}, {change}))}},
                 {extra})
"""


def write_study(path: Path, config: TrialConfig, *, name: str = "tiny", arms: tuple[str, str] = ("mask-15", "mask-30"),
                change: str = "masking.ratio=0.3", seeds: tuple[int, ...] = (0,),
                extra: str = "budget=replace(DEFAULT_BUDGET, tokens=4_000)") -> str:
    """A two-arm study file over `config`: the second arm sets `change` ("section.field=value")."""
    section, assignment = change.split(".", 1)
    field, value = assignment.split("=", 1)
    path.write_text(STUDY_TEMPLATE.format(
        config=config.to_dict(), name=name, factor=f"{section}.{field}", seeds=seeds, first=arms[0],
        second=arms[1], field=section, change=f"{field}={value}", extra=extra))
    return str(path)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory, monkeypatch_session):
    path = tmp_path_factory.mktemp("embedlab-cache")
    monkeypatch_session.setenv("EMBEDLAB_CACHE", str(path))
    return path


@pytest.fixture(scope="session")
def monkeypatch_session():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="session")
def prepared(cache_dir, ray_session):
    from embedlab.prepared.build import prepare_data

    return prepare_data(TEST_DATA, cache_dir=cache_dir)


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    """The Hugging Face hub switched off and a private datasets cache, for Hub-layout directories on
    local disk (datasets and huggingface_hub read the variables at import: patch both)."""
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


# The S3-compatible server's credentials: fake, but distinctive, so a test can prove they
# never reach a log line, a run record or a manifest.
S3_KEY_ID = "EMBEDLABTESTKEY7F3C"
S3_SECRET = "embedlab-test-secret-9b1e4d2a"


@dataclasses.dataclass(frozen=True)
class S3Server:
    endpoint: str
    env: dict[str, str]  # what a subprocess (a node, a CLI) needs to reach it

    def bucket(self, name: str) -> str:
        """A fresh bucket; its s3:// URI."""
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return f"s3://{name}"


@pytest.fixture(scope="session")
def s3_server(monkeypatch_session, tmp_path_factory):
    """moto's standalone S3 server on loopback, for the whole session, reached through the
    standard AWS variables (set before the session's Ray starts, so its workers inherit them)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path_factory.mktemp("s3") / "moto.log"
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": S3_KEY_ID, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    for key, value in env.items():
        monkeypatch_session.setenv(key, value)
    yield S3Server(endpoint, env)
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture(scope="session")
def ray_session(s3_server, cache_dir):
    """One local Ray cluster for every test that is about Ray (its processes reach the
    session's S3 server and use the session's cache: both are set before Ray starts, whose
    processes keep the environment they started with)."""
    import ray

    from embedlab.sweep.cluster import connect

    connect(None, progress=lambda message: None)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def two_worker_phase1(ray_session, prepared, tmp_path_factory):
    """A phase-1 run of `tiny_trial` on two Ray Train workers, reporting every step and
    checkpointing every second one: the uninterrupted reference of test_faults' killed-worker
    run, and the checkpoint test_ray_end_to_end scores and starts phase 2 from (one fit, each
    costing a worker group's start, serves both). (trial, result, the run's metrics log)."""
    from embedlab.train.phase1 import run_phase1

    trial = tiny_trial(num_workers=2, report_every_steps=1, checkpoint_every_steps=2)
    storage = tmp_path_factory.mktemp("two-workers")
    result = run_phase1(trial, prepared, storage_path=storage, name="full")
    return trial, result, storage / "full" / "metrics.jsonl"


# The in-process training oracles (test_resume, test_faults): a frozen tokenizer and a parent.
@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    import synthetic

    return synthetic.tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def parent(frozen, tmp_path_factory):
    import synthetic

    return synthetic.write_parent(tmp_path_factory.mktemp("parent") / "checkpoint", frozen)


# --- the suite's time: the `ray` marker, the fast loop's guard, recorded durations ---------------

# Where a local Ray cluster writes its session directories (ray.init and `ray start`, unless
# told --temp-dir): a new one during a `-m "not ray"` run means a test started Ray unmarked.
RAY_TEMP = Path("/tmp/ray")
# Each test's wall time in this session (setup + call + teardown, seconds), by node id, for
# test_suite_time.py; also kept in pytest's cache at the end of a whole run.
DURATIONS: dict[str, float] = {}
DURATIONS_CACHE_KEY = "embedlab/durations"
# How long the suite-time check waits, with no test of the other worker finishing, before it
# gives up and names the tests whose durations never arrived.
DURATIONS_WAIT_S = 600.0
_RAY_BEFORE = pytest.StashKey[set]()  # in the fast loop: Ray's session directories before a test
_SHARED_DURATIONS: list[Path] = []  # set in an xdist worker (`_shared_durations`)


def _ray_sessions() -> set[str]:
    return {p.name for p in RAY_TEMP.glob("session_2*")} if RAY_TEMP.is_dir() else set()


def _started_elsewhere(session: str) -> bool:
    """Whether a Ray session was started by a live process outside this one's tree: another
    suite or job on the same machine, not a test. A session's name ends in the id of the process
    that started it; one that has exited is counted as this test's (a subprocess it ran)."""
    pid = session.rsplit("_", 1)[-1]
    if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
        return False
    while pid.isdigit() and int(pid) > 1:
        if int(pid) == os.getpid():
            return False
        try:  # the parent's id follows the name, which may hold spaces and parentheses
            pid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            return False
    return True


def pytest_configure(config):
    if hasattr(config, "workerinput") and config.option.basetemp:  # an xdist worker: <run>/popen-gw<n>
        _SHARED_DURATIONS.append(Path(config.option.basetemp).parent / "durations")
    if _RAY_LANE_FILES in getattr(config, "workerinput", {}):
        config.pluginmanager.register(_RayLaneWorker(), "embedlab-ray-lane")
    config.addinivalue_line("markers", "ray: starts Ray (a local cluster, a rehearsal fleet or a subprocess "
                                       "that does); `make test-fast` leaves these out")
    config.addinivalue_line("markers", "slow: starts no Ray but takes over 10 s on 2 cores (torch.compile, a whole "
                                       "corpus); `make test-fast` leaves these out too")


def pytest_collection_modifyitems(config, items):
    """Mark every test that uses the session's Ray cluster `ray` (explicitly marked ones start
    their own), and run the suite-time check last, after every duration it reads."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
    last = [item for item in items if item.nodeid.startswith(SUITE_TIME)]
    items[:] = [item for item in items if item not in last] + last


# --- two workers (pytest-xdist): one lane for the Ray tests -----------------------------------

# Whole-suite runs on two workers put every Ray test on the first worker (gw0), in one lane,
# while the others take the rest module by module at the lowest CPU priority: two Ray
# clusters on two cores would each run at half speed and near their start-up time-outs, and
# the lane is the run's critical path, the other tests fill its idle cycles. Within the lane
# the modules of the tests that start clusters of their own (a rehearsal fleet, an S3 study)
# run last. The suite-time check is a unit of its own, handed out only when nothing else is
# left, so nothing can queue behind it on its worker while it waits for the other's
# durations. The workers tell the scheduler, which collects nothing itself, which of the
# selected tests are Ray's.
RAY_LANE = "ray-lane"
SUITE_TIME_UNIT = "suite-time"
RAY_LANE_WORKER = "gw0"
RAY_LANE_LAST = ("tests/test_object_storage.py", "tests/test_multinode.py")
SUITE_TIME = "tests/test_suite_time.py::"
_RAY_LANE_FILES = "embedlab_ray_lane"  # workerinput key: the folder the workers write into


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    import tempfile

    config = node.config
    if not hasattr(config, "_embedlab_ray_lane"):
        config._embedlab_ray_lane = Path(tempfile.mkdtemp(prefix="embedlab-ray-lane-"))
    node.workerinput[_RAY_LANE_FILES] = str(config._embedlab_ray_lane)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayLaneScheduling(LoadFileScheduling):
        """`--dist loadfile`, but every `ray`-marked test in one work unit, which goes to
        `RAY_LANE_WORKER`, and the suite-time check in the last unit handed out."""

        _ray: set[str] | None = None

        def _ray_tests(self) -> set[str]:
            if self._ray is None:
                folder = getattr(config, "_embedlab_ray_lane", None)
                self._ray = set()
                for path in (folder.glob("*.txt") if folder else ()):
                    self._ray.update(path.read_text().splitlines())
            return self._ray

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SUITE_TIME):
                return SUITE_TIME_UNIT
            if nodeid in self._ray_tests():
                return RAY_LANE
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            if RAY_LANE in self.workqueue:
                lane = self.workqueue[RAY_LANE]
                rank = lambda test: test.startswith(RAY_LANE_LAST)
                self.workqueue[RAY_LANE] = {test: lane[test] for test in sorted(lane, key=rank)}  # stable
                self.workqueue.move_to_end(RAY_LANE, last=node.gateway.id != RAY_LANE_WORKER)
            if SUITE_TIME_UNIT in self.workqueue:
                self.workqueue.move_to_end(SUITE_TIME_UNIT)
            super()._assign_work_unit(node)

    return RayLaneScheduling(config, log)


class _RayLaneWorker:
    """In an xdist worker, after deselection: tells the scheduler the node ids of the selected
    `ray` tests, and, when there are some and this is not the lane's worker, drops to the
    lowest CPU priority and one torch thread, taking the cycles the lane leaves idle."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        import os

        import torch

        ray = [item.nodeid for item in items if item.get_closest_marker("ray")]
        workerid = config.workerinput["workerid"]
        (Path(config.workerinput[_RAY_LANE_FILES]) / f"{workerid}.txt").write_text("\n".join(ray))
        if ray and workerid != RAY_LANE_WORKER:
            os.nice(19)
            torch.set_num_threads(1)


def pytest_unconfigure(config):
    import shutil

    folder = getattr(config, "_embedlab_ray_lane", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _fast_loop(config) -> bool:
    return "notray" in (config.getoption("markexpr", "") or "").replace(" ", "")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _fast_loop(item.config):
        item.stash[_RAY_BEFORE] = _ray_sessions()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In the fast loop (`-m "not ray"`), a test that started a local Ray (its fixtures
    included) fails at teardown, naming the marker it lacks."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _RAY_BEFORE in item.stash:
        started = {s for s in _ray_sessions() - item.stash[_RAY_BEFORE] if not _started_elsewhere(s)}
        if started:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} started Ray ({', '.join(sorted(started))}) but is not marked "
                               "`ray`: mark it (@pytest.mark.ray) or use the ray_session fixture")


def _shared_durations() -> Path | None:
    """Under pytest-xdist, the folder where each worker appends its tests' durations (one file
    per worker), so the suite-time check, on whichever worker runs it, reads them all: beside
    the workers' own base temporary folders, which pytest removes with the run's others."""
    return _SHARED_DURATIONS[0] if _SHARED_DURATIONS else None


def pytest_runtest_logreport(report):
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, 0.0) + report.duration
    shared = _shared_durations()
    if shared is not None:
        import json
        import os

        shared.mkdir(exist_ok=True)
        line = json.dumps({"test": report.nodeid, "phase": report.when, "seconds": report.duration})
        with open(shared / f"{os.environ['PYTEST_XDIST_WORKER']}.jsonl", "a") as out:
            out.write(line + "\n")


def session_durations(session, exclude: str, wait_s: float = DURATIONS_WAIT_S) -> dict[str, float]:
    """Every collected test's duration in this session, but those whose node id starts with
    `exclude`: this process's own record, or, under pytest-xdist, every worker's, waiting until
    each test has torn down (xdist hands out the last-collected module last, so the tests still
    running are the other worker's). Fails naming the tests still missing after `wait_s`
    seconds in which none finished."""
    import json
    import time

    shared = _shared_durations()
    if shared is None:
        return {k: v for k, v in DURATIONS.items() if not k.startswith(exclude)}
    expected = {item.nodeid for item in session.items if not item.nodeid.startswith(exclude)}
    finished: set[str] = set()
    last_progress = time.monotonic()
    while True:
        seconds: dict[str, float] = {}
        done: set[str] = set()
        for path in shared.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                if line.endswith("}"):  # a line still being written is read next time
                    record = json.loads(line)
                    seconds[record["test"]] = seconds.get(record["test"], 0.0) + record["seconds"]
                    if record["phase"] == "teardown":
                        done.add(record["test"])
        if expected <= done:
            return {test: seconds[test] for test in expected}
        if done != finished:
            finished, last_progress = done, time.monotonic()
        elif time.monotonic() - last_progress > wait_s:
            missing = sorted(expected - done)
            pytest.fail(f"no duration after {wait_s:.0f} s for {len(missing)} test(s): {', '.join(missing[:5])}")
        time.sleep(1.0)


def pytest_sessionfinish(session, exitstatus):
    # A whole run (no selection) is remembered: test_suite_time.py reads it when run on its own.
    # Under xdist only the controller, to which every worker's reports come, keeps it.
    if getattr(session.config, "cache", None) is not None and not session.config.getoption("markexpr", "") and (
            not session.config.getoption("keyword", "")) and len(DURATIONS) > 100 and (
            not hasattr(session.config, "workerinput")):
        session.config.cache.set(DURATIONS_CACHE_KEY, DURATIONS)
